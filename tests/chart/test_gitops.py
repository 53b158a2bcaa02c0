"""The chart as GitOps and operator stacks use it, rendered by Helm's real engine: as a
subchart of an umbrella chart, under Argo CD's API detection, with the exporter's TLS and
basic auth on, images pinned, and vLLM's credentials from Secrets.

The umbrella chart is tests/fixtures/umbrella-chart/, with this chart vendored into its
charts/ as `helm dependency build` would (no helm binary here). The core objects are
checked against Kubernetes' schemas (kubernetes-validate, strict), the operator's objects
against its typed models. What runs for real (an exporter serving TLS, vLLM asking for
its key, the helm test's probe) is in tests/e2e/test_chart_secured.py.
"""

from __future__ import annotations

import functools
import re
import shutil
import textwrap
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.chart_render import (
    CHART,
    CI_DIR,
    KUBE_VERSIONS,
    REPO,
    HelmError,
    Rendered,
    check_core_objects,
    check_operator_objects,
    container_named,
    pod_specs,
    render,
)

UMBRELLA = REPO / "tests" / "fixtures" / "umbrella-chart"
SECURE = yaml.safe_load((CI_DIR / "secure-values.yaml").read_text())
EXPORTER_MODE = yaml.safe_load((CI_DIR / "exporter-values.yaml").read_text())
MONITORING = {"ServiceMonitor", "PodMonitor", "PrometheusRule"}

# What Argo CD passes as --api-versions: every group/version the cluster serves, sorted,
# and no kinds (argo-cd util/argo APIResourcesToStrings with includeKinds false, and
# whatever an Application lists in spec.source.helm.apiVersions; argoproj/argo-cd#6351).
# Here a Kubernetes 1.30 cluster with the Prometheus Operator's CRDs.
ARGOCD_API_VERSIONS = (
    "admissionregistration.k8s.io/v1",
    "apiextensions.k8s.io/v1",
    "apiregistration.k8s.io/v1",
    "apps/v1",
    "authentication.k8s.io/v1",
    "authorization.k8s.io/v1",
    "autoscaling/v1",
    "autoscaling/v2",
    "batch/v1",
    "certificates.k8s.io/v1",
    "coordination.k8s.io/v1",
    "discovery.k8s.io/v1",
    "events.k8s.io/v1",
    "flowcontrol.apiserver.k8s.io/v1",
    "flowcontrol.apiserver.k8s.io/v1beta3",
    "monitoring.coreos.com/v1",
    "monitoring.coreos.com/v1alpha1",
    "networking.k8s.io/v1",
    "node.k8s.io/v1",
    "policy/v1",
    "rbac.authorization.k8s.io/v1",
    "scheduling.k8s.io/v1",
    "storage.k8s.io/v1",
    "v1",
)


@functools.cache
def _secure() -> Rendered:
    """ci/secure-values.yaml rendered once (the tests only read it)."""
    return render(SECURE)


def _pod_spec(rendered: Rendered, kind: str, component: str) -> dict[str, Any]:
    [manifest] = [
        m for m in rendered.of_kind(kind)
        if (m["metadata"]["labels"].get("app.kubernetes.io/component") == component)
    ]  # fmt: skip
    [spec] = pod_specs(manifest)
    return spec


# -- an umbrella chart ------------------------------------------------------------------


