"""One fixed-period schedule for every loop that polls (the exporter's poller, the lab's)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from typing import Literal


def ticks(
    period: float,
    stop: threading.Event,
    *,
    after_overrun: Literal["at once", "a period later"],
    clock: Callable[[], float] = time.monotonic,
) -> Iterator[float]:
    """Yield when each tick was due, `period` seconds apart from now, until `stop` is set.

    The caller's work runs between two ticks. Work that overran the next tick never makes
    a burst of the missed ones: the next tick comes `at once`, or `a period later`.
    """
    due = clock()
    while not stop.is_set():
        yield due
        due += period
        now = clock()
        if due < now:
            due = now + (period if after_overrun == "a period later" else 0.0)
        stop.wait(max(0.0, due - now))
