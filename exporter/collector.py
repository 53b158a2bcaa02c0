"""Metric families the exporter publishes, built by pure functions from one poll's state.

Sample output (abridged):

    glassbox_target_up 1.0
    glassbox_time_per_output_token_seconds{engine="0",model_name="tiny"} 0.0123
    glassbox_tokens_per_forward_pass{engine="0",model_name="tiny"} 4.8
    glassbox_spec_decode_position_acceptance_ratio{engine="0",model_name="tiny",position="0"} 0.97
    glassbox_kv_cache_capacity_tokens{engine="0",model_name="tiny"} 4096.0
    glassbox_model_weights_info{source="safetensors"} 1.0
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from .derive import (
    MOE_NOTE,
    WINDOWED,
    Context,
    FirstRequests,
    Increase,
    decode_floor_seconds,
    first_request_prefill_seconds,
    kv_cache_blocks,
    kv_cache_capacity_tokens,
    kv_cache_exhaustion_seconds,
    kv_cache_free_tokens,
    kv_cache_headroom_requests,
    kv_cache_used_tokens,
    model_load_bytes_per_second,
    spec_position_acceptance,
    startup_stages,
    warm_request_prefill_seconds,
)
from .kv_trend import Growth
from .model import ParallelLayout, Weights
from .snapshot import KV_USAGE, RUNNING, EngineKey, Snapshot
from .startup_log import ColdStart
from .textformat import ERROR_REASONS

ENGINE_LABELS = ["model_name", "engine"]


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
    build_version: str
    kv_cache_logged_tokens: int | None = None  # "KV cache size: N tokens" in vLLM's log
    layout: ParallelLayout = field(default_factory=ParallelLayout)
    cold_start: ColdStart | None = None  # the latest start in vLLM's log
    first_requests: Mapping[EngineKey, FirstRequests] = field(default_factory=dict)
    polled_at: float | None = None  # monotonic time of the latest poll (windows end there)
    used_tokens_growth: Mapping[EngineKey, Growth] = field(default_factory=dict)


def _engine_labels(key: EngineKey) -> list[str]:
    return [key.model_name, key.engine]


def derived_families(state: PollState) -> list[Metric]:
    """The series computed from vLLM's counters; empty while the target is down."""
    if not state.up or state.snapshot is None:
        return []
    context = Context(
        weights_bytes=state.weights.read_per_step if state.weights else None,
        peak_bandwidth=state.peak_bandwidth,
        tensor_parallel=state.layout.tensor,
    )
    window = f" Window: {state.window_seconds:g}s."
    families: list[Metric] = []
    for series in WINDOWED:
        family = GaugeMetricFamily(series.name, series.help + "." + window, labels=ENGINE_LABELS)
        for key, increase in sorted(state.increases.items()):
            value = series.compute(increase, context)
            if value is not None:
                family.add_metric(_engine_labels(key), value)
        families.append(family)

    covered = GaugeMetricFamily(
        "glassbox_window_covered_seconds",
        "Seconds of polls the windowed series of this engine span: the window, less up to "
        "one poll interval; shorter right after the exporter or the engine started.",
        labels=ENGINE_LABELS,
    )
    for key, increase in sorted(state.increases.items()):
        covered.add_metric(_engine_labels(key), increase.seconds)
    families.append(covered)

    by_position = GaugeMetricFamily(
        "glassbox_spec_decode_position_acceptance_ratio",
        "Acceptance at each draft position: Δ accepted_per_pos / Δ drafts." + window,
        labels=[*ENGINE_LABELS, "position"],
    )
    for key, increase in sorted(state.increases.items()):
        for position, value in spec_position_acceptance(increase).items():
            by_position.add_metric([*_engine_labels(key), position], value)
    families.append(by_position)

    kv = {
        name: GaugeMetricFamily(name, text, labels=ENGINE_LABELS)
        for name, text in (
            (
                "glassbox_kv_cache_blocks",
                "KV cache blocks of this engine (vllm:cache_config_info num_gpu_blocks / engines).",
            ),
            ("glassbox_kv_cache_block_size_tokens", "Tokens per KV cache block."),
            (
                "glassbox_kv_cache_capacity_tokens",
                "Tokens the KV pool of this engine holds (kv_cache_size_tokens, "
                "else blocks × block_size, else vLLM's startup log).",
            ),
            (
                "glassbox_kv_cache_used_tokens",
                "Tokens held by running requests: kv_cache_usage_perc × capacity.",
            ),
        )
    }
    for key, sample in state.snapshot.engines.items():
        cache = state.snapshot.cache_for(key)
        if cache is None:
            continue
        labels = _engine_labels(key)
        blocks = kv_cache_blocks(cache)
        capacity = kv_cache_capacity_tokens(cache, state.kv_cache_logged_tokens)
        if blocks is not None:
            kv["glassbox_kv_cache_blocks"].add_metric(labels, blocks)
        if cache.block_size is not None:
            kv["glassbox_kv_cache_block_size_tokens"].add_metric(labels, cache.block_size)
        if capacity is not None:
            kv["glassbox_kv_cache_capacity_tokens"].add_metric(labels, capacity)
        used = kv_cache_used_tokens(sample.gauges.get(KV_USAGE), capacity)
        if used is not None:
            kv["glassbox_kv_cache_used_tokens"].add_metric(labels, used)
    families.extend(kv.values())
    return families


