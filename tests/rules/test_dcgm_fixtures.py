"""The rules' reading of dcgm-exporter against its published pages and counter lists
(tests/fixtures/dcgm/): every DCGM series the rules name is a counter dcgm-exporter
collects, and the labels the rules join on are those its Kubernetes mapping sets."""

from __future__ import annotations

import re
from pathlib import Path

import yaml
from prometheus_client.parser import text_string_to_metric_families

REPO = Path(__file__).resolve().parents[2]
DCGM = REPO / "tests" / "fixtures" / "dcgm"
RULES = REPO / "alerts" / "glassbox-rules.yaml"


def _counters(name: str, commented_too: bool) -> set[str]:
    found = set()
    for line in (DCGM / name).read_text().splitlines():
        text = line.lstrip("# ").strip() if commented_too else line.strip()
        if text.startswith("DCGM_FI_"):
            found.add(text.split(",", 1)[0].strip())
    return found


def _rule_dcgm_names() -> set[str]:
    text = RULES.read_text()
    rules = [r for g in yaml.safe_load(text)["groups"] for r in g["rules"]]
    return {n for r in rules for n in re.findall(r"\bDCGM_FI_[A-Z0-9_]+", r["expr"])}


def test_the_rules_name_dcgm_series_dcgm_exporter_collects() -> None:
    named = _rule_dcgm_names()
    assert named >= {"DCGM_FI_DEV_FB_USED", "DCGM_FI_DEV_FB_FREE", "DCGM_FI_PROF_DRAM_ACTIVE"}
    on_by_default = _counters("default-counters.csv", commented_too=False)
    with_profiling = _counters("dcp-metrics-included.csv", commented_too=False)
    listed = _counters("dcp-metrics-included.csv", commented_too=True)
    # Framebuffer, power and DRAM activity by default; SM activity listed but off until
    # its line is uncommented (docs/cost.md says so).
    assert {"DCGM_FI_DEV_FB_USED", "DCGM_FI_DEV_FB_FREE", "DCGM_FI_DEV_POWER_USAGE"} <= (
        on_by_default
    )
    assert "DCGM_FI_PROF_DRAM_ACTIVE" in with_profiling & on_by_default
    assert "DCGM_FI_PROF_SM_ACTIVE" in listed - with_profiling
    assert named <= listed


def _samples(name: str) -> list[dict[str, str]]:
    return [
        dict(sample.labels)
        for family in text_string_to_metric_families((DCGM / name).read_text())
        for sample in family.samples
    ]


def test_the_labels_the_rules_join_on_are_those_of_the_kubernetes_mapping() -> None:
    pod_mapped = _samples("gpu-operator-340-t4-pod.txt")
    assert all(s["pod"] == "dcgmproftester" and s["namespace"] == "default" for s in pod_mapped)
    assert all(
        {"Hostname", "gpu", "UUID", "modelName", "container"} <= s.keys() for s in pod_mapped
    )
    # A MIG instance no pod uses has no pod label at all; one a pod uses has it.
    mig = _samples("issue-512-h100-mig-pods.txt")
    assert ["pod" in s for s in mig] == [True, False, True]
    # Mapping on, no pod on the GPU: the labels are there, empty.
    assert {s["pod"] for s in _samples("issue-58-titan-v.txt")} == {""}
    joins = set(re.findall(r"on \(([^)]*)\)", RULES.read_text()))
    assert "namespace, pod" in joins


def test_dcgm_framebuffer_is_in_mib() -> None:
    # 15,109 MiB free on a T4 (16 GiB): a number of MiB, not bytes.
    [free] = [
        s.value
        for f in text_string_to_metric_families((DCGM / "gpu-operator-340-t4-pod.txt").read_text())
        for s in f.samples
        if s.name == "DCGM_FI_DEV_FB_FREE"
    ]
    assert free == 15109 and "(in MiB)" in (DCGM / "default-counters.csv").read_text()
