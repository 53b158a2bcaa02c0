"""Rates and steps: decode, prefill and preemptions over an increase; how many engine
steps vLLM counts; a process's CPU.
"""

from __future__ import annotations

import math

from vllm_glassbox.core import snapshot as s
from vllm_glassbox.core.derive.arithmetic import physically_possible, ratio
from vllm_glassbox.core.derive.increases import Increase


def steps_counted_once(process_start_time: float | None, api_servers: int | None) -> bool:
    """Whether vLLM's count of engine steps (`iteration_tokens_total`'s count) counts each
    step once. Each API server observes it once per step that had one of its own requests
    (vllm/v1/engine/async_llm.py's output handler) and, in multiprocess mode, the page sums
    the API servers: a step two of them took part in counts twice (on the CPU build, 1,536
    steps counted as 1,536 + 64 for every 64-token request the other API server took,
    tests/fixtures/metrics/cpu-0.32/api2-*). The log says how many API servers run;
    without it, a page in multiprocess mode (no process_* series: several API servers,
    vLLM's default under data parallelism) may have several."""
    if api_servers is not None:
        return api_servers <= 1
    return process_start_time is not None


def decode_tokens(d: Increase) -> float:
    """Generated tokens minus each request's first token (which prefill produced);
    unknown (NaN) when the page shows either not at all: 0 would read as no decode."""
    if not (d.has(s.GENERATION_TOKENS) and d.has(s.TTFT_COUNT)):
        return math.nan
    return d[s.GENERATION_TOKENS] - d[s.TTFT_COUNT]


def time_per_output_token(d: Increase) -> float | None:
    """Seconds per decode token; correct under speculation (one ITL sample per step)."""
    return ratio(d[s.ITL_SUM], decode_tokens(d))


def inter_token_latency(d: Increase) -> float | None:
    """Mean seconds of one decode step of one sequence."""
    return ratio(d[s.ITL_SUM], d[s.ITL_COUNT])


def tokens_per_forward_pass(d: Increase) -> float | None:
    """Decode tokens per decode step of one sequence: 1.0 without speculation."""
    return ratio(decode_tokens(d), d[s.ITL_COUNT])


def engine_steps_per_second(d: Increase) -> float | None:
    # Without vLLM's step histogram on the page there is no rate, not a rate of 0.
    return ratio(d[s.ENGINE_STEPS], d.seconds) if d.has(s.ENGINE_STEPS) else None


def generation_tokens_per_second(d: Increase) -> float | None:
    return ratio(d[s.GENERATION_TOKENS], d.seconds)


def tokens_per_engine_step(d: Increase) -> float | None:
    return physically_possible(ratio(d[s.GENERATION_TOKENS], d[s.ENGINE_STEPS]), at_least=1.0)


def time_to_first_token(d: Increase) -> float | None:
    return ratio(d[s.TTFT_SUM], d[s.TTFT_COUNT])


def request_prefill_seconds(d: Increase) -> float | None:
    """Mean prefill time of the requests that finished (vLLM's engine-core timestamps)."""
    return ratio(d[s.PREFILL_SUM], d[s.PREFILL_COUNT])


def preemptions_per_second(d: Increase) -> float | None:
    # A counter vLLM does not show at all (V0 pages) is absent, not a rate of 0.
    return ratio(d[s.PREEMPTIONS], d.seconds) if d.has(s.PREEMPTIONS) else None


def time_per_token_of_step(
    step_seconds: float | None, tokens_per_forward_pass: float | None
) -> float | None:
    """Seconds per decode token when one step of `step_seconds` makes
    `tokens_per_forward_pass` tokens (1 without speculation)."""
    if step_seconds is None or tokens_per_forward_pass is None:
        return None
    return ratio(step_seconds, tokens_per_forward_pass)


def cpu_seconds_per_second(
    before: float | None, after: float | None, seconds: float
) -> float | None:
    """CPU seconds a process used per second of wall time (1.0: one core busy throughout;
    a Python event loop uses at most about that); absent without both readings or when
    they went down (another process answered)."""
    if before is None or after is None or after < before:
        return None
    return ratio(after - before, seconds)
