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
    Increase,
    decode_floor_seconds,
    kv_cache_blocks,
    kv_cache_capacity_tokens,
    kv_cache_used_tokens,
    spec_position_acceptance,
)
from .model import ParallelLayout, Weights
from .snapshot import KV_USAGE, EngineKey, Snapshot
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
    return self_families(state) + static_families(state) + derived_families(state)