def static_families(state: PollState) -> list[Metric]:
    """Facts about the model and the hardware; they do not depend on the poll."""
    layout = state.layout
    parallel = GaugeMetricFamily(
        "glassbox_parallel_info",
        "The parallel layout the weight and bandwidth series assume (vLLM's engine-config "
        "log line, else --tensor-parallel-size / --pipeline-parallel-size, else 1).",
        labels=["tensor_parallel", "pipeline_parallel", "data_parallel"],
    )
    parallel.add_metric([str(layout.tensor), str(layout.pipeline), str(layout.data)], 1)
    families: list[Metric] = [parallel]
    if state.weights is not None:
        families.append(
            GaugeMetricFamily(
                "glassbox_model_weights_bytes",
                "Bytes of the whole model's weights as vLLM holds them: a tensor- or "
                "pipeline-parallel model once, a data-parallel copy not twice "
                "(see glassbox_model_weights_info).",
                value=state.weights.bytes,
            )
        )
        info = GaugeMetricFamily(
            "glassbox_model_weights_info",
            "Where the weight bytes come from: flag, log, safetensors or config.",
            labels=["source"],
        )
        info.add_metric([state.weights.source], 1)
        families.append(info)
    if state.weights is not None and state.weights.active_bytes is not None:
        families.append(
            GaugeMetricFamily(
                "glassbox_model_active_weights_bytes",
                "Mixture-of-experts model: the weight bytes one token's forward pass reads "
                "(shared weights plus its top-k experts, in the checkpoint's proportions).",
                value=state.weights.active_bytes,
            )
        )
    if state.peak_bandwidth is not None:
        families.append(
            GaugeMetricFamily(
                "glassbox_gpu_memory_bandwidth_bytes_per_second",
                "Peak memory bandwidth of one GPU (datasheet or flag).",
                value=state.peak_bandwidth,
            )
        )
    floor = decode_floor_seconds(
        state.weights.read_per_step if state.weights else None,
        state.peak_bandwidth,
        layout.tensor,
    )
    if floor is not None:
        families.append(
            GaugeMetricFamily(
                "glassbox_decode_floor_seconds",
                "Lower bound of one decode step: weights / (tensor-parallel size × peak "
                "memory bandwidth of one GPU)" + MOE_NOTE + ".",
                value=floor,
            )
        )
    if state.kv_cache_logged_tokens is not None:
        families.append(
            GaugeMetricFamily(
                "glassbox_kv_cache_logged_capacity_tokens",
                "KV pool in tokens as vLLM's startup log states it (KV cache size: N tokens).",
                value=state.kv_cache_logged_tokens,
            )
        )
    if state.kv_cache_memory_bytes is not None:
        families.append(
            GaugeMetricFamily(
                "glassbox_kv_cache_memory_bytes",
                "Memory vLLM gave the KV cache at startup (its log: Available KV cache memory).",
                value=state.kv_cache_memory_bytes,
            )
        )
    return families


