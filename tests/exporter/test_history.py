"""Windowed increases over a bounded history of polls (exporter/history.py)."""

from __future__ import annotations

import math
import re
import tracemalloc
from pathlib import Path

import pytest
from vllm_glassbox.core import derive
from vllm_glassbox.core import snapshot as s
from vllm_glassbox.core.snapshot import EngineKey, Snapshot, read_snapshot
from vllm_glassbox.exporter import history as history_module
from vllm_glassbox.exporter.history import History

from tests.fixtures import grow_engines, page

TINY = EngineKey("tiny", "0")


def snap(name: str) -> Snapshot:
    return read_snapshot(page(name))


def fed(window: float, polls: list[tuple[float, str]], max_entries: int = 100) -> History:
    history = History(window, max_entries)
    for at, name in polls:
        history.add(snap(name), at)
    return history


PLAIN = [
    (0.0, "cpu-0.32/plain-idle.txt"),
    (10.0, "cpu-0.32/plain-after-1x64.txt"),
    (20.0, "cpu-0.32/plain-after-3x64.txt"),
]


def test_the_window_reaches_back_to_the_oldest_poll_inside_it() -> None:
    d = fed(60.0, PLAIN).increases()[TINY]
    assert (d[s.GENERATION_TOKENS], d.seconds) == (192, 20.0)
    d = fed(15.0, PLAIN).increases()[TINY]
    assert (d[s.GENERATION_TOKENS], d.seconds) == (128, 10.0)  # the poll at 0 s is outside


def test_a_poll_exactly_at_the_window_edge_is_inside() -> None:
    d = fed(20.0, PLAIN).increases()[TINY]
    assert (d[s.GENERATION_TOKENS], d.seconds) == (192, 20.0)


def test_increases_over_a_window_ending_later_than_the_last_poll() -> None:
    history = fed(15.0, PLAIN)
    assert history.increases(now=25.0)[TINY][s.GENERATION_TOKENS] == 128
    assert history.increases(now=30.0) == {}  # only the latest poll is left in the window


def test_one_poll_or_polls_too_far_apart_give_no_increase() -> None:
    assert fed(60.0, PLAIN[:1]).increases() == {}
    assert fed(60.0, [(0.0, PLAIN[0][1]), (100.0, PLAIN[2][1])]).increases() == {}


def test_windowed_values_come_from_the_derivation_core() -> None:
    d = fed(60.0, PLAIN).increases()[TINY]
    assert derive.tokens_per_forward_pass(d) == 1.0
    assert derive.engine_steps_per_second(d) == 192 / 20.0


# --- resets and restarts ---------------------------------------------------------------------

SPEC_THEN_PLAIN = [
    (0.0, "cpu-0.32/spec-idle.txt"),
    (10.0, "cpu-0.32/spec-after-1x256.txt"),
    (20.0, "cpu-0.32/spec-after-2x256.txt"),
    # vLLM restarted without speculation: a new process, counters from 0.
    (30.0, "cpu-0.32/plain-idle.txt"),
    (40.0, "cpu-0.32/plain-after-1x64.txt"),
    (50.0, "cpu-0.32/plain-after-3x64.txt"),
]


def test_a_restart_adds_what_the_new_process_counted_never_a_negative() -> None:
    history = History(60.0, 100)
    restarts = [history.add(snap(name), at) for at, name in SPEC_THEN_PLAIN]
    assert restarts == [False, False, False, True, False, False]
    assert history.restarts == 1
    d = history.increases()[TINY]
    assert d[s.GENERATION_TOKENS] == 512 + 192
    assert d[s.TTFT_COUNT] == 2 + 3
    assert all(value >= 0 for value in d.counters.values()), d.counters
    # The new process has no speculation: its spec values are absent at once (unlike
    # Prometheus' increase(), which would still count the old drafts for a window).
    assert not d.has(s.SPEC_DRAFTS)
    assert derive.spec_draft_coverage(d) is None


def test_ratios_across_a_restart_stay_between_the_values_on_either_side() -> None:
    history = fed(60.0, SPEC_THEN_PLAIN)
    before = fed(60.0, SPEC_THEN_PLAIN[:3]).increases()[TINY]
    after = fed(60.0, SPEC_THEN_PLAIN[3:]).increases()[TINY]
    across = history.increases()[TINY]
    for f in (derive.tokens_per_forward_pass, derive.inter_token_latency):
        b, a, x = f(before), f(after), f(across)
        assert b is not None and a is not None and x is not None, f.__name__
        assert min(a, b) <= x <= max(a, b), f.__name__


