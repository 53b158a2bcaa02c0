"""The exporter's page: the metric families of one poll, built by pure functions.

What each family is (name, type, HELP, labels) is declared in `series.py`; this module
fills them with the values of one poll's state. Sample output (abridged):

    glassbox_target_up 1.0
    glassbox_time_per_output_token_seconds{engine="0",model_name="tiny"} 0.0123
    glassbox_tokens_per_forward_pass{engine="0",model_name="tiny"} 4.8
    glassbox_spec_decode_position_acceptance_ratio{engine="0",model_name="tiny",position="0"} 0.97
    glassbox_kv_cache_capacity_tokens{engine="0",model_name="tiny"} 4096.0
    glassbox_model_weights_info{source="safetensors"} 1.0
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from vllm_glassbox.core import series
from vllm_glassbox.core.build import Build
from vllm_glassbox.core.cold_start import ColdStart
from vllm_glassbox.core.derive import (
    FirstRequests,
    Increase,
    cost_of_share,
    decode_floor_seconds,
    engine_hourly_cost,
    first_request_prefill_seconds,
    idle_ratio,
    kv_cache_blocks,
    kv_cache_exhaustion_seconds,
    kv_cache_free_tokens,
    kv_cache_headroom_requests,
    kv_cache_headroom_requests_at_completion,
    model_load_bytes_per_second,
    request_tokens_at_completion,
    spec_position_acceptance,
    startup_stages,
    unused_pool_ratio,
    warm_request_prefill_seconds,
)
from vllm_glassbox.core.disagg_page import KvRole
from vllm_glassbox.core.errors import ERROR_REASONS
from vllm_glassbox.core.kv_trend import Growth, KvPool
from vllm_glassbox.core.layout import ParallelLayout
from vllm_glassbox.core.snapshot import RUNNING, EngineKey, Snapshot
from vllm_glassbox.core.weights import Weights
from vllm_glassbox.explain.diagnoses import explain
from vllm_glassbox.exporter.disaggregation import (
    adapter_families,
    disaggregation_families,
    role_of,
)
from vllm_glassbox.exporter.pool_window import PoolWindow
from vllm_glassbox.exporter.scene import scene_from_state


@dataclass(frozen=True)
class PollState:
    """Everything one publication is built from."""

    up: bool | None  # None until the first poll has ended: not known yet, not down
    window_seconds: float
    scrape_duration_seconds: float
    errors: Mapping[str, int]
    restarts: int
    last_success_unix: float | None
    snapshot: Snapshot | None  # None while the target is down
    increases: Mapping[EngineKey, Increase]
    weights: Weights | None
    peak_bandwidth: float | None
    kv_cache_memory_bytes: float | None
    vllm_version: str | None
    build: Build
    kv_cache_logged_tokens: int | None = None  # "KV cache size: N tokens" in vLLM's log
    layout: ParallelLayout = field(default_factory=ParallelLayout)
    cold_start: ColdStart | None = None  # the latest start in vLLM's log
    first_requests: Mapping[EngineKey, FirstRequests] = field(default_factory=dict)
    polled_at: float | None = None  # monotonic time of the latest poll (windows end there)
    last_restart_unix: float | None = None  # when a poll last saw vLLM restart
    #: Shapes of the target itself glassbox cannot read (several servers behind it), with
    #: what shows them.
    target_shapes: Mapping[str, str] = field(default_factory=dict)
    used_tokens_growth: Mapping[EngineKey, Growth] = field(default_factory=dict)
    # Each engine's KV pool as of this poll (`kv_trend.kv_pools`), computed once by the poll.
    kv_pools: Mapping[EngineKey, KvPool] = field(default_factory=dict)
    # Shapes of vLLM's latest start in its log that glassbox does not read (shape -> line).
    log_unrecognised: Mapping[str, str] = field(default_factory=dict)
    kv_hybrid_in_log: bool = False  # the log says the KV pool is shared by layer groups
    # The model_name `weights` are of: engines serving another have no weight-based series
    # (None: the engines' whatever their name).
    weights_model: str | None = None
    # Weights glassbox has but of another model than vLLM serves, by the input that shows
    # it (page: another model_name; log: another start) -> what shows it.
    weights_of_another_model: Mapping[str, str] = field(default_factory=dict)
    # Engine steps counted once per API server that took part (derive.steps_counted_once):
    # the input that shows it and how; their series are absent.
    steps_per_api_server: tuple[str, str] | None = None
    # The weights of the model the log's latest start loaded (its load rate), "as_page":
    # those of `weights`.
    start_weights: Weights | Literal["as_page"] | None = "as_page"
    # The KV role and connector the log's --kv-transfer-config states, and the peak of the
    # link a consumer receives KV on (--kv-link-bandwidth, bytes/s).
    kv_role_in_log: KvRole | None = None
    kv_link_bandwidth: float | None = None
    # Each engine's pool over the window (peaks, preemptions and when): computed when the
    # findings ask for them.
    pool_window: PoolWindow | None = None
    # The price of one GPU hour (--gpu-hour-price), and each engine's readings of running
    # requests and KV usage in the window's polls: the cost series.
    gpu_hour_price: float | None = None
    running_readings: Mapping[EngineKey, Sequence[float]] = field(default_factory=dict)
    kv_usage_readings: Mapping[EngineKey, Sequence[float]] = field(default_factory=dict)

    def engine_hourly_cost(self) -> float | None:
        """What one engine's GPUs cost an hour (TP × PP of them), None without a price."""
        return engine_hourly_cost(self.gpu_hour_price, self.layout.tensor, self.layout.pipeline)


