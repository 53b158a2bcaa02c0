"""vLLM glassbox / Service-level objectives: per objective (an SLO file's, docs/slo.md) its
attainment, the error budget left, the burn rate over each of the SRE workbook's windows,
the burn alerts, and beside them the mechanisms that usually explain a breach.

Everything reads the SLO rules' records (glassbox/slo_rules.yaml), `by (namespace, job,
model_name)` with the labels `slo`, `sli` and `threshold`: one line per objective and model
in each namespace. The queries and panels of this dashboard live here; the overview shows
`overview_panels()`.
"""

from __future__ import annotations

from grafanalib.core import Panel
from vllm_glassbox.dashboards import panels as p
from vllm_glassbox.dashboards.common import (
    NUMBER,
    PER_SECOND,
    PLACE,
    RATIO,
    RULE,
    STATE_MAPPINGS,
    Q,
    Row,
    stat,
    table,
    timeseries,
)
from vllm_glassbox.dashboards.common import dashboard as _dashboard

# --- queries --------------------------------------------------------------------------------

RECORD = "namespace_job_model_name_slo:glassbox_slo_"
LEGEND = "{{slo}} ({{sli}}) {{model_name}}, {{namespace}}"


def record(name: str) -> str:
    """A record of the SLO rules for the picked namespaces, jobs and models."""
    return f"{RECORD}{name}{{{RULE}}}"


TARGET = record("target:ratio")


def attainment(window: str) -> str:
    """The share of requests within the objective over a window: 1 - its error ratio."""
    return f"1 - {record('error_ratio:' + window)}"


def burn_rate(window: str) -> str:
    """The error ratio over the budget (1 - target): 1 spends it exactly over the period."""
    return f"{record('error_ratio:' + window)} / (1 - {TARGET} > 0)"


BUDGET_REMAINING = record("error_budget_remaining:ratio")
BOUNDARY_MISSING = record("boundary_missing:count")
REQUESTS = record("requests:rate5m")
SLO_ALERTS = "VLLMSLOFastBurn|VLLMSLOSlowBurn|VLLMSLOTicketBurn|VLLMSLOBoundaryMissing"
# 0 inactive, 1 pending, 2 firing: the worst of each alert and objective.
ALERT_STATES = (
    f'max by (alertname, slo) (2 * ALERTS{{alertname=~"{SLO_ALERTS}", alertstate="firing", '
    f'{RULE}}}) or max by (alertname, slo) (ALERTS{{alertname=~"{SLO_ALERTS}", '
    f'alertstate="pending", {RULE}}})'
)
FIRING = f'count(ALERTS{{alertname=~"{SLO_ALERTS}", alertstate="firing", {PLACE}}}) or vector(0)'
# The workbook's windows, short to long, and the burn each alert pages or tickets at.
SHORT_WINDOWS = ("rate5m", "rate30m", "rate1h", "rate2h", "rate6h")
LONG_WINDOWS = ("rate1d", "rate3d", "period")
BURN_THRESHOLDS = [("green", None), ("orange", 1.0), ("red", 6.0)]
BURN_LINES = [("green", None), ("orange", 1.0), ("red", 6.0), ("purple", 14.4)]

_RECORDS = (
    " From the SLO rules (glassbox rules --slo, or the chart's prometheusRule.slo): one line "
    "per objective and model in each namespace. Empty when Prometheus loads no SLO rules."
)


# --- panels ---------------------------------------------------------------------------------


def attainment_now() -> Panel:
    return timeseries(
        "Attainment: last 5 minutes and last hour",
        "The share of the requests each objective counts that met it: 1 - "
        f"{RECORD}error_ratio:rate5m (solid) and :rate1h (dashed), beside its target "
        "(dotted). A latency objective counts vLLM's histogram bucket at its threshold (the "
        "label threshold: the nearest boundary below when the threshold is none)." + _RECORDS,
        [
            Q(attainment("rate5m"), "5m " + LEGEND),
            Q(attainment("rate1h"), "1h " + LEGEND, dashed=True),
            Q(TARGET, "target " + LEGEND, dashed=True),
        ],
        RATIO,
        min_zero=False,
    )


def attainment_period() -> Panel:
    return timeseries(
        "Attainment over the objective's window",
        f"1 - {RECORD}error_ratio:period: the share of requests within the objective over "
        "its whole window (the SLO file's window: 28 days unless it says otherwise), from "
        "hourly means written every 5 minutes." + _RECORDS,
        [Q(attainment("period"), LEGEND), Q(TARGET, "target " + LEGEND, dashed=True)],
        RATIO,
        min_zero=False,
    )


def budget_remaining() -> Panel:
    return timeseries(
        "Error budget remaining",
        f"{RECORD}error_budget_remaining:ratio: 1 - the window's error ratio over the budget "
        "(1 - target). 1 untouched, 0 spent, below 0 overspent." + _RECORDS,
        [Q(BUDGET_REMAINING, LEGEND)],
        RATIO,
        min_zero=False,
        thresholds=[("red", None), ("orange", 0.0), ("green", 0.25)],
    )


