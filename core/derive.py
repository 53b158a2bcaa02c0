"""The derivation core: every number glassbox publishes, as pure functions.

The exporter (over a sliding window), the lab (around one request) and the tests all
compute derived values here and nowhere else. Inputs are `Increase`s: how much each
canonical counter grew over some span. A ratio whose denominator did not grow is None:
absent, never 0 and never NaN.

Counter increases follow one rule, whoever asks (`increase_between`): a counter absent
before counts from 0 (vLLM creates some lazily); when vLLM restarted, every counter of
the engine starts again from 0. A restart shows as a new `process_start_time_seconds`, or
as any `_total` or `_count` counter going down (vLLM's multiprocess mode, i.e. every
data-parallel deployment of recent versions, has no process series). A `_sum` going down
alone is not a restart: the histogram observed a negative value (TTFT is measured on the
wall clock), and that poll adds 0 to it, neither a negative value nor a spike.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from vllm_glassbox.core import snapshot as s
from vllm_glassbox.core.units import GIB


def counter_increase(before: float, after: float) -> float:
    """Prometheus' rule for one counter on its own: a decrease means it restarted at 0."""
    return after - before if after >= before else after


def ratio(numerator: float, denominator: float) -> float | None:
    """numerator / denominator; absent when the denominator did not grow, or when either
    is unknown (NaN: a counter the window's polls did not all see, exporter/history.py)."""
    if not (denominator > 0 and math.isfinite(numerator) and math.isfinite(denominator)):
        return None
    return numerator / denominator


@dataclass(frozen=True)
class Increase:
    """How much each canonical counter grew over `seconds` (for one engine, or combined).

    Two ways to combine increases, never confused: `alongside` for engines over the same
    span (data-parallel engines: the span stays), `then` for spans one after the other
    (sequential runs: the spans add up). Both sum the counters, so ratios aggregate by
    summing numerators and denominators, never by averaging ratios.
    """

    counters: Mapping[str, float]
    seconds: float

    def __getitem__(self, name: str) -> float:
        return self.counters.get(name, 0.0)

    def has(self, name: str) -> bool:
        return name in self.counters

    def _summed(self, other: Increase, seconds: float) -> Increase:
        names = set(self.counters) | set(other.counters)
        return Increase({n: self[n] + other[n] for n in names}, seconds)

    def alongside(self, other: Increase) -> Increase:
        """Another engine over the same span: counters summed, the longer span kept."""
        return self._summed(other, max(self.seconds, other.seconds))

    def then(self, other: Increase) -> Increase:
        """The span that followed this one: counters summed, spans added."""
        return self._summed(other, self.seconds + other.seconds)

    def unknown(self, name: str) -> Increase:
        """The same, with `name`'s increase unknown (NaN): every ratio over it is absent."""
        return Increase({**self.counters, name: math.nan}, self.seconds)


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


def engines_together(increases: Iterable[Increase], seconds: float = 0.0) -> Increase:
    """Every engine's increase over the same span, combined (`Increase.alongside`)."""
    total = Increase({}, seconds)
    for one in increases:
        total = total.alongside(one)
    return total


def process_restarted(before_start: float | None, after_start: float | None) -> bool:
    """vLLM's `process_start_time_seconds` changed between two readings."""
    return before_start is not None and after_start is not None and before_start != after_start


def counters_restarted(before: Mapping[str, float], after: Mapping[str, float]) -> bool:
    """A `_total` or `_count` counter of one engine went down: the engine started again
    from zero. A `_sum` going down alone is a negative observation, not a restart."""
    return any(
        name in before and value < before[name]
        for name, value in after.items()
        if name not in s.SUMS
    )


def increase_between(
    before: Mapping[str, float],
    after: Mapping[str, float],
    seconds: float,
    restarted: bool = False,
) -> Increase:
    """Increase of one engine's counters from one reading to the next (the rule above).

    `restarted` says the process restarted in between (its start time changed); a counter
    going down says so too. A `_sum` that went down alone (a histogram observed a negative
    value: vLLM's TTFT is measured on the wall clock, which can step back) grew by an
    unknown amount: NaN, so every ratio over it is absent (`ratio`), never 0.
    """
    from_zero = restarted or counters_restarted(before, after)
    return Increase(
        {
            name: value
            if from_zero or name not in before
            else value - before[name]
            if value >= before[name]
            else math.nan
            for name, value in after.items()
        },
        seconds,
    )


