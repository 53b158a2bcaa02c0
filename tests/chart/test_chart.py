"""The Helm chart, rendered by Helm's real engine, against what Kubernetes, the Prometheus
Operator, promtool, the lab and the exporter expect of it.

What cannot run here: a Kubernetes API server (admission, defaulting, controllers). The
rendered objects are checked against the API's published schemas (kubernetes-validate,
strict), the operator's types (cloudcoil models), promtool, the lab's own plan loader and
Kubernetes backend (through the API double of tests/k8s_double.py), and the Pod Security
"restricted" rules written out in tests/pod_security.py. The image test
(tests/e2e/test_image.py) runs the rendered sidecar for real.
"""

from __future__ import annotations

import base64
import copy
import gzip
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from vllm_glassbox.lab.backends.kubernetes import Timeouts
from vllm_glassbox.lab.plan import load_plan
from vllm_glassbox.probe import exporter_problem

from tests.chart_render import (
    CHART,
    CI_DIR,
    KUBE_VERSIONS,
    REPO,
    HelmError,
    Rendered,
    check_core_objects,
    check_operator_objects,
    ci_values,
    container_named,
    containers,
    pod_specs,
    render,
    version_tuple,
)
from tests.pod_security import restricted_violations

CI = ci_values()
CASES = [(name, kube) for name in CI for kube in KUBE_VERSIONS]
_renders: dict[tuple[str, str], Rendered] = {}


def rendered_ci(name: str, kube: str) -> Rendered:
    if (name, kube) not in _renders:
        _renders[name, kube] = render(CI[name][0], kube_version=kube)
    return _renders[name, kube]


def supported(name: str, kube: str) -> bool:
    return version_tuple(kube) >= version_tuple(CI[name][1])


def _supported_cases() -> list[tuple[str, str]]:
    return [(n, k) for n, k in CASES if supported(n, k)]


# -- rendering, lint, schema ---------------------------------------------------------


def test_there_is_a_ci_values_file_for_each_mode() -> None:
    modes = {values.get("mode", "sidecar") for values, _ in CI.values()}
    assert modes == {"sidecar", "exporter"}
    assert any(v.get("lab", {}).get("enabled") for v, _ in CI.values())
    assert any(v.get("vllm", {}).get("dra", {}).get("enabled") for v, _ in CI.values())
    assert any(v.get("exporter", {}).get("nativeSidecar") for v, _ in CI.values())


@pytest.mark.slow
@pytest.mark.parametrize(("name", "kube"), CASES)
def test_every_ci_values_file_renders_valid_objects_on_every_kubernetes_version(
    name: str, kube: str
) -> None:
    if not supported(name, kube):
        with pytest.raises(
            HelmError, match=rf"needs Kubernetes 1\.\d+ or later; this cluster is v{kube}"
        ):
            rendered_ci(name, kube)
        return
    rendered = rendered_ci(name, kube)
    assert rendered.manifests
    check_core_objects(rendered.manifests, kube)


@pytest.mark.parametrize("name", sorted(CI))
def test_strict_lint_passes_for_every_ci_values_file(name: str) -> None:
    import helm_python as helm

    values, oldest = CI[name]
    report = helm.lint(CHART, values, strict=True, kube_version=f"v{max(oldest, '1.30.0')}")
    assert report["errors"] == [] and report["messages"] == [], report


def test_the_default_values_render_and_lint() -> None:
    import helm_python as helm

    assert helm.lint(CHART, strict=True, kube_version="v1.25.0")["messages"] == []
    rendered = render(kube_version="1.25.0")
    assert {"Deployment", "Service", "ConfigMap", "ServiceAccount", "Pod"} <= set(rendered.kinds())


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"vllm": {"modle": "x"}}, "at '/vllm': additional properties 'modle' not allowed"),
        ({"servceMonitor": {}}, "additional properties 'servceMonitor' not allowed"),
        ({"vllm": {"port": "8000"}}, "at '/vllm/port': got string, want integer"),
        ({"exporter": {"interval": "5 seconds"}}, "at '/exporter/interval'"),
        ({"serviceMonitor": {"enabled": "yes"}}, "at '/serviceMonitor/enabled'"),
        (
            {"serviceMonitor": {"vllm": {"jobName": "vllm-glassbox"}}},
            "at '/serviceMonitor/vllm/jobName'",
        ),
        (
            {"vllm": {"args": {"--max-model-len": "1"}}},
            "'--max-model-len' does not match pattern '^[a-z0-9][a-z0-9-]*$'",
        ),
        ({"mode": "inject"}, "at '/mode'"),
        ({"lab": {"runId": "Run 1"}}, "at '/lab/runId'"),
    ],
)
def test_values_with_a_typo_or_a_wrong_type_are_refused(
    values: dict[str, Any], message: str
) -> None:
    with pytest.raises(HelmError) as raised:
        render(values)
    assert message in str(raised.value)


