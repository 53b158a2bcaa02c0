"""The KV-pressure phase in report.md: its summary line and its section (the acts, the
polling's health, the pool timeline)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

from vllm_glassbox.lab.experiments.kv_pressure.judge import MIN_ACT_POLLS, thin_acts
from vllm_glassbox.lab.experiments.kv_pressure.result import Act, KvPressureResult
from vllm_glassbox.lab.experiments.pool_acts import (
    ACT_CONDITIONS,
    THREE_ACTS,
    TimelinePoint,
    preemption_jumps,
)
from vllm_glassbox.lab.experiments.pool_forecasts import forecast_table, verdict
from vllm_glassbox.lab.report_format import (
    Column,
    integer,
    num,
    percent,
    plot_name,
    server_facts,
    table_of,
)
from vllm_glassbox.lab.results import PhaseResult

MAX_TIMELINE_ROWS = 40


def summary(k: KvPressureResult) -> str:
    """The pool, its acts, the queue and the preemptions, in one sentence."""
    found = k.pressure
    pool = integer(k.startup.kv_cache_tokens if k.startup else None)
    acts = " → ".join(a.name for a in found.acts)
    story = (
        "the article's three acts"
        if not found.missing_acts
        else f"missing act(s): {', '.join(found.missing_acts)}"
    )
    gap = (
        f"; largest gap between polls {found.max_gap_seconds:.1f} s "
        f"(poll every {num(k.poll_seconds)} s)"
        if found.max_gap_seconds is not None
        else ""
    )
    return (
        f"pool of {pool} tokens; {acts} ({story}); full after {num(found.first_full_at)} s, "
        f"queue peaked at {integer(found.peak_waiting)}, {found.preemptions_total:g} "
        f"preemptions, the largest jump {found.max_preemption_jump:g} in one poll"
        + (
            f" (t = {found.max_preemption_jump_at:.0f} s)"
            if found.max_preemption_jump_at is not None
            else ""
        )
        + gap
        + (f"; {len(k.missed_polls)} poll(s) failed" if k.missed_polls else "")
        + (f"; first preemption forecast: {verdict(k.forecast)}" if k.forecast else "")
        + "."
    )


def _sampled(timeline: Sequence[TimelinePoint], keep: set[int]) -> list[int]:
    if len(timeline) <= MAX_TIMELINE_ROWS:
        return list(range(len(timeline)))
    step = len(timeline) / MAX_TIMELINE_ROWS
    picked = {int(i * step) for i in range(MAX_TIMELINE_ROWS)} | keep | {len(timeline) - 1}
    return sorted(picked)


ACT_COLUMNS: tuple[Column[Act], ...] = (
    Column("act", lambda a: a.name),
    Column("condition", lambda a: ACT_CONDITIONS.get(a.name, "")),
    Column("from s", lambda a: f"{a.start_t:.0f}"),
    Column("to s", lambda a: f"{a.end_t:.0f}"),
    Column("polls", lambda a: str(a.polls)),
    Column("preemptions", lambda a: f"{a.preemptions:g}"),
    Column("peak waiting", lambda a: integer(a.peak_waiting)),
    Column("peak KV", lambda a: percent(a.peak_kv_cache_usage)),
)


class _Poll(NamedTuple):
    """A row of the pool timeline: one poll, and the preemptions it saw."""

    point: TimelinePoint
    jump: float


POLL_COLUMNS: tuple[Column[_Poll], ...] = (
    Column("t s", lambda r: f"{r.point.t:.1f}"),
    Column("running", lambda r: num(r.point.running)),
    Column("waiting", lambda r: num(r.point.waiting)),
    Column("KV usage", lambda r: percent(r.point.kv_cache_usage)),
    Column("preemptions", lambda r: f"{r.point.preemptions:g}"),
    Column("this poll", lambda r: f"+{r.jump:g}" if r.jump else ""),
    Column("tokens", lambda r: integer(r.point.generated_tokens)),
    Column("answer s", lambda r: num(r.point.latency_seconds, 2)),
    Column("sent late s", lambda r: num(r.point.delay_seconds, 2)),
)


def section(phase: PhaseResult, k: KvPressureResult) -> list[str]:
    found = k.pressure
    out = server_facts(k.startup)
    out += [
        f"{k.requests} concurrent requests, {k.completed} completed, {k.failed} failed, "
        f"in {k.flood_seconds:.0f} s. Preemptions: {found.preemptions_total:g} in total, "
        f"the largest jump **{found.max_preemption_jump:g}** in one poll. Peak KV usage "
        f"{percent(found.peak_kv_cache_usage)}, peak queue {integer(found.peak_waiting)}.",
        "",
        "The acts, each named only where its condition holds. vLLM counts a preemption "
        "when the preempted request runs again, so at a full pool requests queue before "
        "the count moves.",
        "",
    ]
    out += table_of(ACT_COLUMNS, found.acts)
    if found.missing_acts:
        out += [
            f"**Missing act(s)** of the article's three ({' → '.join(THREE_ACTS)}): "
            f"{', '.join(found.missing_acts)}.",
            "",
        ]
    else:
        out += ["All three of the article's acts happened, in order.", ""]
    for act in thin_acts(found.acts):
        out += [
            f"**{act.name.capitalize()} was seen in {act.polls} poll(s) only** "
            f"(under {MIN_ACT_POLLS}): it passed faster than the polls; a shorter `poll` "
            "shows it.",
            "",
        ]
    if k.poll_seconds is not None:
        hole = found.max_gap_seconds is not None and found.max_gap_seconds > 2 * k.poll_seconds
        out += [
            f"Polled every {num(k.poll_seconds)} s by a process of its own: "
            f"{len(k.timeline)} pages, {k.late_polls} late (vLLM took longer than a period "
            f"to answer), {len(k.missed_polls)} failed; the largest gap between two pages "
            f"{num(found.max_gap_seconds)} s"
            + (" — **a hole in the timeline** (more than two periods)" if hole else "")
            + _gap_cause(k)
            + ".",
            "",
        ]
        for m in k.missed_polls[:10]:
            out += [f"- poll at {m.t:.1f} s failed: {m.error}"]
        if k.missed_polls:
            out += [""]
    if k.forecast is not None:
        out += [
            f"**Did the pool's forecasts see the first preemption coming?** {verdict(k.forecast)}.",
            "",
            *forecast_table(k.forecast),
            "",
        ]
    jumps = preemption_jumps(k.timeline)
    biggest = {jumps.index(max(jumps))} if jumps and max(jumps) > 0 else set()
    rows = [_Poll(k.timeline[i], jumps[i]) for i in _sampled(k.timeline, biggest)]
    out += [
        "The pool timeline"
        + (
            " (sampled; every poll is in results.json)"
            if len(k.timeline) > MAX_TIMELINE_ROWS
            else ""
        )
        + ":",
        "",
    ]
    out += table_of(POLL_COLUMNS, rows)
    if k.request_errors:
        out += ["Request errors: " + "; ".join(k.request_errors), ""]
    out += [f"![KV pressure timeline]({plot_name(phase, 'timeline')})", ""]
    return out


def _gap_cause(k: KvPressureResult) -> str:
    """Why the largest gap: the page ending it was sent late, or vLLM answered late."""
    end = next((p for p in k.timeline if p.t == k.pressure.max_gap_ended_at), None)
    if end is None or k.poll_seconds is None or end.latency_seconds is None:
        return ""
    parts = []
    if (end.delay_seconds or 0.0) > 0.5 * k.poll_seconds:
        parts.append(
            f"its closing poll was sent {end.delay_seconds:.1f} s after its tick (this "
            "machine's CPU was taken)"
        )
    if end.latency_seconds > 0.5 * k.poll_seconds:
        parts.append(f"vLLM took {end.latency_seconds:.1f} s to answer it")
    return f": {' and '.join(parts)}" if parts else ""
