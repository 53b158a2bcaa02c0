"""`glassbox demo`'s Prometheus: the rule files it loads, the demo's objectives' among them.

The demo (lab/demo.py) loads glassbox's rule files and the rules of its SLO file
(lab/plans/cpu-demo.slo.yaml), so its SLO dashboard and the overview's SLO row have data.
The rules are checked against `glassbox rules --slo`'s own output for the same file, and
the Prometheus the demo starts is checked to be configured with them (the process itself
is not started here: tests/lab/test_local.py runs the whole demo).
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any

import pytest
import yaml
from vllm_glassbox.core import slo
from vllm_glassbox.lab import demo
from vllm_glassbox.lab.backends.server_process import ServerError
from vllm_glassbox.rules import slo_rule_file_text

REPO = Path(__file__).resolve().parents[2]


def test_the_demo_loads_glassboxs_rules_and_its_objectives_rules(tmp_path: Path) -> None:
    rules = demo.demo_rule_files(tmp_path / "prometheus")
    assert rules[:-1] == sorted(str(p) for p in (REPO / "alerts").glob("*.yaml"))
    assert rules[:-1] and Path(rules[-1]).parent == tmp_path / "prometheus"
    loaded = yaml.safe_load(Path(rules[-1]).read_text())
    # What `glassbox rules --slo` writes for the demo's file, every group at the global
    # evaluation interval (the budget group's 5 minutes would outlast the demo's run).
    objectives = slo.read_slo_file(demo.DEMO_SLO)
    written = yaml.safe_load(slo_rule_file_text(objectives, demo.DEMO_SLO.name, []))
    intervals = {g["name"]: g.pop("interval") for g in written["groups"] if "interval" in g}
    assert sorted(intervals) == ["glassbox.slo.demo-e2e.budget", "glassbox.slo.demo-ttft.budget"]
    assert loaded == written
    # Both burn (e2e: the flood's requests) and a kept objective (ttft) are on show.
    assert {(o.name, o.sli, o.model) for o in objectives.objectives} == {
        ("demo-e2e", "e2e", None),
        ("demo-ttft", "ttft", None),
    }
    assert slo.warnings(objectives) == []  # each threshold is one of vLLM's boundaries


def test_the_demos_prometheus_is_configured_with_those_rule_files(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    configs: list[dict[str, Any]] = []

    class Configured:
        def __init__(self, workdir: Path, config: dict[str, Any], **_: Any) -> None:
            configs.append(config)

        def start(self, ready_timeout_seconds: float) -> None:
            raise ServerError("not started in this test")

    monkeypatch.setattr(demo, "PrometheusProcess", Configured)
    monkeypatch.setattr(demo.shutil, "which", lambda name: f"/usr/bin/{name}")
    rules = demo.demo_rule_files(tmp_path)
    with contextlib.ExitStack() as stack:
        url = stack.enter_context(demo.prometheus(tmp_path, {"vllm": 8000}, rules))
    assert url is None  # it did not start: the demo goes on without pictures
    assert [c["rule_files"] for c in configs] == [rules]
    assert any(r.endswith("slo.rules.yaml") for r in configs[0]["rule_files"])
    assert configs[0]["global"]["evaluation_interval"] == demo.SCRAPE_INTERVAL


def test_without_glassboxs_rule_files_the_demo_loads_none(tmp_path: Path) -> None:
    assert demo.demo_rule_files(tmp_path / "prometheus", directory=tmp_path / "absent") == []


@pytest.mark.prometheus
def test_promtool_reads_the_demos_objectives_rules(tmp_path: Path) -> None:
    from tests.rules.test_rules import promtool

    result = promtool("check", "rules", demo.slo_rule_file(demo.DEMO_SLO, tmp_path))
    assert result.returncode == 0, result.stdout + result.stderr