@pytest.fixture(scope="module")
def umbrella(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The fixture's umbrella chart with this chart vendored in charts/."""
    root = tmp_path_factory.mktemp("umbrella") / "inference-platform"
    shutil.copytree(UMBRELLA, root)
    shutil.copytree(CHART, root / "charts" / "vllm-glassbox")
    return root


def _umbrella_values(**glassbox: Any) -> dict[str, Any]:
    values: dict[str, Any] = yaml.safe_load((UMBRELLA / "values.yaml").read_text())
    values["vllm-glassbox"] |= glassbox
    return values


@pytest.mark.slow
@pytest.mark.parametrize("kube", KUBE_VERSIONS)
def test_the_chart_renders_as_a_subchart_with_globals_and_valid_objects(
    umbrella: Path, kube: str
) -> None:
    rendered = render(_umbrella_values(), chart_dir=umbrella, name="platform", kube_version=kube)
    assert rendered.one("ConfigMap", "platform-platform")["data"] == {"storageClass": "fast-ssd"}
    deployment = rendered.one("Deployment", "platform-vllm-glassbox")
    spec = deployment["spec"]["template"]["spec"]
    # global.imageRegistry reaches every image; the umbrella's values reach the subchart.
    mirror = "registry.example.com/mirror"
    assert container_named(spec, "vllm")["image"] == f"{mirror}/vllm/vllm-openai:v0.32.0"
    assert container_named(spec, "glassbox")["image"] == f"{mirror}/vllm-glassbox:0.1.0"
    assert container_named(spec, "vllm")["args"][0] == "Qwen/Qwen2.5-7B-Instruct-AWQ"
    [monitor, _] = rendered.of_kind("ServiceMonitor")
    assert monitor["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    assert {"PrometheusRule", "Pod"} <= set(rendered.kinds())
    check_core_objects(rendered.manifests, kube)
    check_operator_objects(rendered.manifests)


def test_the_umbrellas_condition_and_the_charts_own_switch_turn_it_off(umbrella: Path) -> None:
    off = render(_umbrella_values(enabled=False), chart_dir=umbrella, name="platform")
    assert off.kinds() == ["ConfigMap"]  # the umbrella's own object only
    # Installed on its own, enabled: false renders nothing either, and says so.
    alone = render({"enabled": False})
    assert alone.manifests == []
    assert "vllm-glassbox is off (enabled: false): nothing was rendered" in alone.notes


def test_the_subcharts_values_stay_strict_under_an_umbrella(umbrella: Path) -> None:
    with pytest.raises(HelmError, match="additional properties 'modle' not allowed"):
        render(_umbrella_values(vllm={"modle": "x"}), chart_dir=umbrella, name="platform")
    with pytest.raises(HelmError, match="at '/global/imageRegistry': got number, want string"):
        render({"global": {"imageRegistry": 5}})


# -- API detection as Argo CD passes it ---------------------------------------------------


def test_argo_cds_api_versions_list_renders_the_monitors_and_rules_with_auto() -> None:
    rendered = render(api_versions=ARGOCD_API_VERSIONS)
    assert set(rendered.kinds()) & MONITORING == {"ServiceMonitor", "PrometheusRule"}
    assert 'ServiceMonitor demo-vllm-glassbox-glassbox: job "demo-vllm-glassbox-glassbox"' in (
        rendered.notes
    )
    assert "PrometheusRule demo-vllm-glassbox: the recording rules" in rendered.notes
    pods = render({"podMonitor": {"enabled": "auto"}, "serviceMonitor": {"enabled": False}},
                  api_versions=ARGOCD_API_VERSIONS)  # fmt: skip
    assert set(pods.kinds()) & MONITORING == {"PodMonitor", "PrometheusRule"}


def test_a_list_that_names_kinds_is_trusted_for_each_kind() -> None:
    # Helm's own discovery lists group/versions and kinds: a CRD that is absent is absent.
    monitors_only = ("monitoring.coreos.com/v1", "monitoring.coreos.com/v1/ServiceMonitor")
    rendered = render(api_versions=monitors_only)
    assert set(rendered.kinds()) & MONITORING == {"ServiceMonitor"}
    assert "No PrometheusRule rendered: prometheusRule.enabled is auto" in rendered.notes
    # `helm template --api-versions monitoring.coreos.com/v1/PrometheusRule` alone.
    rules_only = render(api_versions=("monitoring.coreos.com/v1/PrometheusRule",))
    assert set(rules_only.kinds()) & MONITORING == {"PrometheusRule"}


def test_notes_say_why_a_monitor_or_rule_is_absent() -> None:
    undetected = render(api_versions=tuple(a for a in ARGOCD_API_VERSIONS if "coreos" not in a))
    assert set(undetected.kinds()) & MONITORING == set()
    notes = " ".join(undetected.notes.split())
    assert (
        "No ServiceMonitor/PodMonitor rendered: serviceMonitor.enabled is auto, and Helm was "
        "not told that the cluster serves ServiceMonitor of monitoring.coreos.com/v1 (with "
        "helm template or GitOps: --api-versions monitoring.coreos.com/v1, or "
        "serviceMonitor.enabled: true)"
    ) in notes
    assert "No PrometheusRule rendered: prometheusRule.enabled is auto" in notes
    off = render({"serviceMonitor": {"enabled": False}, "prometheusRule": {"enabled": False}})
    notes = " ".join(off.notes.split())
    assert "No ServiceMonitor/PodMonitor rendered: serviceMonitor.enabled is false." in notes
    assert "No PrometheusRule rendered: prometheusRule.enabled is false." in notes


# -- images, scheduling ---------------------------------------------------------------------


def test_images_take_a_registry_and_a_digest_and_the_digest_replaces_the_tag() -> None:
    rendered = _secure()
    spec = _pod_spec(rendered, "Deployment", "vllm")
    digest = SECURE["image"]["digest"]
    assert container_named(spec, "glassbox")["image"] == (
        f"registry.example.com/mirror/vllm-glassbox@{digest}"
    )
    assert container_named(spec, "vllm")["image"] == (
        f"registry.example.com/mirror/vllm/vllm-openai@{SECURE['vllm']['image']['digest']}"
    )
    [test_pod] = rendered.of_kind("Pod")
    assert test_pod["spec"]["containers"][0]["image"] == container_named(spec, "glassbox")["image"]
    # The image's own registry wins over the global one; a tag without a digest stays.
    lab = render({"global": {"imageRegistry": "mirror.local"},
                  "lab": {"enabled": True, "runId": "r1", "plan": {"phases": [{}]},
                          "image": {"registry": "lab.local:5000"}}})  # fmt: skip
    [job] = lab.of_kind("Job")
    assert job["spec"]["template"]["spec"]["containers"][0]["image"] == (
        "lab.local:5000/vllm-glassbox:0.1.0-lab"
    )
    with pytest.raises(HelmError, match="at '/image/digest'"):
        render({"image": {"digest": "latest"}})


def test_runtime_class_and_topology_spread_reach_the_pods() -> None:
    spec = _pod_spec(_secure(), "Deployment", "vllm")
    assert spec["runtimeClassName"] == "nvidia"
    assert spec["topologySpreadConstraints"] == SECURE["vllm"]["topologySpreadConstraints"]
    spread = [{"maxSkew": 1, "topologyKey": "kubernetes.io/hostname",
               "whenUnsatisfiable": "DoNotSchedule", "labelSelector": {"matchLabels": {
                   "app.kubernetes.io/component": "exporter"}}}]  # fmt: skip
    values = {**EXPORTER_MODE, "exporter": {**EXPORTER_MODE["exporter"],
              "topologySpreadConstraints": spread, "runtimeClassName": "gvisor"}}  # fmt: skip
    for deployment in render(values).of_kind("Deployment"):
        [spec] = pod_specs(deployment)
        assert spec["topologySpreadConstraints"] == spread
        assert spec["runtimeClassName"] == "gvisor"
    assert "runtimeClassName" not in _pod_spec(render(), "Deployment", "vllm")


# -- vLLM's API key and the Hugging Face token ----------------------------------------------


def _env(container: dict[str, Any]) -> dict[str, Any]:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in container["env"]}


def _secret_files(spec: dict[str, Any], container: dict[str, Any]) -> dict[str, tuple[str, str]]:
    """The files a container sees from Secrets: path -> (Secret, key)."""
    volumes = {v["name"]: v for v in spec.get("volumes", [])}
    files = {}
    for mount in container.get("volumeMounts", []):
        secret = volumes[mount["name"]].get("secret")
        if secret is None:
            continue
        assert mount["readOnly"] is True
        for item in secret.get("items", []):
            files[f"{mount['mountPath']}/{item['path']}"] = (secret["secretName"], item["key"])
    return files


def test_vllm_reads_its_api_key_and_hf_token_from_secrets_never_from_a_flag() -> None:
    rendered = _secure()
    spec = _pod_spec(rendered, "Deployment", "vllm")
    vllm = container_named(spec, "vllm")
    env = _env(vllm)
    assert env["VLLM_API_KEY"] == {"secretKeyRef": {"name": "vllm-api-key", "key": "api-key"}}
    assert env["HF_TOKEN"] == {"secretKeyRef": {"name": "hf-token", "key": "token"}}
    assert not any("api-key" in a or "token" in a for a in vllm["args"])
    assert "VLLM_API_KEY" not in _env(
        container_named(_pod_spec(render(), "Deployment", "vllm"), "vllm")
    )
    with pytest.raises(HelmError, match=r"vllm\.args\.api-key: a flag's value shows in the pod"):
        render({"vllm": {"args": {"api-key": "s3cret"}}})


def test_the_exporter_the_helm_test_and_the_lab_send_vllms_api_key() -> None:
    rendered = _secure()
    spec = _pod_spec(rendered, "Deployment", "vllm")
    exporter = container_named(spec, "glassbox")
    files = _secret_files(spec, exporter)
    [token_arg] = [a for a in exporter["args"] if a.startswith("--target-bearer-token-file=")]
    assert files[token_arg.split("=", 1)[1]] == ("vllm-api-key", "api-key")
    [pod] = rendered.of_kind("Pod")
    [key_arg] = [a for a in pod["spec"]["containers"][0]["args"] if "--vllm-api-key-file" in a]
    assert _secret_files(pod["spec"], pod["spec"]["containers"][0])[key_arg.split("=", 1)[1]] == (
        "vllm-api-key", "api-key",
    )  # fmt: skip
    lab = render(yaml.safe_load((CI_DIR / "lab-values.yaml").read_text()))
    [job] = lab.of_kind("Job")
    spec = job["spec"]["template"]["spec"]
    key_file = _env(spec["containers"][0])["VLLM_API_KEY_FILE"]
    assert _secret_files(spec, spec["containers"][0])[key_file] == ("vllm-api-key", "api-key")


def test_in_exporter_mode_each_target_has_its_own_token() -> None:
    targets = [{**EXPORTER_MODE["exporter"]["targets"][0], "apiKey": {"existingSecret": "a-key",
                "key": "token"}}, EXPORTER_MODE["exporter"]["targets"][1]]  # fmt: skip
    rendered = render({**EXPORTER_MODE, "exporter": {**EXPORTER_MODE["exporter"],
                                                     "targets": targets}})  # fmt: skip
    a, b = sorted(rendered.of_kind("Deployment"), key=lambda d: d["metadata"]["name"])
    [spec_a], [spec_b] = pod_specs(a), pod_specs(b)
    args_a = container_named(spec_a, "glassbox")["args"]
    assert "--target-bearer-token-file=/etc/glassbox/vllm-api-key/token" in args_a
    assert _secret_files(spec_a, container_named(spec_a, "glassbox")) == {
        "/etc/glassbox/vllm-api-key/token": ("a-key", "token")
    }
    assert not any("bearer" in arg for arg in container_named(spec_b, "glassbox")["args"])
    assert "volumes" not in spec_b


# -- the exporter's TLS and basic auth ------------------------------------------------------


def test_the_exporter_serves_the_web_config_the_chart_writes_and_mounts_only_its_keys() -> None:
    rendered = _secure()
    spec = _pod_spec(rendered, "Deployment", "vllm")
    exporter = container_named(spec, "glassbox")
    secret = rendered.one("Secret", "demo-vllm-glassbox-glassbox-web")
    config = yaml.safe_load(secret["stringData"]["web-config.yml"])
    assert config == {
        "tls_server_config": {"cert_file": "/etc/glassbox/tls/tls.crt",
                              "key_file": "/etc/glassbox/tls/tls.key"},
        "basic_auth_users": SECURE["exporter"]["basicAuth"]["users"],
    }  # fmt: skip
    assert "--web-config-file=/etc/glassbox/web/web-config.yml" in exporter["args"]
    files = _secret_files(spec, exporter)
    assert files["/etc/glassbox/tls/tls.crt"] == ("glassbox-exporter-tls", "tls.crt")
    assert files["/etc/glassbox/tls/tls.key"] == ("glassbox-exporter-tls", "tls.key")
    web = next(v for v in spec["volumes"] if v["name"] == "web-config")
    assert web["secret"] == {"secretName": "demo-vllm-glassbox-glassbox-web"}
    for probe in ("livenessProbe", "readinessProbe"):
        assert exporter[probe]["httpGet"] == {"path": "/healthz", "port": "glassbox",
                                              "scheme": "HTTPS"}  # fmt: skip
    # vLLM's container holds none of the exporter's files.
    assert _secret_files(spec, container_named(spec, "vllm")) == {}


@pytest.mark.parametrize("monitor", ["serviceMonitor", "podMonitor"])
def test_the_monitors_scrape_the_exporter_over_tls_with_basic_auth(monitor: str) -> None:
    values = {**SECURE, "serviceMonitor": {"enabled": monitor == "serviceMonitor"},
              "podMonitor": {"enabled": monitor == "podMonitor"}}  # fmt: skip
    rendered = render(values)
    kind = monitor[0].upper() + monitor[1:]
    exporter_monitor = rendered.one(kind, "demo-vllm-glassbox-glassbox")
    key = "endpoints" if kind == "ServiceMonitor" else "podMetricsEndpoints"
    [endpoint] = exporter_monitor["spec"][key]
    assert endpoint["scheme"] == "https"
    assert endpoint["tlsConfig"] == {
        "ca": {"secret": {"name": "glassbox-exporter-tls", "key": "ca.crt"}},
        "serverName": "demo-vllm-glassbox-glassbox.llm.svc",
    }
    assert endpoint["basicAuth"] == {
        "username": {"name": "glassbox-scrape", "key": "username"},
        "password": {"name": "glassbox-scrape", "key": "password"},
    }
    # vLLM's own /metrics is not the exporter's: plain http, no credentials.
    [vllm_endpoint] = rendered.one(kind, "demo-vllm-glassbox-vllm")["spec"][key]
    assert not {"scheme", "tlsConfig", "basicAuth"} & set(vllm_endpoint)


def test_exporter_mode_without_targets_is_refused_with_the_reason_even_with_tls() -> None:
    values = {"mode": "exporter", "exporter": {"tls": {"enabled": True, "secretName": "t"}}}
    with pytest.raises(HelmError, match=r"exporter\.targets: mode exporter needs at least one"):
        render(values)


@pytest.mark.slow
@pytest.mark.parametrize("variant", ["serviceMonitor", "podMonitor", "exporter mode"])
def test_the_locked_down_objects_are_valid_kubernetes_and_operator_objects(variant: str) -> None:
    values: dict[str, Any] = {**SECURE, "serviceMonitor": {"enabled": variant != "podMonitor"},
                              "podMonitor": {"enabled": variant == "podMonitor"}}  # fmt: skip
    if variant == "exporter mode":
        secured = {k: SECURE["exporter"][k] for k in ("tls", "basicAuth")}
        values = {**EXPORTER_MODE, "exporter": {**EXPORTER_MODE["exporter"], **secured}}
    rendered = render(values)
    for kube in KUBE_VERSIONS:
        check_core_objects(rendered.manifests, kube)
    check_operator_objects(rendered.manifests)


def test_the_monitors_tls_config_is_merged_over_the_default() -> None:
    values = {
        **SECURE,
        "serviceMonitor": {
            "enabled": True,
            "tlsConfig": {
                "serverName": "glassbox.example.com",
                "ca": {"configMap": {"name": "ca", "key": "ca"}},
            },
        },
    }
    rendered = render(values)
    [endpoint] = rendered.one("ServiceMonitor", "demo-vllm-glassbox-glassbox")["spec"]["endpoints"]
    assert endpoint["tlsConfig"]["serverName"] == "glassbox.example.com"
    assert endpoint["tlsConfig"]["ca"]["configMap"] == {"name": "ca", "key": "ca"}


def test_the_helm_test_trusts_the_ca_and_holds_no_private_key() -> None:
    rendered = _secure()
    [pod] = rendered.of_kind("Pod")
    probe = pod["spec"]["containers"][0]
    assert probe["args"][0] == "--exporter=https://demo-vllm-glassbox-glassbox.llm.svc:9400"
    files = _secret_files(pod["spec"], probe)
    assert files == {
        "/etc/glassbox/vllm-api-key/token": ("vllm-api-key", "api-key"),
        "/etc/glassbox/tls/ca.crt": ("glassbox-exporter-tls", "ca.crt"),
        "/etc/glassbox/basic-auth/username": ("glassbox-scrape", "username"),
        "/etc/glassbox/basic-auth/password": ("glassbox-scrape", "password"),
    }
    flags = dict(a.split("=", 1) for a in probe["args"] if not a.startswith("--exporter"))
    assert {v for k, v in flags.items() if k.endswith("-file")} <= set(files)


def test_exporter_mode_with_tls_names_every_targets_service() -> None:
    values = {**EXPORTER_MODE, "exporter": {**EXPORTER_MODE["exporter"],
              "tls": {"enabled": True, "secretName": "tls"}}}  # fmt: skip
    rendered = render(values)
    [endpoint] = rendered.one("ServiceMonitor")["spec"]["endpoints"]
    assert endpoint["tlsConfig"]["serverName"] == "demo-vllm-glassbox-glassbox-qwen-a.llm.svc"
    notes = " ".join(rendered.notes.split())
    assert (
        "its certificate must name demo-vllm-glassbox-glassbox-qwen-a.llm.svc "
        "demo-vllm-glassbox-glassbox-qwen-b.llm.svc"
    ) in notes
    [pod] = rendered.of_kind("Pod")
    assert [a for a in pod["spec"]["containers"][0]["args"] if a.startswith("--exporter")] == [
        "--exporter=https://demo-vllm-glassbox-glassbox-qwen-a.llm.svc:9400",
        "--exporter=https://demo-vllm-glassbox-glassbox-qwen-b.llm.svc:9400",
    ]
    assert "Secret" in rendered.kinds()  # the web-config, no basic auth


def test_a_web_config_secret_of_your_own_replaces_the_charts() -> None:
    values = {
        "exporter": {"webConfigSecret": "my-web", "basicAuth": {"enabled": True, "secretName": "s"}}
    }
    rendered = render(values)
    assert "Secret" not in rendered.kinds()
    spec = _pod_spec(rendered, "Deployment", "vllm")
    web = next(v for v in spec["volumes"] if v["name"] == "web-config")
    assert web["secret"] == {"secretName": "my-web"}  # whole: its relative paths resolve


@pytest.mark.parametrize(
    ("exporter", "message"),
    [
        ({"tls": {"enabled": True}}, "exporter.tls.secretName: exporter.tls.enabled needs"),
        ({"tls": {"secretName": "t"}}, "exporter.tls.secretName is set but exporter.tls.enabled"),
        ({"basicAuth": {"enabled": True, "secretName": "s"}},
         "exporter.basicAuth.users: exporter.basicAuth.enabled needs at least one user"),
        ({"basicAuth": {"users": {"u": "$2b$10$" + "a" * 53}}},
         "exporter.basicAuth.users is set but exporter.basicAuth.enabled is false"),
        ({"basicAuth": {"enabled": True, "users": {"u": "$2b$10$" + "a" * 53}}},
         "exporter.basicAuth.secretName: the monitors and the helm test need"),
        ({"webConfigSecret": "w"}, "exporter.webConfigSecret: say what it asks of clients"),
    ],
)  # fmt: skip
def test_tls_and_basic_auth_values_that_cannot_work_are_refused(
    exporter: dict[str, Any], message: str
) -> None:
    with pytest.raises(HelmError, match=message):
        render({"exporter": exporter})


def test_a_plain_password_is_refused_where_a_bcrypt_hash_belongs() -> None:
    values = {"exporter": {"basicAuth": {"enabled": True, "secretName": "s",
                                         "users": {"prometheus": "hunter2"}}}}  # fmt: skip
    with pytest.raises(HelmError) as refused:
        render(values)
    assert "exporter.basicAuth.users.prometheus: not a bcrypt hash" in str(refused.value)
    assert "hunter2" not in str(refused.value)


# -- docs/helm.md: what it shows renders as it says ---------------------------------------

DOC = REPO / "docs" / "helm.md"


def _doc_yaml(containing: str) -> dict[str, Any]:
    blocks = re.findall(r"```yaml\n(.*?)```", DOC.read_text(), flags=re.S)
    [block] = [textwrap.dedent(b) for b in blocks if containing in b]
    loaded: dict[str, Any] = yaml.safe_load(block)
    return loaded


def test_the_documented_argo_cd_application_renders_monitors_and_rules() -> None:
    helm = _doc_yaml("kind: Application")["spec"]["source"]["helm"]
    rendered = render(helm["valuesObject"], name=helm["releaseName"], namespace="llm",
                      api_versions=tuple(helm["apiVersions"]),
                      kube_version=helm["kubeVersion"])  # fmt: skip
    assert set(rendered.kinds()) & MONITORING == {"ServiceMonitor", "PrometheusRule"}
    for monitor in rendered.of_kind("ServiceMonitor"):
        assert monitor["metadata"]["labels"]["release"] == "kube-prometheus-stack"


def test_the_documented_flux_release_renders() -> None:
    values = _doc_yaml("kind: HelmRelease")["spec"]["values"]
    assert render(values, name="llm").one("Deployment")["metadata"]["name"] == ("llm-vllm-glassbox")


def test_the_documented_umbrella_is_the_fixtures(umbrella: Path) -> None:
    documented = _doc_yaml("condition: vllm-glassbox.enabled")["dependencies"]
    fixture = yaml.safe_load((UMBRELLA / "Chart.yaml").read_text())["dependencies"]
    same = ("name", "version", "condition")
    assert [{k: d[k] for k in same} for d in documented] == [
        {k: d[k] for k in same} for d in fixture
    ]
    values = _doc_yaml("vllm-glassbox:\n  enabled: true")
    rendered = render(values, chart_dir=umbrella, name="llm")
    assert rendered.one("Deployment")["metadata"]["name"] == "llm-vllm-glassbox"


def test_the_documented_tls_values_render_and_the_certificate_names_the_service() -> None:
    values = _doc_yaml("secretName: glassbox-scrape")
    rendered = render(values, name="llm", namespace="llm")
    certificate = _doc_yaml("kind: Certificate")["spec"]
    assert certificate["secretName"] == values["exporter"]["tls"]["secretName"]
    [endpoint] = rendered.one("ServiceMonitor", "llm-vllm-glassbox-glassbox")["spec"]["endpoints"]
    assert certificate["dnsNames"] == [endpoint["tlsConfig"]["serverName"]]
    assert f"its certificate must name {certificate['dnsNames'][0]}" in rendered.notes