def startup_families(state: PollState) -> list[Metric]:
    """How long the latest start of vLLM took, by stage (from its log; kept while vLLM is
    down, since they describe a start that happened)."""
    cold = state.cold_start
    if cold is None:
        return []
    labels = ["model_name", "start"]
    values = [cold.model_name or "", cold.start_label]
    stages = startup_stages(cold)
    by_stage = GaugeMetricFamily(
        "glassbox_startup_stage_seconds",
        "Seconds of each stage of the latest start of vLLM, from its log: weights_load, "
        "compile (torch.compile), cuda_graphs (graph capture), engine_init (vLLM's init "
        "engine less compile and graph capture: profiling, KV allocation, warm-up), other "
        "(the rest of process start to ready); absent for stages the version does not log.",
        labels=[*labels, "stage"],
    )
    for stage, seconds in stages.by_stage().items():
        by_stage.add_metric([*values, stage], seconds)
    total = GaugeMetricFamily(
        "glassbox_startup_seconds",
        "Seconds from process start to ready of the latest start of vLLM: its log's time "
        "from the server-version line to the Starting vLLM server line.",
        labels=labels,
    )
    if stages.total is not None:
        total.add_metric(values, stages.total)
    load_rate = GaugeMetricFamily(
        "glassbox_model_load_bytes_per_second",
        "How fast the latest start loaded the weights: model weight bytes / weights_load "
        "seconds (tensor-parallel ranks load side by side: their sum).",
        labels=labels,
    )
    rate = model_load_bytes_per_second(
        state.weights.bytes if state.weights else None, stages.weights_load
    )
    if rate is not None:
        load_rate.add_metric(values, rate)
    return [by_stage, total, load_rate]


def kv_headroom_families(state: PollState) -> list[Metric]:
    """Room left in each engine's KV pool, for autoscaling; empty while the target is down."""
    if not state.up or state.snapshot is None:
        return []
    free = GaugeMetricFamily(
        "glassbox_kv_cache_free_tokens",
        "Tokens of the KV pool no running request holds: capacity − used.",
        labels=ENGINE_LABELS,
    )
    headroom = GaugeMetricFamily(
        "glassbox_kv_cache_headroom_requests",
        "How many more requests of the current mean size fit in the KV pool: "
        "floor(free tokens / (used tokens / running requests)); absent while none runs.",
        labels=ENGINE_LABELS,
    )
    exhaustion = GaugeMetricFamily(
        "glassbox_kv_cache_exhaustion_seconds",
        "Seconds until the KV pool is full at the window's growth of used tokens: "
        "free tokens / (Δ used tokens / window seconds); absent unless used tokens grew.",
        labels=ENGINE_LABELS,
    )
    for key, sample in sorted(state.snapshot.engines.items()):
        cache = state.snapshot.cache_for(key)
        capacity = kv_cache_capacity_tokens(cache, state.kv_cache_logged_tokens)
        used = kv_cache_used_tokens(sample.gauges.get(KV_USAGE), capacity)
        labels = _engine_labels(key)
        left = kv_cache_free_tokens(used, capacity)
        if left is not None:
            free.add_metric(labels, left)
        fit = kv_cache_headroom_requests(used, capacity, sample.gauges.get(RUNNING))
        if fit is not None:
            headroom.add_metric(labels, fit)
        growth = state.used_tokens_growth.get(key)
        if growth is not None:
            seconds = kv_cache_exhaustion_seconds(left, growth.tokens, growth.seconds)
            if seconds is not None:
                exhaustion.add_metric(labels, seconds)
    return [free, headroom, exhaustion]


