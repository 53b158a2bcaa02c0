"""vLLM / glassbox overview: is the server healthy, and what do its three mechanisms cost?

The top answers "how is it doing now" (fleet recording rules, the objectives, what
`glassbox explain` finds), the middle puts the decode numbers next to vLLM's own raw
series, the bottom says whether the exporter can see vLLM.
"""

from __future__ import annotations

from grafanalib.core import Panel
from vllm_glassbox.dashboards import panels as p
from vllm_glassbox.dashboards import queries as q
from vllm_glassbox.dashboards import slo
from vllm_glassbox.dashboards.common import (
    BYTES_PER_SECOND,
    ENGINE_LEGEND,
    NUMBER,
    PER_SECOND,
    RATIO,
    SECONDS,
    STATE_MAPPINGS,
    TOKENS_PER_SECOND,
    UP_MAPPINGS,
    Q,
    Row,
    stacked_bars,
    stat,
    table,
    timeseries,
)
from vllm_glassbox.dashboards.common import dashboard as _dashboard
from vllm_glassbox.dashboards.exporter_help import help_of, per_engine
from vllm_glassbox.dashboards.panels import KV_THRESHOLDS, fleet_q

_NO_START_LINES = (
    " Empty without vLLM's log (--vllm-log), or while the log shows no whole start (its "
    "first line and the line that says the server is up: docs/exporter.md lists them)."
)


def startup_stages() -> Panel:
    return stacked_bars(
        "Start-up by stage, per start",
        "One bar per start of vLLM in the time range (its start time in vLLM's log), "
        f"stacked by stage. {help_of('glassbox_startup_stage_seconds')} The bar's height is "
        "process start to ready." + _NO_START_LINES,
        Q(q.STARTUP_STAGES, "{{stage}}"),
        SECONDS,
        bar="start",
        stack="stage",
    )


def startup_total() -> Panel:
    return timeseries(
        "Process start to ready",
        f"{help_of('glassbox_startup_seconds')} One line per start. Dashed: recording rule "
        "namespace_model_name:glassbox_startup_seconds_previous:max7d, the longest start of "
        "the model "
        "in the 7 days before (the starts published now left out), which VLLMStartupSlow "
        "compares a new start with." + _NO_START_LINES,
        [
            Q(q.STARTUP_SECONDS, "{{model_name}} start {{start}} ({{instance}})"),
            fleet_q(q.STARTUP_PREVIOUS_MAX, "{{model_name}} longest previous"),
        ],
        SECONDS,
    )


def model_load_rate() -> Panel:
    return timeseries(
        "Weights load bandwidth",
        help_of("glassbox_model_load_bytes_per_second")
        + " The weights are the exporter's (glassbox_model_weights_info says from where)."
        + " Empty without vLLM's log (--vllm-log), or when no load time or no weights are known.",
        [Q(q.MODEL_LOAD_RATE, "{{model_name}} start {{start}} ({{instance}})")],
        BYTES_PER_SECOND,
    )


def first_request_prefill() -> Panel:
    return timeseries(
        "First request after a start vs warm prefill",
        f"First: {help_of('glassbox_first_request_prefill_seconds')} "
        f"Warm: {help_of('glassbox_warm_request_prefill_seconds')} "
        "The gap is what a cold start costs the first user. Empty until a request finishes "
        "after a start the exporter saw.",
        [
            Q(q.FIRST_REQUEST_PREFILL, "first " + ENGINE_LEGEND),
            Q(q.WARM_REQUEST_PREFILL, "warm " + ENGINE_LEGEND),
        ],
        SECONDS,
    )


def startup_slow_stat() -> Panel:
    return stat(
        "Slow start",
        "VLLMStartupSlow from Prometheus' ALERTS series: a start in the last hour took over "
        "1.5 × and over a minute longer than the model's longest start in the 7 days "
        "before. See alerts/runbook.md.",
        [Q(q.STARTUP_SLOW, "VLLMStartupSlow")],
        NUMBER,
        mappings=STATE_MAPPINGS,
        thresholds=[("green", None), ("orange", 1), ("red", 2)],
    )


def generation_stat() -> Panel:
    return stat(
        "Output tokens / s",
        "Recording rule namespace_job_model_name:vllm_generation_tokens:rate5m.",
        [fleet_q(q.GENERATION_TOKENS_FLEET, "{{model_name}}")],
        TOKENS_PER_SECOND,
    )


def target_up_stat() -> Panel:
    return stat(
        "Exporter sees vLLM",
        help_of("glassbox_target_up"),
        [Q(q.TARGET_UP, "{{instance}}")],
        NUMBER,
        mappings=UP_MAPPINGS,
        thresholds=[("red", None), ("green", 1)],
    )


def restarts_stat() -> Panel:
    return stat(
        "vLLM restarts in range",
        help_of("glassbox_target_restarts_total") + " Increase over the dashboard's range.",
        [Q(q.RESTARTS_IN_RANGE, "restarts")],
        NUMBER,
        thresholds=[("green", None), ("orange", 1)],
    )


def findings() -> Panel:
    return table(
        "Findings",
        f"{help_of('glassbox_finding_info')} One row per finding of each exporter's latest "
        "poll, by namespace, instance and model, with its severity (critical, warning, "
        "info, ok). Each exporter judges its own server over its window; the sentences, "
        "their numbers, the evidence and what would change each: `glassbox explain "
        "--exporter URL` for one server, or `glassbox explain --prometheus URL` for a model "
        "across its replicas, its service-level objectives with it (docs/explain.md). Empty "
        "when no exporter was scraped at the end of the range: the table shows the latest "
        "poll.",
        [Q(q.FINDINGS)],
        ["namespace", "instance", "model_name", "severity", "diagnosis", "finding"],
    )