def test_a_counter_going_down_without_a_new_process_is_a_reset() -> None:
    # Same process_start_time_seconds, counters lower: Prometheus' increase() rule.
    history = History(60.0, 100)
    history.add(snap("cpu-0.32/spec-after-2x256.txt"), 0.0)
    assert history.add(snap("cpu-0.32/spec-after-1x256.txt"), 10.0) is True
    history.add(snap("cpu-0.32/spec-after-2x256.txt"), 20.0)
    d = history.increases()[TINY]
    assert d[s.GENERATION_TOKENS] == 256 + (512 - 256)
    assert history.restarts == 1


def test_a_new_process_start_time_is_a_restart_even_if_counters_grew() -> None:
    idle = page("cpu-0.32/spec-idle.txt")
    after = page("cpu-0.32/spec-after-1x256.txt")
    start = read_snapshot(idle).process_start_time
    assert start is not None
    # The same page from a process that started 100 s later.
    restarted = re.sub(
        r"^process_start_time_seconds .*$",
        f"process_start_time_seconds {start + 100}",
        after,
        flags=re.MULTILINE,
    )
    history = History(60.0, 100)
    history.add(read_snapshot(after), 0.0)
    assert history.add(read_snapshot(restarted), 10.0) is True
    # Everything the new process counted is new, not the difference of the two pages.
    assert history.increases()[TINY][s.GENERATION_TOKENS] == 256


def test_pages_without_a_process_start_time_rely_on_counters_alone() -> None:
    two_api = snap("v0.11.0-2api/after.txt")
    assert two_api.process_start_time is None
    history = History(60.0, 100)
    assert history.add(two_api, 0.0) is False
    assert history.add(two_api, 10.0) is False
    assert history.restarts == 0


# --- engines that come and go ------------------------------------------------------------------


def test_an_engine_that_disappears_and_reappears_starts_its_window_again() -> None:
    one = page("cpu-0.32/spec-after-1x256.txt")
    two = page("cpu-0.32/spec-after-2x256.txt")
    history = History(60.0, 100)
    history.add(read_snapshot(grow_engines(one, 2)), 0.0)
    history.add(read_snapshot(two), 10.0)  # engine 1 missing from this page
    history.add(read_snapshot(grow_engines(two, 2)), 20.0)
    increases = history.increases()
    engine0, engine1 = EngineKey("tiny", "0"), EngineKey("tiny", "1")
    assert increases[engine0][s.GENERATION_TOKENS] == 256
    assert engine1 not in increases  # one poll since it came back: nothing to compare yet
    history.add(read_snapshot(grow_engines(page("cpu-0.32/flood-mid.txt"), 2)), 30.0)
    increases = history.increases()
    mid = snap("cpu-0.32/flood-mid.txt").engines[TINY].counters
    assert increases[engine1][s.GENERATION_TOKENS] == mid[s.GENERATION_TOKENS] - 512
    assert increases[engine1].seconds == 10.0
    assert increases[engine0][s.GENERATION_TOKENS] == mid[s.GENERATION_TOKENS] - 256


def test_a_counter_vllm_creates_late_is_unknown_until_seen_twice_in_the_window() -> None:
    history = History(60.0, 100)
    history.add(Snapshot({TINY: s.EngineSample({s.GENERATION_TOKENS: 10}, {})}), 0.0)
    history.add(Snapshot({TINY: s.EngineSample({s.GENERATION_TOKENS: 20, "late": 5}, {})}), 5.0)
    history.add(Snapshot({TINY: s.EngineSample({s.GENERATION_TOKENS: 30, "late": 8}, {})}), 10.0)
    d = history.increases()[TINY]
    # Its 5 may have been counted before the first poll (a page that lacked the family):
    # over a window that spans its first sighting its growth is unknown, never a jump.
    assert d[s.GENERATION_TOKENS] == 20 and math.isnan(d["late"])
    assert History  # the window from its first sighting on knows it:
    short = History(6.0, 100)
    for at, counters in (
        (0.0, {s.GENERATION_TOKENS: 10}),
        (5.0, {s.GENERATION_TOKENS: 20, "late": 5}),
        (10.0, {s.GENERATION_TOKENS: 30, "late": 8}),
    ):
        short.add(Snapshot({TINY: s.EngineSample(counters, {})}), at)
    assert short.increases()[TINY]["late"] == 3


# --- memory ------------------------------------------------------------------------------------


def test_history_keeps_at_most_max_entries_polls() -> None:
    history = History(window_seconds=10.0, max_entries=4)
    pages = [snap(name) for _, name in PLAIN]
    for i in range(50):
        history.add(pages[min(i, 2)], float(i))
    d = history.increases()[TINY]
    assert d.seconds == 3.0  # the oldest of the 4 polls kept, not 10 s back
    history.forget()
    assert history.increases() == {}


