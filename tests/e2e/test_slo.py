"""Service-level objectives on real data: the session stack's Prometheus (tests/realstack.py)
evaluates the rules of STACK_SLO every second over the real vLLM CPU build, whose flood
pushes its requests past stack-e2e (2.5 s end to end for 99 %). The fast-burn alert fires
then (and before only if the spec phase already missed the objective), and the SLO
dashboard's attainment equals the count from vLLM's raw buckets by hand.
"""

from __future__ import annotations

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


def _counted(stack: RealStack, at: float) -> tuple[float, float]:
    """(requests vLLM's e2e histogram counted, those within 2.5 s) since it started, at
    `at`."""

    def one(selector: str) -> float:
        # The last sample before `at` (a scrape that timed out under the flood leaves a
        # staleness marker, which an instant query would take for no series at all).
        (series,) = stack.query(f"last_over_time({selector}[30s])", at=at)
        return float(series["value"][1])

    return (
        one(f"vllm:e2e_request_latency_seconds_count{{{E2E}}}"),
        one(f'vllm:e2e_request_latency_seconds_bucket{{{E2E}, le="2.5"}}'),
    )


def test_the_fast_burn_fires_before_the_flood_only_if_the_spec_phase_missed_the_objective(
    stack: RealStack,
) -> None:
    """Three spec requests: one over 2.5 s (the first, compiling the ngram proposer, on a
    busy machine) is a third of them, past 14.4 × 1 %; none is nothing to page for."""
    t = stack.times
    counted, within = _counted(stack, stack.spec_compare_at)
    assert counted == 3
    fired = firing_times(stack, t["spec_start"], stack.spec_compare_at)
    print(f"spec phase: {within:g} of 3 requests within 2.5 s; fast burn fired: {bool(fired)}")
    assert bool(fired) == (within < counted)


def test_the_flood_past_the_objective_fires_the_fast_burn_alert(stack: RealStack) -> None:
    t = stack.times
    before, after = _counted(stack, t["flood_start"]), _counted(stack, t["flood_end"] + 2)
    missed = (after[0] - before[0]) - (after[1] - before[1])
    assert after[0] - before[0] == 16 and missed >= 3, (before, after)  # pushed past it
    fired = firing_times(stack, t["flood_start"], t["fill_end"])
    assert fired, "VLLMSLOFastBurn never fired while the flood's requests missed stack-e2e"
    if not firing_times(stack, t["spec_start"], t["flood_start"]):
        assert fired[0] > t["flood_start"]  # the flood made it fire
    print(
        f"the flood: {missed:g} of 16 requests over 2.5 s; VLLMSLOFastBurn firing "
        f"{fired[0] - t['flood_start']:.0f} s after the flood began (it lasted "
        f"{t['flood_end'] - t['flood_start']:.0f} s)"
    )
    (alert,) = stack.query(f'{FAST_BURN}, alertstate="firing"}}', at=fired[0])
    assert alert["metric"]["sli"] == "e2e" and alert["metric"]["threshold"] == "2.5"
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
    """After the flood: requests within 2.5 s over all requests, from the raw bucket and
    count series over the same 5 minutes, against the SLO dashboard's 5-minute attainment
    as Grafana would ask for it."""
    at = stack.times["flood_end"] + 2
    counted = _raw(stack, f"vllm:e2e_request_latency_seconds_count{{{E2E}}}", at)
    within = _raw(stack, f'vllm:e2e_request_latency_seconds_bucket{{{E2E}, le="2.5"}}', at)
    hand = (within[-1] - within[0]) / (counted[-1] - counted[0])
    assert counted[-1] - counted[0] >= 16
    expr, names = _dashboard_query("glassbox-slo", "Attainment: last 5 minutes and last hour", "A")
    sent = substitute(expr, names, TimeRange(at - 300, at, 1.0, 1.0))
    shown: dict[str, Any] = {
        r["metric"]["slo"]: float(r["value"][1]) for r in stack.query(sent, at=at)
    }
    print(f"stack-e2e within 2.5 s: {hand:.4f} by hand, {shown['stack-e2e']:.4f} on the dashboard")
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
