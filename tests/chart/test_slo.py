"""The chart's prometheusRule.slo: the same objectives render the same rules as
`glassbox rules --slo` (the chart's template and core/slo/ fill one rule template),
the SLO alerts follow the chart's alert settings, and what the CLI refuses the chart
refuses too, naming the key."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import yaml
from vllm_glassbox.core import slo
from vllm_glassbox.rules import with_aggregation_labels

from tests.chart_render import HelmError, render
from tests.core.test_slo import GOOD, REFUSED, changed

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = yaml.safe_load((REPO / "alerts" / "slo" / "example.yaml").read_text())


def chart_groups(objectives: dict[str, Any], **rule_values: Any) -> list[dict[str, Any]]:
    values = {"prometheusRule": {"enabled": True, "slo": objectives, **rule_values}}
    spec = render(values).one("PrometheusRule")["spec"]
    return [g for g in spec["groups"] if g["name"].startswith("glassbox.slo.")]


def cli_groups(objectives: dict[str, Any]) -> list[dict[str, Any]]:
    return slo.rule_groups(slo.parse(copy.deepcopy(objectives), "slo.yaml"))


# Every shape a value can take: thresholds as durations and as seconds, targets as
# percentages (99.9 %: decimal arithmetic on both sides) and shares, windows, every SLI,
# objectives of one model and namespace or of all, buckets of vLLM's defaults and given.
VARIANTS = {
    "the example file": EXAMPLE,
    "every shape of value": {
        "buckets": {"time_to_first_token": [0.1, 0.3, 0.6, 1.2], "request_latency": [1, 2, 4]},
        "objectives": [
            {"name": "a", "sli": "ttft", "threshold": "600ms", "target": "99.9%"},
            {"name": "b", "sli": "ttft", "threshold": 0.45, "target": 0.995, "window": "7d"},
            {
                "name": "c",
                "sli": "e2e",
                "threshold": "3s",
                "target": "95%",
                "model": "Qwen/Qwen2.5-7B",
            },
            {"name": "d", "sli": "tpot", "threshold": "1m", "target": "99.95%", "namespace": "ml"},
            {"name": "e", "sli": "errors", "target": 0.9999, "window": "30d", "model": "x:y"},
        ],
    },
}


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_the_chart_renders_the_rules_glassbox_rules_writes(variant: str) -> None:
    objectives = VARIANTS[variant]
    got, want = chart_groups(copy.deepcopy(objectives)), cli_groups(objectives)
    assert [g["name"] for g in got] == [g["name"] for g in want]
    for mine, theirs in zip(got, want, strict=True):
        assert mine == theirs, mine["name"]


def test_the_chart_adds_aggregation_labels_to_the_slo_rules_as_glassbox_rules_does() -> None:
    got = chart_groups(copy.deepcopy(EXAMPLE), additionalAggregationLabels=["cluster"])
    for mine, theirs in zip(got, cli_groups(EXAMPLE), strict=True):
        for a, b in zip(mine["rules"], theirs["rules"], strict=True):
            assert a["expr"] == with_aggregation_labels(b["expr"], ["cluster"])


def test_no_objectives_no_slo_rules() -> None:
    assert chart_groups({"objectives": []}) == []


def _alerts(groups: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [r for g in groups for r in g["rules"] if "alert" in r]


def test_slo_alerts_follow_the_charts_alert_settings() -> None:
    prefix = "https://runbooks.example/glassbox.md"
    groups = chart_groups(
        copy.deepcopy(EXAMPLE),
        additionalRuleLabels={"team": "inference"},
        runbookUrlPrefix=prefix,
        disabledAlerts=["VLLMSLOTicketBurn"],
    )
    alerts = _alerts(groups)
    assert alerts and {a["alert"] for a in alerts} == {
        "VLLMSLOFastBurn",
        "VLLMSLOSlowBurn",
        "VLLMSLOBoundaryMissing",
    }
    for alert in alerts:
        assert alert["labels"]["team"] == "inference"
        assert alert["annotations"]["runbook_url"] == f"{prefix}#{alert['alert'].lower()}"
    # alerts: false keeps the records (the dashboards read them), not the alerts.
    quiet = chart_groups(copy.deepcopy(EXAMPLE), alerts=False)
    assert _alerts(quiet) == [] and sum(len(g["rules"]) for g in quiet) > 40


def test_slo_alerts_can_be_disabled_before_any_objective_is_given() -> None:
    assert chart_groups({"objectives": []}, disabledAlerts=["VLLMSLOFastBurn"]) == []


def test_notes_say_which_thresholds_are_counted_at_a_lower_boundary() -> None:
    notes = render({"prometheusRule": {"enabled": True, "slo": copy.deepcopy(EXAMPLE)}}).notes
    assert "the rules of 4 service-level objective(s)" in notes
    assert 'fleet-e2e: e2e threshold 25 s is not a bucket boundary; counted at le="20.0"' in notes
    assert "chat-ttft: ttft threshold" not in notes  # 500 ms is a boundary


# --- what both refuse ---------------------------------------------------------------------


@pytest.mark.parametrize(("change", "key", "says"), REFUSED)
def test_what_glassbox_rules_refuses_the_chart_refuses(
    change: dict[str, object], key: str, says: str
) -> None:
    """Each refusal of tests/core/test_slo.py: the schema names the path
    (/prometheusRule/slo/objectives/0…), the template the key and says what the command
    says."""
    with pytest.raises(HelmError) as chart:
        render({"prometheusRule": {"enabled": True, "slo": {"objectives": [changed(change)]}}})
    message = str(chart.value)
    if f"prometheusRule.slo.objectives[0].{key}: " in message:  # the template's words
        assert says in message, message
    else:  # the schema's
        assert "/prometheusRule/slo/objectives/0" in message, message


def test_a_name_given_twice_and_falling_buckets_are_refused_by_both() -> None:
    objectives = [GOOD, {**GOOD, "sli": "e2e"}]
    with pytest.raises(slo.SloError, match=r"objectives\[1\]\.name: 'a' is the name"):
        slo.parse({"objectives": objectives}, "slo.yaml")
    with pytest.raises(HelmError, match=r"prometheusRule.slo.objectives\[1\].name: \"a\" is the"):
        render({"prometheusRule": {"enabled": True, "slo": {"objectives": objectives}}})
    falling = {"buckets": {"time_to_first_token": [1, 0.5]}, "objectives": [GOOD]}
    with pytest.raises(slo.SloError, match=r"buckets.time_to_first_token: must rise"):
        slo.parse(copy.deepcopy(falling), "slo.yaml")
    with pytest.raises(HelmError, match=r"prometheusRule.slo.buckets.time_to_first_token: must"):
        render({"prometheusRule": {"enabled": True, "slo": falling}})