def test_memory_stays_flat_over_many_polls() -> None:
    snapshot = snap("cpu-0.32/flood-after.txt")
    history = History(window_seconds=60.0, max_entries=14)
    # Count only what the history and the core allocate: other tests' servers and pollers
    # may still be running in this process (the session's real stack).
    ours = [
        tracemalloc.Filter(True, history_module.__file__),
        tracemalloc.Filter(True, str(Path(derive.__file__).parent / "*")),  # every module of it
    ]

    def held() -> int:
        stats = tracemalloc.take_snapshot().filter_traces(ours).statistics("filename")
        return sum(stat.size for stat in stats)

    tracemalloc.start()
    try:
        for i in range(200):
            history.add(snapshot, float(i))
            history.increases()
        warm = held()
        for i in range(200, 2200):
            history.add(snapshot, float(i))
            history.increases()
        later = held()
    finally:
        tracemalloc.stop()
    assert later - warm < 16 * 1024, (warm, later)


@pytest.mark.parametrize("max_entries", [0, 1])
def test_history_always_keeps_two_polls_to_compare(max_entries: int) -> None:
    history = History(60.0, max_entries)
    for at, name in PLAIN:
        history.add(snap(name), at)
    assert history.increases()[TINY][s.GENERATION_TOKENS] == 128


def _engine_snapshot(counters: dict[str, float]) -> Snapshot:
    return Snapshot({TINY: s.EngineSample(counters, {})}, process_start_time=1.0)


def test_a_counter_created_since_the_last_poll_gives_no_ratio_for_that_window() -> None:
    before = {s.ITL_COUNT: 100.0, s.GENERATION_TOKENS: 101.0, s.TTFT_COUNT: 1.0}
    after = {s.ITL_COUNT: 120.0, s.GENERATION_TOKENS: 121.0, s.TTFT_COUNT: 1.0, s.SPEC_DRAFTS: 10.0}
    history = History(60.0, 10)
    history.add(_engine_snapshot(before), 0.0)
    history.add(_engine_snapshot(after), 5.0)
    windowed = history.increases()[TINY]
    assert math.isnan(windowed[s.SPEC_DRAFTS])
    assert derive.spec_draft_coverage(windowed) is None  # not 0.5 from a raw value
    assert derive.tokens_per_forward_pass(windowed) == 1.0  # the others are whole
    assert history.restarts == 0


def test_without_the_step_histogram_step_rates_are_absent_not_zero() -> None:
    d = derive.Increase({s.GENERATION_TOKENS: 50.0, s.ITL_COUNT: 40.0}, 10.0)
    assert derive.engine_steps_per_second(d) is None
    assert derive.weight_bytes_per_output_token(d, 1e9) is None
    with_steps = derive.Increase({s.GENERATION_TOKENS: 50.0, s.ENGINE_STEPS: 25.0}, 10.0)
    assert derive.engine_steps_per_second(with_steps) == 2.5
    assert derive.weight_bytes_per_output_token(with_steps, 1e9) == 5e8


def test_a_restart_in_multiprocess_mode_counts_what_the_new_process_counted() -> None:
    # No process start time: the spec server, then the plain one after 3 × 64 tokens.
    history = History(60.0, 10)
    for at, name in (
        (0.0, "cpu-0.32/spec-after-2x256.txt"),
        (10.0, "cpu-0.32/plain-after-3x64.txt"),
    ):
        counters = snap(name).engines[TINY].counters
        assert history.add(Snapshot({TINY: s.EngineSample(counters, {})}), at) is (at > 0)
    d = history.increases()[TINY]
    assert (d[s.GENERATION_TOKENS], d[s.TTFT_COUNT], d[s.ITL_COUNT]) == (192, 3, 189)
    assert derive.tokens_per_forward_pass(d) == 1.0  # the counters that went down only: 2.247
    assert history.restarts == 1