def snapshot_increases(
    before: s.Snapshot, after: s.Snapshot, seconds: float
) -> dict[s.EngineKey, Increase]:
    """Each engine's increase from one page to a later one (an engine absent before
    counts from 0)."""
    restarted = process_restarted(before.process_start_time, after.process_start_time)
    return {
        key: increase_between(
            before.engines[key].counters if key in before.engines else {},
            sample.counters,
            seconds,
            restarted,
        )
        for key, sample in after.engines.items()
    }


# --- decode -----------------------------------------------------------------------------


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


def physically_possible(
    value: float | None, at_least: float | None = None, at_most: float | None = None
) -> float | None:
    """The one rule for numbers that cannot be: a value outside what physics allows comes
    from an input glassbox misread (a layout, a counter of another meaning), so it is
    absent, never published. Every engine step of a serving engine makes at least one
    token; no GPU reads faster than its peak."""
    if value is None:
        return None
    if (at_least is not None and value < at_least) or (at_most is not None and value > at_most):
        return None
    return value


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


# --- service-level objectives -----------------------------------------------------------
# glassbox/slo_rules.yaml computes the same in PromQL (from the same counter increases:
# tests/rules/test_slo.py holds the rules to these functions), the lab per request.


def request_time_per_output_token(
    e2e_seconds: float | None, ttft_seconds: float | None, output_tokens: int
) -> float | None:
    """vLLM's request_time_per_output_token_seconds of one request: its decode time (after
    the first token) over the tokens after the first; 0 for a request of one token, as
    vLLM records it."""
    if e2e_seconds is None or ttft_seconds is None or output_tokens < 1:
        return None
    if output_tokens == 1:
        return 0.0
    return (e2e_seconds - ttft_seconds) / (output_tokens - 1)


def requests_over_threshold(counted: float, within: float) -> float:
    """Requests a latency histogram counted beyond a boundary: all minus its bucket's."""
    return max(counted - within, 0.0)


def slo_error_ratio(bad: float, counted: float) -> float | None:
    """The share of counted requests that missed the objective (1 - its attainment)."""
    return ratio(bad, counted)


def burn_rate(error_ratio: float | None, target: float) -> float | None:
    """How many times faster than the objective allows its error budget is spent: the bad
    share over the budget (1 - target). 1 spends the budget exactly over the period."""
    if error_ratio is None or not 0 < target < 1:
        return None
    return error_ratio / (1.0 - target)


def error_budget_remaining(period_error_ratio: float | None, target: float) -> float | None:
    """The share of the period's budget not yet spent: 1 untouched, 0 spent, below 0
    overspent."""
    burned = burn_rate(period_error_ratio, target)
    return None if burned is None else 1.0 - burned


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


def weights_from_log(by_engine: Mapping[str, Sequence[float]], shards: int) -> float | None:
    """Whole-model weight bytes from the "Model loading took" lines of one startup.

    `by_engine`: for each data-parallel engine, the bytes each of its processes logged.
    Every engine holds a full copy, split into `shards` (TP × PP) parts. vLLM ≤ 0.11.0
    logs every part, later versions only the first rank of a node: a copy is the parts
    logged, scaled up to all its parts (taken as equal) when fewer were logged. The
    engines' copies are the same model, counted once.
    """
    copies = [
        sum(parts) * max(shards, len(parts)) / len(parts) for parts in by_engine.values() if parts
    ]
    return max(copies) if copies else None


def active_weights(total_bytes: float, routed_expert_bytes: float, share: float) -> float:
    """A mixture-of-experts model's weights that one token reads: all but the routed
    experts it does not use (`share` = top-k / routed experts)."""
    return total_bytes - routed_expert_bytes * (1.0 - share)


def active_weights_of(
    weights_bytes: float, checkpoint_bytes: float, checkpoint_active_bytes: float
) -> float:
    """The checkpoint's proportion of active weights, carried over to weights known from
    another source (the flag, the log)."""
    if checkpoint_bytes <= 0:
        return weights_bytes
    return weights_bytes * checkpoint_active_bytes / checkpoint_bytes