def raw_running_waiting() -> Panel:
    return timeseries(
        "Running and waiting requests",
        "vllm:num_requests_running and vllm:num_requests_waiting, per engine.",
        [Q(q.RUNNING, "running " + ENGINE_LEGEND), Q(q.WAITING, "waiting " + ENGINE_LEGEND)],
        NUMBER,
    )


def raw_kv_usage() -> Panel:
    return timeseries(
        "KV cache usage",
        "vllm:kv_cache_usage_perc per engine: the share of KV blocks held by requests.",
        [Q(q.KV_USAGE, ENGINE_LEGEND)],
        RATIO,
        thresholds=KV_THRESHOLDS,
    )


def raw_preemptions() -> Panel:
    return timeseries(
        "Preemptions per second",
        "rate(vllm:num_preemptions_total), summed over engines.",
        [Q(q.RAW_PREEMPTIONS, "{{model_name}}")],
        PER_SECOND,
    )


def raw_throughput() -> Panel:
    return timeseries(
        "Token throughput",
        "rate(vllm:prompt_tokens_total) (prompt tokens, counted once a request's prefill "
        "completes) and rate(vllm:generation_tokens_total), summed over engines.",
        [
            Q(q.PROMPT_TOKENS_RATE, "prompt {{model_name}}"),
            Q(q.GENERATION_TOKENS_RATE, "generated {{model_name}}"),
        ],
        TOKENS_PER_SECOND,
    )


def raw_requests() -> Panel:
    return timeseries(
        "Finished requests per second",
        "rate(vllm:request_success_total), all finish reasons, summed over engines.",
        [Q(q.REQUESTS_RATE, "{{model_name}}")],
        PER_SECOND,
    )


def raw_ttft() -> Panel:
    return timeseries(
        "Time to first token",
        "p50 and p95 per model, all selected namespaces together, from recording rule "
        "namespace_job_model_name_le:vllm_time_to_first_token_seconds_bucket:rate5m (the "
        "buckets of vllm:time_to_first_token_seconds over 5 m, not narrowed by pod or "
        "engine), and the mean (rate of _sum / rate of _count); for a short prompt it is "
        "mostly fixed overhead.\n\n" + per_engine("glassbox_time_to_first_token_seconds"),
        [
            Q(q.TTFT_P50, "p50 {{model_name}}"),
            Q(q.TTFT_P95, "p95 {{model_name}}"),
            Q(q.TTFT_RAW_MEAN, "mean {{model_name}}"),
            Q(q.TTFT_MEAN, "mean " + ENGINE_LEGEND),
        ],
        SECONDS,
    )


def exporter_poll_duration() -> Panel:
    return timeseries(
        "Exporter: poll duration",
        help_of("glassbox_scrape_duration_seconds"),
        [Q(q.SCRAPE_DURATION, "{{instance}}")],
        SECONDS,
    )


def exporter_errors() -> Panel:
    return timeseries(
        "Exporter: failed polls per second",
        help_of("glassbox_scrape_errors_total") + " Rate, by reason.",
        [Q(q.SCRAPE_ERRORS, "{{reason}}")],
        PER_SECOND,
    )


dashboard = _dashboard(
    uid="glassbox-overview",
    title="vLLM glassbox / Overview",
    description="Lab phases, the fleet at a glance, its service-level objectives, what "
    "glassbox explain finds, decode efficiency, cold starts by stage and vLLM's raw context "
    "(running, waiting, KV usage, preemptions, throughput, TTFT).",
    rows=[
        Row("Lab phases", [(p.lab_phase(), 24)], height=4),
        Row(
            "At a glance (fleet, 5 m)",
            [
                (p.tpot_stat(), 4),
                (p.tokens_per_forward_pass_stat(), 4),
                (generation_stat(), 4),
                (p.kv_usage_stat(), 4),
                (p.waiting_stat(), 4),
                (p.preemptions_stat(), 4),
                (p.acceptance_stat(), 4),
                (p.draft_coverage_stat(), 4),
                (p.preemption_storm_stat(), 4),
                (p.weights_bytes(), 4),
                (target_up_stat(), 4),
                (restarts_stat(), 4),
            ],
            height=4,
        ),
        Row("Service-level objectives (SLO rules)", slo.overview_panels(), height=4),
        Row("What glassbox explain finds", [(findings(), 24)], height=6),
        Row("Decode", [(p.tpot(), 12), (p.tokens_per_forward_pass(), 12)]),
        Row(
            "Cold start (from vLLM's log)",
            [
                (startup_stages(), 12),
                (startup_total(), 12),
                (model_load_rate(), 10),
                (first_request_prefill(), 10),
                (startup_slow_stat(), 4),
            ],
        ),
        Row(
            "Raw context (vLLM's own series)",
            [
                (raw_running_waiting(), 8),
                (raw_kv_usage(), 8),
                (raw_preemptions(), 8),
                (raw_throughput(), 8),
                (raw_requests(), 8),
                (raw_ttft(), 8),
            ],
        ),
        Row("Exporter", [(exporter_poll_duration(), 12), (exporter_errors(), 12)], height=6),
    ],
)
