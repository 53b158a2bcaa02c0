"""Each engine's KV pool as of one poll, and how fast it fills: used tokens over the window.

The pool (capacity and used tokens) is computed once per poll (`kv_pools`), for the page
and for the trend. The history of counters (`history.py`) cannot say how fast it fills:
used tokens are a gauge. The trend keeps one reading per poll and engine, bounded like
the history, and gives the growth from the oldest poll in the window to the latest.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass

from vllm_glassbox.core.derive import (
    engine_sleeping,
    kv_cache_capacity_tokens,
    kv_cache_held_tokens,
    kv_cache_used_tokens,
)
from vllm_glassbox.core.snapshot import AWAKE, KV_USAGE, EngineKey, Snapshot


@dataclass(frozen=True)
class KvPool:
    """One engine's KV pool as of one poll; None where it is not known. A sleeping engine's
    pool is discarded: capacity and used tokens 0 (`derive.kv_cache_held_tokens`)."""

    capacity_tokens: int | None
    used_tokens: float | None
    sleeping: bool | None = None  # None: the page does not say (vLLM before 0.11.1)


def kv_pools(
    snapshot: Snapshot, logged_tokens: int | None = None, hybrid: bool = False
) -> dict[EngineKey, KvPool]:
    """Every engine's pool as of one poll, by the core's one rule: the page, else the
    log's `logged_tokens` (`hybrid`: the log says the pool is shared by layer groups); none
    while the engine sleeps."""
    pools: dict[EngineKey, KvPool] = {}
    for key, sample in snapshot.engines.items():
        sleeping = engine_sleeping(sample.gauges.get(AWAKE))
        configured = kv_cache_capacity_tokens(snapshot.cache_for(key), logged_tokens, hybrid)
        capacity = kv_cache_held_tokens(configured, sleeping)
        used = kv_cache_used_tokens(sample.gauges.get(KV_USAGE), capacity)
        pools[key] = KvPool(capacity, used, sleeping)
    return pools


def used_tokens(pools: Mapping[EngineKey, KvPool]) -> dict[EngineKey, float]:
    """Used KV tokens of every engine whose pool is known."""
    return {key: pool.used_tokens for key, pool in pools.items() if pool.used_tokens is not None}


@dataclass(frozen=True)
class Growth:
    """Used tokens gained (negative when the pool drained) over `seconds`."""

    tokens: float
    seconds: float


@dataclass(frozen=True)
class _Reading:
    at: float  # monotonic seconds
    used: Mapping[EngineKey, float]


class UsedTokensTrend:
    def __init__(self, window_seconds: float, max_entries: int) -> None:
        self.window_seconds = window_seconds
        self._readings: deque[_Reading] = deque(maxlen=max(max_entries, 2))

    def __len__(self) -> int:
        return len(self._readings)

    def add(self, at: float, used: Mapping[EngineKey, float]) -> None:
        self._readings.append(_Reading(at, dict(used)))

    def growth(self) -> dict[EngineKey, Growth]:
        """Per engine, from the oldest poll inside the window that saw it (in an unbroken
        run up to the latest poll) to the latest; an engine needs two such polls."""
        if len(self._readings) < 2:
            return {}
        latest = self._readings[-1]
        horizon = latest.at - self.window_seconds
        out: dict[EngineKey, Growth] = {}
        for key, now in latest.used.items():
            start: _Reading | None = None
            for reading in reversed(self._readings):
                if reading is latest:
                    continue
                if reading.at < horizon - 1e-9 or key not in reading.used:
                    break
                start = reading
            if start is not None:
                out[key] = Growth(now - start.used[key], latest.at - start.at)
        return out