def weight_bytes_per_output_token(d: Increase, weights_bytes: float | None) -> float | None:
    """Weight bytes read per generated token: each engine step reads every weight once."""
    steps_per_token = None
    if d.has(s.ENGINE_STEPS):  # the inverse of tokens per engine step, under its rule
        steps_per_token = ratio(d[s.ENGINE_STEPS], d[s.GENERATION_TOKENS])
    r = physically_possible(steps_per_token, at_most=1.0)
    return None if r is None or weights_bytes is None else weights_bytes * r


def weight_read_bandwidth_per_gpu(
    d: Increase, weights_bytes: float | None, tensor_parallel: int = 1
) -> float | None:
    """Bytes/s one GPU reads weights at, from the mean decode step. In each step every GPU
    of a pipeline stage reads its 1/TP share while the stages run one after another, so one
    GPU reads weights / (TP × PP) in step / PP: PP cancels out."""
    step = inter_token_latency(d)
    if step is None or weights_bytes is None:
        return None
    return ratio(weights_bytes, tensor_parallel * step)


def memory_bandwidth_utilization(
    d: Increase,
    weights_bytes: float | None,
    peak_bandwidth: float | None,
    tensor_parallel: int = 1,
) -> float | None:
    """One GPU's achieved weight-read bandwidth over one GPU's peak."""
    achieved = weight_read_bandwidth_per_gpu(d, weights_bytes, tensor_parallel)
    if achieved is None or peak_bandwidth is None:
        return None
    return physically_possible(ratio(achieved, peak_bandwidth), at_most=1.0)


def decode_floor_seconds(
    weights_bytes: float | None, peak_bandwidth: float | None, tensor_parallel: int = 1
) -> float | None:
    """Physical lower bound of one decode step: each GPU reads its 1/TP share of the
    weights at its peak bandwidth (the pipeline stages' shares add up to the same time)."""
    if weights_bytes is None or peak_bandwidth is None:
        return None
    return ratio(weights_bytes, tensor_parallel * peak_bandwidth)


def marginal_weight_read_bandwidth(slope_seconds_per_gib: float) -> float | None:
    """The lab's fit of TPOT against weight GiB, read as a bandwidth: the bytes/s at which
    one more byte of the whole model costs decode time (fixed per-step costs sit in the
    intercept). A different estimator from `weight_read_bandwidth_per_gpu`, which divides
    all of one GPU's weights by the whole mean step."""
    return GIB / slope_seconds_per_gib if slope_seconds_per_gib > 0 else None


def cpu_seconds_per_second(
    before: float | None, after: float | None, seconds: float
) -> float | None:
    """CPU seconds a process used per second of wall time (1.0: one core busy throughout;
    a Python event loop uses at most about that); absent without both readings or when
    they went down (another process answered)."""
    if before is None or after is None or after < before:
        return None
    return ratio(after - before, seconds)


# --- KV cache ---------------------------------------------------------------------------

#: KV usage from which a pool counts as full: vLLM preempts once it cannot grow a running
#: request's blocks, which a pool of whole blocks reaches short of 100 %. The lab's acts,
#: the dashboards' threshold and VLLMKVCacheSaturated's (tests/rules/test_pool_full.py).
KV_POOL_FULL = 0.95
#: A pool full within this many seconds at its recent growth is about to run out:
#: VLLMKVCacheExhaustionForecast's threshold and the lab's judgement of the forecasts
#: (tests/rules/test_pool_full.py).
KV_EXHAUSTION_WARNING_SECONDS = 600.0


def kv_cache_blocks(cache: s.CacheConfig | None) -> int | None:
    """KV blocks of one engine: vLLM labels every engine with the sum over engines."""
    if cache is None or cache.num_gpu_blocks_total is None:
        return None
    return cache.num_gpu_blocks_total // max(cache.engines, 1)


