"""A bounded history of snapshots, and increases over a sliding window.

Each poll folds the new readings into running totals with the derivation core's counter
rule (`derive.increase_between`: a restart, seen as a new process start time or a
counter going down, starts every counter of the engine again from zero), so the increase
over any window is one subtraction per counter and memory stays bounded by the number of
polls in a window.

A counter a page does not show (vLLM creates families lazily; a restarting server's
first pages lack some) keeps its total and last reading, and every window whose polls
missed it, or that spans its first sighting or a `_sum` stepping back, gives it as NaN:
unknown, so the ratios that need it are absent (`derive.ratio`) until it has been seen
in two polls of the window again.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass

from vllm_glassbox.core.derive import (
    Increase,
    counters_restarted,
    increase_between,
    process_restarted,
)
from vllm_glassbox.core.snapshot import SUMS, EngineKey, Snapshot
from vllm_glassbox.exporter.pool_window import PoolWindow


@dataclass(frozen=True)
class _Entry:
    at: float  # monotonic seconds
    # Per engine: each counter's latest raw value (carried over polls that missed it).
    readings: Mapping[EngineKey, Mapping[str, float]]
    # Per engine: each counter's growth since first sight, summed (carried likewise).
    totals: Mapping[EngineKey, Mapping[str, float]]
    # Per engine: the counters this page did not show.
    absent: Mapping[EngineKey, frozenset[str]]
    # Per engine: the counters whose growth into this poll is unknown — absent from this
    # page or the one before, new, or a `_sum` that went down. A window spanning such a
    # step has no value for them (never a zero, never a jump).
    gaps: Mapping[EngineKey, frozenset[str]]
    # Per engine: the gauges this page showed (the page's own mapping, not a copy).
    gauges: Mapping[EngineKey, Mapping[str, float]]


_NONE: frozenset[str] = frozenset()


class History:
    def __init__(self, window_seconds: float, max_entries: int) -> None:
        self.window_seconds = window_seconds
        self._entries: deque[_Entry] = deque(maxlen=max(max_entries, 2))
        self._process_start: float | None = None
        self.restarts = 0

    def __len__(self) -> int:
        """How many polls are kept: at most max_entries, however long the exporter runs."""
        return len(self._entries)

    def add(self, snapshot: Snapshot, at: float, gone_since: bool = False) -> bool:
        """Fold in one poll; returns True when it shows that vLLM restarted. `gone_since`:
        the target refused a connection since the poll before (its process was gone), the
        one sign of a restart left to a page without `process_start_time_seconds`
        (multiprocess mode) whose counters all grew past their old values."""
        prev = self._entries[-1] if self._entries else None
        process_restart = process_restarted(self._process_start, snapshot.process_start_time)
        if gone_since and snapshot.process_start_time is None and prev is not None:
            process_restart = True
        restarted = process_restart
        if snapshot.process_start_time is not None:
            self._process_start = snapshot.process_start_time
        readings: dict[EngineKey, dict[str, float]] = {}
        totals: dict[EngineKey, dict[str, float]] = {}
        absent: dict[EngineKey, frozenset[str]] = {}
        gaps: dict[EngineKey, frozenset[str]] = {}
        for key, sample in snapshot.engines.items():
            counters = sample.counters
            before = prev.readings.get(key) if prev else None
            base = prev.totals.get(key) if prev else None
            if prev is None or before is None or base is None:
                # A new engine (or back after missing a poll): its past is in no window.
                readings[key] = dict(counters)
                totals[key] = dict.fromkeys(counters, 0.0)
                absent[key] = _NONE
                gaps[key] = _NONE
                continue
            # Each engine by its own counters: data-parallel engines come and go alone.
            engine_restarted = process_restart or counters_restarted(before, counters)
            restarted = restarted or engine_restarted
            step = increase_between(before, counters, 0.0, engine_restarted)
            total = {name: base.get(name, 0.0) + step[name] for name in counters}
            reading = dict(counters)
            missing = frozenset(before.keys() - counters.keys())
            unknown = set(missing) | (counters.keys() - before.keys())
            unknown |= counters.keys() & prev.absent.get(key, _NONE)  # back after a miss
            if not engine_restarted:
                # A `_sum` that went down while its count grew (a wall clock stepped back):
                # how much it grew is unknown, its new value the base from now on.
                unknown |= {
                    n for n in SUMS & counters.keys() & before.keys() if counters[n] < before[n]
                }
            for name in unknown & counters.keys() & before.keys():
                total[name] = base.get(name, 0.0)  # its step unknown: the window says so
            if missing and not engine_restarted:
                # Carried, so the counter's next reading is compared with its last one;
                # after a restart its old value belongs to the old process: forgotten.
                for name in missing:
                    reading[name] = before[name]
                    total[name] = base.get(name, 0.0)
            readings[key], totals[key] = reading, total
            absent[key] = missing if not engine_restarted else _NONE
            gaps[key] = frozenset(unknown)
        gauges = {key: sample.gauges for key, sample in snapshot.engines.items()}
        self._entries.append(_Entry(at, readings, totals, absent, gaps, gauges))
        if restarted:
            self.restarts += 1
        return restarted

    def increases(self, now: float | None = None) -> dict[EngineKey, Increase]:
        """Increase of every counter over the window ending at the latest poll, per engine.

        An engine needs two polls inside the window; the span used is the time between
        the oldest such poll and the latest (no extrapolation).
        """
        if len(self._entries) < 2:
            return {}
        latest = self._entries[-1]
        horizon = (latest.at if now is None else now) - self.window_seconds
        out: dict[EngineKey, Increase] = {}
        for key, end in latest.totals.items():
            start: _Entry | None = None
            # Walk back over the contiguous run of polls that saw this engine.
            for entry in reversed(self._entries):
                if entry is latest:
                    continue
                if entry.at < horizon - 1e-9 or key not in entry.totals:
                    break
                start = entry
            if start is None:
                continue
            base = start.totals[key]
            unknown: set[str] = set()
            for entry in self._entries:
                if entry.at > start.at and entry.gaps.get(key):
                    unknown |= entry.gaps[key]
            out[key] = Increase(
                {
                    name: math.nan if name in unknown or name not in base else total - base[name]
                    for name, total in end.items()
                    if name not in latest.absent.get(key, _NONE)
                },
                latest.at - start.at,
            )
        return out

    def pool_window(self) -> PoolWindow:
        """The polls of the window ending at the latest poll, for the pools' facts
        (peaks, preemptions and when they came: `pool_window.py`), computed when asked."""
        if not self._entries:
            return PoolWindow((), self.window_seconds)
        horizon = self._entries[-1].at - self.window_seconds - 1e-9
        return PoolWindow([e for e in self._entries if e.at >= horizon], self.window_seconds)

    def gauge_readings(self, name: str) -> dict[EngineKey, list[float]]:
        """Each engine's readings of gauge `name` in the polls of the
        window ending at the latest poll, oldest first; an engine needs two."""
        if len(self._entries) < 2:
            return {}
        horizon = self._entries[-1].at - self.window_seconds
        out: dict[EngineKey, list[float]] = {}
        for entry in self._entries:
            if entry.at < horizon - 1e-9:
                continue
            for key, gauges in entry.gauges.items():
                if name in gauges:
                    out.setdefault(key, []).append(gauges[name])
        return {key: values for key, values in out.items() if len(values) >= 2}

    def forget(self) -> None:
        """Every poll and the process they came from: the next poll starts afresh."""
        self._entries.clear()
        self._process_start = None
