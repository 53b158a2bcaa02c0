"""vLLM glassbox / Fleet: per model and namespace, which servers are off the bandwidth
line, preempting, or out of KV headroom.

Counts and the worst servers come from the exporters' per-engine series (a table of the
worst few, not of every pod); the per-namespace lines are the recording rules, and the
lines across namespaces are sums of those records.
"""

from __future__ import annotations

from grafanalib.core import Panel
from vllm_glassbox.dashboards import queries as q
from vllm_glassbox.dashboards.common import (
    BYTES,
    ENGINE_LEGEND,
    NUMBER,
    PER_SECOND,
    RATIO,
    SECONDS,
    TOKENS_PER_SECOND,
    Q,
    Row,
    table,
    timeseries,
)
from vllm_glassbox.dashboards.common import dashboard as _dashboard
from vllm_glassbox.dashboards.exporter_help import help_of, per_engine
from vllm_glassbox.dashboards.panels import (
    ANY_PREEMPTION,
    KV_THRESHOLDS,
    NO_DECODE,
    NO_PEAK,
    YOUNG,
    fleet_q,
)

_PER_NAMESPACE_LEGEND = "{{model_name}} {{namespace}} {{cluster}}"


_SERVER_COLUMNS = ["cluster", "namespace", "model_name", "instance", "Value"]


_WORST = f"The {q.SHOWN_SERVERS} worst at the end of the range, from the exporters' series."


def fleet_servers() -> Panel:
    return timeseries(
        "vLLM servers per model and namespace",
        "vLLM targets scraped that serve each model (vllm:num_requests_running: one series "
        "per engine, grouped per server).",
        [Q(q.SERVERS, _PER_NAMESPACE_LEGEND)],
        NUMBER,
    )


def fleet_off_bandwidth_count() -> Panel:
    return timeseries(
        "Servers off the bandwidth line",
        f"Servers whose slowest engine is under {q.BANDWIDTH_LOW:.0%} (the threshold of "
        "VLLMDecodeBandwidthLow), per model and namespace. "
        f"{per_engine('glassbox_memory_bandwidth_utilization_ratio')}" + NO_PEAK,
        [Q(q.OFF_BANDWIDTH_COUNT, _PER_NAMESPACE_LEGEND)],
        NUMBER,
    )


def fleet_preempting_count() -> Panel:
    return timeseries(
        "Servers preempting",
        "Servers with any preemption over the exporter's window (above 0 on any engine), "
        f"per model and namespace. {per_engine('glassbox_preemptions_per_second')} Empty "
        "while no server preempts.",
        [Q(q.PREEMPTING_COUNT, _PER_NAMESPACE_LEGEND)],
        NUMBER,
    )


def fleet_out_of_headroom_count() -> Panel:
    return timeseries(
        "Servers out of KV headroom",
        "Servers where not one more request fits in any engine's KV pool (summed over "
        "engines, under 1), per model and namespace. "
        f"{per_engine('glassbox_kv_cache_headroom_requests')} Absent while no request runs.",
        [Q(q.OUT_OF_HEADROOM_COUNT, _PER_NAMESPACE_LEGEND)],
        NUMBER,
    )


def fleet_off_bandwidth_servers() -> Panel:
    return table(
        "Furthest off the bandwidth line",
        f"The slowest engine of each server, under {q.BANDWIDTH_LOW:.0%}. {_WORST} "
        f"{per_engine('glassbox_memory_bandwidth_utilization_ratio')}" + NO_PEAK,
        [Q(q.OFF_BANDWIDTH_SERVERS)],
        _SERVER_COLUMNS,
    )


def fleet_preempting_servers() -> Panel:
    return table(
        "Preempting most",
        f"Preemptions per second of each server, summed over engines, above 0. {_WORST} "
        f"{per_engine('glassbox_preemptions_per_second')} Empty while no server preempts.",
        [Q(q.PREEMPTING_SERVERS)],
        _SERVER_COLUMNS,
    )


def fleet_out_of_headroom_servers() -> Panel:
    return table(
        "Out of KV headroom",
        f"Requests that still fit, summed over engines, under 1. {_WORST} "
        f"{per_engine('glassbox_kv_cache_headroom_requests')} Empty while every server has "
        "room for one more request of its current size, or runs none.",
        [Q(q.OUT_OF_HEADROOM_SERVERS)],
        _SERVER_COLUMNS,
    )


def fleet_firing_alerts() -> Panel:
    return table(
        "Firing alerts per namespace",
        "Prometheus' ALERTS in state firing, counted per cluster, namespace and alert: the "
        "namespace is the route each one takes (alerts/runbook.md). Empty while no glassbox "
        "alert fires.",
        [Q(q.FIRING_ALERTS)],
        ["cluster", "namespace", "alertname", "Value"],
    )


