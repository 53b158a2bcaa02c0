"""The first request(s) to finish after each start of vLLM, per engine.

The first request after a start pays for what vLLM compiles on first use (the ngram
proposer's JIT, Triton kernels). vLLM's counters start from 0 at each start, so the
prefill-time counters at the first poll that sees any request finished are the first
requests' own. When the exporter first meets an engine that has already served requests,
their start is in the past and unknown: nothing is published until the next start.
"""

from __future__ import annotations

from collections.abc import Mapping

from vllm_glassbox.core.derive import FirstRequests
from vllm_glassbox.core.snapshot import PREFILL_COUNT, PREFILL_SUM, EngineKey, Snapshot


class FirstRequestsWatch:
    def __init__(self) -> None:
        self._first: dict[EngineKey, FirstRequests] = {}
        self._awaiting: set[EngineKey] = set()  # started, nothing finished yet
        self._seen: set[EngineKey] = set()

    @property
    def first(self) -> Mapping[EngineKey, FirstRequests]:
        return self._first

    def observe(self, snapshot: Snapshot, at: float, restarted: bool) -> None:
        """Fold in one poll; `restarted` says vLLM started again since the last one."""
        if restarted:
            self._first.clear()
            self._awaiting.clear()
            self._seen.clear()
        for key, sample in snapshot.engines.items():
            count = sample.counters.get(PREFILL_COUNT)
            if count is None:  # a vLLM without the prefill-time histogram
                continue
            if key not in self._seen:
                self._seen.add(key)
                if count == 0 or restarted:  # counting from this start on
                    self._awaiting.add(key)
            if key in self._awaiting and count > 0:
                total = sample.counters.get(PREFILL_SUM, 0.0)
                self._first[key] = FirstRequests(total, count, at)
                self._awaiting.discard(key)