@pytest.mark.parametrize(
    ("values", "message"),
    [
        (
            {"vllm": {"startupProbe": {"failureThreshold": 200}}},
            r"vllm.startupProbe: its budget .* = 2000s\) exceeds "
            r"vllm.progressDeadlineSeconds \(1500\)",
        ),
        (
            {"vllm": {"progressDeadlineSeconds": 2000}},
            r"vllm.progressDeadlineSeconds \(2000\) exceeds lab.rolloutTimeoutSeconds \(1800\)",
        ),
        ({"vllm": {"args": {"port": 9}}}, "vllm.args.port: set vllm.port instead"),
        ({"serviceMonitor": {"relabelings": [{"targetLabel": "job", "replacement": "x"}]}},
         "serviceMonitor.relabelings: a relabeling may not set `job`"),
        ({"podMonitor": {"enabled": True}, "serviceMonitor": {"enabled": True}},
         "serviceMonitor and podMonitor are both on"),
        ({"mode": "exporter"}, "exporter.targets: mode exporter needs at least one vLLM server"),
        ({"mode": "exporter", "exporter": {"targets": [{"name": "a", "url": "http://a:1"}] * 2}},
         'the name "a" is used twice'),
        ({"lab": {"enabled": True, "plan": {"phases": [{"kind": "kv-pressure"}]}}},
         "lab.runId: set a run id"),
        ({"lab": {"enabled": True, "runId": "r1"}}, "lab.plan: give the plan's phases"),
        ({"prometheusRule": {"disabledAlerts": ["VLLMPreemptionStrom"]}},
         'no alert named "VLLMPreemptionStrom"'),
    ],
)  # fmt: skip
def test_values_that_break_a_cross_field_rule_are_refused_with_the_reason(
    values: dict[str, Any], message: str
) -> None:
    with pytest.raises(HelmError, match=message):
        render(values)


# -- the operator's objects, rules and dashboards ------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(CI))
def test_operator_objects_are_valid_typed_models_with_no_unknown_field(name: str) -> None:
    check_operator_objects(rendered_ci(name, "1.34.0").manifests)


def test_monitoring_objects_follow_auto_true_and_false() -> None:
    kinds = {"ServiceMonitor", "PodMonitor", "PrometheusRule"}
    with_crds = set(render().kinds()) & kinds
    without_crds = set(render(api_versions=()).kinds()) & kinds
    forced = set(render({"serviceMonitor": {"enabled": True}, "prometheusRule": {"enabled": True}},
                        api_versions=()).kinds()) & kinds  # fmt: skip
    off = set(render({"serviceMonitor": {"enabled": False}, "prometheusRule": {"enabled": False}})
              .kinds()) & kinds  # fmt: skip
    assert with_crds == {"ServiceMonitor", "PrometheusRule"}
    assert without_crds == set()
    assert forced == {"ServiceMonitor", "PrometheusRule"}
    assert off == set()
    # A PodMonitor that is on replaces the "auto" ServiceMonitor.
    assert set(render({"podMonitor": {"enabled": True}}).kinds()) & kinds == {
        "PodMonitor", "PrometheusRule",
    }  # fmt: skip


def _exporter_job(rendered: Rendered, namespace: str = "llm") -> list[str]:
    """The job names Prometheus gives the exporter's targets, by the operator's rules."""
    jobs = []
    for sm in rendered.of_kind("ServiceMonitor"):
        if sm["spec"]["endpoints"][0]["port"] != "glassbox":
            continue
        selector = sm["spec"]["selector"]["matchLabels"]
        for service in rendered.of_kind("Service"):
            if selector.items() <= service["metadata"]["labels"].items():
                jobs.append(service["metadata"]["name"])  # no jobLabel: the Service's name
    for pm in rendered.of_kind("PodMonitor"):
        if pm["spec"]["podMetricsEndpoints"][0]["port"] == "glassbox":
            jobs.append(f"{namespace}/{pm['metadata']['name']}")
    return jobs


