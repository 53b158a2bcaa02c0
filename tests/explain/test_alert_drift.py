"""The KV pool's diagnosis and the alerts it mirrors judge alike: the thresholds and the
shape of each alert's expression (alerts/glassbox-alerts.yaml), read from the file,
against the diagnosis' constants (explain/diagnoses/kv_pool.py). A change to one without
the other fails here."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml
from vllm_glassbox.core import series
from vllm_glassbox.explain.diagnoses import kv_pool

REPO = Path(__file__).resolve().parents[2]
NUMBER = r"([0-9.]+)"


def alerts() -> dict[str, dict[str, Any]]:
    data = yaml.safe_load((REPO / "alerts" / "glassbox-alerts.yaml").read_text())
    return {r["alert"]: r for g in data["groups"] for r in g["rules"] if "alert" in r}


def expr(name: str) -> str:
    return " ".join(str(alerts()[name]["expr"]).split())


def threshold(expression: str, pattern: str) -> float:
    found = re.findall(pattern, expression)
    assert len(found) == 1, (pattern, expression)
    return float(found[0])


def test_the_storm_is_judged_as_vllm_preemption_storm() -> None:
    e = expr(kv_pool.STORM_ALERT)
    count = r"increase\(vllm:num_preemptions_total\[\w+\]\) \) >= " + NUMBER
    assert threshold(e, count) == kv_pool.STORM_PREEMPTIONS
    fill = r"max_over_time\(vllm:kv_cache_usage_perc\[\w+\]\) \) >= " + NUMBER
    assert threshold(e, fill) == kv_pool.STORM_FILL
    # The queue's peak: waiting for capacity where the page says why, else every reason.
    waiting = r'max_over_time\(vllm:num_requests_waiting_by_reason\{reason="capacity"\}\[\w+\]\)'
    assert re.search(waiting + r" or on \([^)]*\) max_over_time\(vllm:num_requests_waiting\[", e)
    assert threshold(e, r"\[\w+\]\) \) > " + NUMBER) == kv_pool.STORM_WAITING


def test_the_storms_conditions_are_over_one_window_and_matched_on_the_engine() -> None:
    """The diagnosis judges all three over the scene's one window, engine by engine."""
    e = expr(kv_pool.STORM_ALERT)
    assert len(set(re.findall(r"\[(\w+)\]", e))) == 1
    assert e.count("and on (namespace, job, instance, model_name, engine)") == 2


def test_saturation_is_judged_as_vllm_kv_cache_saturated() -> None:
    e = expr(kv_pool.SATURATED_ALERT)
    assert threshold(e, r"\(vllm:kv_cache_usage_perc\) >= " + NUMBER) == kv_pool.SATURATED_FILL
    assert threshold(e, r"vllm:num_requests_waiting \) > " + NUMBER) == kv_pool.SATURATED_WAITING
    assert 'num_requests_waiting_by_reason{reason="capacity"}' in e


def test_fills_soon_needs_both_forecasts_of_the_exhaustion_alert() -> None:
    e = expr(kv_pool.FORECAST_ALERT)
    soon = threshold(e, rf"\({series.KV_EXHAUSTION.name} < {NUMBER}\)")
    assert soon == kv_pool.FULL_SOON_SECONDS
    below = threshold(e, rf"\({series.KV_HEADROOM_AT_COMPLETION.name} < {NUMBER}\)")
    assert below == kv_pool.HEADROOM_AT_COMPLETION_BELOW
    assert re.search(r"\) and on \([^)]*engine\) \(", e), "both, on the same engine"


@pytest.mark.parametrize("alert", ["STORM_ALERT", "SATURATED_ALERT", "FORECAST_ALERT"])
def test_each_mirrored_alert_exists_with_its_runbook_section(alert: str) -> None:
    name = getattr(kv_pool, alert)
    rule = alerts()[name]
    assert rule["annotations"]["runbook_url"].endswith("#" + name.lower())
    assert f"## {name}\n" in (REPO / "alerts" / "runbook.md").read_text()


def test_the_check_sees_a_threshold_that_drifted() -> None:
    e = expr(kv_pool.STORM_ALERT).replace(">= 0.9", ">= 0.8")
    fill = r"max_over_time\(vllm:kv_cache_usage_perc\[\w+\]\) \) >= " + NUMBER
    assert threshold(e, fill) != kv_pool.STORM_FILL
