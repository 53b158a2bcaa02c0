"""vLLM glassbox / KV cache and scheduling: how big is the pool, and is it paging?

Paging is invisible until the pool is full: first usage climbs with nobody waiting, then
requests queue, then vLLM preempts running requests to make room. The rows follow that
order.
"""

from __future__ import annotations

from grafanalib.core import Panel
from vllm_glassbox.core.derive import KV_POOL_FULL
from vllm_glassbox.dashboards import panels as p
from vllm_glassbox.dashboards import queries as q
from vllm_glassbox.dashboards.common import (
    ENGINE_LEGEND,
    FLEET_LEGEND,
    NUMBER,
    RATIO,
    SECONDS,
    STATE_MAPPINGS,
    TOKENS,
    Q,
    Row,
    stat,
    table,
    timeseries,
)
from vllm_glassbox.dashboards.common import dashboard as _dashboard
from vllm_glassbox.dashboards.exporter_help import help_of
from vllm_glassbox.dashboards.panels import (
    KV_THRESHOLDS,
    fleet_q,
)


def kv_tokens() -> Panel:
    return timeseries(
        "KV pool: capacity, used and free tokens",
        f"Capacity: {help_of('glassbox_kv_cache_capacity_tokens')} "
        f"Used: {help_of('glassbox_kv_cache_used_tokens')} "
        f"Free: {help_of('glassbox_kv_cache_free_tokens')}",
        [
            Q(q.KV_CAPACITY_TOKENS, "capacity " + ENGINE_LEGEND),
            Q(q.KV_USED_TOKENS, "used " + ENGINE_LEGEND),
            Q(q.KV_FREE_TOKENS, "free " + ENGINE_LEGEND),
        ],
        TOKENS,
    )


def kv_tokens_fleet() -> Panel:
    return timeseries(
        "KV pool of the fleet: used, free and capacity tokens",
        "Recording rules namespace_job_model_name:glassbox_kv_cache_used_tokens:sum, "
        "namespace_job_model_name:glassbox_kv_cache_free_tokens:sum and "
        "namespace_job_model_name:glassbox_kv_cache_capacity_tokens:sum: the exporter's per-engine "
        "tokens summed over the engines of a job and model.",
        [
            fleet_q(q.KV_CAPACITY_TOKENS_FLEET, "capacity {{model_name}} ({{job}})"),
            fleet_q(q.KV_USED_TOKENS_FLEET, "used {{model_name}} ({{job}})"),
            fleet_q(q.KV_FREE_TOKENS_FLEET, "free {{model_name}} ({{job}})"),
        ],
        TOKENS,
    )


def kv_usage() -> Panel:
    return timeseries(
        "KV cache usage",
        "vllm:kv_cache_usage_perc, the share of KV blocks held by requests (a fraction, "
        "evictable prefix-cache blocks count as free); per engine, and the fleet's maximum "
        "(recording rule namespace_job_model_name:vllm_kv_cache_usage:max). Paging is invisible "
        f"until the pool is full: the line marks {KV_POOL_FULL:.0%}.",
        [Q(q.KV_USAGE, ENGINE_LEGEND), fleet_q(q.KV_USAGE_FLEET, "max " + FLEET_LEGEND)],
        RATIO,
        thresholds=KV_THRESHOLDS,
    )


def kv_capacity_stat() -> Panel:
    return stat(
        "KV capacity",
        help_of("glassbox_kv_cache_capacity_tokens"),
        [Q(q.KV_CAPACITY_TOKENS, ENGINE_LEGEND)],
        TOKENS,
    )


def kv_blocks_stat() -> Panel:
    return stat(
        "KV blocks",
        help_of("glassbox_kv_cache_blocks"),
        [Q(q.KV_BLOCKS, ENGINE_LEGEND)],
        NUMBER,
    )


def kv_block_size_stat() -> Panel:
    return stat(
        "KV block size",
        help_of("glassbox_kv_cache_block_size_tokens")
        + " vLLM allocates KV memory to requests in whole blocks (cache_config_info block_size).",
        [Q(q.KV_BLOCK_SIZE, ENGINE_LEGEND)],
        TOKENS,
    )


def cache_config() -> Panel:
    return table(
        "vLLM cache configuration",
        "Labels of vllm:cache_config_info per engine: every configuration seen over the "
        "range, one row per distinct one (a restart with other settings adds a row). "
        "num_gpu_blocks is summed over data-parallel engines by vLLM; "
        "glassbox_kv_cache_blocks divides it back. Empty when no vLLM was scraped in the "
        "range.",
        [Q(q.CACHE_CONFIG)],
        [
            "instance",
            "engine",
            "block_size",
            "num_gpu_blocks",
            "cache_dtype",
            "gpu_memory_utilization",
            "enable_prefix_caching",
        ],
    )


