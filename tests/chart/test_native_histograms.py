"""The chart's prometheusRule.histograms: native renders the rules `glassbox rules
--histograms native` writes (the rule files and an SLO file's objectives alike), and
classic, the default, the rule files as they are."""

from __future__ import annotations

import copy
from typing import Any

import pytest
import yaml
from vllm_glassbox.core import slo
from vllm_glassbox.histograms import native_rules

from tests.chart.test_slo import EXAMPLE, chart_groups
from tests.chart_render import HelmError, render
from tests.rules.test_rules import RULE_FILES


def _groups(histograms: str | None) -> list[dict[str, Any]]:
    values: dict[str, Any] = {"enabled": True}
    if histograms is not None:
        values["histograms"] = histograms
    return list(render({"prometheusRule": values}).one("PrometheusRule")["spec"]["groups"])


def _rule_files(native: bool) -> list[dict[str, Any]]:
    groups = []
    for path in RULE_FILES:
        document = yaml.safe_load(path.read_text())
        if native:
            native_rules(document)
        groups += document["groups"]
    return groups


def test_by_default_the_chart_renders_the_classic_rules() -> None:
    assert _groups(None) == _groups("classic") == _rule_files(native=False)


def test_native_renders_the_rules_glassbox_rules_writes_for_native_histograms() -> None:
    got = _groups("native")
    assert got == _rule_files(native=True)
    assert got != _rule_files(native=False)
    exprs = "\n".join(r["expr"] for g in got for r in g["rules"])
    assert "histogram_count(rate(vllm:inter_token_latency_seconds[5m]))" in exprs
    assert "_bucket" not in exprs and "seconds_count" not in exprs


def test_native_slo_rules_are_the_ones_glassbox_rules_writes() -> None:
    got = chart_groups(copy.deepcopy(EXAMPLE), histograms="native")
    want = slo.rule_groups(slo.parse(copy.deepcopy(EXAMPLE), "slo.yaml"), histograms="native")
    assert got == want
    exprs = "\n".join(r["expr"] for g in got for r in g["rules"])
    assert "histogram_fraction(-Inf, 0.5, rate(vllm:time_to_first_token_seconds{" in exprs
    assert "boundary_missing:count" not in [
        r.get("record", "")[-22:] for g in got for r in g["rules"]
    ]


def test_a_histograms_mode_of_no_kind_is_refused_by_the_schema() -> None:
    with pytest.raises(HelmError, match="histograms"):
        render({"prometheusRule": {"enabled": True, "histograms": "exponential"}})
