"""When a failed scrape is not its target's fault: the stall watch (tests/stall_watch.py),
evidence that the machine stopped every process, and Prometheus' own lateness."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest

from tests.realstack import (
    SCRAPE_TIMEOUT_SECONDS,
    FailedScrape,
    machine_stalls,
    stall_watch,
    wait_until,
)


def test_the_watch_records_a_span_that_holds_the_time_it_was_stopped(tmp_path: Path) -> None:
    with stall_watch(tmp_path) as watch:
        assert watch.pid is not None
        # Stopped before it watches, it would see nothing.
        wait_until(lambda: watch.log_text().startswith("#"), "the watch watching")
        os.kill(watch.pid, signal.SIGSTOP)
        stopped = time.time()
        # Stopped, it cannot run: however busy the machine, this is a stall of at least
        # the time until SIGCONT.
        time.sleep(0.5)
        resumed = time.time()
        os.kill(watch.pid, signal.SIGCONT)
        wait_until(
            lambda: any(a <= stopped and b >= resumed for a, b in machine_stalls(watch.log_path)),
            "the stop recorded",
            timeout_seconds=30,
        )


def test_only_whole_lines_are_read(tmp_path: Path) -> None:
    log = tmp_path / "stalls.log"
    log.write_text("# header\n100.0 101.25\n102.5")  # the last line is being written
    assert machine_stalls(log) == [(100.0, 101.25)]


# The figures of a real failure: the exporter's scrape at 450.6 failed after 0.944 s while
# the watch, beside it, did not run from 450.6 to 451.6.
@pytest.mark.parametrize(
    ("stalls", "stalled"),
    [
        ([(450.6, 451.6)], True),  # the whole deadline
        ([(449.0, 451.1)], True),  # more than half of it: 0.5 s of 0.9
        ([(451.06, 452.0)], False),  # 0.44 s: the exporter had more than half
        ([(450.6, 450.85), (451.2, 451.5)], True),  # 0.25 + 0.30 s
        ([(451.5, 455.0)], False),  # after the deadline
        ([], False),
    ],
)
def test_the_machine_stalled_when_the_watch_lost_half_the_scrapes_deadline(
    stalls: list[tuple[float, float]], stalled: bool
) -> None:
    assert SCRAPE_TIMEOUT_SECONDS == 0.9  # the deadline the figures above are of
    scrape = FailedScrape("glassbox", 450.6, 0.944)
    assert scrape.machine_stalled(stalls) is stalled
    assert scrape.the_targets_fault(stalls) is not stalled  # Prometheus was on time


# Prometheus keeps its 0.9 s timeout to within 4 ms when it runs; real failures that took
# it 2.047 and 5.706 s came while the watch ran on.
@pytest.mark.parametrize(
    ("seconds", "late"), [(0.904, False), (0.999, False), (1.001, True), (5.706, True)]
)
def test_a_failure_prometheus_noticed_late_is_not_the_targets(seconds: float, late: bool) -> None:
    scrape = FailedScrape("vllm", 100.0, seconds)
    assert scrape.prometheus_late is late
    assert scrape.the_targets_fault([]) is not late
