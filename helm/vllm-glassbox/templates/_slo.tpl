{{- /*
The rules of prometheusRule.slo's objectives (docs/slo.md): files/slo/slo_rules.yaml (a copy
of glassbox/slo_rules.yaml) filled as core/slo.py fills it, so the chart and
`glassbox rules --slo` render the same rules (tests/chart/test_slo.py compares them).

Returns YAML: {groups: [...], notes: [...]}, a note for each latency threshold counted at
the nearest bucket boundary below it. What values.schema.json cannot say fails here,
naming the key: a threshold missing or given where it has no meaning, a name given twice,
a threshold below every boundary.
*/}}
{{- define "vllm-glassbox.sloRules" -}}
{{- $slo := .Values.prometheusRule.slo }}
{{- $text := .Files.Get "files/slo/slo_rules.yaml" }}
{{- $template := fromYaml $text }}
{{- $groupsText := regexFind "(?ms)^groups:\n.*" $text }}
{{- $units := dict "ms" "0.001" "s" "1" "m" "60" }}
{{- $groups := list }}
{{- $notes := list }}
{{- $names := list }}
{{- range $family, $boundaries := $slo.buckets }}
{{- $previous := 0.0 }}
{{- range $boundaries }}
{{- if le (float64 .) $previous }}
{{- fail (printf "prometheusRule.slo.buckets.%s: must rise, each boundary once (as vLLM requires), not %v" $family $boundaries) }}
{{- end }}
{{- $previous = float64 . }}
{{- end }}
{{- end }}
{{- range $i, $o := $slo.objectives }}
{{- $where := printf "prometheusRule.slo.objectives[%d]" $i }}
{{- if has $o.name $names }}
{{- fail (printf "%s.name: %q is the name of an earlier objective" $where $o.name) }}
{{- end }}
{{- $names = append $names $o.name }}
{{- $histogram := get $template.histograms $o.sli }}
{{- $le := "" }}
{{- $family := "" }}
{{- if $histogram }}
{{- if not (hasKey $o "threshold") }}
{{- fail (printf "%s.threshold: required for a latency objective (%s)" $where $o.sli) }}
{{- end }}
{{- $seconds := 0.0 }}
{{- if kindIs "string" $o.threshold }}
{{- $number := regexFind "^[0-9]+(\\.[0-9]+)?" $o.threshold | float64 }}
{{- $seconds = mulf $number (get $units (regexFind "(ms|s|m)$" $o.threshold) | float64) }}
{{- else }}
{{- $seconds = float64 $o.threshold }}
{{- end }}
{{- $boundaries := get (default dict $slo.buckets) $histogram.family | default $histogram.buckets }}
{{- $chosen := -1.0 }}
{{- range $boundaries }}
{{- if le (float64 .) $seconds }}
{{- $chosen = float64 . }}
{{- end }}
{{- end }}
{{- if lt $chosen 0.0 }}
{{- fail (printf "%s.threshold: below vLLM's smallest %s boundary: no request can be counted within it" $where $histogram.family) }}
{{- end }}
{{- $le = printf "%v" $chosen }}
{{- if not (or (contains "." $le) (contains "e" $le)) }}
{{- $le = printf "%s.0" $le }}
{{- end }}
{{- if ne $chosen $seconds }}
{{- $notes = append $notes (printf "%s: %s threshold %v s is not a bucket boundary; counted at le=%q, the nearest below" $o.name $o.sli $seconds $le) }}
{{- end }}
{{- $family = $histogram.name }}
{{- else if hasKey $o "threshold" }}
{{- fail (printf "%s.threshold: an errors objective has no threshold" $where) }}
{{- end }}
{{- $target := 0.0 }}
{{- if kindIs "string" $o.target }}
{{- $target = divf (trimSuffix "%" $o.target | float64) 100 }}
{{- else }}
{{- $target = float64 $o.target }}
{{- end }}
{{- $selector := ternary (printf "model_name=\"%s\"" $o.model) "model_name=~\".+\"" (hasKey $o "model") }}
{{- if hasKey $o "namespace" }}
{{- $selector = printf "%s, namespace=\"%s\"" $selector $o.namespace }}
{{- end }}
{{- $simple := dict
  "@NAME@" $o.name
  "@SLI@" $o.sli
  "@TARGET@" (printf "%.10g" $target)
  "@BUDGET@" (printf "%.10g" (subf 1 $target))
  "@PERIOD@" (default "28d" $o.window)
  "@SELECTOR@" $selector
  "@FAMILY@" $family
  "@LE@" $le
  "@FAST_GONE@" (include "vllm-glassbox.sloBudgetLasts" (list $o 144))
  "@SLOW_GONE@" (include "vllm-glassbox.sloBudgetLasts" (list $o 60)) }}
{{- $latency := ternary "latency_native" "latency" (eq $.Values.prometheusRule.histograms "native") }}
{{- $snippets := get $template.sli (ternary "errors" $latency (eq $o.sli "errors")) }}
{{- $filled := dict }}
{{- range $key := list "requests" "errors" "missing_alert" "missing" "objective" }}
{{- $snippet := get $snippets $key }}
{{- range $placeholder, $value := $simple }}
{{- $snippet = replace $placeholder $value $snippet }}
{{- end }}
{{- $_ := set $filled (printf "@%s@" (upper $key)) (replace "\n" "\n          " $snippet) }}
{{- end }}
{{- $out := $groupsText }}
{{- range $placeholder, $value := $filled }}
{{- $out = replace $placeholder $value $out }}
{{- end }}
{{- range $placeholder, $value := $simple }}
{{- $out = replace $placeholder $value $out }}
{{- end }}
{{- range (fromYaml $out).groups }}
{{- $rules := list }}
{{- range .rules }}
{{- if trim (toString .expr) }}
{{- $rules = append $rules . }}
{{- end }}
{{- end }}
{{- $groups = append $groups (set . "rules" $rules) }}
{{- end }}
{{- end }}
{{- toYaml (dict "groups" $groups "notes" $notes) }}
{{- end }}

{{- /* How long an objective's whole budget lasts at a burn above a factor given in tenths
(144: the fast alert's 14.4×, 60: the slow one's 6×), as core/slo/rules.py's budget_lasts
says it: rounded up to a tenth of a day, to an hour below two days. */}}
{{- define "vllm-glassbox.sloBudgetLasts" -}}
{{- $days := trimSuffix "d" (default "28d" (index . 0).window) | atoi }}
{{- $factor := index . 1 }}
{{- $tenths := div (add (mul $days 100) (sub $factor 1)) $factor }}
{{- if lt $tenths 20 }}under {{ div (add (mul $days 240) (sub $factor 1)) $factor }} hours
{{- else if eq (mod $tenths 10) 0 }}under {{ div $tenths 10 }} days
{{- else }}under {{ div $tenths 10 }}.{{ mod $tenths 10 }} days
{{- end }}
{{- end }}
{{- /* The alert names the SLO rules can have (whether or not objectives are given). */}}
{{- define "vllm-glassbox.sloAlertNames" -}}
{{- $names := list }}
{{- range (.Files.Get "files/slo/slo_rules.yaml" | fromYaml).groups }}
{{- range .rules }}
{{- if .alert }}
{{- $names = append $names .alert }}
{{- end }}
{{- end }}
{{- end }}
{{- join "," $names }}
{{- end }}
