"""How the real stack's fill phase tells that vLLM preempted (tests/realstack.py), on the
poll sequences it met: the queue emptied before a request waited again, and a run where
one request waited from the start (seen on a loaded machine, CI's stack failed on it)."""

from __future__ import annotations

from tests.fill_phase import PREEMPTED, RUNNING, WAITING, FinePoll, first_preemption


def polls(rows: list[tuple[float, float, float]]) -> list[FinePoll]:
    """(running, waiting, preemptions counted) per poll, a quarter second apart."""
    return [
        FinePoll(i * 0.25, {RUNNING: r, WAITING: w, PREEMPTED: c})
        for i, (r, w, c) in enumerate(rows)
    ]


def test_a_request_waiting_again_after_all_ran_is_the_first_preemption() -> None:
    seen = polls([(0, 0, 0), (4, 0, 0), (4, 0, 0), (3, 1, 0), (4, 0, 1)])
    assert first_preemption(seen) == seen[3]


def test_a_request_going_back_to_the_queue_counts_once_vllm_confirms_it() -> None:
    # The CI run: one request waits from the start, so the queue never empties first.
    rows = [(0, 0, 0), (2, 1, 0), (2, 1, 0), (1, 2, 0), (1, 2, 0), (0, 2, 0)]
    assert first_preemption(polls(rows)) is None  # not counted yet: maybe a finish
    seen = polls([*rows, (2, 0, 2)])
    assert first_preemption(seen) == seen[3]


def test_a_queue_that_only_drains_shows_no_preemption() -> None:
    assert first_preemption(polls([(0, 0, 0), (2, 2, 0), (3, 1, 0), (4, 0, 0), (3, 0, 0)])) is None


def test_polls_that_missed_the_queue_still_see_vllms_counter_grow() -> None:
    # CI on a loaded machine: few polls answered, none while a request waited.
    seen = polls([(0, 0, 0), (1, 0, 0), (2, 0, 0), (2, 0, 3), (0, 0, 5)])
    assert first_preemption(seen) == seen[3]