def test_a_histogram_sum_going_down_alone_is_not_a_restart() -> None:
    # One TTFT observed negative after a wall-clock step, one more request served.
    before = {s.TTFT_SUM: 10.0, s.TTFT_COUNT: 5.0, s.GENERATION_TOKENS: 300.0}
    after = {s.TTFT_SUM: 9.5, s.TTFT_COUNT: 6.0, s.GENERATION_TOKENS: 364.0}
    history = History(60.0, 10)
    history.add(_engine_snapshot(before), 0.0)
    assert history.add(_engine_snapshot(after), 5.0) is False
    assert history.restarts == 0  # was 1
    d = history.increases()[TINY]
    # Counted as a reset of the sum, it added 9.5 s: a mean TTFT of 9.5 s for the window;
    # clipped to no growth, a TTFT of 0 s. How much it grew is unknown: TTFT is absent.
    assert (d[s.GENERATION_TOKENS], d[s.TTFT_COUNT]) == (64.0, 1.0)
    assert math.isnan(d[s.TTFT_SUM]) and derive.time_to_first_token(d) is None
    # The next poll's growth is measured from the stepped-back value: known again.
    later = {s.TTFT_SUM: 9.8, s.TTFT_COUNT: 7.0, s.GENERATION_TOKENS: 428.0}
    history.add(_engine_snapshot(later), 10.0)
    short = History(6.0, 10)
    for at, counters in ((0.0, before), (5.0, after), (10.0, later)):
        short.add(_engine_snapshot(counters), at)
    assert derive.time_to_first_token(short.increases()[TINY]) == pytest.approx(0.3)
    assert derive.time_to_first_token(history.increases()[TINY]) is None  # spans the step


def _pages_with_families_dropped(
    pages: list[str], dropped: dict[int, tuple[str, ...]]
) -> list[Snapshot]:
    """The captured pages, from poll i on dropping the families named for i (that poll)."""
    out = []
    for i, text in enumerate(pages):
        prefixes = dropped.get(i, ())
        kept = [
            line
            for line in text.splitlines()
            if not any(
                line.startswith(p)
                or line.startswith(f"# TYPE {p}")
                or line.startswith(f"# HELP {p}")
                for p in prefixes
            )
        ]
        out.append(read_snapshot("\n".join(kept) + "\n"))
    return out


SPEC_FAMILIES = ("vllm:spec_decode_",)
DECODE_FAMILIES = (
    "vllm:generation_tokens",
    "vllm:time_to_first_token",
    "vllm:inter_token_latency",
    "vllm:request_time_per_output_token",
)


#: One speculating server's pages, polled 10 s apart: two requests, then a flood.
ONE_SERVER = [
    "cpu-0.32/spec-idle.txt",
    "cpu-0.32/spec-after-1x256.txt",
    "cpu-0.32/spec-after-2x256.txt",
    "cpu-0.32/flood-mid.txt",
    "cpu-0.32/flood-after.txt",
]


def _by_hand(first: dict[str, float], last: dict[str, float]) -> dict[str, float]:
    """The oracle: coverage, tokens per pass and acceptance from two pages' raw values."""
    grew = {name: last[name] - first[name] for name in last}
    return {
        "coverage": grew[s.SPEC_DRAFTS] / grew[s.ITL_COUNT],
        "per_pass": (grew[s.GENERATION_TOKENS] - grew[s.TTFT_COUNT]) / grew[s.ITL_COUNT],
        "acceptance": grew[s.SPEC_ACCEPTED] / grew[s.SPEC_DRAFT_TOKENS],
    }


def _values(d: derive.Increase) -> dict[str, float | None]:
    return {
        "coverage": derive.spec_draft_coverage(d),
        "per_pass": derive.tokens_per_forward_pass(d),
        "acceptance": derive.spec_acceptance_ratio(d),
    }


@pytest.mark.parametrize("families", [SPEC_FAMILIES, DECODE_FAMILIES], ids=["spec", "decode"])
def test_a_family_missing_from_one_page_is_absent_from_windows_until_seen_twice(
    families: tuple[str, ...],
) -> None:
    pages = _pages_with_families_dropped([page(n) for n in ONE_SERVER], {1: families})
    whole = [snap(n).engines[TINY].counters for n in ONE_SERVER]
    assert pages[1].engines[TINY].counters.keys() < whole[1].keys()
    needs = {"coverage", "acceptance"} if families == SPEC_FAMILIES else {"coverage", "per_pass"}
    long, short = History(60.0, 100), History(25.0, 100)
    for i, snapshot in enumerate(pages):
        for history in (long, short):
            history.add(snapshot, i * 10.0)
        if i == 0:
            continue
        # Every 60 s window spans the poll that missed the families: what needs them is
        # absent, the rest equals the raw pages' arithmetic.
        values = _values(long.increases()[TINY])
        expected = _by_hand(whole[0], whole[i])
        for name, value in values.items():
            if name in needs:
                assert value is None, (i, name, value)
            elif value is not None:
                assert value == pytest.approx(expected[name]), (i, name)
    assert long.restarts == short.restarts == 0
    # A 25 s window from the poll at 20 s on has seen them twice since: exact again.
    d = short.increases()[TINY]
    assert d.seconds == 20.0
    expected = _by_hand(whole[2], whole[4])
    assert _values(d) == pytest.approx(expected)
