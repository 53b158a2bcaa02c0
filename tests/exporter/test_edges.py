"""The poll history at its edges, through the real poller and its publication: a page
that came late is stamped when it came (the counters are of that moment, not of when
the poll was sent), so rates over the window are the raw pages' arithmetic.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable

import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families
from vllm_glassbox.core import snapshot as s
from vllm_glassbox.core.derive import counters_restarted
from vllm_glassbox.core.errors import ScrapeError
from vllm_glassbox.core.snapshot import EngineKey, read_snapshot
from vllm_glassbox.exporter.server_trail import SEVERAL_SERVERS
from vllm_glassbox.exporter.service import Poller, make_registry

from tests.exporter.test_exposition_golden import Clock, PageSequence, config
from tests.fixtures import page

TINY = EngineKey("tiny", "0")


class LateAnswers(PageSequence):
    """Each /metrics answer takes the next of `delays` seconds of the fake clock."""

    def __init__(self, pages: list[str], clock: Clock, delays: list[float]) -> None:
        super().__init__(list(pages), "0.32.0")
        self.clock, self.delays = clock, delays

    def get_text(self, path: str, timeout_seconds: float | None = None) -> str:
        if path == "/metrics":
            self.clock.now += self.delays.pop(0)
        return super().get_text(path, timeout_seconds)


def _published(poller: Poller, name: str) -> float | None:
    text = generate_latest(make_registry(poller)).decode()
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name:
                return sample.value
    return None


def test_a_page_that_came_late_is_stamped_when_it_came() -> None:
    names = ["cpu-0.32/plain-idle.txt", "cpu-0.32/plain-after-3x64.txt"]
    clock = Clock()
    fetcher = LateAnswers([page(n) for n in names], clock, [0.0, 9.0])
    poller = Poller(config(), fetcher=fetcher, clock=clock)
    poller.poll_once()  # sent and answered at 1000 s
    clock.now += 10.0
    poller.poll_once()  # sent at 1010 s, answered at 1019 s
    first, last = (read_snapshot(page(n)).engines for n in names)
    steps = sum(e.counters[s.ENGINE_STEPS] for e in last.values()) - sum(
        e.counters[s.ENGINE_STEPS] for e in first.values()
    )
    assert steps > 0
    # By hand: the two pages' steps over the 19 s between their answers (not 10 s).
    assert _published(poller, "glassbox_engine_steps_per_second") == steps / 19.0


# --- several servers behind one target, and restarts without a process start time ------


def multiprocess(name: str) -> str:
    """A captured page as vLLM's multiprocess mode serves it: no process_* series."""
    return re.sub(r"^process_.*\n", "", page(name), flags=re.MULTILINE)


def _polled(pages: list[str | ScrapeError]) -> Poller:
    clock = Clock()
    poller = Poller(config(), fetcher=PageSequence(pages, "0.32.0"), clock=clock)
    for _ in pages:
        poller.poll_once()
        clock.now += 10.0
    return poller


def _flags(poller: Poller) -> set[str]:
    text = generate_latest(make_registry(poller)).decode()
    return {
        sample.labels["shape"]
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == "glassbox_input_unrecognised"
    }


#: Two servers' pages: the plain one and the speculating one (two processes).
PLAIN, SPEC = "cpu-0.32/plain-after-3x64.txt", "cpu-0.32/spec-after-2x256.txt"


@pytest.mark.parametrize("shape", [page, multiprocess], ids=["start times", "multiprocess"])
def test_a_service_in_front_of_two_replicas_is_flagged_and_gives_no_rates(
    shape: Callable[[str], str],
) -> None:
    poller = _polled([shape(n) for n in [PLAIN, SPEC] * 4])
    assert SEVERAL_SERVERS in _flags(poller)
    # One switch looks like a restart before the second shows the pattern; after that
    # no switch is counted (it climbed at every poll: 7 here).
    assert _published(poller, "glassbox_target_restarts_total") == 1
    assert _published(poller, "glassbox_engine_steps_per_second") is None
    assert _published(poller, "glassbox_tokens_per_forward_pass") is None
    assert _published(poller, "glassbox_target_up") == 1  # each page is read