def kv_cache_capacity_tokens(
    cache: s.CacheConfig | None, logged_tokens: int | None = None, hybrid: bool = False
) -> int | None:
    """Tokens one engine's KV pool holds: vLLM's own count on its page
    (`kv_cache_size_tokens`, 0.24+, right for hybrid models too), else blocks × block
    size, else what its startup log states ("KV cache size: N tokens").

    A hybrid model (the page's mamba labels or its log say so) shares every block between
    its layer groups, so blocks × block size overstates the pool by the number of groups:
    there only vLLM's own count is taken, from the page or the log, else none."""
    if cache is not None and cache.kv_cache_size_tokens is not None:
        return cache.kv_cache_size_tokens
    if hybrid or (cache is not None and cache.hybrid):
        return logged_tokens
    blocks = kv_cache_blocks(cache)
    if blocks is not None and cache is not None and cache.block_size is not None:
        return blocks * cache.block_size
    return logged_tokens


def kv_cache_memory_bytes(cache: s.CacheConfig | None, logged_bytes: float | None) -> float | None:
    """Memory one GPU gave its KV pool: what the startup log states ("Available KV cache
    memory"), else the `--kv-cache-memory-bytes` vLLM was started with (its cache config
    on the page), which sets the pool to exactly that size and skips the profiling that
    logs the figure (the CPU build's usual case)."""
    if logged_bytes is not None:
        return logged_bytes
    if cache is not None and cache.kv_cache_memory_bytes is not None:
        return float(cache.kv_cache_memory_bytes)
    return None


def engine_sleeping(awake: float | None) -> bool | None:
    """Whether vLLM's sleep mode put the engine to sleep: `engine_sleep_state{sleep_state=
    "awake"}` is 0 (vLLM 0.11.1+); None on a page without the family (older vLLM).

    Every way to sleep discards the KV pool: `/sleep?level=1` (weights offloaded to the
    CPU), `level=2` (weights discarded too), `/release_kv_cache_memory` (the pool alone);
    a `/wake_up` of some tags only (the weights) leaves vLLM's gauge at 0, and the pool
    still gone."""
    if awake is None:
        return None
    return awake < 0.5


def kv_cache_held_tokens(capacity_tokens: int | None, sleeping: bool | None) -> int | None:
    """Tokens the KV pool of an engine holds now: its capacity, 0 while it sleeps (the pool
    discarded, whatever `cache_config_info` still says the pool is when awake). 0, not
    absent, so that every sum of pools (a fleet's capacity, its usage) leaves the sleeping
    engines out without a filter; the free tokens of a pool of 0 are absent."""
    return 0 if sleeping else capacity_tokens


def kv_cache_used_tokens(usage: float | None, capacity_tokens: int | None) -> float | None:
    if usage is None or capacity_tokens is None:
        return None
    return usage * capacity_tokens


def kv_cache_free_tokens(used_tokens: float | None, capacity_tokens: int | None) -> float | None:
    """Tokens of the pool no running request holds: capacity − used; absent where there is
    no pool (a capacity of 0: an engine asleep), which has no room rather than a full one."""
    if used_tokens is None or capacity_tokens is None or capacity_tokens <= 0:
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


def request_tokens_at_completion(d: Increase) -> float | None:
    """The KV tokens a request holds when it finishes, as the requests that finished over
    the span held them: mean prompt + mean output (vLLM's request-size histograms, observed
    at completion). Absent until a request finished in the span."""
    prompt = ratio(d[s.REQUEST_PROMPT_SUM], d[s.REQUEST_PROMPT_COUNT])
    output = ratio(d[s.REQUEST_OUTPUT_SUM], d[s.REQUEST_OUTPUT_COUNT])
    if prompt is None or output is None:
        return None
    return prompt + output


def kv_cache_headroom_requests_at_completion(
    capacity_tokens: int | None, running: float | None, tokens_at_completion: float | None
) -> float | None:
    """How many more requests fit once every running request has grown to the size requests
    reach at completion: floor((capacity − running × size) / size), whole requests;
    negative when the running requests alone will outgrow the pool (that many too many).

    It prices a young request at what it will hold, not what it holds now
    (`kv_cache_headroom_requests`), so it reaches 0 while the pool still has room: the
    pool is promised. It assumes the running requests end like those that just finished,
    none ends early and none shares blocks (prefix caching makes it pessimistic)."""
    if capacity_tokens is None or capacity_tokens <= 0 or running is None:
        return None
    if tokens_at_completion is None or tokens_at_completion <= 0:
        return None
    return float(
        math.floor((capacity_tokens - running * tokens_at_completion) / tokens_at_completion)
    )


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


