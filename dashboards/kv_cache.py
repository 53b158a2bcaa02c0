"""vLLM glassbox / KV cache and scheduling: how big is the pool, and is it paging?

Paging is invisible until the pool is full: first usage climbs with nobody waiting, then
requests queue, then vLLM preempts running requests to make room. The rows follow that
order.
"""

from __future__ import annotations

from vllm_glassbox.dashboards import panels as p
from vllm_glassbox.dashboards.common import Row
from vllm_glassbox.dashboards.common import dashboard as _dashboard

dashboard = _dashboard(
    uid="glassbox-kv-cache",
    title="vLLM glassbox / KV cache and scheduling",
    description="KV pool capacity, used and free tokens, blocks and block size, usage; "
    "headroom in requests, time until full and replicas needed (autoscaling); "
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
        Row("Usage and queue", [(p.kv_usage(), 12), (p.running_waiting(), 12)]),
        Row("Preemptions", [(p.preemptions(), 12), (p.preemption_storm(), 12)]),
        Row("Configuration", [(p.cache_config(), 24)], height=5),
    ],
)