def _engine_labels(key: EngineKey) -> list[str]:
    return [key.model_name, key.engine]


_UNKNOWN_POOL = KvPool(None, None)


def _add(
    family: GaugeMetricFamily | CounterMetricFamily, labels: list[str], value: float | None
) -> None:
    """A series whose value is unknown is absent: never 0, never NaN."""
    if value is not None:
        family.add_metric(labels, value)


def derived_families(state: PollState) -> list[Metric]:
    """The series computed from vLLM's counters; empty while the target is down."""
    if not state.up or state.snapshot is None:
        return []
    hourly = state.engine_hourly_cost()
    tensor = state.layout.tensor
    context = series.derivation_context(state.weights, state.peak_bandwidth, tensor, hourly)
    # An engine of another model than the weights' has no weight-based series.
    unweighted = series.derivation_context(None, state.peak_bandwidth, tensor, hourly)
    window = state.window_seconds
    increases = sorted(state.increases.items())
    families: list[Metric] = []
    for windowed in series.WINDOWED:
        family = windowed.new(window)
        for key, increase in increases:
            ours = state.weights_model is None or key.model_name == state.weights_model
            value = windowed.compute(increase, context if ours else unweighted)
            _add(family, _engine_labels(key), value)
        families.append(family)

    covered = series.WINDOW_COVERED.new()
    for key, increase in increases:
        covered.add_metric(_engine_labels(key), increase.seconds)
    families.append(covered)

    by_position = series.POSITION_ACCEPTANCE.new(window)
    for key, increase in increases:
        for position, value in spec_position_acceptance(increase).items():
            by_position.add_metric([*_engine_labels(key), position], value)
    families.append(by_position)

    pool = (series.KV_BLOCKS, series.KV_BLOCK_SIZE, series.KV_CAPACITY, series.KV_USED)
    blocks, block_size, capacity, used = (family.new() for family in pool)
    sleeping = series.SLEEPING.new()
    for key in state.snapshot.engines:
        labels = _engine_labels(key)
        kv = state.kv_pools.get(key, _UNKNOWN_POOL)
        if kv.sleeping is not None:
            sleeping.add_metric(labels, 1.0 if kv.sleeping else 0.0)
        cache = state.snapshot.cache_for(key)
        if cache is not None:
            _add(blocks, labels, kv_cache_blocks(cache))
            _add(block_size, labels, cache.block_size)
        # Without a cache config on the page (the Rust front end) the log's size, if any.
        _add(capacity, labels, kv.capacity_tokens)
        _add(used, labels, kv.used_tokens)
    return [*families, blocks, block_size, capacity, used, sleeping]


def static_families(state: PollState) -> list[Metric]:
    """Facts about the model and the hardware; they do not depend on the poll."""
    layout = state.layout
    families: list[Metric] = [
        series.PARALLEL_INFO.single(1, str(layout.tensor), str(layout.pipeline), str(layout.data))
    ]
    if state.weights is not None:
        families.append(series.WEIGHTS_BYTES.single(state.weights.bytes))
        families.append(series.WEIGHTS_INFO.single(1, state.weights.source))
    if state.weights is not None and state.weights.active_bytes is not None:
        families.append(series.ACTIVE_WEIGHTS_BYTES.single(state.weights.active_bytes))
    if state.peak_bandwidth is not None:
        families.append(series.PEAK_BANDWIDTH.single(state.peak_bandwidth))
    context = series.derivation_context(state.weights, state.peak_bandwidth, layout.tensor)
    floor = decode_floor_seconds(
        context.weights_bytes, context.peak_bandwidth, context.tensor_parallel
    )
    if floor is not None:
        families.append(series.DECODE_FLOOR.single(floor))
    if state.kv_cache_logged_tokens is not None:
        families.append(series.KV_LOGGED_CAPACITY.single(state.kv_cache_logged_tokens))
    if state.kv_cache_memory_bytes is not None:
        families.append(series.KV_MEMORY.single(state.kv_cache_memory_bytes))
    return families


