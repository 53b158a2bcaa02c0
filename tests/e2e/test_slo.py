"""Service-level objectives on real data: the session stack's Prometheus (tests/realstack.py)
evaluates the rules of STACK_SLO every second over the real vLLM CPU build, whose flood
pushes its requests past stack-e2e (10 s end to end for 99 %). The fast-burn alert fires
then and not before, and the SLO dashboard's attainment equals the count from vLLM's raw
buckets by hand.
"""

from __future__ import annotations

import math
from typing import Any

import pytest
from vllm_glassbox.dashboards import catalog
from vllm_glassbox.dashboards.grafana import TimeRange, substitute, variable_names

from tests.realstack import STACK_SLO, RealStack

pytestmark = pytest.mark.vllm

E2E = 'model_name="tiny"'
FAST_BURN = 'ALERTS{alertname="VLLMSLOFastBurn", slo="stack-e2e"'


def firing_times(stack: RealStack, start: float, end: float) -> list[float]:
    result = stack.query_range(f'{FAST_BURN}, alertstate="firing"}}', start, end, 1.0)
    return sorted(float(t) for series in result for t, _ in series["values"])


def test_requests_within_the_objective_fire_nothing(stack: RealStack) -> None:
    """The spec phase's three requests take seconds end to end: within 10 s."""
    t = stack.times
    seconds = math.ceil(stack.spec_compare_at - t["spec_start"])
    within = stack.query(
        f'max_over_time(vllm:e2e_request_latency_seconds_bucket{{{E2E}, le="10.0"}}[{seconds}s])',
        at=stack.spec_compare_at,
    )
    assert [float(r["value"][1]) for r in within] == [3.0]
    assert firing_times(stack, t["spec_start"], stack.spec_compare_at) == []


def test_the_flood_past_the_objective_fires_the_fast_burn_alert(stack: RealStack) -> None:
    t = stack.times
    fired = firing_times(stack, t["flood_start"], t["fill_end"])
    assert fired, "VLLMSLOFastBurn never fired while the flood's requests missed stack-e2e"
    print(
        f"VLLMSLOFastBurn first fired {fired[0] - t['flood_start']:.0f} s after the flood "
        f"began (the flood lasted {t['flood_end'] - t['flood_start']:.0f} s)"
    )
    (alert,) = stack.query(f'{FAST_BURN}, alertstate="firing"}}', at=fired[0])
    assert alert["metric"]["sli"] == "e2e" and alert["metric"]["threshold"] == "10.0"
    assert alert["metric"]["model_name"] == "tiny" and alert["metric"]["severity"] == "critical"


def _raw(stack: RealStack, selector: str, at: float) -> list[float]:
    """The raw samples of one series over the 5 minutes before `at`."""
    (series,) = stack.query(f"{selector}[300s]", at=at)
    return [float(v) for _, v in series["values"]]


def _dashboard_query(uid: str, title: str, ref_id: str) -> tuple[str, list[str]]:
    board = next(catalog.as_json(d) for d in catalog.dashboards() if d.uid == uid)
    panel = next(p for p in board["panels"] if p.get("title") == title)
    target = next(x for x in panel["targets"] if x["refId"] == ref_id)
    return target["expr"], variable_names(board)


def test_the_dashboards_attainment_equals_the_hand_count_from_vllms_raw_buckets(
    stack: RealStack,
) -> None:
    """After the flood: requests within 10 s over all requests, from the raw bucket and
    count series over the same 5 minutes, against the SLO dashboard's 5-minute attainment
    as Grafana would ask for it."""
    at = stack.times["flood_end"] + 2
    counted = _raw(stack, f"vllm:e2e_request_latency_seconds_count{{{E2E}}}", at)
    within = _raw(stack, f'vllm:e2e_request_latency_seconds_bucket{{{E2E}, le="10.0"}}', at)
    hand = (within[-1] - within[0]) / (counted[-1] - counted[0])
    assert counted[-1] - counted[0] >= 16 and hand < 0.9  # the flood missed the objective
    expr, names = _dashboard_query("glassbox-slo", "Attainment: last 5 minutes and last hour", "A")
    sent = substitute(expr, names, TimeRange(at - 300, at, 1.0, 1.0))
    shown: dict[str, Any] = {
        r["metric"]["slo"]: float(r["value"][1]) for r in stack.query(sent, at=at)
    }
    print(f"stack-e2e within 10 s: {hand:.4f} by hand, {shown['stack-e2e']:.4f} on the dashboard")
    if counted[0] == 0 and within[0] == 0:
        # Every request of the run inside the window: both counters start at 0, so rate()
        # extrapolates both alike and the ratio is exact.
        assert shown["stack-e2e"] == pytest.approx(hand, abs=1e-9)
    else:  # a slow machine's run longer than 5 minutes: extrapolations differ a little
        assert shown["stack-e2e"] == pytest.approx(hand, abs=0.02)


def test_an_objective_vllm_has_no_bucket_for_is_flagged_and_its_numbers_absent(
    stack: RealStack,
) -> None:
    at = stack.times["flood_end"] + 2
    flagged = stack.query(
        'namespace_job_model_name_slo:glassbox_slo_boundary_missing:count{slo="stack-tpot-custom"}',
        at=at,
    )
    assert [(r["metric"]["threshold"], float(r["value"][1])) for r in flagged] == [("0.06", 1.0)]
    for window in ("rate5m", "rate1h"):
        ratio = f"namespace_job_model_name_slo:glassbox_slo_error_ratio:{window}"
        assert stack.query(ratio + '{slo="stack-tpot-custom"}', at=at) == []
    # The objectives vLLM can count have their numbers.
    counting = stack.query("namespace_job_model_name_slo:glassbox_slo_error_ratio:rate5m", at=at)
    names = {o["name"] for o in STACK_SLO["objectives"]}  # type: ignore[index]
    assert {r["metric"]["slo"] for r in counting} == names - {"stack-tpot-custom"}