def _vllm_jobs(rendered: Rendered) -> list[str]:
    jobs = []
    for monitor in [*rendered.of_kind("ServiceMonitor"), *rendered.of_kind("PodMonitor")]:
        endpoints = monitor["spec"].get("endpoints") or monitor["spec"]["podMetricsEndpoints"]
        if endpoints[0]["port"] == "http":
            relabel = [r for r in endpoints[0]["relabelings"] if r.get("targetLabel") == "job"]
            jobs.append(relabel[-1]["replacement"])
    return jobs


@pytest.mark.slow
@pytest.mark.parametrize(
    "release", ["demo", "glassbox", "vllm-glassbox", "x", "a-very-long-release-name-" + "x" * 28]
)
@pytest.mark.parametrize("monitor", ["serviceMonitor", "podMonitor"])
def test_the_exporters_job_contains_glassbox_and_vllms_does_not_for_any_release_name(
    release: str, monitor: str
) -> None:
    values = {"serviceMonitor": {"enabled": monitor == "serviceMonitor"},
              "podMonitor": {"enabled": monitor == "podMonitor"}}  # fmt: skip
    rendered = render(values, name=release)
    [job] = _exporter_job(rendered)
    assert "glassbox" in job
    assert _vllm_jobs(rendered) == ["vllm"]
    exporter_mode = render(
        {**yaml.safe_load((CI_DIR / "exporter-values.yaml").read_text()), **values}, name=release
    )
    jobs = _exporter_job(exporter_mode)
    assert len(jobs) == (2 if monitor == "serviceMonitor" else 1)
    assert all("glassbox" in j for j in jobs)
    for m in rendered.manifests + exporter_mode.manifests:
        if m["kind"] in ("Service", "Job"):  # DNS labels (a Job's name is a pod label)
            assert len(m["metadata"]["name"]) <= 63, m["metadata"]["name"]


def _rules_file_groups(path: Path) -> list[dict[str, Any]]:
    groups: list[dict[str, Any]] = yaml.safe_load(path.read_text())["groups"]
    return groups


def test_the_prometheus_rule_is_the_rule_files_with_the_knobs_applied(tmp_path: Path) -> None:
    rendered = rendered_ci("sidecar-values.yaml", "1.30.0")
    spec = rendered.one("PrometheusRule")["spec"]
    source = _rules_file_groups(REPO / "alerts/glassbox-rules.yaml") + _rules_file_groups(
        REPO / "alerts/glassbox-alerts.yaml"
    )
    want = [r for g in source for r in g["rules"] if r.get("alert") != "VLLMSpecDecodeBypassed"]
    got = [r for g in spec["groups"] for r in g["rules"]]
    assert [r.get("record") or r["alert"] for r in got] == [
        r.get("record") or r["alert"] for r in want
    ]
    for mine, theirs in zip(got, want, strict=True):
        assert mine["expr"] == theirs["expr"]  # verbatim: never passed through tpl
        if "alert" in mine:
            assert mine["labels"] == {**theirs["labels"], "team": "inference"}
            anchor = theirs["annotations"]["runbook_url"].split("#")[1]
            assert mine["annotations"]["runbook_url"] == (
                f"https://runbooks.example.com/vllm-glassbox#{anchor}"
            )
            assert mine["annotations"]["description"] == theirs["annotations"]["description"]
    assert "{{ $labels.instance }}" in json.dumps(spec)
    rules = tmp_path / "rules.yaml"
    rules.write_text(yaml.safe_dump(spec))
    check = subprocess.run(
        ["promtool", "check", "rules", str(rules)], capture_output=True, text=True
    )
    assert check.returncode == 0, check.stdout + check.stderr
    assert f"SUCCESS: {len(want)} rules found" in check.stdout


def test_dashboards_are_byte_equal_to_the_generated_json_and_small() -> None:
    rendered = rendered_ci("sidecar-values.yaml", "1.30.0")
    maps = [
        m for m in rendered.of_kind("ConfigMap") if "grafana_dashboard" in m["metadata"]["labels"]
    ]
    generated = {p.name: p.read_text() for p in (REPO / "dashboards/generated").glob("*.json")}
    assert {k: v for m in maps for k, v in m["data"].items()} == generated
    for m in maps:
        assert m["metadata"]["namespace"] == "monitoring"
        assert m["metadata"]["labels"]["grafana_dashboard"] == "1"
        assert m["metadata"]["annotations"] == {"grafana_folder": "vLLM"}
        size = len(json.dumps(m["data"]).encode())
        assert size < 256 * 1024, (m["metadata"]["name"], size)