def first_request_families(state: PollState) -> list[Metric]:
    """The first request's prefill after each start, beside the warm mean."""
    if not state.up or state.snapshot is None:
        return []
    first = GaugeMetricFamily(
        "glassbox_first_request_prefill_seconds",
        "Mean prefill seconds of the first request(s) to finish after vLLM started (the "
        "first poll that saw any): first-use compilation lands here.",
        labels=ENGINE_LABELS,
    )
    for key, requests in sorted(state.first_requests.items()):
        value = first_request_prefill_seconds(requests)
        if value is not None:
            first.add_metric(_engine_labels(key), value)
    warm = GaugeMetricFamily(
        "glassbox_warm_request_prefill_seconds",
        "Mean prefill seconds of the requests that finished in the window, without the "
        "first ones after a start: Δ prefill sum / Δ prefill count (vLLM's "
        f"request_prefill_time_seconds). Window: {state.window_seconds:g}s.",
        labels=ENGINE_LABELS,
    )
    if state.polled_at is not None:
        for key, increase in sorted(state.increases.items()):
            value = warm_request_prefill_seconds(
                increase, state.first_requests.get(key), state.polled_at - increase.seconds
            )
            if value is not None:
                warm.add_metric(_engine_labels(key), value)
    return [first, warm]


def self_families(state: PollState) -> list[Metric]:
    """The exporter observing itself and its target; present whatever vLLM does."""
    families: list[Metric] = []
    if state.up is not None:
        families.append(
            GaugeMetricFamily(
                "glassbox_target_up",
                "1 if the last poll of vLLM succeeded, else 0.",
                value=1.0 if state.up else 0.0,
            )
        )
    families += [
        GaugeMetricFamily(
            "glassbox_scrape_duration_seconds",
            "Wall time of the last poll of vLLM (fetch, parse, derive).",
            value=state.scrape_duration_seconds,
        ),
        GaugeMetricFamily(
            "glassbox_window_seconds",
            "Window of every windowed series.",
            value=state.window_seconds,
        ),
    ]
    errors = CounterMetricFamily(
        "glassbox_scrape_errors_total",
        "Failed polls of vLLM, by reason; reason slow counts polls answered after the "
        "interval, which are read and are not failures.",
        labels=["reason"],
    )
    for reason in ERROR_REASONS:
        errors.add_metric([reason], state.errors.get(reason, 0))
    families.append(errors)
    families.append(
        CounterMetricFamily(
            "glassbox_target_restarts_total",
            "Restarts of vLLM seen: process_start_time_seconds changed, or a _total or "
            "_count counter of an engine went down.",
            value=state.restarts,
        )
    )
    if state.last_success_unix is not None:
        families.append(
            GaugeMetricFamily(
                "glassbox_last_scrape_success_timestamp_seconds",
                "Unix time of the last successful poll.",
                value=state.last_success_unix,
            )
        )
    build = GaugeMetricFamily("glassbox_build_info", "The exporter's version.", labels=["version"])
    build.add_metric([state.build_version], 1)
    families.append(build)
    if state.up and state.vllm_version is not None:  # no stale facts while vLLM is down
        info = GaugeMetricFamily(
            "glassbox_vllm_info", "vLLM's version (from /version).", labels=["version"]
        )
        info.add_metric([state.vllm_version], 1)
        families.append(info)
    return families


def build_families(state: PollState) -> list[Metric]:
    return (
        self_families(state)
        + static_families(state)
        + derived_families(state)
        + startup_families(state)
        + kv_headroom_families(state)
        + first_request_families(state)
    )
