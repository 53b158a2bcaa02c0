{{/*
Names. The exporter's objects are "<fullname>-glassbox": the exporter's scrape job is
named after them, and "glassbox" in the job name is what GlassboxExporterAbsent selects
on, whatever the release is called. fullname is cut to 54 characters so that the suffix
still fits a 63-character DNS label.
*/}}
{{- define "vllm-glassbox.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "vllm-glassbox.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 54 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 54 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 54 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{- define "vllm-glassbox.exporterName" -}}
{{- printf "%s-glassbox" (include "vllm-glassbox.fullname" .) }}
{{- end }}

{{- define "vllm-glassbox.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "vllm-glassbox.labels" -}}
helm.sh/chart: {{ include "vllm-glassbox.chart" . }}
{{ include "vllm-glassbox.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- with .Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{- define "vllm-glassbox.selectorLabels" -}}
app.kubernetes.io/name: {{ include "vllm-glassbox.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{/* The vLLM pods (with the exporter beside vLLM in sidecar mode). */}}
{{- define "vllm-glassbox.vllmSelectorLabels" -}}
{{ include "vllm-glassbox.selectorLabels" . }}
app.kubernetes.io/component: vllm
{{- end }}

{{/* The exporter pods of exporter mode. */}}
{{- define "vllm-glassbox.exporterSelectorLabels" -}}
{{ include "vllm-glassbox.selectorLabels" . }}
app.kubernetes.io/component: exporter
{{- end }}

{{- define "vllm-glassbox.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "vllm-glassbox.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/*
An image reference: [registry/]repository, then @digest when set, else :tag (default:
the given tag; none when both are empty). The registry is the image's own, else
global.imageRegistry (an umbrella chart's mirror). Call with
(list $ IMAGE-VALUES DEFAULT-TAG).
*/}}
{{- define "vllm-glassbox.imageRef" -}}
{{- $root := index . 0 }}{{- $image := index . 1 }}
{{- $registry := default (($root.Values.global | default dict).imageRegistry | default "") $image.registry }}
{{- $name := ternary (printf "%s/%s" (trimSuffix "/" $registry) $image.repository) $image.repository (ne $registry "") }}
{{- if $image.digest }}{{ printf "%s@%s" $name $image.digest }}
{{- else if (default (index . 2) $image.tag) }}{{ printf "%s:%s" $name (default (index . 2) $image.tag) }}
{{- else }}{{ $name }}
{{- end }}
{{- end }}

{{- define "vllm-glassbox.image" -}}
{{- include "vllm-glassbox.imageRef" (list . .Values.image .Chart.AppVersion) }}
{{- end }}

{{- define "vllm-glassbox.labImage" -}}
{{- include "vllm-glassbox.imageRef" (list . .Values.lab.image (printf "%s-lab" .Chart.AppVersion)) }}
{{- end }}

{{- define "vllm-glassbox.vllmImage" -}}
{{- include "vllm-glassbox.imageRef" (list . .Values.vllm.image "") }}
{{- end }}

{{/*
Whether a monitoring object is rendered: "auto" when the cluster serves its kind, true
always, false never (and never while the chart is off). The kind is detected by its API
group/version: a list that names kinds (Helm's own discovery) must name this one; a list
of group/versions only (Argo CD, `helm template --api-versions monitoring.coreos.com/v1`)
is trusted for every kind of the group/version. Call with
(list $ .Values.x.enabled "monitoring.coreos.com/v1/Kind").
*/}}
{{- define "vllm-glassbox.enabled" -}}
{{- $root := index . 0 }}{{- $setting := toString (index . 1) }}{{- $api := index . 2 }}
{{- if and $root.Values.enabled (or (eq $setting "true") (and (eq $setting "auto") (include "vllm-glassbox.served" (list $root $api)))) }}true{{ end }}
{{- end }}

{{/* Why a monitoring object is not rendered, for NOTES. Call with (list $ VALUES-NAME). */}}
{{- define "vllm-glassbox.whyNot" -}}
{{- $what := index . 1 }}{{- $kind := printf "%s%s" (upper (substr 0 1 $what)) (substr 1 -1 $what) }}
{{- if ne (toString (index (index . 0).Values $what).enabled) "auto" }}{{ $what }}.enabled is false.
{{- else }}{{ $what }}.enabled is auto, and Helm was
  not told that the cluster serves {{ $kind }} of monitoring.coreos.com/v1 (with helm
  template or GitOps: --api-versions monitoring.coreos.com/v1, or {{ $what }}.enabled: true).
{{- end }}
{{- end }}

{{/* Whether the cluster serves "group/version/Kind", as above. Call with (list $ API). */}}
{{- define "vllm-glassbox.served" -}}
{{- $root := index . 0 }}{{- $api := index . 1 }}
{{- $groupVersion := regexReplaceAll "/[^/]*$" $api "" }}
{{- $namesKinds := false }}
{{- range $root.Capabilities.APIVersions }}
{{- if hasPrefix (printf "%s/" $groupVersion) . }}{{ $namesKinds = true }}{{ end }}
{{- end }}
{{- if or ($root.Capabilities.APIVersions.Has $api) (and (not $namesKinds) ($root.Capabilities.APIVersions.Has $groupVersion)) }}true{{ end }}
{{- end }}

{{/*
vLLM's flags, from the map in vllm.args, as container args (a JSON list): the model first
(`vllm serve MODEL`), --port, then each flag in key order. Whole numbers are written as
integers (Helm reads every YAML number as a float).
*/}}
{{- define "vllm-glassbox.vllmArgs" -}}
{{- $args := list .Values.vllm.model (printf "--port=%d" (int .Values.vllm.port)) }}
{{- range $name, $value := .Values.vllm.args }}
{{- $kind := kindOf $value }}
{{- if eq $kind "bool" }}
{{- $args = append $args (ternary (printf "--%s" $name) (printf "--no-%s" $name) $value) }}
{{- else if eq $kind "map" }}
{{- $args = append $args (printf "--%s=%s" $name (toJson $value)) }}
{{- else if eq $kind "slice" }}
{{- $args = append $args (printf "--%s" $name) }}
{{- range $value }}{{- $args = append $args (include "vllm-glassbox.scalar" .) }}{{- end }}
{{- else if ne $kind "invalid" }}
{{- $args = append $args (printf "--%s=%s" $name (include "vllm-glassbox.scalar" $value)) }}
{{- end }}
{{- end }}
{{- toJson $args }}
{{- end }}

{{- define "vllm-glassbox.scalar" -}}
{{- if and (eq (kindOf .) "float64") (eq (float64 (int64 .)) .) }}{{ int64 . }}{{ else }}{{ toString . }}{{ end }}
{{- end }}

{{/* The value of a vLLM flag in vllm.args, as a string ("" when absent). */}}
{{- define "vllm-glassbox.arg" -}}
{{- $value := index (index . 0).Values.vllm.args (index . 1) }}
{{- if not (kindIs "invalid" $value) }}{{ include "vllm-glassbox.scalar" $value }}{{ end }}
{{- end }}

{{- define "vllm-glassbox.shmEnabled" -}}
{{- $setting := toString .Values.vllm.shm.enabled }}
{{- $tp := int (default "1" (include "vllm-glassbox.arg" (list . "tensor-parallel-size"))) }}
{{- $pp := int (default "1" (include "vllm-glassbox.arg" (list . "pipeline-parallel-size"))) }}
{{- if or (eq $setting "true") (and (eq $setting "auto") (or (gt $tp 1) (gt $pp 1))) }}true{{ end }}
{{- end }}

{{/* The exporter's --model-dir in sidecar mode: exporter.modelDir, else the model when it
lies on the weights volume. */}}
{{- define "vllm-glassbox.modelDir" -}}
{{- if .Values.exporter.modelDir }}{{ .Values.exporter.modelDir }}
{{- else if and .Values.weights.existingClaim (hasPrefix (printf "%s/" (trimSuffix "/" .Values.weights.mountPath)) .Values.vllm.model) }}{{ .Values.vllm.model }}
{{- end }}
{{- end }}

{{/*
cost.gpuHourPrice as --gpu-hour-price reads it: a price, or NAME=PRICE,... in name order.
*/}}
{{- define "vllm-glassbox.gpuHourPrice" -}}
{{- if kindIs "map" . }}
{{- $items := list }}{{- range $name := keys . | sortAlpha }}{{ $items = append $items (printf "%s=%s" $name (include "vllm-glassbox.scalar" (index $ $name))) }}{{ end }}
{{- join "," $items }}
{{- else }}{{ include "vllm-glassbox.scalar" . }}{{ end }}
{{- end }}

{{/*
The exporter's args. Call with (dict "root" $ "target" URL "t" TARGET-OVERRIDES "secrets"
EXPORTER-SECRETS), the last from vllm-glassbox.exporterSecrets.
*/}}
{{- define "vllm-glassbox.exporterArgs" -}}
{{- $e := .root.Values.exporter }}{{- $t := .t }}
{{- $host := $e.listenHost }}{{- if contains ":" $host }}{{ $host = printf "[%s]" $host }}{{ end }}
{{- $args := list (printf "--target=%s" .target) (printf "--listen=%s:%d" $host (int $e.port)) (printf "--interval=%s" $e.interval) (printf "--window=%s" $e.window) (printf "--log-level=%s" $e.logLevel) }}
{{- with .logFile }}{{ $args = append $args (printf "--vllm-log=%s" .) }}{{ end }}
{{- with (default .modelDir $t.modelDir) }}{{ $args = append $args (printf "--model-dir=%s" .) }}{{ end }}
{{- with (default $e.weightsBytes $t.weightsBytes) }}{{ $args = append $args (printf "--weights-bytes=%s" (include "vllm-glassbox.scalar" .)) }}{{ end }}
{{- $gpu := default $e.gpu $t.gpu }}{{- $bandwidth := default $e.gpuMemoryBandwidth $t.gpuMemoryBandwidth }}
{{- if $gpu }}{{ $args = append $args (printf "--gpu=%s" $gpu) }}
{{- else if $bandwidth }}{{ $args = append $args (printf "--gpu-memory-bandwidth=%s" (include "vllm-glassbox.scalar" $bandwidth)) }}
{{- end }}
{{- $cost := .root.Values.cost }}
{{- if ne (toString $cost.gpuHourPrice) "" }}{{ $args = append $args (printf "--gpu-hour-price=%s" (include "vllm-glassbox.gpuHourPrice" $cost.gpuHourPrice)) }}{{ end }}
{{- with $cost.nodePool }}{{ $args = append $args (printf "--node-pool=%s" .) }}{{ end }}
{{- with (default $e.kvLinkBandwidth $t.kvLinkBandwidth) }}{{ $args = append $args (printf "--kv-link-bandwidth=%s" (include "vllm-glassbox.scalar" .)) }}{{ end }}
{{- range (concat .secrets.args $e.extraArgs (default list $t.extraArgs)) }}{{ $args = append $args . }}{{ end }}
{{- toJson $args }}
{{- end }}

{{- define "vllm-glassbox.webConfigOn" -}}
{{- if or .Values.exporter.tls.enabled .Values.exporter.basicAuth.enabled }}true{{ end }}
{{- end }}

{{- define "vllm-glassbox.webConfigSecretName" -}}
{{- default (printf "%s-web" (include "vllm-glassbox.exporterName" .)) .Values.exporter.webConfigSecret }}
{{- end }}

{{/*
The exporter's files from Secrets, as JSON {args, mounts, volumes}: its web-config (TLS
and basic auth of its port), the TLS certificate and key, and the token it sends to vLLM.
Only the keys each one needs are mounted. Call with (dict "root" $ "apiKey" {existingSecret, key}).
*/}}
{{- define "vllm-glassbox.exporterSecrets" -}}
{{- $e := .root.Values.exporter }}
{{- $args := list }}{{- $mounts := list }}{{- $volumes := list }}
{{- if include "vllm-glassbox.webConfigOn" .root }}
{{- $args = append $args "--web-config-file=/etc/glassbox/web/web-config.yml" }}
{{- $mounts = append $mounts (dict "name" "web-config" "mountPath" "/etc/glassbox/web" "readOnly" true) }}
{{- $volumes = append $volumes (dict "name" "web-config" "secret" (dict "secretName" (include "vllm-glassbox.webConfigSecretName" .root))) }}
{{- end }}
{{- if $e.tls.enabled }}
{{- $mounts = append $mounts (dict "name" "tls" "mountPath" "/etc/glassbox/tls" "readOnly" true) }}
{{- $items := list (dict "key" "tls.crt" "path" "tls.crt") (dict "key" "tls.key" "path" "tls.key") }}
{{- $volumes = append $volumes (dict "name" "tls" "secret" (dict "secretName" $e.tls.secretName "items" $items)) }}
{{- end }}
{{- with .apiKey }}{{ if .existingSecret }}
{{- $args = append $args "--target-bearer-token-file=/etc/glassbox/vllm-api-key/token" }}
{{- $mounts = append $mounts (dict "name" "vllm-api-key" "mountPath" "/etc/glassbox/vllm-api-key" "readOnly" true) }}
{{- $volumes = append $volumes (dict "name" "vllm-api-key" "secret" (dict "secretName" .existingSecret "items" (list (dict "key" .key "path" "token")))) }}
{{- end }}{{ end }}
{{- toJson (dict "args" $args "mounts" $mounts "volumes" $volumes) }}
{{- end }}

{{/*
How Prometheus scrapes the exporter's port: scheme, tlsConfig and basicAuth of a
ServiceMonitor endpoint or a PodMetricsEndpoint, as YAML to indent. The TLS default trusts
ca.crt of exporter.tls.secretName and checks the name of the exporter's Service (in
exporter mode the first target's; the certificate names them all); the monitor's
tlsConfig is merged over it. Call with (list $ MONITOR-VALUES).
*/}}
{{- define "vllm-glassbox.exporterScrapeAuth" -}}
{{- $root := index . 0 }}{{- $m := index . 1 }}{{- $e := $root.Values.exporter }}
{{- if $e.tls.enabled }}
{{- $service := include "vllm-glassbox.exporterName" $root }}
{{- if and (eq $root.Values.mode "exporter") $e.targets }}{{ $service = include "vllm-glassbox.targetName" (list $root (first $e.targets).name) }}{{ end }}
{{- $default := dict "ca" (dict "secret" (dict "name" $e.tls.secretName "key" "ca.crt")) "serverName" (printf "%s.%s.svc" $service $root.Release.Namespace) }}
scheme: https
tlsConfig: {{- toYaml (merge (deepCopy $m.tlsConfig) $default) | nindent 2 }}
{{- end }}
{{- if $e.basicAuth.enabled }}
basicAuth:
  username: {name: {{ $e.basicAuth.secretName }}, key: username}
  password: {name: {{ $e.basicAuth.secretName }}, key: password}
{{- end }}
{{- end }}

{{/* The exporter's container (sidecar or alone). Call with (dict "root" $ "args" JSON-LIST "mounts" LIST). */}}
{{- define "vllm-glassbox.exporterContainer" -}}
{{- $e := .root.Values.exporter -}}
name: glassbox
image: {{ include "vllm-glassbox.image" .root }}
imagePullPolicy: {{ .root.Values.image.pullPolicy }}
command: ["glassbox", "exporter"]
args: {{ .args }}
ports:
  - name: glassbox
    containerPort: {{ $e.port }}
    protocol: TCP
{{- $scheme := ternary ", scheme: HTTPS" "" (eq (toString $e.tls.enabled) "true") }}
livenessProbe:  # the exporter's own health (no credentials needed): a vLLM outage must not restart it
  httpGet: {path: /healthz, port: glassbox{{ $scheme }}}
  periodSeconds: 10
  timeoutSeconds: 5
readinessProbe:
  httpGet: {path: /healthz, port: glassbox{{ $scheme }}}
  periodSeconds: 10
  timeoutSeconds: 5
resources: {{- toYaml $e.resources | nindent 2 }}
securityContext: {{- toYaml (merge (dict "runAsNonRoot" true) $e.securityContext) | nindent 2 }}
{{- with .mounts }}
volumeMounts: {{- toYaml . | nindent 2 }}
{{- end }}
{{- end }}

{{/* Refuse relabelings that rename `job`: GlassboxExporterAbsent relies on it. */}}
{{- define "vllm-glassbox.checkRelabelings" -}}
{{- $where := index . 0 }}
{{- range (index . 1) }}
{{- if eq (toString .targetLabel) "job" }}
{{- fail (printf "%s: a relabeling may not set `job`: the exporter's job must contain \"glassbox\" (GlassboxExporterAbsent); the chart names it" $where) }}
{{- end }}
{{- end }}
{{- end }}

{{/* ServiceMonitors: on per serviceMonitor.enabled, except that "auto" gives way to a
PodMonitor that is on (one of the two scrapes each target). */}}
{{- define "vllm-glassbox.serviceMonitorOn" -}}
{{- $pm := include "vllm-glassbox.podMonitorOn" . }}
{{- if and (include "vllm-glassbox.enabled" (list . .Values.serviceMonitor.enabled "monitoring.coreos.com/v1/ServiceMonitor")) (or (not $pm) (eq (toString .Values.serviceMonitor.enabled) "true")) }}true{{ end }}
{{- end }}

{{- define "vllm-glassbox.podMonitorOn" -}}
{{- include "vllm-glassbox.enabled" (list . .Values.podMonitor.enabled "monitoring.coreos.com/v1/PodMonitor") }}
{{- end }}

{{/* The path of vLLM's log file, as the logging config writes it and the exporter reads it. */}}
{{- define "vllm-glassbox.logFile" -}}
{{- printf "%s/vllm.log" (trimSuffix "/" .Values.vllm.log.dir) }}
{{- end }}

{{/* The exporter of one target in exporter mode: "<fullname>-glassbox-<target>", the
fullname cut so that the whole fits 63 characters and keeps "glassbox". Call with
(list $ TARGET-NAME). */}}
{{- define "vllm-glassbox.targetName" -}}
{{- $root := index . 0 }}{{- $target := index . 1 }}
{{- printf "%s-glassbox-%s" (include "vllm-glassbox.fullname" $root | trunc (int (sub 53 (len $target))) | trimSuffix "-") $target }}
{{- end }}
