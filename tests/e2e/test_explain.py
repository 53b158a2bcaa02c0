"""`glassbox explain` on the real stack (tests/realstack.py: vLLM's CPU build with ngram
speculation and a 4,096-token pool, the exporter, Prometheus), at the end of each moment
of its workload (tests/capture_prometheus.py `stack_moments`), each window holding that
moment only. The session's stack serves every end-to-end module: this one adds no server.

Each expected number is worked out from vLLM's raw counters and gauges in the same
Prometheus over the same window, by hand arithmetic here (the oracle), never by the
derivation core: an idle server has nothing to say; the repetitive prompt's speculation
works (tokens per forward pass); the flood fills the pool, requests wait and vLLM
preempts, and a larger --kv-cache-memory-bytes would hold them, while the end-to-end
objective of the stack's SLO rules burns fast with the pool named behind it; the sampled
fill phase drafts for nothing.
"""

from __future__ import annotations

import json
import math
from typing import Any

import pytest

from tests.capture_prometheus import stack_moments
from tests.explain.run import explain
from tests.realstack import RealStack

pytestmark = [pytest.mark.vllm, pytest.mark.prometheus, pytest.mark.slow]

KV_BYTES_PER_TOKEN = 2048  # the tiny model: 2 KV heads × 64 × 2 (K, V) × 4 layers × 2 bytes
BLOCK = 128  # the CPU build's block size


def findings(stack: RealStack, moment: str) -> dict[str, dict[str, Any]]:
    at, since = stack_moments(stack)[moment]
    ran = explain(
        [
            "--prometheus",
            stack.prometheus_url,
            "--model",
            stack.served_model_name,
            "--at",
            repr(at),
            "--since",
            f"{since:g}s",
            "--format",
            "json",
        ]
    )
    assert (ran.status, ran.err) == (0, ""), ran
    (scene,) = json.loads(ran.out)["scenes"]
    # One finding per diagnosis, but one per objective (its title: "SLO NAME (…): …").
    return {
        f"slo {f['title'].split()[1]}" if f["diagnosis"] == "slo" else f["diagnosis"]: f
        for f in scene["findings"]
    }


def raw(stack: RealStack, moment: str, expr: str) -> float:
    """One number from vLLM's own series over the moment's window (`[W]` in `expr`)."""
    at, since = stack_moments(stack)[moment]
    result = stack.query(expr.replace("[W]", f"[{since:g}s]"), at)
    return math.fsum(float(r["value"][1]) for r in result)


def figure(finding: dict[str, Any], name: str) -> float:
    value: float = finding["what"]["figures"][name]["value"]
    return value


def test_an_idle_server_has_nothing_to_say(stack: RealStack) -> None:
    found = findings(stack, "idle")
    samples = raw(stack, "idle", "count_over_time(vllm:generation_tokens_total[W])")
    assert found["idle"]["severity"] == "ok", (stack.times, stack_moments(stack), samples, found)
    assert figure(found["idle"], "tokens") == 0
    assert raw(stack, "idle", "increase(vllm:generation_tokens_total[W])") == 0
    # The one objective vLLM has no bucket for (STACK_SLO's on purpose) cannot be read.
    assert found.pop("slo stack-tpot-custom")["finding"] == "boundary_missing"
    assert [f["severity"] for f in found.values() if f["severity"] in ("critical", "warning")] == []


def test_speculation_on_a_repetitive_prompt_works(stack: RealStack) -> None:
    f = findings(stack, "spec")["speculation"]
    assert (f["finding"], f["severity"]) == ("working", "ok")
    generated = raw(stack, "spec", "increase(vllm:generation_tokens_total[W])")
    first = raw(stack, "spec", "increase(vllm:time_to_first_token_seconds_count[W])")
    steps = raw(stack, "spec", "increase(vllm:inter_token_latency_seconds_count[W])")
    accepted = raw(stack, "spec", "increase(vllm:spec_decode_num_accepted_tokens_total[W])")
    drafted = raw(stack, "spec", "increase(vllm:spec_decode_num_draft_tokens_total[W])")
    assert figure(f, "per_pass") == pytest.approx((generated - first) / steps)
    assert figure(f, "acceptance") == pytest.approx(accepted / drafted)
    assert figure(f, "per_pass") > 2  # greedy decoding of random weights repeats itself


