"""vLLM glassbox / KV cache and scheduling: how big is the pool, and is it paging?

Paging is invisible until the pool is full: first usage climbs with nobody waiting, then
requests queue, then vLLM preempts running requests to make room. The rows follow that
order.
"""

from __future__ import annotations

from grafanalib.core import Panel
from vllm_glassbox.dashboards import panels as p
from vllm_glassbox.dashboards import queries as q
from vllm_glassbox.dashboards.common import (
    ENGINE_LEGEND,
    NUMBER,
    TOKENS,
    Q,
    Row,
    timeseries,
)
from vllm_glassbox.dashboards.common import dashboard as _dashboard
from vllm_glassbox.dashboards.exporter_help import help_of


def kv_headroom_at_completion() -> Panel:
    return timeseries(
        "Forecast: more requests that fit once the running ones finish",
        f"Per engine: {help_of('glassbox_kv_cache_headroom_requests_at_completion')} Below 0 "
        "while the pool fills (Time until the KV pool is full) is the warning of "
        "VLLMKVCacheExhaustionForecast; below 0 in a steady state is a pool whose requests "
        "finish at staggered times.",
        [Q(q.KV_HEADROOM_AT_COMPLETION, ENGINE_LEGEND)],
        NUMBER,
    )


def request_size_at_completion() -> Panel:
    return timeseries(
        "Size a request reaches when it finishes",
        f"Per engine: {help_of('glassbox_request_size_at_completion_tokens')} What the "
        "forecast prices every running request at.",
        [Q(q.REQUEST_SIZE_AT_COMPLETION, ENGINE_LEGEND)],
        TOKENS,
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
                (p.kv_capacity_stat(), 6),
                (p.kv_blocks_stat(), 6),
                (p.kv_block_size_stat(), 6),
                (p.kv_usage_stat(), 6),
            ],
            height=4,
        ),
        Row("Tokens", [(p.kv_tokens(), 12), (p.kv_tokens_fleet(), 12)]),
        Row(
            "Headroom (autoscaling)",
            [(p.kv_headroom(), 8), (p.kv_exhaustion(), 8), (p.kv_replicas_needed(), 8)],
        ),
        Row(
            "Forecast",
            [(kv_headroom_at_completion(), 12), (request_size_at_completion(), 12)],
        ),
        Row("Usage and queue", [(p.kv_usage(), 12), (p.running_waiting(), 12)]),
        Row("Preemptions", [(p.preemptions(), 12), (p.preemption_storm(), 12)]),
        Row("Configuration", [(p.cache_config(), 24)], height=5),
    ],
)
