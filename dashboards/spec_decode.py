"""vLLM glassbox / Speculative decoding: are drafts made, accepted, and worth it?

Three questions in order: does speculation run at all (draft coverage: requests can
bypass it silently), how much of each draft is accepted (overall and by position), and
what it buys (tokens per forward pass, which is what divides the time per token).
"""

from __future__ import annotations

from vllm_glassbox.dashboards import panels as p
from vllm_glassbox.dashboards.common import Row
from vllm_glassbox.dashboards.common import dashboard as _dashboard

dashboard = _dashboard(
    uid="glassbox-spec-decode",
    title="vLLM glassbox / Speculative decoding",
    description="Draft coverage, acceptance ratio and length, acceptance by draft position, "
    "drafts per second, and the tokens per forward pass they yield.",
    rows=[
        Row("Lab phases", [(p.lab_phase(), 24)], height=4),
        Row(
            "At a glance (fleet, 5 m)",
            [
                (p.draft_coverage_stat(), 6),
                (p.acceptance_stat(), 6),
                (p.acceptance_length_stat(), 6),
                (p.tokens_per_forward_pass_stat(), 6),
            ],
            height=4,
        ),
        Row("Does it speculate?", [(p.draft_coverage(), 12), (p.drafts_rate(), 12)]),
        Row("Acceptance", [(p.acceptance(), 12), (p.acceptance_length(), 12)]),
        Row(
            "By position, and the payoff",
            [(p.acceptance_by_position(), 12), (p.tokens_per_forward_pass(), 12)],
        ),
    ],
)
