"""What the KV-pressure phase found: the polled timeline, its acts, and the result's JSON
(results.json: `kv_cache_blocks`, `kv_cache_tokens`, `timeline[]`, `max_preemption_jump`)."""

from __future__ import annotations

from dataclasses import asdict, dataclass

from vllm_glassbox.lab.experiments.pool_acts import TimelinePoint
from vllm_glassbox.lab.experiments.pool_forecasts import ForecastJudgement
from vllm_glassbox.lab.results import JSON, Startup, startup_json


@dataclass(frozen=True)
class MissedPoll:
    """A poll that failed or timed out: recorded, never silently skipped."""

    t: float
    error: str


@dataclass(frozen=True)
class Act:
    name: str  # see ACT_CONDITIONS
    start_t: float
    end_t: float
    polls: int
    preemptions: float
    peak_waiting: float
    peak_kv_cache_usage: float


@dataclass(frozen=True)
class PressureSummary:
    """The timeline judged (`judge.pressure_summary`): its acts, peaks and first moments."""

    acts: tuple[Act, ...]
    missing_acts: tuple[str, ...]  # of the article's three, which did not happen
    max_preemption_jump: float
    max_preemption_jump_at: float | None
    preemptions_total: float
    peak_waiting: float | None
    peak_kv_cache_usage: float | None
    first_full_at: float | None
    first_waiting_at: float | None
    first_preemption_at: float | None
    max_gap_seconds: float | None  # largest time between two polls' pages
    max_gap_ended_at: float | None  # t of the page that ended it


@dataclass(frozen=True)
class KvPressureResult:
    startup: Startup | None
    requests: int
    completed: int
    failed: int
    flood_seconds: float  # from the first request sent to the last answered
    timeline: tuple[TimelinePoint, ...]
    pressure: PressureSummary
    request_errors: tuple[str, ...] = ()
    poll_seconds: float | None = None  # the period the timeline was polled at
    missed_polls: tuple[MissedPoll, ...] = ()
    late_polls: int = 0  # polls that took longer than one period
    # The pool's forecasts against the flood's first preemption (pool_forecasts.py).
    forecast: ForecastJudgement | None = None

    def to_json(self) -> JSON:
        p = self.pressure
        return {  # results.json's keys, in their order
            **startup_json(self.startup),
            "requests": self.requests,
            "completed": self.completed,
            "failed": self.failed,
            "flood_seconds": self.flood_seconds,
            "timeline": [asdict(t) for t in self.timeline],
            "acts": [asdict(a) for a in p.acts],
            "max_preemption_jump": p.max_preemption_jump,
            "max_preemption_jump_at": p.max_preemption_jump_at,
            "preemptions_total": p.preemptions_total,
            "peak_waiting": p.peak_waiting,
            "peak_kv_cache_usage": p.peak_kv_cache_usage,
            "first_full_at": p.first_full_at,
            "first_waiting_at": p.first_waiting_at,
            "first_preemption_at": p.first_preemption_at,
            "request_errors": list(self.request_errors),
            "poll_seconds": self.poll_seconds,
            "missed_polls": [asdict(m) for m in self.missed_polls],
            "late_polls": self.late_polls,
            "max_gap_seconds": p.max_gap_seconds,
            "max_gap_ended_at": p.max_gap_ended_at,
            "missing_acts": list(p.missing_acts),
            "forecast": asdict(self.forecast) if self.forecast else None,
        }