def test_the_release_stays_well_under_the_secret_size_limit() -> None:
    """Helm keeps a release (chart files + manifest) gzipped and base64'd in a Secret,
    at most 1 MiB."""
    import helm_python as helm

    chart = helm.Chart.load(CHART)
    files = [f["data"] for f in chart.files] + [t["data"] for t in chart.templates]
    rendered = rendered_ci("lab-values.yaml", "1.30.0")
    release = json.dumps({"files": files, "manifest": rendered.text}).encode()
    stored = base64.b64encode(gzip.compress(release))
    assert len(stored) < 1024 * 1024, len(stored)


def test_chart_files_match_their_sources() -> None:
    check = subprocess.run(
        [sys.executable, str(REPO / "scripts/sync-chart-files.py"), "--check"],
        capture_output=True,
        text=True,
    )
    assert check.returncode == 0, check.stderr


def test_a_drifted_chart_file_is_named(tmp_path: Path) -> None:
    for folder in ("alerts", "dashboards/generated", "glassbox", "helm/vllm-glassbox/files"):
        (tmp_path / folder).parent.mkdir(parents=True, exist_ok=True)
        subprocess.run(["cp", "-r", str(REPO / folder), str(tmp_path / folder)], check=True)
    with open(tmp_path / "alerts/glassbox-alerts.yaml", "a") as f:
        f.write("# an edit\n")
    (tmp_path / "helm/vllm-glassbox/files/dashboards/stale.json").write_text("{}")
    check = subprocess.run(
        [
            sys.executable,
            str(REPO / "scripts/sync-chart-files.py"),
            "--check",
            "--repo",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
    )
    assert check.returncode == 1
    assert "files/rules/glassbox-alerts.yaml: differs from its source" in check.stderr
    assert "files/dashboards/stale.json: no source (stale)" in check.stderr
    fix = subprocess.run(
        [sys.executable, str(REPO / "scripts/sync-chart-files.py"), "--repo", str(tmp_path)],
        capture_output=True,
    )
    assert fix.returncode == 0
    copy_ = (tmp_path / "helm/vllm-glassbox/files/rules/glassbox-alerts.yaml").read_text()
    assert copy_.startswith(
        "# GENERATED by scripts/sync-chart-files.py from alerts/glassbox-alerts.yaml"
    )
    assert copy_.endswith("# an edit\n")


# -- the vLLM Deployment ---------------------------------------------------------------


def _deployment(rendered: Rendered) -> dict[str, Any]:
    [deployment] = [d for d in rendered.of_kind("Deployment") if d["metadata"]["labels"].get(
        "app.kubernetes.io/component") == "vllm"]  # fmt: skip
    return deployment


@pytest.mark.slow
@pytest.mark.parametrize(("name", "kube"), _supported_cases())
def test_every_pod_passes_pod_security_restricted_and_mounts_no_token_but_the_labs(
    name: str, kube: str
) -> None:
    for manifest in rendered_ci(name, kube).manifests:
        for spec in pod_specs(manifest):
            assert restricted_violations(spec) == [], manifest["metadata"]["name"]
            assert spec["enableServiceLinks"] is False
            is_lab = manifest["kind"] == "Job"
            assert spec["automountServiceAccountToken"] is is_lab, manifest["metadata"]["name"]
            for container in containers(spec):
                assert container["securityContext"]["readOnlyRootFilesystem"] is True
    for account in rendered_ci(name, kube).of_kind("ServiceAccount"):
        is_lab = account["metadata"]["name"].endswith("-lab")
        assert account["automountServiceAccountToken"] is is_lab


@pytest.mark.parametrize("name", [n for n in CI if CI[n][0].get("mode", "sidecar") == "sidecar"])
def test_the_vllm_deployment_is_recreated_and_its_probe_budgets_are_ordered(name: str) -> None:
    values = CI[name][0]
    deployment = _deployment(rendered_ci(name, "1.34.0"))
    assert deployment["spec"]["strategy"] == {"type": "Recreate"}
    assert "podDisruptionBudget" not in json.dumps(values)
    startup = container_named(deployment["spec"]["template"]["spec"], "vllm")["startupProbe"]
    budget = (
        startup.get("initialDelaySeconds", 0)
        + startup["periodSeconds"] * startup["failureThreshold"]
    )
    lab_timeout = values.get("lab", {}).get("rolloutTimeoutSeconds", Timeouts().rollout_seconds)
    assert budget <= deployment["spec"]["progressDeadlineSeconds"] <= lab_timeout


def test_no_pod_disruption_budget_by_default() -> None:
    assert "PodDisruptionBudget" not in render().kinds()
    assert "PodDisruptionBudget" in render({"podDisruptionBudget": {"enabled": True}}).kinds()


def test_the_lab_timeout_default_is_the_labs_own() -> None:
    chart_default = yaml.safe_load((CHART / "values.yaml").read_text())["lab"][
        "rolloutTimeoutSeconds"
    ]
    assert chart_default == Timeouts().rollout_seconds == 1800


def test_the_sidecar_reads_vllms_log_file_and_weights_read_only() -> None:
    rendered = rendered_ci("sidecar-values.yaml", "1.30.0")
    spec = _deployment(rendered)["spec"]["template"]["spec"]
    vllm, exporter = container_named(spec, "vllm"), container_named(spec, "glassbox")
    logging_map = rendered.one("ConfigMap", "demo-vllm-glassbox-vllm-logging")
    config = json.loads(logging_map["data"]["logging.json"])
    log_file = config["handlers"]["file"]["filename"]
    assert config["loggers"]["vllm"]["handlers"] == ["console", "file"]  # stdout stays
    env = {e["name"]: e["value"] for e in vllm["env"]}
    config_mount = next(m for m in vllm["volumeMounts"] if m["name"] == "vllm-logging")
    assert env["VLLM_LOGGING_CONFIG_PATH"] == config_mount["mountPath"] + "/logging.json"
    assert f"--vllm-log={log_file}" in exporter["args"]
    log_dir = str(Path(log_file).parent)
    assert {"name": "vllm-log", "mountPath": log_dir} in vllm["volumeMounts"]
    assert {"name": "vllm-log", "mountPath": log_dir, "readOnly": True} in exporter["volumeMounts"]
    for container in (vllm, exporter):
        assert {"name": "weights", "mountPath": "/models", "readOnly": True} in container[
            "volumeMounts"
        ]
    weights = next(v for v in spec["volumes"] if v["name"] == "weights")
    assert weights["persistentVolumeClaim"] == {"claimName": "models", "readOnly": True}
    assert "--model-dir=/models/Qwen2.5-7B-Instruct-AWQ" in exporter["args"]
    assert "--gpu=L40S" in exporter["args"]
    assert "--target=http://127.0.0.1:8000" in exporter["args"]


def test_shm_only_for_parallel_workers_and_dra_claims_the_gpu() -> None:
    tp = _deployment(rendered_ci("tensor-parallel-values.yaml", "1.30.0"))["spec"]["template"][
        "spec"
    ]
    assert {"name": "shm", "emptyDir": {"medium": "Memory", "sizeLimit": "16Gi"}} in tp["volumes"]
    plain = _deployment(render())["spec"]["template"]["spec"]
    assert all(v["name"] != "shm" for v in plain["volumes"])
    rendered = rendered_ci("dra-values.yaml", "1.34.0")
    spec = _deployment(rendered)["spec"]["template"]["spec"]
    template = rendered.one("ResourceClaimTemplate")
    assert spec["resourceClaims"] == [
        {"name": "gpu", "resourceClaimTemplateName": template["metadata"]["name"]}
    ]
    assert container_named(spec, "vllm")["resources"] == {"claims": [{"name": "gpu"}]}
    request = template["spec"]["spec"]["devices"]["requests"][0]["exactly"]
    assert request["deviceClassName"] == "gpu.nvidia.com" and request["count"] == 1


def test_the_native_sidecar_is_an_init_container_that_keeps_running() -> None:
    spec = _deployment(rendered_ci("native-sidecar-values.yaml", "1.29.0"))["spec"]["template"][
        "spec"
    ]
    assert [c["name"] for c in spec["initContainers"]] == ["glassbox"]
    assert spec["initContainers"][0]["restartPolicy"] == "Always"
    assert [c["name"] for c in spec["containers"]] == ["vllm"]
    assert spec["initContainers"][0]["args"][-1] == "--timeout=4s"


def test_exporter_mode_renders_one_exporter_per_target() -> None:
    rendered = rendered_ci("exporter-values.yaml", "1.30.0")
    deployments = {d["metadata"]["name"]: d for d in rendered.of_kind("Deployment")}
    assert sorted(deployments) == [
        "demo-vllm-glassbox-glassbox-qwen-a",
        "demo-vllm-glassbox-glassbox-qwen-b",
    ]
    b = deployments["demo-vllm-glassbox-glassbox-qwen-b"]
    assert b["spec"]["replicas"] == 1
    args = container_named(b["spec"]["template"]["spec"], "glassbox")["args"]
    assert args[0] == "--target=http://vllm-b.inference.svc:8000"
    assert "--gpu=A100-80GB" in args and "--weights-bytes=15.2e9" in args
    assert "--kv-link-bandwidth=50e9" in args
    assert not any(a.startswith("--vllm-log") for a in args)
    a = deployments["demo-vllm-glassbox-glassbox-qwen-a"]
    args_a = container_named(a["spec"]["template"]["spec"], "glassbox")["args"]
    assert not any(arg.startswith("--kv-link-bandwidth") for arg in args_a)


def _exporter_args(values: dict[str, Any]) -> list[str]:
    spec = _deployment(render(values))["spec"]["template"]["spec"]
    return list(container_named(spec, "glassbox")["args"])


@pytest.mark.parametrize(
    ("cost", "flags"),
    [
        ({}, []),
        ({"gpuHourPrice": 3.5}, ["--gpu-hour-price=3.5"]),
        ({"gpuHourPrice": 2}, ["--gpu-hour-price=2"]),
        ({"gpuHourPrice": "3.5/h"}, ["--gpu-hour-price=3.5/h"]),
        (
            {"gpuHourPrice": {"H200": 3.5, "A100": 1.8, "pool:spot": 1.2}, "nodePool": "spot"},
            ["--gpu-hour-price=A100=1.8,H200=3.5,pool:spot=1.2", "--node-pool=spot"],
        ),
    ],
)
def test_the_gpu_hour_price_reaches_the_exporter_as_its_flag(
    cost: dict[str, Any], flags: list[str]
) -> None:
    args = _exporter_args({"cost": cost, "exporter": {"gpu": "H200"}})
    assert [a for a in args if a.startswith(("--gpu-hour-price", "--node-pool"))] == flags


@pytest.mark.parametrize(
    ("price", "message"),
    [(-1, "gpuHourPrice"), ("3.5/min", "gpuHourPrice"), ("cheap", "gpuHourPrice"),
     ({"H200": -2}, "gpuHourPrice"), ({"H200": "per_second"}, "gpuHourPrice")],
)  # fmt: skip
def test_a_bad_gpu_hour_price_is_refused_by_the_schema(price: object, message: str) -> None:
    with pytest.raises(HelmError, match=message):
        render({"cost": {"gpuHourPrice": price}})


def test_prices_by_model_without_the_model_are_refused_with_the_reason() -> None:
    with pytest.raises(HelmError, match=r"set exporter\.gpu"):
        render({"cost": {"gpuHourPrice": {"H200": 3.5}}})


def test_the_network_policy_admits_prometheus_to_the_exporter_and_clients_to_vllm() -> None:
    rendered = rendered_ci("sidecar-values.yaml", "1.30.0")
    [policy] = rendered.of_kind("NetworkPolicy")
    by_port = {rule["ports"][0]["port"]: rule["from"] for rule in policy["spec"]["ingress"]}
    prometheus = yaml.safe_load((CHART / "values.yaml").read_text())["networkPolicy"]["prometheus"]
    test_pod = {"podSelector": {"matchLabels": {
        "app.kubernetes.io/name": "vllm-glassbox", "app.kubernetes.io/instance": "demo",
        "app.kubernetes.io/component": "test"}}}  # fmt: skip
    assert by_port["glassbox"] == [*prometheus, test_pod]
    gateway = {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "gateway"}}}
    assert gateway in by_port["http"] and prometheus[0] in by_port["http"]
    assert "NetworkPolicy" not in render().kinds()