def burn_rates(windows: tuple[str, ...], title: str) -> Panel:
    names = ", ".join(w.removeprefix("rate") for w in windows)
    return timeseries(
        title,
        f"Burn rate over {names}: the window's error ratio over the budget (1 - target). "
        "1 spends the budget exactly over the objective's window; VLLMSLOTicketBurn opens "
        "above 1 (3 days and 6 hours) or 3 (a day and 2 hours), VLLMSLOSlowBurn pages above "
        "6 (6 hours and 30 minutes), VLLMSLOFastBurn above 14.4 (an hour and 5 minutes)."
        + _RECORDS,
        [Q(burn_rate(w), f"{w.removeprefix('rate')} {LEGEND}") for w in windows],
        NUMBER,
        thresholds=BURN_LINES,
    )


def alert_states() -> Panel:
    return timeseries(
        "Burn alerts",
        "State of the SLO alerts from Prometheus' ALERTS series per alert and objective (1 "
        "pending, 2 firing): VLLMSLOFastBurn and VLLMSLOSlowBurn page, VLLMSLOTicketBurn "
        "opens a ticket, VLLMSLOBoundaryMissing says an objective cannot count (see "
        "alerts/runbook.md). Empty while none is pending or firing.",
        [Q(ALERT_STATES, "{{alertname}} {{slo}}")],
        NUMBER,
        mappings=STATE_MAPPINGS,
        band=True,
    )


def boundary_missing() -> Panel:
    return table(
        "Objectives vLLM has no bucket for",
        f"{RECORD}boundary_missing:count: how many series of the model's histogram have no "
        "bucket at the objective's threshold (vLLM runs with other buckets than the SLO "
        "file says). Such an objective's numbers are absent, not guessed. Empty when every "
        "objective can count.",
        [Q(BOUNDARY_MISSING)],
        ["namespace", "model_name", "slo", "sli", "threshold", "Value"],
    )


def requests_counted() -> Panel:
    return timeseries(
        "Requests each objective counts",
        f"{RECORD}requests:rate5m: requests per second in the objective's histogram (latency) "
        "or finished and refused (errors), over 5 minutes." + _RECORDS,
        [Q(REQUESTS, LEGEND)],
        PER_SECOND,
    )


# The overview's row: the worst objective in view.


def worst_attainment_stat() -> Panel:
    return stat(
        "SLO attainment, worst",
        f"The lowest 1 - {RECORD}error_ratio:period among the objectives in view: the share "
        "of requests within its objective over its window. The SLO dashboard has each one."
        + _RECORDS,
        [Q(f"min({attainment('period')})", "worst objective")],
        RATIO,
    )


def worst_budget_stat() -> Panel:
    return stat(
        "Error budget left, least",
        f"The lowest {RECORD}error_budget_remaining:ratio among the objectives in view: 1 "
        "untouched, 0 spent, below 0 overspent." + _RECORDS,
        [Q(f"min({BUDGET_REMAINING})", "least budget")],
        RATIO,
        thresholds=[("red", None), ("orange", 0.0), ("green", 0.25)],
    )


def fastest_burn_stat() -> Panel:
    return stat(
        "Burn rate, last hour, fastest",
        "The highest burn rate over the last hour among the objectives in view (its error "
        "ratio over its budget): 14.4 with the last 5 minutes above it too pages "
        "(VLLMSLOFastBurn)." + _RECORDS,
        [Q(f"max({burn_rate('rate1h')})", "fastest burn")],
        NUMBER,
        thresholds=BURN_THRESHOLDS,
    )


def firing_stat() -> Panel:
    return stat(
        "SLO alerts firing",
        "How many SLO alerts fire (VLLMSLOFastBurn, VLLMSLOSlowBurn, VLLMSLOTicketBurn, "
        "VLLMSLOBoundaryMissing), from Prometheus' ALERTS series.",
        [Q(FIRING, "firing")],
        NUMBER,
        thresholds=[("green", None), ("red", 1)],
    )


def overview_panels() -> list[tuple[Panel, int]]:
    """The overview's SLO row."""
    return [
        (worst_attainment_stat(), 6),
        (worst_budget_stat(), 6),
        (fastest_burn_stat(), 6),
        (firing_stat(), 6),
    ]


dashboard = _dashboard(
    uid="glassbox-slo",
    title="vLLM glassbox / Service-level objectives",
    description="Per objective of the SLO rules: attainment, the error budget left, the burn "
    "rate over each window and the burn alerts, beside the mechanisms that usually explain "
    "a breach (the KV pool, preemptions, the queue, the decode step).",
    rows=[
        Row("Lab phases", [(p.lab_phase(), 24)], height=4),
        Row("The objectives at a glance", overview_panels(), height=4),
        Row("Attainment", [(attainment_now(), 12), (attainment_period(), 12)]),
        Row(
            "Error budget and burn rate",
            [
                (budget_remaining(), 8),
                (burn_rates(SHORT_WINDOWS, "Burn rate: 5 m to 6 h"), 8),
                (burn_rates(LONG_WINDOWS, "Burn rate: a day, 3 days, the window"), 8),
            ],
        ),
        Row(
            "Alerts and what the objectives count",
            [(alert_states(), 8), (requests_counted(), 8), (boundary_missing(), 8)],
        ),
        Row(
            "What usually explains a breach (alerts/runbook.md)",
            [
                (p.kv_usage_stat(), 4),
                (p.waiting_stat(), 4),
                (p.preemptions_stat(), 4),
                (p.preemption_storm_stat(), 4),
                (p.tpot_stat(), 4),
                (p.tokens_per_forward_pass_stat(), 4),
                (p.running_waiting(), 8),
                (p.preemptions(), 8),
                (p.tpot(), 8),
            ],
        ),
    ],
)