def startup_families(state: PollState) -> list[Metric]:
    """How long the latest start of vLLM took, by stage (from its log; kept while vLLM is
    down, since they describe a start that happened)."""
    cold = state.cold_start
    if cold is None:
        return []
    values = [cold.model_name or "", cold.start_label]
    stages = startup_stages(cold)
    by_stage = series.STARTUP_STAGE.new()
    for stage, seconds in stages.by_stage().items():
        by_stage.add_metric([*values, stage], seconds)
    total = series.STARTUP.new()
    _add(total, values, stages.total)
    load_rate = series.MODEL_LOAD_RATE.new()
    loaded = state.weights if state.start_weights == "as_page" else state.start_weights
    weights = loaded.bytes if loaded else None
    _add(load_rate, values, model_load_bytes_per_second(weights, stages.weights_load))
    return [by_stage, total, load_rate]


def kv_headroom_families(state: PollState) -> list[Metric]:
    """Room left in each engine's KV pool, for autoscaling; empty while the target is down."""
    if not state.up or state.snapshot is None:
        return []
    free = series.KV_FREE.new()
    headroom = series.KV_HEADROOM.new()
    at_completion = series.KV_HEADROOM_AT_COMPLETION.new(state.window_seconds)
    exhaustion = series.KV_EXHAUSTION.new()
    for key, sample in sorted(state.snapshot.engines.items()):
        pool = state.kv_pools.get(key, _UNKNOWN_POOL)
        used, capacity = pool.used_tokens, pool.capacity_tokens
        labels = _engine_labels(key)
        left = kv_cache_free_tokens(used, capacity)
        _add(free, labels, left)
        running = sample.gauges.get(RUNNING)
        _add(headroom, labels, kv_cache_headroom_requests(used, capacity, running))
        increase = state.increases.get(key)
        size = request_tokens_at_completion(increase) if increase is not None else None
        _add(
            at_completion, labels, kv_cache_headroom_requests_at_completion(capacity, running, size)
        )
        growth = state.used_tokens_growth.get(key)
        if growth is not None:
            seconds = kv_cache_exhaustion_seconds(left, growth.tokens, growth.seconds)
            _add(exhaustion, labels, seconds)
    return [free, headroom, at_completion, exhaustion]


def cost_families(state: PollState) -> list[Metric]:
    """The price, each engine's GPUs' cost an hour, and the share of it no request used
    (the cost per million tokens is among the windowed series); none without a price."""
    hourly = state.engine_hourly_cost()
    if state.gpu_hour_price is None or hourly is None:
        return []
    families: list[Metric] = [series.GPU_HOUR_PRICE.single(state.gpu_hour_price)]
    if not state.up or state.snapshot is None:
        return families
    cost = series.ENGINE_HOURLY_COST.new()
    idle = series.COST_IDLE.new(state.window_seconds)
    unused = series.COST_UNUSED_POOL.new(state.window_seconds)
    unused_hourly = series.COST_UNUSED_POOL_HOURLY.new(state.window_seconds)
    for key in sorted(state.snapshot.engines):
        labels = _engine_labels(key)
        cost.add_metric(labels, hourly)
        _add(idle, labels, idle_ratio(state.running_readings.get(key, ())))
        share = unused_pool_ratio(state.kv_usage_readings.get(key, ()))
        _add(unused, labels, share)
        _add(unused_hourly, labels, cost_of_share(hourly, share))
    return [*families, cost, idle, unused, unused_hourly]


def first_request_families(state: PollState) -> list[Metric]:
    """The first request's prefill after each start, beside the warm mean."""
    if not state.up or state.snapshot is None:
        return []
    first = series.FIRST_PREFILL.new()
    for key, requests in sorted(state.first_requests.items()):
        _add(first, _engine_labels(key), first_request_prefill_seconds(requests))
    warm = series.WARM_PREFILL.new(state.window_seconds)
    if state.polled_at is not None:
        for key, increase in sorted(state.increases.items()):
            value = warm_request_prefill_seconds(
                increase, state.first_requests.get(key), state.polled_at - increase.seconds
            )
            _add(warm, _engine_labels(key), value)
    return [first, warm]