class LoggedStart(Protocol):
    """One start of vLLM as its log states it: seconds per process that wrote a stage's
    line (ranks work side by side), as the log reader gives them (`cold_start.ColdStart`)."""

    @property
    def model_load_seconds(self) -> Mapping[str, float]: ...

    @property
    def weights_load_seconds(self) -> Mapping[str, float]: ...

    @property
    def compile_seconds(self) -> Mapping[str, float]: ...

    @property
    def cuda_graph_seconds(self) -> Mapping[str, float]: ...

    @property
    def engine_init_seconds(self) -> float | None:
        """The slowest engine's "init engine", compile and graph capture included."""
        ...

    @property
    def engine_init_compile_seconds(self) -> float | None:
        """Its "(compilation: S s)": vLLM's own total over its models."""
        ...

    @property
    def ready_after_seconds(self) -> float | None:
        """Process start to ready, on the log's clock."""
        ...

    @property
    def ranks_unknown(self) -> bool:
        """A stage line did not tell its rank (a prefix of no known shape, Ray's
        deduplication): no rank's seconds can be told the slowest."""
        ...


def weights_load_seconds(
    model_load: Mapping[str, float], weights_load: Mapping[str, float]
) -> float | None:
    """How long loading the weights took: the slowest process's "Model loading took" (the
    whole load), else its "Loading weights took" (the CPU build logs only the weight read)."""
    slowest = _slowest(model_load)
    return slowest if slowest is not None else _slowest(weights_load)


def startup_stages(start: LoggedStart) -> StartupStages:
    """The stages of one start (see StartupStages); none but the total when a stage line
    does not tell its rank (a prefix glassbox does not know, a line Ray deduplicated)."""
    total = start.ready_after_seconds
    if start.ranks_unknown:
        return StartupStages(None, None, None, None, None, total)
    weights_load = weights_load_seconds(start.model_load_seconds, start.weights_load_seconds)
    compile_ = start.engine_init_compile_seconds
    if compile_ is None:
        compile_ = _slowest(start.compile_seconds)
    graphs = _slowest(start.cuda_graph_seconds)
    engine_init = None
    if start.engine_init_seconds is not None:
        inside = (compile_ or 0.0) + (graphs or 0.0)
        engine_init = max(start.engine_init_seconds - inside, 0.0)
    other = None
    if total is not None:
        logged = (weights_load or 0.0) + (compile_ or 0.0) + (graphs or 0.0) + (engine_init or 0.0)
        other = max(total - logged, 0.0)
    return StartupStages(weights_load, compile_, graphs, engine_init, other, total)


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


# --- beside the increases --------------------------------------------------------------


@dataclass(frozen=True)
class Context:
    """What a derived value may need besides counter increases."""

    #: Weight bytes one decode step reads: the whole model, or for a mixture-of-experts
    #: model its active weights (shared weights plus one token's top-k experts).
    weights_bytes: float | None = None
    peak_bandwidth: float | None = None  # of one GPU
    tensor_parallel: int = 1


# --- what would change it ---------------------------------------------------------------
# The what-ifs `glassbox explain` states, each from what was measured: another precision,
# another memory budget for the KV pool, speculation's break-even. Like every number
# above, computed here only.


def kv_cache_fill(used_tokens: float | None, capacity_tokens: float | None) -> float | None:
    """Share of the pool running requests hold: used tokens / capacity."""
    if used_tokens is None or capacity_tokens is None:
        return None
    return ratio(used_tokens, capacity_tokens)


def kv_cache_bytes_per_token(
    memory_bytes: float | None, capacity_tokens: float | None
) -> float | None:
    """KV memory of one GPU per token of its pool, as the pool was sized: what one more
    token of pool costs (all layers, this GPU's share of the KV heads)."""
    if memory_bytes is None or capacity_tokens is None:
        return None
    return ratio(memory_bytes, capacity_tokens)


