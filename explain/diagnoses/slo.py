"""slo: each service-level objective of the model, from its rules' records: burning (the
most urgent burn alert whose condition holds), kept, or unreadable; what usually explains
a burn is named, not judged again. The thresholds are the burn alerts' own
(`slo.BURN_ALERTS`, read from the rule template)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from vllm_glassbox.core import derive
from vllm_glassbox.core import slo as objectives
from vllm_glassbox.explain.diagnoses.common import RUNBOOK
from vllm_glassbox.explain.findings import (
    Figure,
    Finding,
    Severity,
    Statement,
    core,
    joined,
    read,
    say,
    say_if,
)
from vllm_glassbox.explain.scene import ObjectiveState, Reading, Scene

#: Each burn alert (glassbox/slo_rules.yaml, most urgent first: `slo.BURN_ALERTS`) as a
#: finding: its name, severity and title. A fast burn is critical, as its page; a slow
#: burn and a ticket's are warnings: the budget goes, not within hours.
BURNS: dict[str, tuple[str, Severity, str]] = {
    "VLLMSLOFastBurn": ("fast_burn", "critical", "its error budget burns fast"),
    "VLLMSLOSlowBurn": ("slow_burn", "warning", "its error budget burns"),
    "VLLMSLOTicketBurn": ("ticket_burn", "warning", "its error budget runs out early"),
}
BOUNDARY_MISSING = "VLLMSLOBoundaryMissing"
#: The records' windows (their names' suffixes) in words.
WINDOW_WORDS = {
    "rate5m": "the last five minutes",
    "rate30m": "the last thirty minutes",
    "rate1h": "the last hour",
    "rate2h": "the last two hours",
    "rate6h": "the last six hours",
    "rate1d": "the last day",
    "rate3d": "the last three days",
}
#: The window a kept objective is told by: the first one recorded.
KEPT_WINDOWS = ("rate1h", "rate5m", "rate6h", "rate30m", "rate1d", "rate2h", "rate3d")
#: What a request must do to meet a latency objective ({threshold}: the boundary counted).
SLI_WORDS = {
    "ttft": "a first token within {threshold}",
    "tpot": "a time per output token within {threshold}",
    "e2e": "a whole answer within {threshold}",
}
_QUEUE = ("kv_pool/preemption_storm", "kv_pool/saturated")
_DECODE = (
    "decode/not_weight_bound",
    "decode/weight_bound",
    "speculation/bypassed",
    "speculation/not_paying",
    "speculation/low_acceptance",
)
#: The findings that usually explain a burn of each SLI (alerts/runbook.md, "What usually
#: explains a breach"): requests waiting for KV room delay first tokens; preemptions and a
#: slow decode step stretch the time per token; both lengthen a request end to end.
BEHIND = {
    "ttft": _QUEUE,
    "tpot": ("kv_pool/preemption_storm", *_DECODE),
    "e2e": (*_QUEUE, *_DECODE),
    "errors": (),
}
_ERRORS_UNSEEN = (
    "why requests failed: aborts and errors by finished_reason, refusals at admission "
    "(vllm:admission_rejections_total) and vLLM's log; no mechanism glassbox derives "
    "explains them"
)


def _objective_title(o: ObjectiveState, state: str) -> str:
    where = ", ".join(f"{k} {v}" for k, v in o.labels.items())
    return f"SLO {o.name}{f' ({where})' if where else ''}: {state}"


def _met(o: ObjectiveState, missed: Figure, window: str) -> Statement:
    """Over `window`, the share of requests that missed the objective, in its words."""
    threshold = read(o.threshold, "seconds")
    asked = read(o.asked_threshold, "seconds")
    if o.sli not in SLI_WORDS or threshold is None:
        return say(
            f"over {WINDOW_WORDS[window]} {{missed}} of requests were aborted, failed or refused",
            missed=missed,
        )
    met = say(
        f"over {WINDOW_WORDS[window]} {{missed}} of requests missed {SLI_WORDS[o.sli]}",
        missed=missed,
        threshold=threshold,
    )
    if asked is not None and asked.value > threshold.value:
        return joined(
            met, say(" (the bucket boundary counted, below the objective's {asked})", asked=asked)
        )
    return met


def _none_missed(o: ObjectiveState, window: str) -> Statement:
    """Over `window`, no request missed the objective."""
    threshold = read(o.threshold, "seconds")
    if o.sli not in SLI_WORDS or threshold is None:
        return say(f"over {WINDOW_WORDS[window]} no request was aborted, failed or refused")
    return say(
        f"over {WINDOW_WORDS[window]} every request got {SLI_WORDS[o.sli]}", threshold=threshold
    )


def _budget(o: ObjectiveState, target: Figure) -> Statement | None:
    """The period's error budget: what is left, or how many times over it is spent."""
    left = read(o.budget_remaining, "ratio")
    if left is None:
        return None
    if left.value >= 0:
        return say("; {left} of the error budget is left", left=left)
    spent = core(derive.burn_rate, o.error_ratios.get("period"), target, unit="times")
    return say_if(
        "; over the objective's window it has spent {spent} its error budget", spent=spent
    ) or say("; the error budget is overspent ({left} left)", left=left)