def self_families(state: PollState) -> list[Metric]:
    """The exporter observing itself and its target; present whatever vLLM does."""
    families: list[Metric] = []
    if state.up is not None:
        families.append(series.TARGET_UP.single(1.0 if state.up else 0.0))
    families += [
        series.SCRAPE_DURATION.single(state.scrape_duration_seconds),
        series.WINDOW.single(state.window_seconds),
    ]
    errors = series.SCRAPE_ERRORS.new()
    for reason in ERROR_REASONS:
        errors.add_metric([reason], state.errors.get(reason, 0))
    families.append(errors)
    families.append(series.TARGET_RESTARTS.single(state.restarts))
    if state.last_restart_unix is not None:
        families.append(series.LAST_RESTART.single(state.last_restart_unix))
    if state.last_success_unix is not None:
        families.append(series.LAST_SUCCESS.single(state.last_success_unix))
    families.append(
        series.BUILD_INFO.single(
            1, state.build.version, state.build.revision, state.build.python_version
        )
    )
    if state.up and state.vllm_version is not None:  # no stale facts while vLLM is down
        families.append(series.VLLM_INFO.single(1, state.vllm_version))
    return families


def disaggregated_families(state: PollState) -> list[Metric]:
    """The KV role, prompt tokens by source, KV transfers and adapters; empty while the
    target is down."""
    if not state.up or state.snapshot is None:
        return []
    role = role_of(state.snapshot, state.kv_role_in_log, state.vllm_version)
    return disaggregation_families(
        state.snapshot, state.increases, role, state.window_seconds, state.kv_link_bandwidth
    ) + adapter_families(state.snapshot)


def unrecognised_inputs(state: PollState) -> dict[tuple[str, str], str]:
    """Every shape of the inputs glassbox does not read, by (source, shape), with what
    shows it; the page's only while vLLM is up."""
    shapes = {("log", shape): shown for shape, shown in state.log_unrecognised.items()}
    for source, shown in state.weights_of_another_model.items():
        shapes[(source, "weights_of_another_model")] = shown
    if state.up and state.steps_per_api_server is not None:
        source, shown = state.steps_per_api_server
        shapes[(source, "steps_counted_per_api_server")] = shown
    if state.up and state.snapshot is not None:
        shapes |= {("page", shape): shown for shape, shown in state.snapshot.unrecognised.items()}
        shapes |= {("page", shape): shown for shape, shown in state.target_shapes.items()}
        if state.snapshot.engines and not state.snapshot.cache and not state.kv_cache_logged_tokens:
            # vLLM's Rust front end (VLLM_USE_RUST_FRONTEND=1, opt-in in 0.33) serves no
            # cache_config_info (nor process_*): the pool's size is nowhere to be read.
            shapes[("page", "no_cache_config_info")] = (
                "a vLLM page without vllm:cache_config_info, and no KV size in the log "
                "(the Rust front end, VLLM_USE_RUST_FRONTEND=1?): engines "
                + ", ".join(sorted({key.engine for key in state.snapshot.engines}))
            )
        hybrid = [
            key.engine
            for key in state.snapshot.engines
            if (cache := state.snapshot.cache_for(key)) is not None
            and cache.kv_cache_size_tokens is None
            and (cache.hybrid or state.kv_hybrid_in_log)
            and state.kv_cache_logged_tokens is None
        ]
        if hybrid:
            shapes[("page", "hybrid_kv_groups")] = (
                "hybrid model without kv_cache_size_tokens or a logged KV size: engines "
                + ", ".join(sorted(hybrid))
            )
    return shapes


def unrecognised_families(state: PollState) -> list[Metric]:
    family = series.INPUT_UNRECOGNISED.new()
    for source, shape in sorted(unrecognised_inputs(state)):
        family.add_metric([source, shape], 1.0)
    return [family]


def finding_families(state: PollState) -> list[Metric]:
    """What `glassbox explain` finds in this poll (the same diagnoses, over the window):
    one series per finding, for a dashboard's table or an alert; the words at /findings."""
    explained = explain(scene_from_state(state, unrecognised_inputs(state)))
    family = series.FINDING_INFO.new()
    labels = {
        (explained.scope.model or "", f.diagnosis, f.finding, f.severity): None
        for f in explained.findings
    }
    for values in labels:
        family.add_metric(list(values), 1.0)
    return [family]


def poll_families(state: PollState) -> list[Metric]:
    """The families every poll publishes at once."""
    return (
        self_families(state)
        + static_families(state)
        + derived_families(state)
        + startup_families(state)
        + kv_headroom_families(state)
        + first_request_families(state)
        + cost_families(state)
        + disaggregated_families(state)
        + unrecognised_families(state)
    )


def build_families(state: PollState) -> list[Metric]:
    """The whole page of one poll. The exporter builds the findings when a scrape asks
    for them (once per poll at most, `service.py`), not at every poll: they cost a poll
    about half again what the rest of its families cost."""
    return poll_families(state) + finding_families(state)
