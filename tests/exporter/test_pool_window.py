"""Each engine's pool over the window (exporter/pool_window.py, through the history): the
peaks, the preemptions counted and when they came, against the captured pages' values
(tests/fixtures/README.md, vLLM 0.24.0 on one H200) worked out by hand."""

from __future__ import annotations

import pytest
from vllm_glassbox.core import snapshot as s
from vllm_glassbox.core.snapshot import EngineKey, read_snapshot
from vllm_glassbox.exporter.history import History
from vllm_glassbox.exporter.pool_window import CAPACITY, PoolFacts

from tests.fixtures import page

QWEN = EngineKey("qwen", "0")
H200 = "cuda-0.24.0-h200/"
STORM = [H200 + n for n in ("flood-filling", "flood-preempting", "flood-preempting-later")]


def facts(polls: list[tuple[float, str]], window: float = 60.0) -> PoolFacts:
    history = History(window, max_entries=100)
    for at, name in polls:
        history.add(read_snapshot(page(name + ".txt")), at)
    return history.pool_window().facts[QWEN]


def test_peaks_are_the_windows_not_the_latest_polls() -> None:
    """Filling (0.8306, 0 waiting), preempting (0.9826, 4 waiting, 4 preemptions),
    later (0.9779, 10 waiting, 10), drained (0, 0 waiting, 18): 3 s apart."""
    f = facts([(0.0, STORM[0]), (3.0, STORM[1]), (6.0, STORM[2]), (9.0, H200 + "flood-after")])
    assert f.peak(s.KV_USAGE) == pytest.approx(0.9826158940397351)
    assert f.now[s.KV_USAGE] == 0.0
    assert (f.peak(s.RUNNING), f.peak(s.WAITING), f.peak(CAPACITY)) == (32.0, 10.0, 10.0)
    assert f.preemptions == 18.0
    assert (f.first_preemption_ago, f.last_preemption_ago) == (6.0, 0.0)
    assert (f.polls, f.seconds) == (4, 9.0)


def test_polls_that_left_the_window_leave_its_facts() -> None:
    f = facts([(0.0, STORM[0]), (3.0, STORM[1]), (6.0, STORM[2]), (61.0, H200 + "flood-after")])
    # The window (60 s) reaches back to the poll at 3 s: the first rise seen is at 6 s.
    assert (f.preemptions, f.peak(s.WAITING)) == (14.0, 10.0)
    assert (f.first_preemption_ago, f.last_preemption_ago) == (55.0, 0.0)
    f = facts([(0.0, STORM[1]), (100.0, STORM[2])])
    assert (f.polls, f.preemptions, f.first_preemption_ago) == (1, None, None)
    assert f.peak(s.WAITING) == 10.0  # one poll: its gauges, no count


def test_a_restart_counts_the_new_process_from_zero() -> None:
    """A restart (counters down) after 10 preemptions: the new process's 4 are counted."""
    f = facts([(0.0, STORM[2]), (3.0, STORM[1])])
    assert (f.preemptions, f.last_preemption_ago) == (4.0, 0.0)


def test_the_facts_are_computed_once_and_from_the_polls_of_their_window() -> None:
    history = History(60.0, max_entries=100)
    history.add(read_snapshot(page(STORM[0] + ".txt")), 0.0)
    window = history.pool_window()
    history.add(read_snapshot(page(STORM[1] + ".txt")), 3.0)
    assert window.facts[QWEN].peak(s.KV_USAGE) == pytest.approx(0.8305739514348786)
    assert window.facts is window.facts
    assert History(60.0, 10).pool_window().facts == {}
