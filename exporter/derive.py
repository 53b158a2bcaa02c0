"""The derivation core: every number glassbox publishes, as pure functions.

The exporter (over a sliding window), the lab (around one request) and the tests all
compute derived values here and nowhere else. Inputs are `Increase`s: how much each
canonical counter grew over some span, with Prometheus `increase()` semantics (a decrease
is a counter reset, never a negative value). A ratio whose denominator did not grow is
None: absent, never 0 and never NaN.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from . import snapshot as s
from .startup_log import ColdStart, read_cold_starts


def counter_increase(before: float, after: float) -> float:
    """Increase of a counter between two readings; a decrease means it restarted at 0."""
    return after - before if after >= before else after


def ratio(numerator: float, denominator: float) -> float | None:
    return numerator / denominator if denominator > 0 else None


@dataclass(frozen=True)
class Increase:
    """How much each canonical counter grew over `seconds` (for one engine, or summed)."""

    counters: Mapping[str, float]
    seconds: float

    def __getitem__(self, name: str) -> float:
        return self.counters.get(name, 0.0)

    def __add__(self, other: Increase) -> Increase:
        """Aggregate engines: sum numerators and denominators, never average ratios."""
        names = set(self.counters) | set(other.counters)
        return Increase({n: self[n] + other[n] for n in names}, max(self.seconds, other.seconds))

    def has(self, name: str) -> bool:
        return name in self.counters


def increase_between(
    before: Mapping[str, float],
    after: Mapping[str, float],
    seconds: float,
    restarted: bool = False,
) -> Increase:
    """Increase from one counter reading to the next (the lab's before/after snapshots).

    A counter absent before starts from 0 (vLLM creates some lazily). `restarted` says
    the target restarted between the readings, so every counter started again from 0.
    """
    return Increase(
        {
            name: value if restarted else counter_increase(before.get(name, 0.0), value)
            for name, value in after.items()
        },
        seconds,
    )


# --- decode -----------------------------------------------------------------------------


def decode_tokens(d: Increase) -> float:
    """Generated tokens minus each request's first token (which prefill produced)."""
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
    return ratio(d[s.GENERATION_TOKENS], d[s.ENGINE_STEPS])


def time_to_first_token(d: Increase) -> float | None:
    return ratio(d[s.TTFT_SUM], d[s.TTFT_COUNT])


def request_prefill_seconds(d: Increase) -> float | None:
    """Mean prefill time of the requests that finished (vLLM's engine-core timestamps)."""
    return ratio(d[s.PREFILL_SUM], d[s.PREFILL_COUNT])


def preemptions_per_second(d: Increase) -> float | None:
    # A counter vLLM does not show at all (V0 pages) is absent, not a rate of 0.
    return ratio(d[s.PREEMPTIONS], d.seconds) if d.has(s.PREEMPTIONS) else None


# --- speculative decoding ---------------------------------------------------------------


def spec_acceptance_ratio(d: Increase) -> float | None:
    return ratio(d[s.SPEC_ACCEPTED], d[s.SPEC_DRAFT_TOKENS])


def spec_mean_acceptance_length(d: Increase) -> float | None:
    r = ratio(d[s.SPEC_ACCEPTED], d[s.SPEC_DRAFTS])
    return None if r is None else 1.0 + r


def spec_position_acceptance(d: Increase) -> dict[str, float]:
    """Acceptance ratio at each draft position (absent when no draft was made)."""
    out: dict[str, float] = {}
    for position in s.spec_positions(d.counters):
        r = ratio(d[s.SPEC_ACCEPTED_AT + position], d[s.SPEC_DRAFTS])
        if r is not None:
            out[position] = r
    return out


def spec_draft_coverage(d: Increase) -> float | None:
    """Share of decode steps that speculated at all; absent without spec counters."""
    if not d.has(s.SPEC_DRAFTS):
        return None
    return ratio(d[s.SPEC_DRAFTS], d[s.ITL_COUNT])


# --- weights and memory bandwidth -------------------------------------------------------


def weight_bytes_per_output_token(d: Increase, weights_bytes: float | None) -> float | None:
    """Weight bytes read per generated token: each engine step reads every weight once."""
    r = ratio(d[s.ENGINE_STEPS], d[s.GENERATION_TOKENS]) if d.has(s.ENGINE_STEPS) else None
    return None if r is None or weights_bytes is None else weights_bytes * r


def weight_read_bandwidth(d: Increase, weights_bytes: float | None) -> float | None:
    """Bytes/s achieved reading the weights: weights over the mean decode step time."""
    step = inter_token_latency(d)
    return None if step is None or weights_bytes is None else ratio(weights_bytes, step)


def memory_bandwidth_utilization(
    d: Increase, weights_bytes: float | None, peak_bandwidth: float | None
) -> float | None:
    achieved = weight_read_bandwidth(d, weights_bytes)
    return None if achieved is None or peak_bandwidth is None else ratio(achieved, peak_bandwidth)


def decode_floor_seconds(weights_bytes: float | None, peak_bandwidth: float | None) -> float | None:
    """Physical lower bound of one decode step: every weight byte read at peak bandwidth."""
    if weights_bytes is None or peak_bandwidth is None:
        return None
    return ratio(weights_bytes, peak_bandwidth)


# --- KV cache ---------------------------------------------------------------------------


def kv_cache_used_tokens(usage: float | None, capacity_tokens: int | None) -> float | None:
    if usage is None or capacity_tokens is None:
        return None
    return usage * capacity_tokens


def kv_cache_free_tokens(used_tokens: float | None, capacity_tokens: int | None) -> float | None:
    """Tokens of the pool no running request holds: capacity − used."""
    if used_tokens is None or capacity_tokens is None:
        return None
    return max(capacity_tokens - used_tokens, 0.0)


def kv_cache_mean_request_tokens(used_tokens: float | None, running: float | None) -> float | None:
    """The current mean size of a running request in the pool: used tokens / running."""
    if used_tokens is None or running is None or used_tokens <= 0:
        return None
    return ratio(used_tokens, running)


def kv_cache_headroom_requests(
    used_tokens: float | None, capacity_tokens: int | None, running: float | None
) -> float | None:
    """How many more requests of the current mean size fit in the pool (whole requests)."""
    free = kv_cache_free_tokens(used_tokens, capacity_tokens)
    mean = kv_cache_mean_request_tokens(used_tokens, running)
    if free is None or mean is None:
        return None
    return float(math.floor(free / mean))


def kv_cache_exhaustion_seconds(
    free_tokens: float | None, used_growth_tokens: float, growth_seconds: float
) -> float | None:
    """Seconds until the pool is full at the window's growth of used tokens; absent unless
    used tokens grew."""
    rate = ratio(used_growth_tokens, growth_seconds)
    if free_tokens is None or rate is None or rate <= 0:
        return None
    return free_tokens / rate


# --- cold start -------------------------------------------------------------------------

STARTUP_STAGES = ("weights_load", "compile", "cuda_graphs", "engine_init", "other")


def _slowest(per_process: Mapping[str, float]) -> float | None:
    """A stage that ranks run side by side takes as long as its slowest rank."""
    return max(per_process.values()) if per_process else None


@dataclass(frozen=True)
class StartupStages:
    """Seconds of one start of vLLM, by stage; None for what the log does not show.

    The stages do not overlap, so they stack up to `total` (process start to ready):
    weights_load, then engine_init (vLLM's "init engine" less the compile and graph capture
    it contains: memory profiling, KV allocation, warm-up), compile, cuda_graphs, and
    other (the rest of the total: processes starting, the API server).
    """

    weights_load: float | None
    compile: float | None
    cuda_graphs: float | None
    engine_init: float | None
    other: float | None
    total: float | None

    def by_stage(self) -> dict[str, float]:
        """The stages present, by name (STARTUP_STAGES order)."""
        values = {name: getattr(self, name) for name in STARTUP_STAGES}
        return {name: value for name, value in values.items() if value is not None}


def startup_seconds(cold: ColdStart) -> float | None:
    """Process start to ready: the log's time from the server-version line to the API
    server's "Starting vLLM … server … on" line."""
    if cold.started_at is None or cold.ready_at is None:
        return None
    return cold.started_at.seconds_until(cold.ready_at)


def startup_stages(cold: ColdStart) -> StartupStages:
    """The stages of one start (see StartupStages)."""
    # "Model loading took" covers the whole load; the CPU build logs only the weight read.
    weights_load = _slowest(cold.model_load_seconds)
    if weights_load is None:
        weights_load = _slowest(cold.weights_load_seconds)
    # The init-engine line's "(compilation: S s)" is vLLM's own total over its models.
    compile_ = cold.engine_init_compile_seconds
    if compile_ is None:
        compile_ = _slowest(cold.compile_seconds)
    graphs = _slowest(cold.cuda_graph_seconds)
    engine_init = None
    if cold.engine_init_seconds is not None:
        inside = (compile_ or 0.0) + (graphs or 0.0)
        engine_init = max(cold.engine_init_seconds - inside, 0.0)
    total = startup_seconds(cold)
    other = None
    if total is not None:
        logged = (weights_load or 0.0) + (compile_ or 0.0) + (graphs or 0.0) + (engine_init or 0.0)
        other = max(total - logged, 0.0)
    return StartupStages(weights_load, compile_, graphs, engine_init, other, total)


def latest_startup_stages(log_text: str) -> StartupStages | None:
    """The stages of the last start in a server's log (the lab's per-variant figures)."""
    starts = read_cold_starts(log_text)
    return startup_stages(starts[-1]) if starts else None


def model_load_bytes_per_second(
    weights_bytes: float | None, load_seconds: float | None
) -> float | None:
    """How fast the weights loaded: weights / the weights_load stage."""
    if weights_bytes is None or load_seconds is None:
        return None
    return ratio(weights_bytes, load_seconds)


# --- the first request after a start ----------------------------------------------------


@dataclass(frozen=True)
class FirstRequests:
    """The request(s) that finished first after a start: vLLM's prefill-time counters at
    the first poll that saw any (counted from 0 at the start), and when that poll was."""

    prefill_sum: float
    prefill_count: float
    at: float  # the poll's monotonic time


def first_request_prefill_seconds(first: FirstRequests | None) -> float | None:
    """Mean prefill of the first request(s) after a start: cold paths (JIT compiles) land here."""
    return None if first is None else ratio(first.prefill_sum, first.prefill_count)


def warm_request_prefill_seconds(
    d: Increase, first: FirstRequests | None, window_start: float
) -> float | None:
    """Mean prefill of the requests that finished in the window, the first ones after a
    start left out: Δ prefill sum / Δ prefill count, less the first requests' share."""
    total, count = d[s.PREFILL_SUM], d[s.PREFILL_COUNT]
    if first is not None and first.at > window_start:  # they finished inside the window
        total, count = total - first.prefill_sum, count - first.prefill_count
    return ratio(total, count)


# --- the catalogue of windowed series ---------------------------------------------------


@dataclass(frozen=True)
class Context:
    """What a derived value may need besides counter increases."""

    weights_bytes: float | None = None
    peak_bandwidth: float | None = None


@dataclass(frozen=True)
class WindowedSeries:
    """One exported series computed from an Increase over the window."""

    name: str
    help: str
    compute: Callable[[Increase, Context], float | None]


WINDOWED: tuple[WindowedSeries, ...] = (
    WindowedSeries(
        "glassbox_time_per_output_token_seconds",
        "Seconds per decode token, correct under speculative decoding: "
        "Δ ITL sum / (Δ generation tokens − Δ TTFT count)",
        lambda d, c: time_per_output_token(d),
    ),
    WindowedSeries(
        "glassbox_inter_token_latency_seconds",
        "Mean seconds of one decode step of one sequence: Δ ITL sum / Δ ITL count",
        lambda d, c: inter_token_latency(d),
    ),
    WindowedSeries(
        "glassbox_tokens_per_forward_pass",
        "Decode tokens per decode step of one sequence (1.0 without speculation): "
        "(Δ generation tokens − Δ TTFT count) / Δ ITL count",
        lambda d, c: tokens_per_forward_pass(d),
    ),
    WindowedSeries(
        "glassbox_engine_steps_per_second",
        "Engine steps per second: Δ iteration_tokens_total_count / window seconds",
        lambda d, c: engine_steps_per_second(d),
    ),
    WindowedSeries(
        "glassbox_tokens_per_engine_step",
        "Generated tokens per engine step across the batch: Δ generation tokens / Δ engine steps",
        lambda d, c: tokens_per_engine_step(d),
    ),
    WindowedSeries(
        "glassbox_time_to_first_token_seconds",
        "Mean time to first token: Δ TTFT sum / Δ TTFT count",
        lambda d, c: time_to_first_token(d),
    ),
    WindowedSeries(
        "glassbox_spec_decode_acceptance_ratio",
        "Share of draft tokens accepted: Δ accepted tokens / Δ draft tokens",
        lambda d, c: spec_acceptance_ratio(d),
    ),
    WindowedSeries(
        "glassbox_spec_decode_mean_acceptance_length",
        "Tokens emitted per verified draft: 1 + Δ accepted tokens / Δ drafts",
        lambda d, c: spec_mean_acceptance_length(d),
    ),
    WindowedSeries(
        "glassbox_spec_decode_draft_coverage_ratio",
        "Share of decode steps that speculated at all: Δ drafts / Δ ITL count "
        "(requests that bypass speculation pull it toward 0)",
        lambda d, c: spec_draft_coverage(d),
    ),
    WindowedSeries(
        "glassbox_weight_bytes_per_output_token",
        "Weight bytes read per generated token: weights × Δ engine steps / Δ generation tokens",
        lambda d, c: weight_bytes_per_output_token(d, c.weights_bytes),
    ),
    WindowedSeries(
        "glassbox_weight_read_bandwidth_bytes_per_second",
        "Achieved bandwidth of weight reads: weights / (Δ ITL sum / Δ ITL count)",
        lambda d, c: weight_read_bandwidth(d, c.weights_bytes),
    ),
    WindowedSeries(
        "glassbox_memory_bandwidth_utilization_ratio",
        "Achieved weight-read bandwidth / peak memory bandwidth of the GPU",
        lambda d, c: memory_bandwidth_utilization(d, c.weights_bytes, c.peak_bandwidth),
    ),
    WindowedSeries(
        "glassbox_preemptions_per_second",
        "Preemptions per second: Δ num_preemptions_total / window seconds",
        lambda d, c: preemptions_per_second(d),
    ),
)
