"""Counter increases: how much each of vLLM's counters grew over a span, one engine's
or several combined.

Counter increases follow one rule, whoever asks (`increase_between`): a counter absent
before counts from 0 (vLLM creates some lazily); when vLLM restarted, every counter of
the engine starts again from 0. A restart shows as a new `process_start_time_seconds`, or
as any `_total` or `_count` counter going down (vLLM's multiprocess mode, i.e. every
data-parallel deployment of recent versions, has no process series). A `_sum` going down
alone is not a restart: the histogram observed a negative value (TTFT is measured on the
wall clock), and that poll adds 0 to it, neither a negative value nor a spike.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from vllm_glassbox.core import snapshot as s


def counter_increase(before: float, after: float) -> float:
    """Prometheus' rule for one counter on its own: a decrease means it restarted at 0."""
    return after - before if after >= before else after


@dataclass(frozen=True)
class Increase:
    """How much each canonical counter grew over `seconds` (for one engine, or combined).

    Two ways to combine increases, never confused: `alongside` for engines over the same
    span (data-parallel engines: the span stays), `then` for spans one after the other
    (sequential runs: the spans add up). Both sum the counters, so ratios aggregate by
    summing numerators and denominators, never by averaging ratios.
    """

    counters: Mapping[str, float]
    seconds: float

    def __getitem__(self, name: str) -> float:
        return self.counters.get(name, 0.0)

    def has(self, name: str) -> bool:
        return name in self.counters

    def _summed(self, other: Increase, seconds: float) -> Increase:
        names = set(self.counters) | set(other.counters)
        return Increase({n: self[n] + other[n] for n in names}, seconds)

    def alongside(self, other: Increase) -> Increase:
        """Another engine over the same span: counters summed, the longer span kept."""
        return self._summed(other, max(self.seconds, other.seconds))

    def then(self, other: Increase) -> Increase:
        """The span that followed this one: counters summed, spans added."""
        return self._summed(other, self.seconds + other.seconds)

    def unknown(self, name: str) -> Increase:
        """The same, with `name`'s increase unknown (NaN): every ratio over it is absent."""
        return Increase({**self.counters, name: math.nan}, self.seconds)


def engines_together(increases: Iterable[Increase], seconds: float = 0.0) -> Increase:
    """Every engine's increase over the same span, combined (`Increase.alongside`)."""
    total = Increase({}, seconds)
    for one in increases:
        total = total.alongside(one)
    return total


def process_restarted(before_start: float | None, after_start: float | None) -> bool:
    """vLLM's `process_start_time_seconds` changed between two readings."""
    return before_start is not None and after_start is not None and before_start != after_start


def counters_restarted(before: Mapping[str, float], after: Mapping[str, float]) -> bool:
    """A `_total` or `_count` counter of one engine went down: the engine started again
    from zero. A `_sum` going down alone is a negative observation, not a restart."""
    return any(
        name in before and value < before[name]
        for name, value in after.items()
        if name not in s.SUMS
    )


def increase_between(
    before: Mapping[str, float],
    after: Mapping[str, float],
    seconds: float,
    restarted: bool = False,
) -> Increase:
    """Increase of one engine's counters from one reading to the next (the rule above).

    `restarted` says the process restarted in between (its start time changed); a counter
    going down says so too. A `_sum` that went down alone (a histogram observed a negative
    value: vLLM's TTFT is measured on the wall clock, which can step back) grew by an
    unknown amount: NaN, so every ratio over it is absent (`ratio`), never 0.
    """
    from_zero = restarted or counters_restarted(before, after)
    return Increase(
        {
            name: value
            if from_zero or name not in before
            else value - before[name]
            if value >= before[name]
            else math.nan
            for name, value in after.items()
        },
        seconds,
    )


def snapshot_increases(
    before: s.Snapshot, after: s.Snapshot, seconds: float
) -> dict[s.EngineKey, Increase]:
    """Each engine's increase from one page to a later one (an engine absent before
    counts from 0)."""
    restarted = process_restarted(before.process_start_time, after.process_start_time)
    return {
        key: increase_between(
            before.engines[key].counters if key in before.engines else {},
            sample.counters,
            seconds,
            restarted,
        )
        for key, sample in after.engines.items()
    }
