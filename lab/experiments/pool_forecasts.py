"""The pool's forecasts at every poll, and how they fared against the first preemption.

Three series foretell that a KV pool runs out (docs/exporter.md, "Forecasts"): the
headroom (more requests of the current mean size that fit: it reaches 0 as the pool
fills), the headroom at completion (the running requests priced at the size requests
finish at: below 0 while the pool still has room) and the time to exhaustion (the pool's
recent growth extrapolated). VLLMKVCacheExhaustionForecast fires when the last two agree.

The KV-pressure and rate-sweep kinds compute them at every poll by the derivation core
over their own polls (`Forecaster`), read the exporter's beside (`exporter_forecast`),
and judge each against the first preemption (`judge_forecasts`): how long before it the
series crossed its threshold (its lead), and how often it crossed with no preemption
following (its false alarms).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from vllm_glassbox.core import derive, series
from vllm_glassbox.core import snapshot as s
from vllm_glassbox.core.kv_trend import UsedTokensTrend
from vllm_glassbox.core.own_page import ExporterPage
from vllm_glassbox.core.snapshot import EngineKey, Snapshot
from vllm_glassbox.lab.experiments.pool_acts import TimelinePoint, preemption_jumps

#: How far back the pool's growth is measured for its time to exhaustion: the lab's and
#: its exporter's (`--forecast-window`), whose window otherwise spans a whole segment.
FORECAST_WINDOW_SECONDS = 30.0
#: A crossing followed by no preemption within this long after it ended is a false alarm.
FALSE_ALARM_GRACE_SECONDS = 60.0


@dataclass(frozen=True)
class PoolForecast:
    """One poll's forecasts of the pool: the headroom summed over the engines (as the
    exporter's series add up), the two others of the engine that fills first."""

    headroom_requests: float | None = None
    headroom_at_completion: float | None = None
    exhaustion_seconds: float | None = None