# -- vLLM's args: the lab patches them by name -----------------------------------------


def _vllm_args(name: str) -> list[str]:
    spec = _deployment(rendered_ci(name, "1.34.0"))["spec"]["template"]["spec"]
    args: list[str] = container_named(spec, "vllm")["args"]
    return args


def _expected_flags(values: dict[str, Any]) -> dict[str, str | None]:
    """What each flag of vllm.args must read as: a value, None for a bare --flag."""
    flags: dict[str, str | None] = {}
    for key, value in (values.get("vllm", {}).get("args") or {}).items():
        if value is True:
            flags[f"--{key}"] = ""
        elif value is False:
            flags[f"--no-{key}"] = ""
        elif isinstance(value, dict):
            flags[f"--{key}"] = json.dumps(value, separators=(",", ":"), sort_keys=True)
        elif isinstance(value, list):
            flags[f"--{key}"] = " ".join(str(v) for v in value)
        elif value is not None:
            flags[f"--{key}"] = str(value)
    return flags


SIDECAR_CI = [n for n in CI if CI[n][0].get("mode", "sidecar") == "sidecar"]


@pytest.mark.parametrize("name", SIDECAR_CI)
def test_rendered_args_read_back_through_the_labs_parser(name: str) -> None:
    from vllm_glassbox.lab.backends.args import apply_overrides, flag_value

    args = _vllm_args(name)
    values = CI[name][0]
    model = values.get("vllm", {}).get("model", "Qwen/Qwen2.5-7B-Instruct")
    assert args[0] == model and flag_value(args, "--model") == model
    assert flag_value(args, "--port") == "8000"
    for flag, value in _expected_flags(values).items():
        read = flag_value(args, flag.replace("--no-", "--"))
        if flag.startswith("--no-"):
            assert f"--{flag[5:]}" not in args and flag in args
        elif value == "":
            assert read == "" or flag in args
        elif value.startswith("{"):
            assert json.loads(read or "") == json.loads(value)
        else:
            assert read == value, flag
    # Patching every flag to the value it has changes nothing: the lab sends no patch.
    # (A list-valued flag is left out: a patch gives a flag one value.)
    lists = {
        f"--{k}" for k, v in values.get("vllm", {}).get("args", {}).items() if isinstance(v, list)
    }
    same = {
        f: v
        for f, v in _expected_flags(values).items()
        if v and not f.startswith("--no-") and f not in lists
    }
    assert apply_overrides(args, same) == args