def test_one_restart_is_a_restart_not_several_servers() -> None:
    spec = ["cpu-0.32/spec-idle.txt", "cpu-0.32/spec-after-1x256.txt", SPEC]
    poller = _polled([page(PLAIN), page(PLAIN), *[page(n) for n in spec]])
    assert SEVERAL_SERVERS not in _flags(poller)
    assert _published(poller, "glassbox_target_restarts_total") == 1
    # The window since the restart: the speculating server's own counters, by hand.
    per_pass = _published(poller, "glassbox_tokens_per_forward_pass")
    assert per_pass == (512 - 2) / 104


def test_the_poll_that_saw_a_restart_is_published_as_its_time_and_kept_until_the_next() -> None:
    spec = ["cpu-0.32/spec-idle.txt", "cpu-0.32/spec-after-1x256.txt", SPEC]
    clock = Clock()
    poller = Poller(
        config(),
        fetcher=PageSequence([page(PLAIN), *[page(n) for n in spec]], "0.32.0"),
        clock=clock,
    )
    seen: list[float | None] = []
    for _ in range(4):
        before = time.time()
        poller.poll_once()
        seen.append(_published(poller, "glassbox_target_last_restart_timestamp_seconds"))
        if seen[-1] is not None and seen[-2] is None:
            assert before <= seen[-1] <= time.time()  # the wall time of the poll that saw it
        clock.now += 10.0
    # Absent before the restart (the first process), set by the poll of the new one, and
    # the same at the polls after it.
    assert seen[:2] == [None, seen[1]] and seen[1] is not None
    assert seen[2] == seen[3] == seen[1]
    assert _published(poller, "glassbox_target_restarts_total") == 1


def test_a_restart_without_a_process_start_time_is_seen_by_the_refused_connection() -> None:
    old, new, later = (
        multiprocess("cpu-0.32/plain-after-1x64.txt"),
        multiprocess(SPEC),
        multiprocess("cpu-0.32/flood-mid.txt"),
    )
    before, after = (read_snapshot(p).engines[TINY].counters for p in (old, new))
    assert not counters_restarted(before, after)  # every counter grew past its old value
    gone = ScrapeError("connect", "/metrics: ConnectError: refused", refused=True)
    poller = _polled([old, gone, new, later])
    assert _published(poller, "glassbox_target_restarts_total") == 1
    # The window holds the new process's counters only, from zero, by hand:
    raw = read_snapshot(later).engines[TINY].counters
    expected = (raw[s.GENERATION_TOKENS] - raw[s.TTFT_COUNT]) / raw[s.ITL_COUNT]
    mixed = (raw[s.GENERATION_TOKENS] - before[s.GENERATION_TOKENS]) - (
        raw[s.TTFT_COUNT] - before[s.TTFT_COUNT]
    )
    assert mixed / (raw[s.ITL_COUNT] - before[s.ITL_COUNT]) != pytest.approx(expected)
    assert _published(poller, "glassbox_tokens_per_forward_pass") == pytest.approx(expected)


def test_a_timeout_is_no_restart_without_a_process_start_time() -> None:
    slow = ScrapeError("timeout", "/metrics: no complete answer within 3s")
    names = ["cpu-0.32/plain-after-1x64.txt", "cpu-0.32/plain-after-3x64.txt"]
    poller = _polled([multiprocess(names[0]), slow, multiprocess(names[1])])
    assert _published(poller, "glassbox_target_restarts_total") == 0
    assert _published(poller, "glassbox_tokens_per_forward_pass") == 1.0  # one window across


def test_a_page_without_cache_config_info_is_flagged_and_gives_no_pool() -> None:
    # vLLM 0.33's Rust front end serves neither cache_config_info nor process_* (written
    # from the captured 0.32 page, those families removed: no capture of it exists here).
    text = re.sub(
        r"^(# (HELP|TYPE) )?vllm:cache_config_info.*\n", "", multiprocess(PLAIN), flags=re.M
    )
    assert "cache_config_info" not in text
    poller = _polled([text, text])
    assert "no_cache_config_info" in _flags(poller)
    assert _published(poller, "glassbox_kv_cache_capacity_tokens") is None
    assert _published(poller, "glassbox_kv_cache_free_tokens") is None
    assert "no_cache_config_info" not in _flags(_polled([page(PLAIN)]))
