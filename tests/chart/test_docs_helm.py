"""docs/helm.md against the chart: the plain-Prometheus scrape config is valid and keeps
the chart's Services, the sidecar patch is the chart's own container, the install
commands render."""

from __future__ import annotations

import json
import re
import shlex
import subprocess
from pathlib import Path
from typing import Any

import helm_python as helm
import yaml

from tests.chart_render import REPO, containers, render

DOC = REPO / "docs" / "helm.md"


def _blocks(language: str) -> list[str]:
    return re.findall(rf"```{language}\n(.*?)```", DOC.read_text(), flags=re.S)


def _yaml_block(containing: str) -> dict[str, Any]:
    [block] = [b for b in _blocks("yaml") if containing in b]
    loaded: dict[str, Any] = yaml.safe_load(block)
    return loaded


def _set_values(command: str) -> dict[str, Any]:
    """The values of a documented `helm install ... --set a=b` command."""
    words = shlex.split(command.replace("\\\n", " "))
    values: dict[str, Any] = {}
    for i, word in enumerate(words):
        if word == "--set":
            for key, value in helm.parse_set_string(words[i + 1]).items():
                values = _merge(values, {key: value})
        if word == "-f":
            values = _merge(values, yaml.safe_load((REPO / words[i + 1]).read_text()))
    return values


def _merge(a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
    out = dict(a)
    for key, value in b.items():
        out[key] = _merge(out[key], value) if isinstance(value, dict) and key in out else value
    return out


def test_the_plain_prometheus_config_is_valid_and_keeps_the_charts_services(
    tmp_path: Path,
) -> None:
    config = _yaml_block("scrape_configs")
    config["rule_files"] = [str(REPO / "alerts" / Path(f).name) for f in config["rule_files"]]
    # Debian's Prometheus is built without Kubernetes discovery, so promtool would refuse
    # the section it does not know: that part is checked here against Prometheus' docs
    # (role, namespaces.names), the rest (relabelling, rule files) by promtool.
    for job in config["scrape_configs"]:
        [sd] = job.pop("kubernetes_sd_configs")
        assert sd["role"] == "endpoints" and set(sd) == {"role", "namespaces"}
        assert isinstance(sd["namespaces"]["names"], list)
        job["static_configs"] = [{"targets": []}]
    (tmp_path / "prometheus.yml").write_text(yaml.safe_dump(config))
    check = subprocess.run(
        ["promtool", "check", "config", str(tmp_path / "prometheus.yml")],
        capture_output=True,
        text=True,
    )
    assert check.returncode == 0, check.stdout + check.stderr
    rendered = render(name="llm", namespace="llm", api_versions=())
    kept = {}
    for job in config["scrape_configs"]:
        keep = next(r for r in job["relabel_configs"] if r.get("action") == "keep")
        for service in rendered.of_kind("Service"):
            component = service["metadata"]["labels"]["app.kubernetes.io/component"]
            for port in service["spec"]["ports"]:
                if re.fullmatch(keep["regex"], f"{component};{port['name']}"):
                    kept[job["job_name"]] = service["metadata"]["name"]
    assert kept == {"glassbox": "llm-vllm-glassbox-glassbox", "vllm": "llm-vllm-glassbox"}


def test_the_sidecar_patch_is_the_charts_container_and_logging_config() -> None:
    patch = _yaml_block("strategic merge patch")
    documented = {c["name"]: c for c in patch["spec"]["template"]["spec"]["containers"]}
    rendered = render(
        {
            "fullnameOverride": "vllm",
            "vllm": {"model": "/models/Qwen2.5-7B-Instruct-AWQ"},
            "weights": {"existingClaim": "models"},
            "exporter": {"gpu": "L40S"},
        },
        name="vllm",
        namespace="vllm",
    )
    [deployment] = rendered.of_kind("Deployment")
    spec = deployment["spec"]["template"]["spec"]
    chart = {c["name"]: c for c in containers(spec)}
    assert documented["glassbox"] == chart["glassbox"]
    for item in documented["vllm"]["env"]:
        assert item in chart["vllm"]["env"]
    for mount in documented["vllm"]["volumeMounts"]:
        assert mount in chart["vllm"]["volumeMounts"]
    [logging_json] = _blocks("json")
    [config_map] = [m for m in rendered.of_kind("ConfigMap") if "logging.json" in m["data"]]
    assert json.loads(logging_json) == json.loads(config_map["data"]["logging.json"])


def test_the_documented_installs_render_what_the_doc_says() -> None:
    [kps, plain] = [b for b in _blocks("sh") if b.startswith("helm install")]
    rendered = render(_set_values(kps.split("\nkubectl")[0]), name="llm", namespace="llm")
    for monitor in rendered.of_kind("ServiceMonitor"):
        assert monitor["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    assert rendered.one("PrometheusRule")["metadata"]["labels"]["release"] == (
        "kube-prometheus-stack"
    )
    assert "deployment/llm-vllm-glassbox" in kps
    plain_render = render(_set_values(plain), name="llm", namespace="llm")
    assert not {"ServiceMonitor", "PrometheusRule"} & set(plain_render.kinds())
