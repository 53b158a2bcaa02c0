"""A bounded history of snapshots, and increases over a sliding window.

Each poll folds the new readings into running totals with the derivation core's counter
rule (`derive.increase_between`: a restart, seen as a new process start time or a
counter going down, starts every counter of the engine again from zero), so the increase
over any window is one subtraction per counter and memory stays bounded by the number of
polls in a window.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass

from vllm_glassbox.exporter.derive import (
    Increase,
    counters_restarted,
    increase_between,
    process_restarted,
)
from vllm_glassbox.exporter.snapshot import EngineKey, Snapshot


@dataclass(frozen=True)
class _Entry:
    at: float  # monotonic seconds
    readings: Mapping[EngineKey, Mapping[str, float]]  # raw counter values
    totals: Mapping[EngineKey, Mapping[str, float]]  # growth since first sight, summed


class History:
    def __init__(self, window_seconds: float, max_entries: int) -> None:
        self.window_seconds = window_seconds
        self._entries: deque[_Entry] = deque(maxlen=max(max_entries, 2))
        self._process_start: float | None = None
        self.restarts = 0

    def add(self, snapshot: Snapshot, at: float) -> bool:
        """Fold in one poll; returns True when it shows that vLLM restarted."""
        prev = self._entries[-1] if self._entries else None
        process_restart = process_restarted(self._process_start, snapshot.process_start_time)
        restarted = process_restart
        if snapshot.process_start_time is not None:
            self._process_start = snapshot.process_start_time
        totals: dict[EngineKey, dict[str, float]] = {}
        for key, sample in snapshot.engines.items():
            before = prev.readings.get(key) if prev else None
            base = prev.totals.get(key) if prev else None
            if before is None or base is None:
                # A new engine (or back after missing a poll): its past is in no window.
                totals[key] = dict.fromkeys(sample.counters, 0.0)
                continue
            # Each engine by its own counters: data-parallel engines come and go alone.
            engine_restarted = process_restart or counters_restarted(before, sample.counters)
            step = increase_between(before, sample.counters, 0.0, engine_restarted)
            totals[key] = {name: base.get(name, 0.0) + step[name] for name in sample.counters}
            restarted = restarted or engine_restarted
        self._entries.append(
            _Entry(at, {k: dict(v.counters) for k, v in snapshot.engines.items()}, totals)
        )
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
            out[key] = Increase(
                {name: total - base.get(name, 0.0) for name, total in end.items()},
                latest.at - start.at,
            )
        return out

    def clear(self) -> None:
        self._entries.clear()