@pytest.mark.vllm
@pytest.mark.parametrize("name", SIDECAR_CI)
def test_rendered_args_parse_in_vllms_own_parser_as_the_values_say(name: str) -> None:
    cli_args = pytest.importorskip("vllm.entrypoints.launchers.cli_args")
    from vllm.utils.argparse_utils import FlexibleArgumentParser
    from vllm_glassbox.lab.backends.args import apply_overrides

    parser = cli_args.make_arg_parser(FlexibleArgumentParser())
    args = _vllm_args(name)
    parsed = vars(parser.parse_args(args))
    values = CI[name][0].get("vllm", {})
    assert parsed["model_tag"] == values.get("model", "Qwen/Qwen2.5-7B-Instruct")
    assert parsed["port"] == 8000
    for key, value in (values.get("args") or {}).items():
        # The value vLLM sees is the one the plain "--key value" form gives it.
        plain: list[str] = ["/m"]
        if value is True:
            plain.append(f"--{key}")
        elif value is False:
            plain.append(f"--no-{key}")
        elif isinstance(value, dict):
            plain += [f"--{key}", json.dumps(value)]
        elif isinstance(value, list):
            plain += [f"--{key}", *map(str, value)]
        else:
            plain += [f"--{key}", str(value)]
        dest = key.replace("-", "_")
        assert parsed[dest] == vars(parser.parse_args(plain))[dest], key
    # A phase's patch by flag name is seen by vLLM as exactly that change.
    patched = vars(parser.parse_args(apply_overrides(args, {"--gpu-memory-utilization": "0.2"})))
    changed = {k for k in parsed if parsed[k] != patched[k]}
    assert changed == {"gpu_memory_utilization"} and patched["gpu_memory_utilization"] == 0.2


