"""vLLM glassbox / Speculative decoding: are drafts made, accepted, and worth it?

Three questions in order: does speculation run at all (draft coverage: requests can
bypass it silently), how much of each draft is accepted (overall and by position), and
what it buys (tokens per forward pass, which is what divides the time per token).
"""

from __future__ import annotations

from grafanalib.core import Panel
from vllm_glassbox.dashboards import panels as p
from vllm_glassbox.dashboards import queries as q
from vllm_glassbox.dashboards.common import (
    ENGINE_LEGEND,
    FLEET_LEGEND,
    PER_SECOND,
    RATIO,
    TOKENS,
    Q,
    Row,
    stat,
    timeseries,
)
from vllm_glassbox.dashboards.common import dashboard as _dashboard
from vllm_glassbox.dashboards.exporter_help import fleet
from vllm_glassbox.dashboards.panels import NO_SPECULATION, fleet_q, per_engine_and_fleet


def acceptance() -> Panel:
    return timeseries(
        "Draft acceptance ratio",
        per_engine_and_fleet(
            "glassbox_spec_decode_acceptance_ratio",
            "namespace_job_model_name:vllm_spec_decode_acceptance_ratio:rate5m",
        )
        + NO_SPECULATION,
        [Q(q.ACCEPTANCE, ENGINE_LEGEND), fleet_q(q.ACCEPTANCE_FLEET, FLEET_LEGEND)],
        RATIO,
    )


def acceptance_length() -> Panel:
    return timeseries(
        "Mean acceptance length",
        "Upper bound: num_speculative_tokens + 1.\n\n"
        + per_engine_and_fleet(
            "glassbox_spec_decode_mean_acceptance_length",
            "namespace_job_model_name:vllm_spec_decode_mean_acceptance_length:rate5m",
        )
        + NO_SPECULATION,
        [Q(q.ACCEPTANCE_LENGTH, ENGINE_LEGEND), fleet_q(q.ACCEPTANCE_LENGTH_FLEET, FLEET_LEGEND)],
        TOKENS,
    )


def acceptance_by_position() -> Panel:
    return timeseries(
        "Acceptance by draft position",
        "Position k is accepted only when positions 0..k-1 were: the curve falls with k.\n\n"
        + per_engine_and_fleet(
            "glassbox_spec_decode_position_acceptance_ratio",
            "namespace_job_model_name_position:vllm_spec_decode_acceptance_ratio:rate5m",
        )
        + NO_SPECULATION,
        [
            Q(q.ACCEPTANCE_BY_POSITION, "position {{position}} " + ENGINE_LEGEND),
            fleet_q(q.ACCEPTANCE_BY_POSITION_FLEET, "position {{position}} " + FLEET_LEGEND),
        ],
        RATIO,
    )


def draft_coverage() -> Panel:
    return timeseries(
        "Draft coverage",
        "Near 0 while decoding means speculation is configured but bypassed, e.g. vLLM "
        "v0.11 skips it for requests with non-default penalties, min_p or logprobs.\n\n"
        + per_engine_and_fleet(
            "glassbox_spec_decode_draft_coverage_ratio",
            "namespace_job_model_name:vllm_spec_decode_draft_coverage_ratio:rate5m",
        )
        + NO_SPECULATION,
        [Q(q.DRAFT_COVERAGE, ENGINE_LEGEND), fleet_q(q.DRAFT_COVERAGE_FLEET, FLEET_LEGEND)],
        RATIO,
    )


def drafts_rate() -> Panel:
    return timeseries(
        "Drafts, draft tokens and accepted tokens per second",
        "Rates of vLLM's spec-decode counters, summed over engines: "
        "vllm:spec_decode_num_drafts_total (one per request per step that drafted), "
        "vllm:spec_decode_num_draft_tokens_total and "
        "vllm:spec_decode_num_accepted_tokens_total." + NO_SPECULATION,
        [
            Q(q.DRAFTS_RATE, "drafts {{model_name}}"),
            Q(q.DRAFT_TOKENS_RATE, "draft tokens {{model_name}}"),
            Q(q.ACCEPTED_TOKENS_RATE, "accepted tokens {{model_name}}"),
        ],
        PER_SECOND,
    )


def acceptance_length_stat() -> Panel:
    return stat(
        "Mean acceptance length",
        fleet("namespace_job_model_name:vllm_spec_decode_mean_acceptance_length:rate5m")
        + NO_SPECULATION,
        [fleet_q(q.ACCEPTANCE_LENGTH_FLEET, "{{model_name}}")],
        TOKENS,
    )


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
                (acceptance_length_stat(), 6),
                (p.tokens_per_forward_pass_stat(), 6),
            ],
            height=4,
        ),
        Row("Does it speculate?", [(draft_coverage(), 12), (drafts_rate(), 12)]),
        Row("Acceptance", [(acceptance(), 12), (acceptance_length(), 12)]),
        Row(
            "By position, and the payoff",
            [(acceptance_by_position(), 12), (p.tokens_per_forward_pass(), 12)],
        ),
    ],
)
