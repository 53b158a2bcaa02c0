"""docs/getting-started.md against the chart and the command: its values files and
`helm install` lines render (the schema is strict, so every key exists), what it tells a
newcomer to run names objects the release has, and every glassbox flag it uses exists."""

from __future__ import annotations

import itertools
import re
import shlex
from pathlib import Path
from typing import Any

import pytest
import yaml
from vllm_glassbox import cli

from tests.chart_render import REPO, Rendered, containers, render

DOC = REPO / "docs" / "getting-started.md"


def _blocks(language: str) -> list[str]:
    return re.findall(rf"```{language}\n(.*?)```", DOC.read_text(), flags=re.S)


def _values_files() -> dict[str, dict[str, Any]]:
    """The doc's values files: each yaml block whose first line names its file."""
    files = {}
    for block in _blocks("yaml"):
        first = block.splitlines()[0]
        if m := re.fullmatch(r"# ([\w.-]+\.yaml)", first):
            files[m.group(1)] = yaml.safe_load(block)
    return files


def _commands() -> list[list[str]]:
    lines = "\n".join(_blocks("sh")).replace("\\\n", " ").splitlines()
    return [shlex.split(line.rstrip(" &")) for line in lines if line.strip()]


def _installs() -> list[tuple[str, str, dict[str, Any]]]:
    """(release, namespace, values) of each documented `helm install`."""
    files = _values_files()
    installs = []
    for words in _commands():
        if words[:2] != ["helm", "install"]:
            continue
        assert words[3] == "helm/vllm-glassbox", words
        values: dict[str, Any] = {}
        for flag, value in itertools.pairwise(words):
            if flag == "-f":
                values |= files[value]
            assert flag != "--set", "the doc's installs take values files"
        installs.append((words[2], words[words.index("-n") + 1], values))
    return installs


def _rendered(release: str) -> tuple[str, Rendered]:
    [(namespace, values)] = [(n, v) for r, n, v in _installs() if r == release]
    return namespace, render(values, name=release, namespace=namespace)


def test_the_doc_installs_both_ways_from_its_values_files() -> None:
    assert sorted(_values_files()) == ["exporter-values.yaml", "my-values.yaml"]
    assert [(r, n, v.get("mode", "sidecar")) for r, n, v in _installs()] == [
        ("llm", "llm", "sidecar"),
        ("glassbox", "inference", "exporter"),
    ]


def test_the_sidecar_install_renders_vllm_with_the_exporter_and_what_kps_selects() -> None:
    _, rendered = _rendered("llm")
    [deployment] = rendered.of_kind("Deployment")
    spec = deployment["spec"]["template"]["spec"]
    pod = {c["name"]: c for c in containers(spec)}
    assert set(pod) == {"vllm", "glassbox"}
    assert pod["glassbox"]["image"] == "registry.example.com/vllm-glassbox:0.1.0"
    args = pod["glassbox"]["args"]
    assert "--model-dir=/models/Qwen2.5-7B-Instruct-AWQ" in args and "--gpu=L40S" in args
    assert any(a.startswith("--vllm-log=") for a in args)
    selected = rendered.of_kind("ServiceMonitor") + rendered.of_kind("PrometheusRule")
    assert len(selected) == 3  # the exporter's monitor, vLLM's, the rules
    assert {o["metadata"]["labels"]["release"] for o in selected} == {"kube-prometheus-stack"}
    dashboards = [
        m
        for m in rendered.of_kind("ConfigMap")
        if "grafana_dashboard" in m["metadata"].get("labels", {})
    ]
    assert len(dashboards) == 7
    assert {m["metadata"]["namespace"] for m in dashboards} == {"monitoring"}
    exporter_monitor = rendered.one("ServiceMonitor", "llm-vllm-glassbox-glassbox")
    assert f"the exporter's is `{exporter_monitor['metadata']['name']}`" in DOC.read_text()


def test_the_exporter_install_renders_one_exporter_per_target_and_no_vllm() -> None:
    _, rendered = _rendered("glassbox")
    [deployment] = rendered.of_kind("Deployment")
    [container] = containers(deployment["spec"]["template"]["spec"])
    assert container["name"] == "glassbox"
    assert "--target=http://vllm-qwen.inference.svc:8000" in container["args"]
    assert "--gpu=H100-SXM" in container["args"]


def test_what_the_doc_runs_against_the_cluster_names_the_releases_objects() -> None:
    namespace, rendered = _rendered("llm")
    names = {(m["kind"], m["metadata"]["name"]) for m in rendered.manifests}
    named = []
    for words in _commands():
        if words[0] != "kubectl" or "-n" not in words or words[words.index("-n") + 1] != namespace:
            continue
        for word in words:
            if m := re.fullmatch(r"(svc|deploy|deployment)/([\w-]+)", word):
                kind = "Service" if m.group(1) == "svc" else "Deployment"
                named.append((kind, m.group(2)))
    assert named and [n for n in named if n not in names] == []
    assert f"helm test llm -n {namespace}" in DOC.read_text()


def test_the_ports_the_doc_forwards_are_the_services_ports() -> None:
    namespace, rendered = _rendered("llm")
    forwards = [w for w in _commands() if w[:4] == ["kubectl", "-n", namespace, "port-forward"]]
    assert len(forwards) == 2
    for words in forwards:
        service = rendered.one("Service", words[4].removeprefix("svc/"))
        ports = {p["port"] for p in service["spec"]["ports"]}
        assert int(words[5].split(":")[1]) in ports, words


def _help(command: str, capsys: pytest.CaptureFixture[str]) -> str:
    with pytest.raises(SystemExit):
        cli.main([command, "--help"])
    return capsys.readouterr().out


def test_every_glassbox_flag_the_doc_uses_exists(capsys: pytest.CaptureFixture[str]) -> None:
    used: dict[str, set[str]] = {}
    for words in _commands():
        starts = [
            i
            for i, (w, sub) in enumerate(itertools.pairwise(words))
            if w == "glassbox" and sub in cli._PARTS
        ]
        for at in starts:
            used.setdefault(words[at + 1], set()).update(
                w.split("=")[0] for w in words[at + 2 :] if w.startswith("--")
            )
    assert set(used) == {"probe", "explain"}
    for command, flags in used.items():
        text = _help(command, capsys)
        assert [f for f in sorted(flags) if f not in text] == [], command


def test_the_build_script_takes_the_tag_the_doc_gives_it() -> None:
    [build] = [w for w in _commands() if w[0] == "scripts/build-image.sh"]
    script = (REPO / "scripts" / "build-image.sh").read_text()
    assert all(f"{w})" in script for w in build if w.startswith("--"))
    assert Path(REPO / build[0]).is_file()