# -- the lab Job -----------------------------------------------------------------------


def test_the_lab_job_runs_the_rendered_plan_against_the_rendered_deployment(tmp_path: Path) -> None:
    rendered = rendered_ci("lab-values.yaml", "1.30.0")
    deployment = _deployment(rendered)
    [job] = rendered.of_kind("Job")
    assert job["metadata"]["name"] == "demo-vllm-glassbox-lab-r1"
    assert job["spec"]["backoffLimit"] == 0
    assert "helm.sh/hook" not in job["metadata"].get("annotations", {})
    spec = job["spec"]["template"]["spec"]
    plan_map = rendered.one("ConfigMap", spec["volumes"][0]["configMap"]["name"])
    (tmp_path / "plan.yaml").write_text(plan_map["data"]["plan.yaml"])
    plan = load_plan(tmp_path / "plan.yaml")  # the lab's own loader: raises on a bad plan
    target = plan.kubernetes
    assert target is not None
    assert (target.namespace, target.deployment, target.container) == (
        "llm", deployment["metadata"]["name"], "vllm",
    )  # fmt: skip
    service = rendered.one("Service", deployment["metadata"]["name"])
    assert target.url == f"http://{service['metadata']['name']}.llm.svc:8000"
    assert target.rollout_timeout_seconds == 1800
    assert [p.kind for p in plan.phases] == ["quantization", "kv-pressure"]
    lab = container_named(spec, "lab")
    assert lab["command"][:4] == ["glassbox", "lab", "run", "/plan/plan.yaml"]
    assert lab["image"] == "vllm-glassbox:0.1.0-lab"
    account = spec["serviceAccountName"]
    [binding] = rendered.of_kind("RoleBinding")
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": account, "namespace": "llm"}]