def _lowest(values: Iterable[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return min(present) if present else None


def _total(values: Iterable[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return sum(present) if present else None


class Forecaster:
    """The derivation core's forecasts over the lab's own polls of one server: the sizes
    requests finish at counted from `baseline` (requests that finished since), the pool's
    growth over FORECAST_WINDOW_SECONDS of polls. `capacity` is one engine's pool."""

    def __init__(self, baseline: Snapshot, capacity: int | None) -> None:
        self.baseline = baseline
        self.capacity = capacity
        self.trend = UsedTokensTrend(FORECAST_WINDOW_SECONDS, max_entries=4096)

    def at(self, monotonic: float, now: Snapshot, seconds: float) -> PoolForecast:
        """The forecasts of the page `now`, read at `monotonic`, `seconds` after baseline."""
        capacity = self.capacity
        used = {
            key: derive.kv_cache_used_tokens(e.gauges.get(s.KV_USAGE), capacity)
            for key, e in now.engines.items()
        }
        self.trend.add(monotonic, {k: v for k, v in used.items() if v is not None})
        growth = self.trend.growth()
        grown = derive.engines_together(
            derive.increase_between(
                self.baseline.engines[key].counters if key in self.baseline.engines else {},
                e.counters,
                seconds,
            )
            for key, e in now.engines.items()
        )
        size = derive.request_tokens_at_completion(grown)

        def exhaustion(key: EngineKey) -> float | None:
            g = growth.get(key)
            free = derive.kv_cache_free_tokens(used[key], capacity)
            return (
                None if g is None else derive.kv_cache_exhaustion_seconds(free, g.tokens, g.seconds)
            )

        engines = now.engines
        return PoolForecast(
            headroom_requests=_total(
                derive.kv_cache_headroom_requests(used[k], capacity, e.gauges.get(s.RUNNING))
                for k, e in engines.items()
            ),
            headroom_at_completion=_lowest(
                derive.kv_cache_headroom_requests_at_completion(
                    capacity, e.gauges.get(s.RUNNING), size
                )
                for e in engines.values()
            ),
            exhaustion_seconds=_lowest(exhaustion(k) for k in engines),
        )


def exporter_forecast(page: ExporterPage) -> PoolForecast:
    """The exporter's forecasts on its page, combined over engines as `PoolForecast` says."""

    def values(family: series.Family) -> list[float | None]:
        return [value for _, value in page.samples.get(family.name, ())]

    return PoolForecast(
        headroom_requests=_total(values(series.KV_HEADROOM)),
        headroom_at_completion=_lowest(values(series.KV_HEADROOM_AT_COMPLETION)),
        exhaustion_seconds=_lowest(values(series.KV_EXHAUSTION)),
    )


# --- the judgement ----------------------------------------------------------------------


def _below(value: float | None, threshold: float) -> bool:
    return value is not None and value < threshold


@dataclass(frozen=True)
class Warning:
    """When a forecast warns, as the report states it, and the fields it reads."""

    text: str
    fields: tuple[str, ...]
    warns: Callable[[PoolForecast], bool]

    def present(self, forecast: PoolForecast | None) -> bool:
        return forecast is not None and all(getattr(forecast, f) is not None for f in self.fields)


_SOON = derive.KV_EXHAUSTION_WARNING_SECONDS
#: Each forecast series, and when it warns.
WARNINGS: dict[str, Warning] = {
    "headroom": Warning(
        "no more request of the current mean size fits (headroom ≤ 0)",
        ("headroom_requests",),
        lambda f: f.headroom_requests is not None and f.headroom_requests <= 0,
    ),
    "headroom at completion": Warning(
        "the running requests, at the size requests finish at, outgrow the pool (< 0)",
        ("headroom_at_completion",),
        lambda f: _below(f.headroom_at_completion, 0.0),
    ),
    "time to exhaustion": Warning(
        f"full within {_SOON:g} s at the recent growth",
        ("exhaustion_seconds",),
        lambda f: _below(f.exhaustion_seconds, _SOON),
    ),
    "forecast alert": Warning(
        "both of the last two: VLLMKVCacheExhaustionForecast's condition, without its 2 minutes",
        ("headroom_at_completion", "exhaustion_seconds"),
        lambda f: _below(f.headroom_at_completion, 0.0) and _below(f.exhaustion_seconds, _SOON),
    ),
}


@dataclass(frozen=True)
class ForecastPoint:
    """One poll as the judgement needs it."""

    t: float  # seconds since the phase began
    preempted: bool  # this poll counted new preemptions
    lab: PoolForecast
    exporter: PoolForecast | None = None


@dataclass(frozen=True)
class ForecastCheck:
    """One forecast series from one source against the phase's preemptions."""

    forecast: str  # a key of WARNINGS
    source: str  # "lab" (the derivation core over the lab's polls) or "exporter"
    polls_seen: int  # polls at which the series was present
    warned_at: float | None  # start of the warning the first preemption came in, if any
    lead_seconds: float | None  # first preemption's poll − warned_at (0: the same poll)
    warnings: int  # separate runs of polls below the threshold
    false_alarms: int  # warnings no preemption followed within FALSE_ALARM_GRACE_SECONDS


@dataclass(frozen=True)
class ForecastJudgement:
    first_preemption_at: float | None
    checks: tuple[ForecastCheck, ...]

    def check(self, forecast: str, source: str = "lab") -> ForecastCheck | None:
        return next((c for c in self.checks if (c.forecast, c.source) == (forecast, source)), None)

    @property
    def best(self) -> ForecastCheck | None:
        """The check with the longest lead before the first preemption."""
        leading = [c for c in self.checks if c.lead_seconds is not None]
        return max(leading, key=lambda c: c.lead_seconds or 0.0) if leading else None


def _runs(flags: Sequence[bool]) -> list[tuple[int, int]]:
    """(first, last) index of each run of True."""
    runs: list[tuple[int, int]] = []
    for i, flag in enumerate(flags):
        if flag and (not runs or runs[-1][1] != i - 1):
            runs.append((i, i))
        elif flag:
            runs[-1] = (runs[-1][0], i)
    return runs


def _check(
    points: Sequence[ForecastPoint],
    name: str,
    source: str,
    forecasts: Sequence[PoolForecast | None],
) -> ForecastCheck:
    warning = WARNINGS[name]
    runs = _runs([f is not None and warning.warns(f) for f in forecasts])
    first = next((i for i, p in enumerate(points) if p.preempted), None)
    warned_at = lead = None
    if first is not None:
        # The latest warning begun by the first preemption's poll and over no longer than
        # the grace before it: vLLM counts a preemption when the preempted request runs
        # again, so the count can trail a full pool by seconds (the pool, freed by the
        # eviction, ends the warning first).
        at = points[first].t
        leading = [
            (a, b) for a, b in runs if a <= first and at - points[b].t <= FALSE_ALARM_GRACE_SECONDS
        ]
        if leading:
            warned_at = points[leading[-1][0]].t
            lead = at - warned_at
    preempted_at = [p.t for p in points if p.preempted]
    false_alarms = sum(
        1
        for a, b in runs
        if not any(
            points[a].t <= t <= points[b].t + FALSE_ALARM_GRACE_SECONDS for t in preempted_at
        )
    )
    seen = sum(1 for f in forecasts if warning.present(f))
    return ForecastCheck(name, source, seen, warned_at, lead, len(runs), false_alarms)


def judge_forecasts(points: Sequence[ForecastPoint]) -> ForecastJudgement:
    """Every forecast of every source against the first preemption, and its false alarms."""
    first = next((p.t for p in points if p.preempted), None)
    checks = [_check(points, name, "lab", [p.lab for p in points]) for name in WARNINGS]
    if any(p.exporter is not None for p in points):
        checks += [
            _check(points, name, "exporter", [p.exporter for p in points]) for name in WARNINGS
        ]
    return ForecastJudgement(first, tuple(checks))


def judge_timeline(timeline: Sequence[TimelinePoint], exporter: bool) -> ForecastJudgement:
    """`judge_forecasts` over a timeline of polls (`exporter`: whether an exporter beside
    gave its series, so that its absence is judged too)."""
    points = [
        ForecastPoint(
            p.t,
            jump > 0,
            PoolForecast(p.headroom_requests, p.headroom_at_completion, p.exhaustion_seconds),
            PoolForecast(
                p.exporter_headroom_requests,
                p.exporter_headroom_at_completion,
                p.exporter_exhaustion_seconds,
            )
            if exporter
            else None,
        )
        for p, jump in zip(timeline, preemption_jumps(timeline), strict=True)
    ]
    return judge_forecasts(points)


# --- in words ----------------------------------------------------------------------------


def _lead_words(check: ForecastCheck) -> str:
    if check.polls_seen == 0:
        return "never present"
    if check.lead_seconds is None:
        return "no warning before it"
    if check.lead_seconds <= 0:
        return "at the same poll"
    return f"{check.lead_seconds:.1f} s ahead"


def verdict(judgement: ForecastJudgement) -> str:
    """One sentence: which forecast saw the first preemption coming first, and how far ahead."""
    if judgement.first_preemption_at is None:
        return "no preemption happened"
    best = judgement.best
    if best is None:
        return "no forecast warned before the first preemption"
    where = "the lab's" if best.source == "lab" else "the exporter's"
    if best.lead_seconds is not None and best.lead_seconds <= 0:
        return f"at once: {where} {best.forecast} warned at the same poll as the first preemption"
    return (
        f"yes: {where} {best.forecast} warned {best.lead_seconds:.1f} s before the first "
        f"preemption ({best.false_alarms} false alarm(s) in {best.warnings} warning(s))"
    )


def forecast_table(judgement: ForecastJudgement) -> list[str]:
    """Every forecast against the first preemption, as a Markdown table."""
    rows = [
        "| forecast | warns when | from | before the first preemption | warnings | false alarms |"
        " polls present |",
        "| --- | --- | --- | --- | ---: | ---: | ---: |",
    ]
    for c in judgement.checks:
        source = "lab (derivation core)" if c.source == "lab" else "exporter"
        rows.append(
            f"| {c.forecast} | {WARNINGS[c.forecast].text} | {source} | {_lead_words(c)} "
            f"| {c.warnings} | {c.false_alarms} | {c.polls_seen} |"
        )
    return rows
