"""Property tests of the one counter rule, on random histories of vLLM's counters.

Engines restart (all together, with or without a process start time, or one alone),
appear and vanish between polls. Whatever happens, the exporter's windowed increase
(`History`) and the lab's increase between two pages (`derive.snapshot_increases`) follow
the same rule, are never negative, never exceed what vLLM really counted, equal it
whenever a restart shows, and equal Prometheus' `increase()` wherever each counter shows
its own resets.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from vllm_glassbox.core import snapshot as s
from vllm_glassbox.core.derive import snapshot_increases
from vllm_glassbox.core.snapshot import EngineKey, EngineSample, Snapshot
from vllm_glassbox.exporter.history import History

# Bounded, and never timed: a busy machine must not fail them.
QUICK = settings(deadline=None, suppress_health_check=[HealthCheck.too_slow])

COUNTERS = (s.GENERATION_TOKENS, s.TTFT_COUNT, s.ITL_COUNT, s.ITL_SUM)
MODEL = "m"


@dataclass(frozen=True)
class EngineStep:
    present: bool  # on the page at this poll
    restarted: bool  # started again from zero since the previous poll (alone)
    growth: tuple[int, ...]  # what it counted since then (or since it restarted)


@dataclass(frozen=True)
class Step:
    process_restarted: bool  # every engine started again from zero
    engines: tuple[EngineStep, ...]


def _rarely(one_in: int) -> st.SearchStrategy[bool]:
    return st.integers(0, one_in - 1).map(lambda x: x == 0)


@st.composite
def histories(draw: st.DrawFn) -> tuple[bool, int, list[Step]]:
    engines = draw(st.integers(1, 3))
    multiprocess = draw(st.booleans())  # no process_start_time_seconds on the page
    window_polls = draw(st.integers(1, 12))
    growth = st.tuples(*[st.integers(0, 40) for _ in COUNTERS])
    engine_step = st.builds(EngineStep, _rarely(6).map(lambda x: not x), _rarely(6), growth)
    steps = draw(
        st.lists(
            st.builds(Step, _rarely(5), st.tuples(*[engine_step] * engines)),
            min_size=2,
            max_size=14,
        )
    )
    return multiprocess, window_polls, steps


@dataclass
class Poll:
    snapshot: Snapshot
    values: dict[int, tuple[int, ...]]  # engine -> counters, for the engines on the page
    grown: dict[int, tuple[int, ...]]  # what vLLM really counted since the previous poll
    really_restarted: dict[int, bool]


def simulate(multiprocess: bool, steps: list[Step]) -> list[Poll]:
    start = 1000.0
    values: dict[int, list[int]] = {}
    pending: dict[int, list[int]] = {}  # counted since this engine was last on a page
    restarted: dict[int, bool] = {}
    polls = []
    for step in steps:
        if step.process_restarted:
            start += 1.0
        for e, es in enumerate(step.engines):
            if step.process_restarted or es.restarted or e not in values:
                values[e] = [0] * len(COUNTERS)
                pending[e] = [0] * len(COUNTERS)  # the old life's last growth is unseen
                restarted[e] = restarted.get(e, False) or e in pending
            values[e] = [v + g for v, g in zip(values[e], es.growth, strict=True)]
            pending[e] = [p + g for p, g in zip(pending[e], es.growth, strict=True)]
        on_page = [e for e, es in enumerate(step.engines) if es.present]
        engines = {
            EngineKey(MODEL, str(e)): EngineSample(
                {name: float(v) for name, v in zip(COUNTERS, values[e], strict=True)}, {}
            )
            for e in on_page
        }
        polls.append(
            Poll(
                Snapshot(engines, process_start_time=None if multiprocess else start),
                {e: tuple(values[e]) for e in on_page},
                {e: tuple(pending[e]) for e in on_page},
                {e: restarted.get(e, False) for e in on_page},
            )
        )
        for e in on_page:
            pending[e] = [0] * len(COUNTERS)
            restarted[e] = False
    return polls


def _shows_restart(before: Poll, after: Poll, e: int) -> bool:
    """What the rule may see: a new process start time, or a _total/_count going down."""
    if before.snapshot.process_start_time != after.snapshot.process_start_time:
        return True
    return any(
        a < b
        for name, b, a in zip(COUNTERS, before.values[e], after.values[e], strict=True)
        if name not in s.SUMS
    )


def _prometheus_increase(series: list[int]) -> int:
    """Prometheus' increase() without extrapolation: each decrease is a reset to 0."""
    return sum(b - a if b >= a else b for a, b in itertools.pairwise(series))


