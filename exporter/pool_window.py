"""What each engine's KV pool went through over the window, as a diagnosis needs it: the
peaks of the pool's usage and of the queue, the preemptions counted and when the first
and the last were seen.

A diagnosis of a storm is judged as its alert judges it (`max_over_time` of the gauges,
`increase` of the preemptions, over one window), not on the latest poll: preemptions free
blocks, so the pool dips inside every storm, and a judgement of the latest poll flips with
it. The history (`history.py`) keeps, per poll, the gauges read and the counters' totals
(restarts already folded in by the core's counter rule); `PoolWindow` holds the polls of
one window and computes the facts the first time they are asked for, once.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import Protocol

from vllm_glassbox.core import disagg_page as kv
from vllm_glassbox.core import snapshot as s
from vllm_glassbox.core.snapshot import EngineKey

#: The gauges whose peaks a diagnosis reads, by their canonical names (core/snapshot.py).
CAPACITY = kv.WAITING_FOR + "capacity"
DEFERRED = kv.WAITING_FOR + "deferred"
PEAKED = (s.KV_USAGE, s.RUNNING, s.WAITING, CAPACITY, DEFERRED)


class Poll(Protocol):
    """One poll as the history keeps it."""

    @property
    def at(self) -> float: ...  # monotonic seconds

    @property
    def gauges(self) -> Mapping[EngineKey, Mapping[str, float]]: ...

    @property
    def totals(self) -> Mapping[EngineKey, Mapping[str, float]]: ...

    @property
    def gaps(self) -> Mapping[EngineKey, frozenset[str]]: ...


@dataclass(frozen=True)
class PoolFacts:
    """One engine's pool over the window: each gauge's peak over its polls (None where no
    poll showed it) and its value at the latest poll, the preemptions counted (None with
    fewer than two polls, or the counter not seen throughout), and how long before the
    latest poll the first and the last poll came whose preemption counter rose."""

    peaks: Mapping[str, float]
    now: Mapping[str, float]
    polls: int
    seconds: float  # from the oldest poll of the window to the latest
    preemptions: float | None
    first_preemption_ago: float | None
    last_preemption_ago: float | None

    def peak(self, name: str) -> float | None:
        return self.peaks.get(name)


class PoolWindow:
    """The polls of one window (oldest first, the latest last), their facts computed on
    first use. It holds references to polls the history keeps anyway: no copy of a page."""

    def __init__(self, polls: Sequence[Poll], window_seconds: float) -> None:
        self._polls = tuple(polls)
        self._window = window_seconds

    @cached_property
    def facts(self) -> Mapping[EngineKey, PoolFacts]:
        if not self._polls:
            return {}
        latest = self._polls[-1]
        horizon = latest.at - self._window - 1e-9
        return {key: _facts(self._run(key, horizon), key) for key in latest.gauges}

    def _run(self, key: EngineKey, horizon: float) -> list[Poll]:
        """The unbroken run of polls inside the window that saw the engine, oldest first."""
        run: list[Poll] = []
        for poll in reversed(self._polls):
            if poll.at < horizon or key not in poll.gauges:
                break
            run.append(poll)
        run.reverse()
        return run


def _facts(run: Sequence[Poll], key: EngineKey) -> PoolFacts:
    latest = run[-1]
    peaks: dict[str, float] = {}
    for poll in run:
        for name in PEAKED:
            value = poll.gauges[key].get(name)
            if value is not None and math.isfinite(value):
                peaks[name] = max(value, peaks.get(name, value))
    now = {n: v for n in PEAKED if (v := latest.gauges[key].get(n)) is not None}
    rises = _rises(run, key)
    counted = _counted(run, key)
    return PoolFacts(
        peaks=peaks,
        now=now,
        polls=len(run),
        seconds=latest.at - run[0].at,
        preemptions=counted,
        first_preemption_ago=latest.at - rises[0].at if rises else None,
        last_preemption_ago=latest.at - rises[-1].at if rises else None,
    )


def _rises(run: Sequence[Poll], key: EngineKey) -> list[Poll]:
    """The polls after the first whose preemption total rose (a step of unknown growth,
    a poll that missed the counter, is not one)."""
    out = []
    for before, poll in itertools.pairwise(run):
        then = before.totals[key].get(s.PREEMPTIONS)
        total = poll.totals[key].get(s.PREEMPTIONS)
        if then is None or total is None or s.PREEMPTIONS in poll.gaps.get(key, frozenset()):
            continue
        if total > then:
            out.append(poll)
    return out


def _counted(run: Sequence[Poll], key: EngineKey) -> float | None:
    """The preemption counter's increase over the run, as `History.increases` gives it;
    None when unknown (fewer than two polls, the counter absent, or a gap in it)."""
    if len(run) < 2:
        return None
    start, end = run[0].totals[key].get(s.PREEMPTIONS), run[-1].totals[key].get(s.PREEMPTIONS)
    if start is None or end is None:
        return None
    if any(s.PREEMPTIONS in poll.gaps.get(key, frozenset()) for poll in run[1:]):
        return None
    return end - start
