"""The one fixed-period schedule (core/ticker.py), on a clock the test moves."""

from __future__ import annotations

import threading
from typing import Literal

import pytest
from vllm_glassbox.core.ticker import ticks


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


class Waits(threading.Event):
    """A stop event whose waits pass on the test clock instead of the wall clock."""

    def __init__(self, clock: Clock) -> None:
        super().__init__()
        self.clock = clock
        self.waited: list[float] = []

    def wait(self, timeout: float | None = None) -> bool:
        assert timeout is not None
        self.waited.append(timeout)
        self.clock.now += timeout
        return self.is_set()


def run(
    work_seconds: list[float], after_overrun: Literal["at once", "a period later"]
) -> tuple[list[float], list[float]]:
    """Due times seen, and waits made, when each tick's work takes the given seconds."""
    clock = Clock()
    stop = Waits(clock)
    due: list[float] = []
    for tick in ticks(10.0, stop, after_overrun=after_overrun, clock=clock):
        due.append(tick)
        clock.now += work_seconds[len(due) - 1]
        if len(due) == len(work_seconds):
            stop.set()
    return due, stop.waited


@pytest.mark.parametrize("after_overrun", ["at once", "a period later"])
def test_ticks_keep_their_period_whatever_the_work_takes_within_it(
    after_overrun: Literal["at once", "a period later"],
) -> None:
    due, waited = run([1.0, 9.5, 0.0, 3.0], after_overrun)
    assert due == [100.0, 110.0, 120.0, 130.0]
    assert waited == [9.0, 0.5, 10.0, 7.0]


def test_work_that_overran_is_followed_at_once_without_a_burst_of_missed_ticks() -> None:
    due, waited = run([25.0, 1.0, 1.0], "at once")
    assert due == [100.0, 125.0, 135.0]
    assert waited == [0.0, 9.0, 9.0]


def test_work_that_overran_is_followed_by_a_whole_period_of_rest() -> None:
    due, waited = run([25.0, 1.0, 1.0], "a period later")
    assert due == [100.0, 135.0, 145.0]
    assert waited == [10.0, 9.0, 9.0]


def test_a_stop_set_before_the_first_tick_yields_none() -> None:
    stop = threading.Event()
    stop.set()
    assert list(ticks(1.0, stop, after_overrun="at once")) == []
