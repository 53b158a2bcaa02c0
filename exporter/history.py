"""A bounded history of snapshots, and increases over a sliding window.

Each poll folds the new readings into reset-adjusted running totals (Prometheus'
`increase()` rule, plus vLLM's `process_start_time_seconds` as a restart signal), so the
increase over any window is one subtraction per counter and memory stays bounded by the
number of polls in a window.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass

from .derive import Increase, counter_increase
from .snapshot import EngineKey, Snapshot


@dataclass(frozen=True)
class _Entry:
    at: float  # monotonic seconds
    readings: Mapping[EngineKey, Mapping[str, float]]  # raw counter values
    totals: Mapping[EngineKey, Mapping[str, float]]  # reset-adjusted, from 0 at first sight


class History:
    def __init__(self, window_seconds: float, max_entries: int) -> None:
        self.window_seconds = window_seconds
        self._entries: deque[_Entry] = deque(maxlen=max(max_entries, 2))
        self._process_start: float | None = None
        self.restarts = 0

    def add(self, snapshot: Snapshot, at: float) -> bool:
        """Fold in one poll; returns True when it shows that vLLM restarted."""
        prev = self._entries[-1] if self._entries else None
        restarted = (
            self._process_start is not None
            and snapshot.process_start_time is not None
            and snapshot.process_start_time != self._process_start
        )
        if snapshot.process_start_time is not None:
            self._process_start = snapshot.process_start_time
        decreased = False
        totals: dict[EngineKey, dict[str, float]] = {}
        for key, sample in snapshot.engines.items():
            before = prev.readings.get(key) if prev else None
            base = prev.totals.get(key) if prev else None
            adjusted: dict[str, float] = {}
            for name, value in sample.counters.items():
                if before is None or base is None:
                    adjusted[name] = 0.0  # a new engine: its past is not in any window
                    continue
                if name not in before:
                    # Created since the last poll on a known engine: all of it is new
                    # (as increase_between counts it for the lab).
                    step = value
                else:
                    if value < before[name]:
                        decreased = True
                    step = value if restarted else counter_increase(before[name], value)
                adjusted[name] = base.get(name, 0.0) + step
            totals[key] = adjusted
        self._entries.append(
            _Entry(at, {k: dict(v.counters) for k, v in snapshot.engines.items()}, totals)
        )
        if restarted or decreased:
            self.restarts += 1
        return restarted or decreased

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
            out[key] = Increase(
                {name: total - base.get(name, 0.0) for name, total in end.items()},
                latest.at - start.at,
            )
        return out

    def clear(self) -> None:
        self._entries.clear()