def test_the_labs_role_allows_what_the_backend_does_on_the_rendered_deployment_only() -> None:
    from vllm_glassbox.lab.backends.backend import restoring

    from tests.k8s_double import FakeCluster
    from tests.k8s_lab import backend_for, not_allowed

    rendered = rendered_ci("lab-values.yaml", "1.30.0")
    deployment = _deployment(rendered)
    [role] = rendered.of_kind("Role")
    rules = role["rules"]
    assert "*" not in json.dumps(rules) and "secrets" not in json.dumps(rules)
    [deploy_rule] = [r for r in rules if "deployments" in r["resources"]]
    assert deploy_rule["resourceNames"] == [deployment["metadata"]["name"]]
    spec = deployment["spec"]["template"]["spec"]
    vllm = container_named(spec, "vllm")
    # The API double holds a Deployment shaped like the rendered one: its name, its
    # containers (the exporter first, vLLM's args as rendered; the tiny KV pool is the
    # only change, so the double's fake vLLM serves it).
    args = [*vllm["args"], "--kv-cache-memory-bytes=33554432"]
    with FakeCluster(args, namespace="llm", name=deployment["metadata"]["name"],
                     sidecars=["glassbox"], command=[]) as cluster:  # fmt: skip
        with restoring(backend_for(cluster)) as backend:
            backend.deploy({"--kv-cache-memory-bytes": "8388608"})
        assert cluster.current_args == args
    assert not_allowed(rules, cluster.requests) == []


# -- NOTES, the helm test, the exporter's imports, the probe ---------------------------


def test_notes_name_the_scrape_jobs_and_the_release_label_hint() -> None:
    notes = render().notes
    assert 'job "demo-vllm-glassbox-glassbox" (the exporter)' in notes
    assert 'job "vllm" (vLLM\'s own /metrics)' in notes
    assert "serviceMonitor.additionalLabels.release=<its release name>" in notes
    plain = render(api_versions=()).notes
    assert "No ServiceMonitor/PodMonitor rendered" in plain and "docs/helm.md" in plain


def test_the_helm_test_probes_every_exporter_through_its_service() -> None:
    [pod] = render().of_kind("Pod")
    assert pod["metadata"]["annotations"]["helm.sh/hook"] == "test"
    assert pod["spec"]["containers"][0]["command"] == ["glassbox", "probe"]
    assert pod["spec"]["containers"][0]["args"] == [
        "--exporter=http://demo-vllm-glassbox-glassbox.llm.svc:9400",
        "--vllm=http://demo-vllm-glassbox.llm.svc:8000",
    ]
    [pod] = rendered_ci("exporter-values.yaml", "1.30.0").of_kind("Pod")
    assert [a.split("//")[1].split(".")[0] for a in pod["spec"]["containers"][0]["args"]] == [
        "demo-vllm-glassbox-glassbox-qwen-a", "demo-vllm-glassbox-glassbox-qwen-b",
    ]  # fmt: skip


def test_glassbox_exporter_imports_none_of_the_lab_libraries() -> None:
    code = (
        "import sys\n"
        "from vllm_glassbox.cli import main\n"
        "try:\n    main(['exporter', '--help'])\nexcept SystemExit:\n    pass\n"
        "import vllm_glassbox.exporter.service, vllm_glassbox.probe\n"
        "heavy = ('matplotlib', 'numpy', 'kubernetes', 'grafanalib')\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in heavy))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip().splitlines()[-1] == "[]"


@pytest.mark.parametrize(
    ("page", "problem"),
    [
        ('glassbox_build_info{version="0.1.0"} 1.0\nglassbox_target_up 1.0\n', None),
        ('glassbox_build_info{version="0.1.0"} 1.0\nglassbox_target_up 0.0\n',
         "glassbox_target_up is 0: the exporter cannot read vLLM (its log says why)"),
        ("glassbox_target_up 1.0\n", "no glassbox_build_info: not a glassbox exporter"),
        ('glassbox_build_info{version="0.1.0"} 1.0\n', "no glassbox_target_up"),
    ],
)  # fmt: skip
def test_the_probe_names_what_is_wrong_with_an_exporter(page: str, problem: str | None) -> None:
    assert exporter_problem(page) == problem


def test_rendering_does_not_change_the_values_it_is_given() -> None:
    values = copy.deepcopy(CI["sidecar-values.yaml"][0])
    render(values)
    assert values == CI["sidecar-values.yaml"][0]