def fleet_generation_by_namespace() -> Panel:
    return timeseries(
        "Generated tokens per model and namespace",
        "Recording rule namespace_job_model_name:vllm_generation_tokens:rate5m per "
        "namespace; dashed: summed over namespaces per model." + YOUNG,
        [
            Q(q.GENERATION_TOKENS_FLEET, _PER_NAMESPACE_LEGEND),
            fleet_q(q.GENERATION_TOKENS_BY_MODEL, "{{model_name}}, all namespaces"),
        ],
        TOKENS_PER_SECOND,
    )


def fleet_tpot_by_namespace() -> Panel:
    return timeseries(
        "TPOT per model and namespace",
        "Recording rule namespace_job_model_name:vllm_time_per_output_token_seconds:rate5m "
        "per namespace (a ratio: never averaged across namespaces)." + NO_DECODE,
        [Q(q.TPOT_FLEET, _PER_NAMESPACE_LEGEND)],
        SECONDS,
    )


def fleet_kv_usage_by_namespace() -> Panel:
    return timeseries(
        "KV usage per model and namespace, fullest engine",
        "Recording rule namespace_job_model_name:vllm_kv_cache_usage:max: the fullest "
        "engine of the namespace's servers.",
        [Q(q.KV_USAGE_FLEET, _PER_NAMESPACE_LEGEND)],
        RATIO,
        thresholds=KV_THRESHOLDS,
    )


def fleet_preemptions_by_namespace() -> Panel:
    return timeseries(
        "Preemptions per model and namespace",
        "Recording rule namespace_job_model_name:vllm_num_preemptions:rate5m per namespace; "
        "dashed: summed over namespaces per model.",
        [
            Q(q.PREEMPTIONS_FLEET, _PER_NAMESPACE_LEGEND),
            fleet_q(q.PREEMPTIONS_BY_MODEL, "{{model_name}}, all namespaces"),
        ],
        PER_SECOND,
        thresholds=ANY_PREEMPTION,
    )


def fleet_waiting_by_namespace() -> Panel:
    return timeseries(
        "Requests waiting per model and namespace",
        "Recording rule namespace_job_model_name:vllm_num_requests_waiting:sum per "
        "namespace; dashed: summed over namespaces per model.",
        [
            Q(q.WAITING_FLEET, _PER_NAMESPACE_LEGEND),
            fleet_q(q.WAITING_BY_MODEL, "{{model_name}}, all namespaces"),
        ],
        NUMBER,
    )


def fleet_headroom_by_namespace() -> Panel:
    return timeseries(
        "KV headroom per model and namespace",
        "Recording rule namespace_job_model_name:glassbox_kv_cache_headroom_requests:sum: "
        "whole requests of the current mean size that still fit, over the namespace's "
        "engines. Absent while no request runs.",
        [Q(q.KV_HEADROOM_FLEET, _PER_NAMESPACE_LEGEND)],
        NUMBER,
    )


_MODEL_LEGEND = "{{model_name}} {{namespace}} {{cluster}}"
_POD_LEGEND = "{{pod}} {{namespace}} {{cluster}}"
_NO_PRICE = (
    " Absent without a price: the exporters' --gpu-hour-price (the chart's "
    "cost.gpuHourPrice), else OpenCost's node cost (docs/cost.md)."
)
_NO_DCGM = (
    " Absent where Prometheus has no dcgm-exporter with its Kubernetes mapping on (docs/cost.md)."
)


def fleet_cost_per_million() -> Panel:
    return timeseries(
        "Cost per million tokens per model and namespace",
        "The model's GPU hours over its tokens: namespace_model_name:vllm_cost_per_million_"
        "generated_tokens:rate5m, and dashed the same hours over prompt tokens (two "
        "readings of one cost, not a split), in the price's unit." + _NO_PRICE,
        [
            Q(q.COST_PER_MILLION_GENERATED, "generated: " + _MODEL_LEGEND),
            fleet_q(q.COST_PER_MILLION_PROMPT, "prompt: " + _MODEL_LEGEND),
        ],
        NUMBER,
    )


def fleet_cost_per_engine() -> Panel:
    return timeseries(
        "Cost per million tokens per engine (the exporters')",
        per_engine("glassbox_cost_per_million_generated_tokens")
        + " Dashed: "
        + help_of("glassbox_cost_per_million_prompt_tokens")
        + _NO_PRICE,
        [
            Q(q.COST_PER_MILLION_GENERATED_ENGINE, "generated: " + ENGINE_LEGEND),
            fleet_q(q.COST_PER_MILLION_PROMPT_ENGINE, "prompt: " + ENGINE_LEGEND),
        ],
        NUMBER,
    )


def fleet_gpu_hourly_cost() -> Panel:
    return timeseries(
        "GPU cost an hour, and the KV room no request used",
        "namespace_model_name:gpu_hourly_cost:sum: what the model's GPUs cost an hour; "
        "dashed: what the share of its KV pools no request held over the last hour costs "
        "an hour." + _NO_PRICE,
        [
            Q(q.GPU_HOURLY_COST, _MODEL_LEGEND),
            fleet_q(q.COST_UNUSED_POOL_HOURLY, "unused room: " + _MODEL_LEGEND),
        ],
        NUMBER,
    )