def _confidence(o: ObjectiveState, budget: Statement | None) -> tuple[list[str], list[str]]:
    assumes = [
        "each error ratio is its record at the window's end, over the record's own window "
        "(not --since), summed over the model's engines and replicas of the job"
    ]
    unseen = []
    threshold, asked = o.threshold, o.asked_threshold
    if o.sli in SLI_WORDS and threshold is not None:
        if asked is None:
            unseen.append(
                "whether the objective's own threshold is above the boundary counted (the "
                "rules count the nearest bucket boundary below it): --slo with its SLO file "
                "says"
            )
        elif asked.value > threshold.value:
            assumes.append(
                "requests between the bucket boundary counted and the objective's threshold "
                "count as missed: the burn is overstated, never understated"
            )
        elif asked.value < threshold.value:
            unseen.append(
                "the objective as the SLO file says it: its records count a boundary above "
                "the file's threshold (rules rendered from another file)"
            )
    if budget is None:
        unseen.append(
            "the error budget left (…_error_budget_remaining:ratio absent: its group runs "
            "every five minutes, and needs a request counted in the objective's window)"
        )
    if o.sli == "errors":
        unseen.append(_ERRORS_UNSEEN)
    return assumes, unseen


def _unrecorded(o: ObjectiveState) -> Finding | None:
    """An objective of the SLO file given that Prometheus has no record of."""
    if o.asked_in is None:
        return None
    return Finding(
        "slo",
        "no_records",
        "info",
        _objective_title(o, "no records"),
        say(
            "Prometheus has no record of this objective of the SLO file for this model: its "
            "rules are not loaded here, or were rendered from another file"
        ),
        unseen=(
            f'namespace_job_model_name_slo:glassbox_slo_target:ratio{{slo="{o.name}"}} '
            f"(glassbox rules --slo {o.asked_in} renders them)",
        ),
    )


def _unreadable(o: ObjectiveState, missing: Figure) -> Finding:
    """vLLM has no bucket at the objective's boundary: nothing can be judged of it."""
    what = say_if(
        "this model's vLLM histogram has no bucket at {threshold}, the boundary this "
        "objective counts, in {missing} of its series: its attainment, error budget and burn "
        "rates are absent, and nothing is judged",
        missing=missing,
        threshold=read(o.threshold, "seconds"),
    ) or say(
        "this model's vLLM histogram has no bucket at the boundary this objective counts in "
        "{missing} of its series: its attainment, error budget and burn rates are absent, and "
        "nothing is judged",
        missing=missing,
    )
    shown = BOUNDARY_MISSING in o.firing and o.alerts_source is not None
    return Finding(
        "slo",
        "boundary_missing",
        "warning",
        _objective_title(o, "cannot be read"),
        what,
        unseen=(
            "whether requests meet it: vLLM runs with other buckets than the SLO file says "
            "(docs/slo.md)",
        ),
        runbook=f"{RUNBOOK}#{BOUNDARY_MISSING.lower()}",
        also_read=(f"{o.alerts_source}: {BOUNDARY_MISSING}",) if shown else (),
    )