def test_a_flood_on_a_small_pool_fills_it_and_says_what_pool_would_hold_it(
    stack: RealStack,
) -> None:
    f = findings(stack, "flood")["kv_pool"]
    assert f["finding"] in ("preemption_storm", "saturated")
    assert figure(f, "capacity") == 4096
    assert figure(f, "fill") >= 0.95
    assert figure(f, "fill") == raw(stack, "flood", "max_over_time(vllm:kv_cache_usage_perc[W])")
    waiting = raw(stack, "flood", "max_over_time(vllm:num_requests_waiting[W])")
    assert figure(f, "waiting") == waiting > 0
    if f["finding"] == "preemption_storm":
        preempted = raw(stack, "flood", "increase(vllm:num_preemptions_total[W])")
        assert figure(f, "preempted") == pytest.approx(preempted)
    # The pool that holds every running and waiting request at the mean size, by hand:
    used = raw(stack, "flood", "avg_over_time(glassbox_kv_cache_used_tokens[W])")
    running = raw(stack, "flood", "avg_over_time(vllm:num_requests_running[W])")
    most = raw(stack, "flood", "max_over_time(vllm:num_requests_running[W])")
    tokens = used / running * (most + waiting)
    memory = math.ceil(tokens / BLOCK) * BLOCK * KV_BYTES_PER_TOKEN
    said = {k: v["value"] for c in f["change"] for k, v in c["figures"].items()}
    assert said["demanded"] == pytest.approx(tokens)
    assert said["memory"] == memory
    assert said["now"] == 8 * 1024**2  # the stack's --kv-cache-memory-bytes
    assert "--kv-cache-memory-bytes" in f["change"][-1]["text"]


def test_the_flood_burns_the_end_to_end_objective_fast_and_names_the_pool_behind_it(
    stack: RealStack,
) -> None:
    """stack-e2e: whole answers within 2.5 s for 99 % (a budget of 0.01); most flood
    requests take longer (docs/slo.md). Its burn rates are its records' error ratios over
    the budget, worked out here from the records themselves."""
    found = findings(stack, "flood")
    f = found["slo stack-e2e"]
    assert (f["finding"], f["severity"]) == ("fast_burn", "critical")
    record = 'namespace_job_model_name_slo:glassbox_slo_error_ratio:{}{{slo="stack-e2e"}}'
    assert figure(f, "burn_long") == pytest.approx(
        raw(stack, "flood", record.format("rate1h")) / 0.01
    )
    assert figure(f, "burn_short") == pytest.approx(
        raw(stack, "flood", record.format("rate5m")) / 0.01
    )
    assert figure(f, "burn_long") > 14.4 and figure(f, "threshold") == 2.5
    assert f"kv_pool/{found['kv_pool']['finding']}" in f["see"]


def test_sampled_requests_draft_for_nothing(stack: RealStack) -> None:
    f = findings(stack, "fill")["speculation"]
    accepted = raw(stack, "fill", "increase(vllm:spec_decode_num_accepted_tokens_total[W])")
    drafted = raw(stack, "fill", "increase(vllm:spec_decode_num_draft_tokens_total[W])")
    assert figure(f, "acceptance") == pytest.approx(accepted / drafted)
    assert f["finding"] == "not_paying"


def test_the_exporter_explains_its_own_window(stack: RealStack) -> None:
    ran = explain(["--exporter", stack.exporter_url, "--format", "json"])
    assert (ran.status, ran.err) == (0, "")
    (scene,) = json.loads(ran.out)["scenes"]
    assert scene["scope"]["source"] == "exporter"
    assert scene["scope"]["model"] == stack.served_model_name