def kv_cache_tokens_for_memory(
    memory_bytes: float | None, bytes_per_token: float | None, block_size: int | None = None
) -> int | None:
    """Tokens a pool of `memory_bytes` (one GPU's) holds: vLLM allocates whole blocks, so
    the tokens are rounded down to a whole number of blocks."""
    if memory_bytes is None or bytes_per_token is None or bytes_per_token <= 0:
        return None
    if memory_bytes <= 0:
        return 0
    tokens = math.floor(memory_bytes / bytes_per_token + 1e-9)
    if block_size:
        tokens -= tokens % block_size
    return tokens


def kv_cache_memory_for_tokens(
    tokens: float | None, bytes_per_token: float | None, block_size: int | None = None
) -> float | None:
    """Memory of one GPU a pool of at least `tokens` needs (whole blocks): what to give
    `--kv-cache-memory-bytes`."""
    if tokens is None or bytes_per_token is None or tokens < 0:
        return None
    whole = math.ceil(tokens - 1e-9)
    if block_size:
        whole = math.ceil(whole / block_size) * block_size
    return whole * bytes_per_token


def kv_cache_memory_with_weights(
    memory_bytes: float | None,
    weights_bytes: float | None,
    other_weights_bytes: float | None,
    shards: int = 1,
) -> float | None:
    """One GPU's KV memory when the model's weights weigh `other_weights_bytes` instead:
    under `--gpu-memory-utilization` vLLM gives the pool what the weights leave, so every
    byte of weights saved on a GPU (its 1/`shards` share, TP × PP) becomes KV cache."""
    if memory_bytes is None or weights_bytes is None or other_weights_bytes is None:
        return None
    return memory_bytes + (weights_bytes - other_weights_bytes) / max(shards, 1)


def kv_cache_memory_at_utilization(
    memory_bytes: float | None,
    utilization: float | None,
    other_utilization: float | None,
    gpu_memory_bytes: float | None,
) -> float | None:
    """One GPU's KV memory at another `--gpu-memory-utilization`: vLLM's budget is that
    share of the GPU's memory, and the pool gets what the budget gains or loses."""
    if (
        memory_bytes is None
        or utilization is None
        or other_utilization is None
        or gpu_memory_bytes is None
    ):
        return None
    return memory_bytes + (other_utilization - utilization) * gpu_memory_bytes


def gpu_memory_utilization_for(
    memory_bytes: float | None,
    current_memory_bytes: float | None,
    utilization: float | None,
    gpu_memory_bytes: float | None,
) -> float | None:
    """The `--gpu-memory-utilization` that gives one GPU's pool `memory_bytes` when
    `utilization` gave it `current_memory_bytes` (the inverse of
    `kv_cache_memory_at_utilization`); absent above 1, which no GPU has."""
    if (
        memory_bytes is None
        or current_memory_bytes is None
        or utilization is None
        or gpu_memory_bytes is None
    ):
        return None
    r = ratio(memory_bytes - current_memory_bytes, gpu_memory_bytes)
    return physically_possible(None if r is None else utilization + r, at_most=1.0)


def weights_at_bits(
    weights_bytes: float | None, bits: float, from_bits: float = 16.0
) -> float | None:
    """The weights stored at `bits` a parameter instead of `from_bits`: every weight
    scaled alike (a quantized checkpoint keeps its embeddings and norms wider, so it
    weighs somewhat more: Qwen2.5-7B's AWQ is 37.6 % of its BF16, not 25 %)."""
    if weights_bytes is None or from_bits <= 0:
        return None
    return weights_bytes * bits / from_bits


def requests_that_fit(pool_tokens: float | None, request_tokens: float | None) -> float | None:
    """Whole requests of `request_tokens` each that a pool of `pool_tokens` holds."""
    if pool_tokens is None or request_tokens is None or request_tokens <= 0:
        return None
    return float(math.floor(pool_tokens / request_tokens + 1e-9))


