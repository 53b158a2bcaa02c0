"""What the KV-pressure numbers mean: each poll's point through the counters, and the
timeline cut into the article's acts — the pool fills, requests queue at a full pool,
vLLM preempts — each named only where its condition holds."""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence

from vllm_glassbox.core import snapshot as s
from vllm_glassbox.core.snapshot import Snapshot
from vllm_glassbox.lab.experiments.kv_pressure.result import Act, PressureSummary
from vllm_glassbox.lab.experiments.pool_acts import (
    FILLING,
    THREE_ACTS,
    TimelinePoint,
    act_names,
    preemption_jumps,
)
from vllm_glassbox.lab.experiments.pool_forecasts import PoolForecast
from vllm_glassbox.lab.vllm.client import gauge_max, gauge_total, increase

# --- its arithmetic (derive's numbers) -----------------------------------------------------


def timeline_point(
    t: float,
    baseline: Snapshot,
    now: Snapshot,
    latency: float | None = None,
    delay: float | None = None,
    forecast: PoolForecast | None = None,
    exporter: PoolForecast | None = None,
) -> TimelinePoint:
    """One poll, with the pool's forecasts at it (the lab's, the exporter's)."""
    grown = increase(baseline, now, t)
    lab, seen = forecast or PoolForecast(), exporter or PoolForecast()
    return TimelinePoint(
        t=t,
        running=gauge_total(now, s.RUNNING),
        waiting=gauge_total(now, s.WAITING),
        kv_cache_usage=gauge_max(now, s.KV_USAGE),
        preemptions=grown[s.PREEMPTIONS],
        generated_tokens=grown[s.GENERATION_TOKENS],
        latency_seconds=latency,
        delay_seconds=delay,
        headroom_requests=lab.headroom_requests,
        headroom_at_completion=lab.headroom_at_completion,
        exhaustion_seconds=lab.exhaustion_seconds,
        exporter_headroom_requests=seen.headroom_requests,
        exporter_headroom_at_completion=seen.headroom_at_completion,
        exporter_exhaustion_seconds=seen.exhaustion_seconds,
    )


# --- what the numbers mean: the acts -------------------------------------------------------


def name_acts(timeline: Sequence[TimelinePoint], saturation: float) -> list[Act]:
    """The timeline cut into its acts, each with its preemptions and peaks."""
    acts: list[Act] = []
    names = act_names(timeline, saturation)
    for point, jump, name in zip(timeline, preemption_jumps(timeline), names, strict=True):
        waiting, usage = point.waiting or 0.0, point.kv_cache_usage or 0.0
        if acts and acts[-1].name == name:
            last = acts[-1]
            acts[-1] = Act(
                name,
                last.start_t,
                point.t,
                last.polls + 1,
                last.preemptions + jump,
                max(last.peak_waiting, waiting),
                max(last.peak_kv_cache_usage, usage),
            )
        else:
            acts.append(Act(name, point.t, point.t, 1, jump, waiting, usage))
    return acts


def missing_acts(acts: Sequence[Act]) -> list[str]:
    """Which of the article's three acts did not happen, in their order. The first act
    counts only when it opens the flood (before anything waited)."""
    names = [a.name for a in acts]
    missing = []
    if not names or names[0] != FILLING:
        missing.append(FILLING)
    missing += [act for act in THREE_ACTS[1:] if act not in names]
    return missing


#: An act seen in fewer polls than this is a moment, not a stretch of the timeline.
MIN_ACT_POLLS = 3


def thin_acts(acts: Sequence[Act]) -> list[Act]:
    """The article's acts that the polls saw only briefly (fewer than MIN_ACT_POLLS)."""
    return [a for a in acts if a.name in THREE_ACTS and a.polls < MIN_ACT_POLLS]


def largest_gap(timeline: Sequence[TimelinePoint]) -> tuple[float | None, float | None]:
    """The longest time between two consecutive polls' pages, and when the page that
    ended it came."""
    gaps = [(b.t - a.t, b.t) for a, b in itertools.pairwise(timeline)]
    gap, at = max(gaps, default=(None, None))
    return gap, at


def first_time(
    timeline: Sequence[TimelinePoint], cond: Callable[[TimelinePoint], bool]
) -> float | None:
    return next((p.t for p in timeline if cond(p)), None)


def _max(values: Sequence[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return max(present) if present else None


def pressure_summary(timeline: Sequence[TimelinePoint], saturation: float) -> PressureSummary:
    """The timeline judged: its acts, its largest jump of preemptions, peaks, the first
    moments the pool was full, requests waited and vLLM preempted, the largest gap."""
    jumps = preemption_jumps(timeline)
    biggest = max(jumps, default=0.0)
    acts = tuple(name_acts(timeline, saturation))
    gap, gap_ended_at = largest_gap(timeline)
    return PressureSummary(
        acts=acts,
        missing_acts=tuple(missing_acts(acts)),
        max_preemption_jump=biggest,
        max_preemption_jump_at=timeline[jumps.index(biggest)].t if biggest > 0 else None,
        preemptions_total=timeline[-1].preemptions if timeline else 0.0,
        peak_waiting=_max([p.waiting for p in timeline]),
        peak_kv_cache_usage=_max([p.kv_cache_usage for p in timeline]),
        first_full_at=first_time(timeline, lambda p: (p.kv_cache_usage or 0) >= saturation),
        first_waiting_at=first_time(timeline, lambda p: (p.waiting or 0) > 0),
        first_preemption_at=first_time(timeline, lambda p: p.preemptions > 0),
        max_gap_seconds=gap,
        max_gap_ended_at=gap_ended_at,
    )