def _kept(
    o: ObjectiveState, window: str, burn: Figure, target: Figure, budget: Statement | None
) -> Statement:
    """Under every burn alert's factor: the share missed over `window`, its burn, the budget."""
    missed = read(o.error_ratios[window], "ratio")
    if missed is None or missed.value == 0:
        return joined(
            _none_missed(o, window), say(", against a target of {target}", target=target), budget
        )
    return joined(
        _met(o, missed, window),
        say(
            ", against a target of {target}: the error budget burns {burn} as fast as the "
            "objective allows, under every burn alert's factor",
            target=target,
            burn=burn,
        ),
        budget,
    )


def _burning(
    o: ObjectiveState,
    alert: str,
    clause: objectives.BurnClause,
    burns: Mapping[str, Figure | None],
    target: Figure,
    budget: Statement | None,
    holding: Sequence[str],
) -> Statement:
    """The alert's condition: the share missed over its long window, the burn over both
    windows above its factor, the burn alerts Prometheus shows firing, the budget."""
    long, short = clause.windows
    missed = read(o.error_ratios[long], "ratio")
    assert missed is not None  # its burn rate holds
    factor = read(Reading(clause.factor, f"{alert} (glassbox/slo_rules.yaml)"), "times")
    firing = [a for a in holding if a in o.firing]
    return joined(
        _met(o, missed, long),
        say(
            ", against a target of {target}: the error budget burns {burn_long} as fast as the "
            f"objective allows, and {{burn_short}} over {WINDOW_WORDS[short]}, above {alert}'s "
            "{factor}",
            target=target,
            burn_long=burns[long],
            burn_short=burns[short],
            factor=factor,
        ),
        say(f" ({', '.join(firing)} firing)") if firing else None,
        budget,
    )


def _objective(o: ObjectiveState) -> Finding | None:
    if not o.recorded:
        return _unrecorded(o)
    missing = read(o.boundary_missing, "count")
    if missing is not None and missing.value > 0:
        return _unreadable(o, missing)
    target = read(o.target, "ratio")
    burns = {
        window: core(derive.burn_rate, reading, o.target, unit="times")
        for window, reading in o.error_ratios.items()
    }
    window = next((w for w in KEPT_WINDOWS if burns.get(w) is not None), None)
    if target is None or window is None:
        return None  # no request counted in three days: nothing to judge, nothing said
    holding = [
        (alert, clause)
        for alert, clauses in objectives.BURN_ALERTS.items()
        for clause in clauses
        if all((b := burns.get(w)) is not None and b.value > clause.factor for w in clause.windows)
    ]
    budget = _budget(o, target)
    assumes, unseen = _confidence(o, budget)
    if not holding:
        burn = burns[window]
        assert burn is not None
        what = _kept(o, window, burn, target, budget)
        return Finding(
            "slo",
            "kept",
            "ok",
            _objective_title(o, "kept"),
            what,
            assumes=tuple(assumes),
            unseen=tuple(unseen),
        )
    alert, clause = holding[0]
    alerts = list(dict.fromkeys(a for a, _ in holding))
    finding, severity, state = BURNS[alert]
    if alert not in o.firing and o.alerts_source is not None:
        unseen.append(
            f"{alert} firing: Prometheus shows it not firing for this objective (its rules "
            "evaluated elsewhere, or at another moment)"
        )
    firing = [a for a in alerts if a in o.firing]
    return Finding(
        "slo",
        finding,
        severity,
        _objective_title(o, state),
        _burning(o, alert, clause, burns, target, budget, alerts),
        assumes=tuple(assumes),
        unseen=tuple(unseen),
        runbook=f"{RUNBOOK}#{alert.lower()}",
        see=BEHIND.get(o.sli, ()),
        also_read=(f"{o.alerts_source}: {', '.join(firing)}",) if firing else (),
    )


def slo(scene: Scene) -> list[Finding]:
    """Each service-level objective of the model, from its rules' records: burning (the
    most urgent burn alert whose condition holds, with its windows' burn rates and the
    budget left), kept, or unreadable (vLLM lacks its bucket); with an SLO file, its
    objectives Prometheus has no record of. One that counted no request says nothing.
    What usually explains a burn is named, not judged again: the pool's, decode's and
    speculation's findings of the same scene (`explain` keeps those that are there)."""
    return [f for o in scene.objectives if (f := _objective(o)) is not None]