def kv_cache_tokens_demanded(
    request_tokens: float | None, running: float | None, waiting: float | None
) -> float | None:
    """Pool tokens the running and the waiting requests hold together at `request_tokens`
    each (the current mean size, as the rules' replicas_needed counts them)."""
    if request_tokens is None or running is None or waiting is None:
        return None
    return request_tokens * (running + waiting)


def tokens_recomputed_by_preemptions(
    preemptions: float | None, request_tokens: float | None
) -> float | None:
    """Tokens vLLM computes again after preempting: a preempted request (vLLM V1) drops
    its KV cache and is prefilled again from its prompt and what it had generated; at
    the current mean size, each preemption costs one request's tokens."""
    if preemptions is None or request_tokens is None:
        return None
    return preemptions * request_tokens


def decode_step_at_bandwidth(
    weights_bytes: float | None, bandwidth_per_gpu: float | None, tensor_parallel: int = 1
) -> float | None:
    """Seconds of one decode step that reads `weights_bytes` at `bandwidth_per_gpu` (each
    GPU its 1/TP share): the step another precision would take at the bandwidth this one
    achieved, if decode is bound by weight reads (with the peak: `decode_floor_seconds`)."""
    return decode_floor_seconds(weights_bytes, bandwidth_per_gpu, tensor_parallel)


def decode_step_on_line(
    weights_bytes: float | None,
    slope_seconds_per_gib: float | None,
    intercept_seconds: float | None,
) -> float | None:
    """The lab's fitted line TPOT = a·GiB + b at `weights_bytes`: the fixed per-step cost
    (b) included, which a bandwidth alone leaves out."""
    if weights_bytes is None or slope_seconds_per_gib is None or intercept_seconds is None:
        return None
    return slope_seconds_per_gib * weights_bytes / GIB + intercept_seconds


def time_per_token_of_step(
    step_seconds: float | None, tokens_per_forward_pass: float | None
) -> float | None:
    """Seconds per decode token when one step of `step_seconds` makes
    `tokens_per_forward_pass` tokens (1 without speculation)."""
    if step_seconds is None or tokens_per_forward_pass is None:
        return None
    return ratio(step_seconds, tokens_per_forward_pass)


def prediction_error(predicted: float | None, measured: float | None) -> float | None:
    """How far a prediction landed from the measured value: predicted / measured − 1."""
    if predicted is None or measured is None:
        return None
    r = ratio(predicted, measured)
    return None if r is None else r - 1.0


def spec_speedup(
    step_seconds: float | None,
    tokens_per_forward_pass: float | None,
    plain_step_seconds: float | None,
) -> float | None:
    """Decode speed-up of speculation: a token's time without it (one token per step of
    `plain_step_seconds`) over its time with it."""
    with_it = time_per_token_of_step(step_seconds, tokens_per_forward_pass)
    if with_it is None or plain_step_seconds is None:
        return None
    return ratio(plain_step_seconds, with_it)


def spec_break_even_tokens_per_pass(
    step_seconds: float | None, plain_step_seconds: float | None
) -> float | None:
    """Tokens each speculative step must make to be as fast as plain decoding: a step
    with speculation (drafting, verifying) over a plain one."""
    if step_seconds is None or plain_step_seconds is None:
        return None
    return ratio(step_seconds, plain_step_seconds)


def spec_coverage_needed(
    tokens_per_pass_needed: float | None, mean_acceptance_length: float | None
) -> float | None:
    """Share of decode steps that must draft for speculation to make
    `tokens_per_pass_needed` tokens per step, when a drafting step makes
    `mean_acceptance_length` tokens and a step that does not draft makes one. Above 1:
    no coverage is enough at this acceptance; absent when a draft adds nothing."""
    if tokens_per_pass_needed is None or mean_acceptance_length is None:
        return None
    return ratio(max(tokens_per_pass_needed - 1.0, 0.0), mean_acceptance_length - 1.0)


def share_of(part: float | None, whole: float | None) -> float | None:
    """`part` / `whole`: a stage's share of a start, one engine's share of a total."""
    if part is None or whole is None:
        return None
    return ratio(part, whole)


def startup_without_stage(total: float | None, stage: float | None) -> float | None:
    """A start's seconds without one of its stages (which do not overlap)."""
    if total is None or stage is None:
        return None
    return max(total - stage, 0.0)
