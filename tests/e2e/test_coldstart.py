"""Cold start and KV headroom on the real stack: vLLM's CPU build started once for the
session (tests/realstack.py), its log followed by the exporter, Prometheus scraping both
every second, then the fill phase watched by an exporter core polling every 0.25 s.

The first preemption is read from vLLM's queue (a preempted request waits again), not
from `vllm:num_preemptions_total`: vLLM counts a preemption only when the preempted
request runs again (the event rides on its next output), seconds later in a full pool.
"""

from __future__ import annotations

import math

import pytest
from vllm_glassbox.core import derive
from vllm_glassbox.core.cold_start import read_cold_starts

from tests.realstack import RUNNING, WAITING, RealStack, first_preemption, waits_again

pytestmark = pytest.mark.vllm


def test_headroom_falls_to_zero_and_exhaustion_is_predicted_before_the_first_preemption(
    stack: RealStack,
) -> None:
    """The fill phase, on an exporter core polling every 0.25 s (RealStack.fine_polls):
    before the first poll that shows a request preempted, polls show no headroom left,
    and exhaustion forecasts before those."""
    polls = stack.fine_polls
    preempted = first_preemption(polls)
    assert preempted is not None, "the fill phase ends at vLLM's first preemption"
    if waits_again(polls) is not preempted:
        # Not seen as all requests running, then one waiting again: the polls missed the
        # queue or a request waited from the start (a loaded machine), so when the pool
        # ran out is not known to a poll.
        print("no poll saw the queue empty, then a request wait again: lead not measured")
        return
    before = [p for p in polls if p.at < preempted.at]
    last_clear = before[-1].at  # the preemption happened between this poll and the next
    headroom_gone = [
        p.at for p in before if p.values.get("glassbox_kv_cache_headroom_requests") == 0
    ]
    forecasts = [p.at for p in before if "glassbox_kv_cache_exhaustion_seconds" in p.values]
    fill_start = stack.times["fill_start"]
    print(
        f"\nfill: {len(before)} polls before the first preemption, which came "
        f"{last_clear - fill_start:.1f}–{preempted.at - fill_start:.1f} s into the phase"
    )
    shown = [p for p in before if p.at >= (headroom_gone or [preempted.at])[0] - 4]
    for p in [*shown, preempted]:
        v = p.values
        print(
            f"  {p.at - preempted.at:+6.2f} s: running {v.get(RUNNING)} waiting "
            f"{v.get(WAITING)} used {v.get('glassbox_kv_cache_used_tokens', math.nan):5.0f} "
            f"headroom {v.get('glassbox_kv_cache_headroom_requests')} full in "
            f"{v.get('glassbox_kv_cache_exhaustion_seconds', math.nan):5.1f} s"
        )
    # At the latest on the first poll that shows a preemption, no request fits any more.
    assert preempted.values.get("glassbox_kv_cache_headroom_requests") == 0
    blind = preempted.at - last_clear
    if blind > 1.0:
        # vLLM's API server answered no /metrics for a while as the pool filled (its
        # engine decoding on a busy machine): a lead shorter than that gap is unseeable.
        print(f"no poll of vLLM for {blind:.1f} s before the preemption: lead not measured")
        return
    assert headroom_gone, "the headroom never reached 0 before the first preemption"
    assert forecasts, "no exhaustion forecast before the first preemption"
    print(
        "lead before the first preemption: headroom 0 from "
        f"{last_clear - headroom_gone[0]:.2f}–{preempted.at - headroom_gone[0]:.2f} s, "
        f"exhaustion forecast from {last_clear - forecasts[0]:.2f}–"
        f"{preempted.at - forecasts[0]:.2f} s"
    )
    earlier = [p.at for p in before if p.at < headroom_gone[0]]
    gap = headroom_gone[0] - earlier[-1] if earlier else math.inf
    if gap > 1.0:
        # No poll kept in the second before the headroom was gone (they timed out on a
        # busy machine): which came first is not known to a poll, only that neither
        # came after the other.
        print(f"no poll kept for {gap:.1f} s before the headroom was gone: order not measured")
        assert forecasts[0] <= headroom_gone[0]
        return
    assert forecasts[0] < headroom_gone[0]  # the forecast comes first


def test_the_real_start_is_read_stage_by_stage_from_vllms_log(stack: RealStack) -> None:
    [cold] = read_cold_starts(stack.vllm.log_text())
    stages = derive.startup_stages(cold)
    model = f'model_name="{stack.served_model_name}"'
    at = stack.times["flood_end"]
    published = {
        r["metric"]["stage"]: float(r["value"][1])
        for r in stack.query(f"glassbox_startup_stage_seconds{{{model}}}", at=at)
    }
    print(f"\nCPU build start by stage: {published}; total {stages.total} s")
    # --enforce-eager on the CPU build: no torch.compile total and no graph capture logged.
    assert published == pytest.approx(stages.by_stage())
    assert set(published) == {"weights_load", "engine_init", "other"}
    [(labels, total)] = [
        (r["metric"], float(r["value"][1]))
        for r in stack.query(f"glassbox_startup_seconds{{{model}}}", at=at)
    ]
    assert labels["start"] == str(cold.started_at) and total == stages.total
    # The log's clock against the test's: launch to /health answering includes the Python
    # imports before vLLM's first line and up to one readiness poll after its last.
    wall = stack.times["vllm_ready"] - stack.times["vllm_launch"]
    print(f"launch to /health {wall:.1f} s; the log's process start to ready {total:.0f} s")
    assert 0 < total <= wall + 1
    rate = stack.query(f"glassbox_model_load_bytes_per_second{{{model}}}", at=at)
    weights = stack.query("glassbox_model_weights_bytes", at=at)
    assert float(rate[0]["value"][1]) == pytest.approx(
        float(weights[0]["value"][1]) / published["weights_load"]
    )


def test_the_first_request_after_the_start_pays_the_ngram_jit(stack: RealStack) -> None:
    model = f'model_name="{stack.served_model_name}"'
    at = stack.spec_compare_at
    [first] = stack.query(f"glassbox_first_request_prefill_seconds{{{model}}}", at=at)
    [warm] = stack.query(f"glassbox_warm_request_prefill_seconds{{{model}}}", at=at)
    cold, hot = float(first["value"][1]), float(warm["value"][1])
    print(f"\nfirst request's prefill {cold:.3f} s, warm mean {hot:.3f} s")
    assert cold > 5 * hot
