"""vLLM / glassbox overview: is the server healthy, and what do its three mechanisms cost?

The top answers "how is it doing now" (fleet recording rules), the middle puts the decode
numbers next to vLLM's own raw series, the bottom says whether the exporter can see vLLM.
"""

from __future__ import annotations

from vllm_glassbox.dashboards import panels as p
from vllm_glassbox.dashboards import slo
from vllm_glassbox.dashboards.common import Row
from vllm_glassbox.dashboards.common import dashboard as _dashboard

dashboard = _dashboard(
    uid="glassbox-overview",
    title="vLLM glassbox / Overview",
    description="Lab phases, the fleet at a glance, its service-level objectives, decode "
    "efficiency, cold starts by stage and vLLM's raw context (running, waiting, KV usage, "
    "preemptions, throughput, TTFT).",
    rows=[
        Row("Lab phases", [(p.lab_phase(), 24)], height=4),
        Row(
            "At a glance (fleet, 5 m)",
            [
                (p.tpot_stat(), 4),
                (p.tokens_per_forward_pass_stat(), 4),
                (p.generation_stat(), 4),
                (p.kv_usage_stat(), 4),
                (p.waiting_stat(), 4),
                (p.preemptions_stat(), 4),
                (p.acceptance_stat(), 4),
                (p.draft_coverage_stat(), 4),
                (p.preemption_storm_stat(), 4),
                (p.weights_bytes(), 4),
                (p.target_up_stat(), 4),
                (p.restarts_stat(), 4),
            ],
            height=4,
        ),
        Row("Service-level objectives (SLO rules)", slo.overview_panels(), height=4),
        Row("Decode", [(p.tpot(), 12), (p.tokens_per_forward_pass(), 12)]),
        Row(
            "Cold start (from vLLM's log)",
            [
                (p.startup_stages(), 12),
                (p.startup_total(), 12),
                (p.model_load_rate(), 10),
                (p.first_request_prefill(), 10),
                (p.startup_slow_stat(), 4),
            ],
        ),
        Row(
            "Raw context (vLLM's own series)",
            [
                (p.raw_running_waiting(), 8),
                (p.raw_kv_usage(), 8),
                (p.raw_preemptions(), 8),
                (p.raw_throughput(), 8),
                (p.raw_requests(), 8),
                (p.raw_ttft(), 8),
            ],
        ),
        Row("Exporter", [(p.exporter_poll_duration(), 12), (p.exporter_errors(), 12)], height=6),
    ],
)
