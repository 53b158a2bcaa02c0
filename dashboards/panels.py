"""The panels more than one dashboard shows, and what every dashboard's panels share: the
judgements they draw (thresholds), the sentences that say when a panel has no data, the
fleet's dashed queries.

Each panel is a function that builds a fresh one (a layout moves what it is given); a
panel one dashboard shows is built in that dashboard's module. Descriptions say what a
series means and how it is computed; for the exporter's series they quote its HELP text
(see `exporter_help`) instead of restating the formula.
"""

from __future__ import annotations

from grafanalib.core import Panel
from vllm_glassbox.core.derive import KV_POOL_FULL
from vllm_glassbox.dashboards import queries as q
from vllm_glassbox.dashboards.common import (
    BYTES,
    ENGINE_LEGEND,
    FLEET_LEGEND,
    NUMBER,
    PER_SECOND,
    RATIO,
    SECONDS,
    STATE_MAPPINGS,
    Q,
    stat,
    timeseries,
)
from vllm_glassbox.dashboards.exporter_help import fleet, help_of, per_engine

# Judgements, shared by the panels that draw them.
KV_THRESHOLDS = [("green", None), ("orange", KV_POOL_FULL)]
ANY_PREEMPTION = [("green", None), ("orange", 1e-9)]


# Prometheus' rate() divides by the whole 5 m window; a series younger than that reads low.
YOUNG = " The 5-minute fleet rate reads low while vLLM has run for less than 5 minutes."

# When a panel can have no data, its description says so in a sentence of its own starting
# "Empty" or "Present only": the lab's report quotes it for every empty panel of a run.
NO_WEIGHTS = (
    ' Empty when the exporter knows no weights (no --weights-bytes, no "Model loading '
    "took\" line in vLLM's log, no readable checkpoint)."
)
NO_PEAK = " Present only when the exporter is given the peak (--gpu or --gpu-memory-bandwidth)."
NO_DECODE = " Empty while no vLLM in range decoded in the 5 minutes before (a ratio of rates)."
NO_SPECULATION = (
    " Empty while no vLLM in range speculates (no --speculative-config) or before it drafts."
)


def fleet_q(expr: str, legend: str = FLEET_LEGEND) -> Q:
    """A query of a fleet recording rule: drawn dashed beside the per-engine lines."""
    return Q(expr, legend, dashed=True)


def per_engine_and_fleet(name: str, record: str) -> str:
    return f"{per_engine(name)}\n\n{fleet(record)}"


# --- lab ----------------------------------------------------------------------------------


def lab_phase() -> Panel:
    return timeseries(
        "Lab phase",
        "1 while a phase of `glassbox lab` runs, one band per phase "
        "(glassbox_lab_phase_info{phase, kind, variant}, served by the lab while it runs). "
        "Empty when no lab ran in the time range.",
        [Q(q.LAB_PHASE, "{{kind}}: {{phase}} {{variant}}")],
        NUMBER,
        band=True,
    )


# --- decode -------------------------------------------------------------------------------


def tpot() -> Panel:
    return timeseries(
        "Time per output token (TPOT)",
        "Seconds per generated decode token, counting every token a speculative step "
        "emits (vLLM's ITL histogram has one sample per step, not per token).\n\n"
        + per_engine_and_fleet(
            "glassbox_time_per_output_token_seconds",
            "namespace_job_model_name:vllm_time_per_output_token_seconds:rate5m",
        ),
        [Q(q.TPOT, ENGINE_LEGEND), fleet_q(q.TPOT_FLEET, FLEET_LEGEND)],
        SECONDS,
    )


def tokens_per_forward_pass() -> Panel:
    return timeseries(
        "Tokens per forward pass",
        "Above 1 only when speculative decoding lands accepted drafts.\n\n"
        + per_engine_and_fleet(
            "glassbox_tokens_per_forward_pass",
            "namespace_job_model_name:vllm_tokens_per_forward_pass:rate5m",
        ),
        [
            Q(q.TOKENS_PER_FORWARD_PASS, ENGINE_LEGEND),
            fleet_q(q.TOKENS_PER_FORWARD_PASS_FLEET, FLEET_LEGEND),
        ],
        NUMBER,
    )


# --- weights and bandwidth ----------------------------------------------------------------


def weights_bytes() -> Panel:
    return stat(
        "Model weights",
        help_of("glassbox_model_weights_bytes") + NO_WEIGHTS,
        [Q(q.WEIGHTS_BYTES, "{{instance}}")],
        BYTES,
    )