def preemption_storm() -> Panel:
    return timeseries(
        "VLLMPreemptionStorm alert",
        "State of the alert from Prometheus' ALERTS series (0 inactive, 1 pending, "
        "2 firing; the worst instance). It fires when preemptions keep happening while the "
        "pool is nearly full and requests wait. See alerts/runbook.md.",
        [Q(q.PREEMPTION_STORM, "VLLMPreemptionStorm")],
        NUMBER,
        mappings=STATE_MAPPINGS,
        band=True,
    )


def kv_headroom() -> Panel:
    return timeseries(
        "Headroom: more requests that fit",
        f"Per engine: {help_of('glassbox_kv_cache_headroom_requests')} It falls to 0 before "
        "vLLM has to preempt. Fleet (dashed): recording rule "
        "namespace_job_model_name:glassbox_kv_cache_headroom_requests:sum, the engines' whole "
        "requests summed. Absent while no request runs.",
        [
            Q(q.KV_HEADROOM, ENGINE_LEGEND),
            fleet_q(q.KV_HEADROOM_FLEET, "{{model_name}} ({{namespace}}, {{job}})"),
        ],
        NUMBER,
    )


def kv_exhaustion() -> Panel:
    return timeseries(
        "Time until the KV pool is full",
        f"Per engine: {help_of('glassbox_kv_cache_exhaustion_seconds')} Fleet (dashed): "
        "recording rule namespace_job_model_name:glassbox_kv_cache_exhaustion_seconds:min, "
        "the engine "
        "that fills first. Absent unless the used tokens grew over the window.",
        [
            Q(q.KV_EXHAUSTION, ENGINE_LEGEND),
            fleet_q(q.KV_EXHAUSTION_FLEET, "{{model_name}} ({{namespace}}, {{job}})"),
        ],
        SECONDS,
    )


def kv_headroom_at_completion() -> Panel:
    return timeseries(
        "Forecast: more requests that fit once the running ones finish",
        f"Per engine: {help_of('glassbox_kv_cache_headroom_requests_at_completion')} Below 0 "
        "while the pool fills (Time until the KV pool is full) is the warning of "
        "VLLMKVCacheExhaustionForecast; below 0 in a steady state is a pool whose requests "
        "finish at staggered times. Empty until a request finishes within the exporter's "
        "window.",
        [Q(q.KV_HEADROOM_AT_COMPLETION, ENGINE_LEGEND)],
        NUMBER,
    )


def request_size_at_completion() -> Panel:
    return timeseries(
        "Size a request reaches when it finishes",
        f"Per engine: {help_of('glassbox_request_size_at_completion_tokens')} What the "
        "forecast prices every running request at. Empty until a request finishes within the "
        "exporter's window.",
        [Q(q.REQUEST_SIZE_AT_COMPLETION, ENGINE_LEGEND)],
        TOKENS,
    )


def kv_replicas_needed() -> Panel:
    return timeseries(
        "Replicas' worth of KV pool needed",
        "Recording rule namespace_model_name:glassbox_kv_cache_replicas_needed:ratio: the "
        "KV tokens the running requests hold plus the waiting ones at the current mean size, "
        "in pools of one replica. The autoscaling signal of docs/autoscaling.md: a target of "
        "0.8 per replica keeps a fifth of every pool free. Empty while no request runs.",
        [Q(q.KV_REPLICAS_NEEDED, "{{model_name}} {{namespace}}")],
        NUMBER,
    )


dashboard = _dashboard(
    uid="glassbox-kv-cache",
    title="vLLM glassbox / KV cache and scheduling",
    description="KV pool capacity, used and free tokens, blocks and block size, usage; "
    "headroom in requests, time until full and replicas needed (autoscaling); "
    "the forecast: headroom once the running requests finish, and their size then; "
    "running and waiting requests, preemptions and the VLLMPreemptionStorm alert.",
    rows=[
        Row("Lab phases", [(p.lab_phase(), 24)], height=4),
        Row(
            "Pool",
            [
                (kv_capacity_stat(), 6),
                (kv_blocks_stat(), 6),
                (kv_block_size_stat(), 6),
                (p.kv_usage_stat(), 6),
            ],
            height=4,
        ),
        Row("Tokens", [(kv_tokens(), 12), (kv_tokens_fleet(), 12)]),
        Row(
            "Headroom (autoscaling)",
            [(kv_headroom(), 8), (kv_exhaustion(), 8), (kv_replicas_needed(), 8)],
        ),
        Row(
            "Forecast",
            [(kv_headroom_at_completion(), 12), (request_size_at_completion(), 12)],
        ),
        Row("Usage and queue", [(kv_usage(), 12), (p.running_waiting(), 12)]),
        Row("Preemptions", [(p.preemptions(), 12), (preemption_storm(), 12)]),
        Row("Configuration", [(cache_config(), 24)], height=5),
    ],
)
