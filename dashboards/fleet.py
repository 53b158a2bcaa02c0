"""vLLM glassbox / Fleet: per model and namespace, which servers are off the bandwidth
line, preempting, or out of KV headroom.

Counts and the worst servers come from the exporters' per-engine series (a table of the
worst few, not of every pod); the per-namespace lines are the recording rules, and the
lines across namespaces are sums of those records.
"""

from __future__ import annotations

from vllm_glassbox.dashboards import panels as p
from vllm_glassbox.dashboards.common import Row
from vllm_glassbox.dashboards.common import dashboard as _dashboard

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
                (p.fleet_servers(), 6),
                (p.fleet_off_bandwidth_count(), 6),
                (p.fleet_preempting_count(), 6),
                (p.fleet_out_of_headroom_count(), 6),
            ],
        ),
        Row(
            "The worst servers",
            [
                (p.fleet_off_bandwidth_servers(), 8),
                (p.fleet_preempting_servers(), 8),
                (p.fleet_out_of_headroom_servers(), 8),
                (p.fleet_firing_alerts(), 24),
            ],
        ),
        Row(
            "Per model and namespace (recording rules, 5 m)",
            [
                (p.fleet_generation_by_namespace(), 8),
                (p.fleet_tpot_by_namespace(), 8),
                (p.fleet_kv_usage_by_namespace(), 8),
                (p.fleet_preemptions_by_namespace(), 8),
                (p.fleet_waiting_by_namespace(), 8),
                (p.fleet_headroom_by_namespace(), 8),
            ],
        ),
    ],
)