# --- KV cache and scheduling --------------------------------------------------------------


def kv_usage_stat() -> Panel:
    return stat(
        "KV usage, fleet max",
        "Recording rule namespace_job_model_name:vllm_kv_cache_usage:max: the fullest engine's "
        "vllm:kv_cache_usage_perc.",
        [fleet_q(q.KV_USAGE_FLEET, "{{model_name}}")],
        RATIO,
        thresholds=KV_THRESHOLDS,
    )


# --- speculative decoding -----------------------------------------------------------------


def acceptance_stat() -> Panel:
    return stat(
        "Draft acceptance",
        fleet("namespace_job_model_name:vllm_spec_decode_acceptance_ratio:rate5m") + NO_SPECULATION,
        [fleet_q(q.ACCEPTANCE_FLEET, "{{model_name}}")],
        RATIO,
    )


def draft_coverage_stat() -> Panel:
    return stat(
        "Draft coverage",
        fleet("namespace_job_model_name:vllm_spec_decode_draft_coverage_ratio:rate5m")
        + NO_SPECULATION,
        [fleet_q(q.DRAFT_COVERAGE_FLEET, "{{model_name}}")],
        RATIO,
    )


# --- at a glance --------------------------------------------------------------------------


def tokens_per_forward_pass_stat() -> Panel:
    return stat(
        "Tokens per forward pass",
        fleet("namespace_job_model_name:vllm_tokens_per_forward_pass:rate5m") + NO_DECODE,
        [fleet_q(q.TOKENS_PER_FORWARD_PASS_FLEET, "{{model_name}}")],
        NUMBER,
    )


def preemption_storm_stat() -> Panel:
    return stat(
        "Preemption storm",
        "VLLMPreemptionStorm from Prometheus' ALERTS series: inactive, pending or firing.",
        [Q(q.PREEMPTION_STORM, "VLLMPreemptionStorm")],
        NUMBER,
        mappings=STATE_MAPPINGS,
        thresholds=[("green", None), ("orange", 1), ("red", 2)],
    )


def preemptions_stat() -> Panel:
    return stat(
        "Preemptions / s",
        "Recording rule namespace_job_model_name:vllm_num_preemptions:rate5m: "
        "rate of vllm:num_preemptions_total over 5 minutes, summed over engines.",
        [fleet_q(q.PREEMPTIONS_FLEET, "{{model_name}}")],
        PER_SECOND,
        thresholds=ANY_PREEMPTION,
    )


def waiting_stat() -> Panel:
    return stat(
        "Waiting requests",
        "Recording rule namespace_job_model_name:vllm_num_requests_waiting:sum.",
        [fleet_q(q.WAITING_FLEET, "{{model_name}}")],
        NUMBER,
    )


def tpot_stat() -> Panel:
    return stat(
        "TPOT",
        fleet("namespace_job_model_name:vllm_time_per_output_token_seconds:rate5m") + NO_DECODE,
        [fleet_q(q.TPOT_FLEET, "{{model_name}}")],
        SECONDS,
    )


def running_waiting() -> Panel:
    return timeseries(
        "Requests running and waiting",
        "vllm:num_requests_running and vllm:num_requests_waiting per engine, and the "
        "fleet sums (recording rules "
        "namespace_job_model_name:vllm_num_requests_{running,waiting}:sum). "
        "From vLLM v0.20 vllm:num_requests_waiting_by_reason says why they wait "
        "(capacity: no KV room; deferred: LoRA budget, KV transfer).",
        [
            Q(q.RUNNING, "running " + ENGINE_LEGEND),
            Q(q.WAITING, "waiting " + ENGINE_LEGEND),
            fleet_q(q.RUNNING_FLEET, "running " + FLEET_LEGEND),
            fleet_q(q.WAITING_FLEET, "waiting " + FLEET_LEGEND),
            Q(q.WAITING_BY_REASON, "waiting for {{reason}} {{model_name}}"),
        ],
        NUMBER,
    )


def preemptions() -> Panel:
    return timeseries(
        "Preemptions per second",
        "A preempted request loses its KV blocks and is prefilled again later. "
        "A single one is not a storm; a run of them while requests wait is.\n\n"
        + per_engine_and_fleet(
            "glassbox_preemptions_per_second",
            "namespace_job_model_name:vllm_num_preemptions:rate5m",
        )
        + YOUNG,
        [Q(q.PREEMPTIONS, ENGINE_LEGEND), fleet_q(q.PREEMPTIONS_FLEET, FLEET_LEGEND)],
        PER_SECOND,
    )
