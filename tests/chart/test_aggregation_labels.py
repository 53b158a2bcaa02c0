"""The chart's prometheusRule.additionalAggregationLabels: the rules with more labels kept
in every aggregation, exactly as `glassbox rules --aggregation-labels` writes them (one
pattern in Go's regexp in the template, one in Python's: they must agree)."""

from __future__ import annotations

from typing import Any

import pytest
import yaml
from vllm_glassbox.rules import with_aggregation_labels

from tests.chart_render import HelmError, render
from tests.rules.test_rules import RULE_FILES


def _source_rules() -> list[dict[str, Any]]:
    return [
        rule
        for path in RULE_FILES
        for group in yaml.safe_load(path.read_text())["groups"]
        for rule in group["rules"]
    ]


def _chart_rules(values: dict[str, Any]) -> list[dict[str, Any]]:
    spec = render({"prometheusRule": {"enabled": True, **values}}).one("PrometheusRule")["spec"]
    return [rule for group in spec["groups"] for rule in group["rules"]]


def test_by_default_the_chart_keeps_the_rules_expressions_verbatim() -> None:
    assert [r["expr"] for r in _chart_rules({})] == [r["expr"] for r in _source_rules()]


def test_the_chart_adds_aggregation_labels_as_glassbox_rules_does() -> None:
    labels = ["cluster", "region"]
    got = _chart_rules({"additionalAggregationLabels": labels})
    want = _source_rules()
    assert len(got) == len(want)
    for mine, theirs in zip(got, want, strict=True):
        assert mine["expr"] == with_aggregation_labels(theirs["expr"], labels)
    # Every rule that aggregates got them; the pattern reached records and alerts alike.
    changed = [m for m, t in zip(got, want, strict=True) if m["expr"] != t["expr"]]
    assert {("record" in r) for r in changed} == {True, False}
    assert sum("by (cluster, region, namespace" in r["expr"] for r in got) > 20


@pytest.mark.parametrize(
    ("labels", "message"),
    [
        (["job"], "/prometheusRule/additionalAggregationLabels/0"),
        (["cluster", "cluster"], "/prometheusRule/additionalAggregationLabels"),
        (["k8s-cluster"], "does not match pattern"),
        ("cluster", "/prometheusRule/additionalAggregationLabels"),
    ],
)
def test_labels_the_rules_cannot_take_are_refused_by_the_schema(labels: Any, message: str) -> None:
    with pytest.raises(HelmError) as raised:
        render({"prometheusRule": {"additionalAggregationLabels": labels}})
    assert message in str(raised.value)