def fleet_unused_capacity() -> Panel:
    return timeseries(
        "Share of GPU hours no request used, over the hour",
        "namespace_model_name:vllm_cost_idle:ratio_avg1h: engines with no request "
        "running; dashed: namespace_model_name:vllm_cost_unused_pool:ratio_avg1h, the "
        "KV pools' share no request held (idle time counts whole). No price needed. "
        "Empty while the model's servers have run for less than a minute (the hour's "
        "average is taken a minute at a time).",
        [
            Q(q.COST_IDLE_RATIO, "idle: " + _MODEL_LEGEND),
            fleet_q(q.COST_UNUSED_POOL_RATIO, "unused pool: " + _MODEL_LEGEND),
        ],
        RATIO,
    )


def fleet_dram_beside_weight_reads() -> Panel:
    return timeseries(
        "DRAM activity beside glassbox's weight reads",
        "DCGM_FI_PROF_DRAM_ACTIVE of the model's GPUs (namespace_model_name:dcgm_dram_"
        "active:avg) beside glassbox's weight reads averaged over the model's engines "
        "(dashed): within 0.10 they agree; DRAM busier means a reader the counters' model "
        "misses (KV cache reads share that bandwidth)."
        + _NO_DCGM
        + " Dashed: "
        + per_engine("glassbox_memory_bandwidth_utilization_ratio"),
        [
            Q(q.DCGM_DRAM_ACTIVE, "DRAM: " + _MODEL_LEGEND),
            fleet_q(q.WEIGHT_READS_BY_MODEL, "weight reads: " + _MODEL_LEGEND),
            Q(q.DCGM_SM_ACTIVE, "SM: " + _MODEL_LEGEND),
        ],
        RATIO,
    )


def fleet_dram_beyond_weight_reads() -> Panel:
    return timeseries(
        "DRAM activity beyond the weight reads",
        "namespace_model_name:dcgm_dram_active_beyond_weight_reads:avg: near 0 while "
        "weight reads are the traffic." + _NO_DCGM,
        [Q(q.DCGM_BEYOND_WEIGHT_READS, _MODEL_LEGEND)],
        RATIO,
    )


def fleet_gpu_memory_and_power() -> Panel:
    return timeseries(
        "GPU memory of each vLLM pod",
        "namespace_pod:dcgm_fb_bytes:sum (framebuffer used + free: what vLLM budgets "
        "from) and dashed what is used, summed over the pod's GPUs." + _NO_DCGM,
        [
            Q(q.DCGM_FB_BYTES, _POD_LEGEND),
            fleet_q(q.DCGM_FB_USED_BYTES, "used: " + _POD_LEGEND),
        ],
        BYTES,
    )


def fleet_gpu_power() -> Panel:
    return timeseries(
        "GPU power of each vLLM pod",
        "namespace_pod:dcgm_power_usage_watts:sum: DCGM_FI_DEV_POWER_USAGE summed over "
        "the pod's GPUs, in watts." + _NO_DCGM,
        [Q(q.DCGM_POWER, _POD_LEGEND)],
        NUMBER,
    )


dashboard = _dashboard(
    uid="glassbox-fleet",
    title="vLLM glassbox / Fleet",
    description="Per model and namespace: servers off the bandwidth line, preempting or out "
    "of KV headroom, the worst of them, firing alerts, and the recording rules per "
    "namespace.",
    rows=[
        Row(
            "Servers that stand out, per model and namespace",
            [
                (fleet_servers(), 6),
                (fleet_off_bandwidth_count(), 6),
                (fleet_preempting_count(), 6),
                (fleet_out_of_headroom_count(), 6),
            ],
        ),
        Row(
            "The worst servers",
            [
                (fleet_off_bandwidth_servers(), 8),
                (fleet_preempting_servers(), 8),
                (fleet_out_of_headroom_servers(), 8),
                (fleet_firing_alerts(), 24),
            ],
        ),
        Row(
            "Per model and namespace (recording rules, 5 m)",
            [
                (fleet_generation_by_namespace(), 8),
                (fleet_tpot_by_namespace(), 8),
                (fleet_kv_usage_by_namespace(), 8),
                (fleet_preemptions_by_namespace(), 8),
                (fleet_waiting_by_namespace(), 8),
                (fleet_headroom_by_namespace(), 8),
            ],
        ),
        Row(
            "Cost per model and namespace (docs/cost.md)",
            [
                (fleet_cost_per_million(), 6),
                (fleet_cost_per_engine(), 6),
                (fleet_gpu_hourly_cost(), 6),
                (fleet_unused_capacity(), 6),
            ],
        ),
        Row(
            "The GPU beside vLLM (dcgm-exporter)",
            [
                (fleet_dram_beside_weight_reads(), 6),
                (fleet_dram_beyond_weight_reads(), 6),
                (fleet_gpu_memory_and_power(), 6),
                (fleet_gpu_power(), 6),
            ],
        ),
    ],
)
