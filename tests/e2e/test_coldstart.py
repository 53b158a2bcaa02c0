"""Cold start and KV headroom on the real stack: vLLM's CPU build started once for the
session (tests/realstack.py), its log followed by the exporter, Prometheus scraping both
every second, then the fill phase watched by an exporter core polling vLLM paused between
slices of its running.

The first preemption is read from vLLM's queue (a preempted request waits again), not
from `vllm:num_preemptions_total`: vLLM counts a preemption only when the preempted
request runs again (the event rides on its next output), seconds later in a full pool.
"""

from __future__ import annotations

import math

import pytest
from vllm_glassbox.core import derive
from vllm_glassbox.core.cold_start import read_cold_starts

from tests.fill_phase import RUNNING, WAITING, first_preemption, steps_between, waits_again
from tests.realstack import RealStack

pytestmark = pytest.mark.vllm

BLOCK_TOKENS = 128  # the CPU build's block: the stack's pool is 32 blocks of 128 tokens


def test_headroom_falls_to_zero_and_exhaustion_is_predicted_before_the_first_preemption(
    stack: RealStack,
) -> None:
    """The fill phase, polled slice by slice with vLLM held still at each poll
    (RealStack.fine_polls): no poll is lost or late, so the polls before the first one
    that shows a request preempted show no headroom left, and exhaustion forecasts before
    those; the lead is counted in slices of vLLM's running."""
    polls = stack.fine_polls
    preempted = first_preemption(polls)
    assert preempted is not None, "the fill phase ends at vLLM's first preemption"
    before = polls[: polls.index(preempted)]
    headroom = "glassbox_kv_cache_headroom_requests"
    headroom_gone = [i for i, p in enumerate(before) if p.values.get(headroom) == 0]
    forecasts = [
        i for i, p in enumerate(before) if "glassbox_kv_cache_exhaustion_seconds" in p.values
    ]
    sign = "a request waiting again" if waits_again(polls) is preempted else "its counter"
    print(
        f"\nfill: {len(before)} polls, a slice of vLLM's running apart, before the first "
        f"preemption (seen by {sign})"
    )
    for p in polls[max(0, (headroom_gone or [len(before)])[0] - 4) : len(before) + 1]:
        v = p.values
        print(
            f"  {p.at - preempted.at:+7.2f} s: running {v.get(RUNNING)} waiting "
            f"{v.get(WAITING)} used {v.get('glassbox_kv_cache_used_tokens', math.nan):5.0f} "
            f"headroom {v.get(headroom)} full in "
            f"{v.get('glassbox_kv_cache_exhaustion_seconds', math.nan):5.1f} s"
        )
    # At the latest on the first poll that shows a preemption, no request fits any more.
    assert preempted.values.get(headroom) == 0
    if not headroom_gone and before:
        # The headroom is 0 for the last block of each request, BLOCK_TOKENS steps: a poll
        # lands in it unless vLLM ran that long in the one slice (only where no real-time
        # helper times the slices: tests/vllm_pause.py). Then the lead cannot be seen.
        steps = steps_between(before[-1], preempted)
        if steps >= BLOCK_TOKENS:
            pytest.skip(f"the last slice before the preemption ran {steps:.0f} engine steps")
    assert headroom_gone, "no poll before the first preemption showed the headroom gone"
    assert forecasts, "no exhaustion forecast before the first preemption"
    print(
        f"lead before the first preemption: headroom 0 from {len(before) - headroom_gone[0]} "
        f"slices, exhaustion forecast from {len(before) - forecasts[0]} slices"
    )
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