@settings(QUICK, max_examples=200)
@given(histories())
def test_windowed_increase_is_never_negative_never_spikes_and_is_exact_when_restarts_show(
    history_spec: tuple[bool, int, list[Step]],
) -> None:
    multiprocess, window_polls, steps = history_spec
    polls = simulate(multiprocess, steps)
    history = History(window_seconds=float(window_polls), max_entries=window_polls + 2)
    restarts = 0
    for i, poll in enumerate(polls):
        shown = history.add(poll.snapshot, float(i))
        previous = polls[i - 1] if i else None
        expected_shown = previous is not None and (
            previous.snapshot.process_start_time != poll.snapshot.process_start_time
            or any(e in previous.values and _shows_restart(previous, poll, e) for e in poll.values)
        )
        assert shown == expected_shown
        restarts += shown
    assert history.restarts == restarts

    last = len(polls) - 1
    windowed = history.increases()
    for e in range(len(steps[0].engines)):
        key = EngineKey(MODEL, str(e))
        # The polls the window uses: back from the last, while the engine is on the page.
        first = last
        while first > 0 and first - 1 >= last - window_polls and e in polls[first - 1].values:
            first -= 1
        if e not in polls[last].values or first == last:
            assert key not in windowed
            continue
        got = windowed[key]
        assert got.seconds == float(last - first)
        span = range(first + 1, last + 1)
        for c, name in enumerate(COUNTERS):
            truth = sum(polls[k].grown[e][c] for k in span)
            value = got[name]
            if math.isnan(value):  # unknown: only a `_sum` that stepped back in the window
                stepped_back = any(
                    polls[k].values[e][c] < polls[k - 1].values[e][c]
                    for k in span
                    if e in polls[k - 1].values
                )
                assert name in s.SUMS and stepped_back, (name, value)
                continue
            assert 0 <= value <= truth, (name, value, truth)
            if all(
                _shows_restart(polls[k - 1], polls[k], e)
                for k in span
                if polls[k].really_restarted[e]
            ):
                assert value == truth, name
            if name in s.SUMS:
                continue
            series = [polls[k].values[e][c] for k in range(first, last + 1)]
            own_resets_show = all(
                series[k - first] < series[k - first - 1] or series[k - first - 1] == 0
                for k in span
                if _shows_restart(polls[k - 1], polls[k], e)
            )
            if own_resets_show:
                assert value == _prometheus_increase(series), name


@settings(QUICK, max_examples=150)
@given(histories())
def test_the_lab_and_the_exporter_count_two_pages_alike(
    history_spec: tuple[bool, int, list[Step]],
) -> None:
    multiprocess, _, steps = history_spec
    polls = simulate(multiprocess, steps)
    for before, after in itertools.pairwise(polls):
        history = History(window_seconds=10.0, max_entries=4)
        history.add(before.snapshot, 0.0)
        history.add(after.snapshot, 5.0)
        windowed = history.increases()
        lab = snapshot_increases(before.snapshot, after.snapshot, 5.0)
        for key in after.snapshot.engines:
            if key in before.snapshot.engines:
                assert windowed[key] == lab[key]
            else:  # the lab counts a new engine from zero; the window starts at it
                assert key not in windowed
                assert dict(lab[key].counters) == dict(after.snapshot.engines[key].counters)
