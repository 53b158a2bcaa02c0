"""The exporter against a misbehaving vLLM: every failure is data, never an outage.

A real exporter (make_server + Poller.run on loopback, polling every 0.2 s with a 4 MiB
cap) polls a real HTTP server (tests/misbehaving.py) that is switched from a healthy fake
vLLM to one failure and back. For each failure:

- `glassbox_target_up` is 0 and `glassbox_scrape_errors_total{reason}` counts it under
  the right reason (and no other);
- every series derived from vLLM disappears (no stale values);
- the poll stays within its deadline and memory within a bound set by the byte cap,
  whatever the payload (tracemalloc sees every thread of this process);
- it recovers by itself once the server behaves again.

No assertion reads a clock against a tight bound, so a busy machine cannot fail them:
the poll deadline is 30 s where the fake answers at once, and 1 s only where the fake
hangs for many minutes (what is checked then is "ends at the deadline, not minutes
later"). That the exporter's own /metrics is answered while a poll hangs is checked by
order of events: a scrape answered while the poll is known to be blocked.
"""

from __future__ import annotations

import contextlib
import logging
import re
import threading
import time
import tracemalloc
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families
from vllm_glassbox import __version__
from vllm_glassbox.core.errors import ERROR_REASONS
from vllm_glassbox.core.series import PRICED, WINDOWED
from vllm_glassbox.exporter.service import ExporterConfig, Poller, make_server

from tests.misbehaving import (
    Behaviour,
    FakeVllm,
    Misbehaving,
    Step,
    body,
    cut_at_a_line,
    drip,
    drip_headers,
    garbage,
    gzip_bomb,
    gzip_page,
    healthy,
    huge_page,
    late,
    many_series,
    page_with,
    reset,
    stall_after_headers,
    status,
    truncated,
)

pytestmark = pytest.mark.slow  # starts servers or processes and waits for them

INTERVAL = 0.2
WINDOW = 2.0
TIMEOUT = 30.0  # the fakes answer at once: a loaded machine never reaches this
SHORT_TIMEOUT = 1.0  # for the failures that hang for minutes
# A poll that hangs is cut at SHORT_TIMEOUT; a busy machine adds seconds to that, a
# missing deadline would add the minutes the fake keeps hanging.
HUNG_POLL_BOUND = 20.0
MAX_BYTES = 4 * 1024 * 1024
# Body bytes plus their decoded text, plus slack for everything else running here.
MEMORY_BOUND = 2 * MAX_BYTES + 2 * 1024 * 1024
WEIGHTS = 1e9
PEAK_BANDWIDTH = 1e12

# What a healthy fake vLLM yields besides the windowed series (no speculation there).
PER_ENGINE_DERIVED = {
    "glassbox_window_covered_seconds",
    "glassbox_kv_cache_blocks",
    "glassbox_kv_cache_block_size_tokens",
    "glassbox_kv_cache_capacity_tokens",
    "glassbox_kv_cache_used_tokens",
}
SPEC_ONLY = {
    "glassbox_spec_decode_acceptance_ratio",
    "glassbox_spec_decode_mean_acceptance_length",
    "glassbox_spec_decode_draft_coverage_ratio",
}
# PRICED: absent without a price of a GPU hour; these exporters are given none.
FAILURE_REASONS = tuple(r for r in ERROR_REASONS if r != "slow")
DERIVED = (
    {s.name for s in WINDOWED} - SPEC_ONLY - PRICED | PER_ENGINE_DERIVED | {"glassbox_vllm_info"}
)
#: Absent from a page in multiprocess mode: several API servers may count a step each.
STEP_SERIES = {
    "glassbox_engine_steps_per_second",
    "glassbox_tokens_per_engine_step",
    "glassbox_weight_bytes_per_output_token",
}


class Scrape:
    """One scrape of the exporter's /metrics, parsed by prometheus_client."""

    def __init__(self, text: str) -> None:
        self.samples: dict[str, list[tuple[dict[str, str], float]]] = {}
        for family in text_string_to_metric_families(text):
            for s in family.samples:
                self.samples.setdefault(s.name, []).append((s.labels, s.value))

    def value(self, name: str, **labels: str) -> float | None:
        for have, value in self.samples.get(name, []):
            if all(have.get(k) == v for k, v in labels.items()):
                return value
        return None

    def errors(self) -> dict[str, float]:
        """Failed polls by reason (`slow` polls are not failures: see its own test)."""
        return {
            r: self.value("glassbox_scrape_errors_total", reason=r) or 0.0 for r in FAILURE_REASONS
        }

    def slow(self) -> float:
        return self.value("glassbox_scrape_errors_total", reason="slow") or 0.0

    def names(self) -> set[str]:
        return set(self.samples)


@dataclass
class Exporter:
    url: str
    poller: Poller
    client: httpx.Client  # one client: building one per scrape would dominate the latency

    def scrape(self) -> Scrape:
        r = self.client.get(self.url + "/metrics", timeout=30.0)
        r.raise_for_status()
        return Scrape(r.text)

    def wait_for(
        self, accept: Callable[[Scrape], bool], what: str, seconds: float = 60.0
    ) -> Scrape:
        deadline = time.monotonic() + seconds
        while True:
            s = self.scrape()
            if accept(s):
                return s
            if time.monotonic() > deadline:
                raise AssertionError(f"not {what} after {seconds}s; last scrape: {s.samples}")
            time.sleep(0.05)

    def wait_healthy(self, expected: set[str] = DERIVED) -> Scrape:
        return self.wait_for(
            lambda s: s.value("glassbox_target_up") == 1.0 and s.names() >= expected,
            "healthy with every derived series",
        )


@pytest.fixture
def target() -> Iterator[Misbehaving]:
    with Misbehaving(FakeVllm()) as t:
        yield t


@contextlib.contextmanager
def _exporter(target: Misbehaving, timeout: float = TIMEOUT) -> Iterator[Exporter]:
    """A real exporter on loopback: make_server + Poller.run, as `serve` wires them."""
    poller = Poller(
        ExporterConfig(
            target=target.url,
            interval_seconds=INTERVAL,
            window_seconds=WINDOW,
            timeout_seconds=timeout,
            max_bytes=MAX_BYTES,
            weights_bytes=WEIGHTS,
            peak_bandwidth=PEAK_BANDWIDTH,
        )
    )
    server = make_server(poller, "127.0.0.1", 0)
    stop = threading.Event()
    polling = threading.Thread(target=poller.run, args=(stop,), daemon=True)
    polling.start()
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        with httpx.Client() as client:
            yield Exporter(f"http://127.0.0.1:{server.server_address[1]}", poller, client)
    finally:
        stop.set()
        server.shutdown()
        server.server_close()
        poller.stop()
        polling.join(timeout=30)
        poller.fetcher.close()


@pytest.fixture
def exporter(target: Misbehaving) -> Iterator[Exporter]:
    with _exporter(target) as e:
        yield e


def _first_line(page: str, name: str) -> str:
    return next(line for line in page.splitlines() if line.startswith(name + "{"))


def _set_value(name: str, value: str) -> Callable[[str], str]:
    """Edit a page: every sample of `name` gets `value`."""
    pattern = re.compile(rf"^({re.escape(name)}\{{[^}}]*\}}) \S+$", re.MULTILINE)
    return lambda page: pattern.sub(rf"\1 {value}", page)


def _duplicate(name: str) -> Callable[[str], str]:
    return lambda page: page + _first_line(page, name) + "\n"


def _long_label(page: str) -> str:
    return page + 'vllm:num_requests_running{model_name="' + "m" * 100_000 + '",engine="9"} 1\n'


def _no_vllm(page: str) -> str:
    return "".join(line + "\n" for line in page.splitlines() if "vllm:" not in line)


@dataclass(frozen=True)
class Failure:
    name: str
    reason: str
    behaviour: Callable[[FakeVllm], Behaviour] | None  # None: refuse connections


FAILURES = [
    Failure("connection refused", "connect", None),
    Failure("connection reset", "connect", lambda f: reset()),
    Failure("HTTP 500", "http_status", lambda f: status(500)),
    Failure("HTTP 404", "http_status", lambda f: status(404)),
    Failure("garbage bytes", "decode", lambda f: garbage()),
    Failure("HTML instead of metrics", "parse", lambda f: body("<html>busy</html>\n")),
    Failure("truncated, honest length", "parse", lambda f: truncated(f, honest=True)),
    Failure("truncated, dishonest length", "connect", lambda f: truncated(f, honest=False)),
    Failure("cut at a line, read to the close", "truncated", lambda f: cut_at_a_line(f)),
    Failure(
        "NaN counter",
        "invalid_value",
        lambda f: page_with(f, _set_value("vllm:generation_tokens_total", "NaN")),
    ),
    Failure(
        "+Inf histogram sum",
        "invalid_value",
        lambda f: page_with(f, _set_value("vllm:inter_token_latency_seconds_sum", "+Inf")),
    ),
    Failure(
        "duplicate series",
        "duplicate_series",
        lambda f: page_with(f, _duplicate("vllm:generation_tokens_total")),
    ),
    Failure("slow drip, 1 byte per 0.5 s", "timeout", lambda f: drip(f, 0.5)),
    Failure("headers then stall", "timeout", lambda f: stall_after_headers()),
    Failure("headers dripped", "timeout", lambda f: drip_headers(1.0)),
    Failure("20 MB page, announced", "too_large", lambda f: huge_page(20_000_000)),
    Failure(
        "20 MB page, not announced", "too_large", lambda f: huge_page(20_000_000, announce=False)
    ),
    Failure("gzip bomb", "too_large", lambda f: gzip_bomb(256 * 1024 * 1024)),
    Failure("100k series of one family", "cardinality", lambda f: many_series(100_000)),
    Failure("100 kB label value", "cardinality", lambda f: page_with(f, _long_label)),
    Failure("no vLLM series", "no_vllm_metrics", lambda f: page_with(f, _no_vllm)),
]


@pytest.mark.parametrize("failure", FAILURES, ids=[f.name for f in FAILURES])
def test_failure_is_counted_while_serving_and_recovers(
    failure: Failure, target: Misbehaving
) -> None:
    hangs = failure.reason == "timeout"
    with _exporter(target, SHORT_TIMEOUT if hangs else TIMEOUT) as exporter:
        before = exporter.wait_healthy().errors()
        # Payloads are built before tracing starts: what is measured is the exporter.
        behaviour = failure.behaviour(target.fake) if failure.behaviour else None
        tracemalloc.start()
        try:
            baseline = tracemalloc.get_traced_memory()[0]
            if behaviour is None:
                target.refuse()
            else:
                target.behave(behaviour)
            down = exporter.wait_for(
                lambda s: (
                    s.value("glassbox_target_up") == 0.0
                    and s.errors()[failure.reason] > before[failure.reason]
                ),
                f"counted as {failure.reason}",
            )
            peak = tracemalloc.get_traced_memory()[1] - baseline
        finally:
            tracemalloc.stop()

        others = {r: n for r, n in down.errors().items() if r != failure.reason and n != before[r]}
        assert others == {}, f"counted under other reasons too: {others}"
        assert DERIVED & down.names() == set(), "stale vLLM-derived series while down"
        duration = down.value("glassbox_scrape_duration_seconds")
        # The deadline holds: without it a drip would run for many minutes.
        assert duration is not None and duration < HUNG_POLL_BOUND, f"poll took {duration}s"
        assert peak < MEMORY_BOUND, f"peak {peak / 2**20:.1f} MiB during the bad poll"

        if behaviour is None:
            target.listen()
        target.behave(healthy(target.fake))
        back = exporter.wait_healthy()
        assert back.errors()[failure.reason] >= down.errors()[failure.reason]


def test_own_metrics_are_served_while_a_poll_hangs(target: Misbehaving) -> None:
    """A scrape never waits for vLLM: it is answered while the poll is known to hang."""
    hanging = threading.Event()

    def stall(h: Any) -> None:
        h.send_head(50_000)
        h.wfile.flush()
        hanging.set()
        h.server.owner.stopping.wait(600)  # far past the deadline: the poll stays blocked

    with _exporter(target, timeout=600.0) as exporter:
        exporter.wait_healthy()
        target.behave(stall)
        assert hanging.wait(60), "the exporter did not poll the stalling server"
        s = exporter.scrape()  # a scrape that waited for the poll would hang for minutes
        # Still the last good poll's publication: the hanging poll has not ended.
        assert s.value("glassbox_target_up") == 1.0 and s.names() >= DERIVED
        assert s.errors()["timeout"] == 0


def test_a_target_not_polled_yet_is_neither_up_nor_down(target: Misbehaving) -> None:
    """Until its first poll ends the exporter knows nothing of vLLM: no target_up (a
    restarted exporter must not show a target down that is not), its counters at 0."""
    hanging = threading.Event()

    def stall(h: Any) -> None:
        h.send_head(50_000)
        h.wfile.flush()
        hanging.set()
        h.server.owner.stopping.wait(600)

    target.behave(stall)
    with _exporter(target, timeout=600.0) as exporter:
        assert hanging.wait(60), "the exporter did not poll"
        s = exporter.scrape()
        assert s.value("glassbox_target_up") is None
        assert s.errors() == dict.fromkeys(FAILURE_REASONS, 0.0)
        assert s.value("glassbox_build_info", version=__version__) == 1.0


def test_busy_vllm_that_answers_late_is_up_and_counted_slow(target: Misbehaving) -> None:
    """An answer after the interval but within the deadline is read: vLLM is busy, not
    down. The poll counts as `slow` (not a failure) and every derived series stays."""
    with _exporter(target) as exporter:
        before = exporter.wait_healthy()
        target.behave(late(target.fake, seconds=3 * INTERVAL))
        s = exporter.wait_for(lambda s: s.slow() >= before.slow() + 2, "two slow polls")
        assert s.value("glassbox_target_up") == 1.0
        assert s.names() >= DERIVED
        assert s.errors() == before.errors(), "a late answer counted as a failure"
        took = s.value("glassbox_scrape_duration_seconds")
        assert took is not None and took > INTERVAL


def test_gzip_page_from_a_compressing_proxy_is_read(
    target: Misbehaving, exporter: Exporter
) -> None:
    exporter.wait_healthy()
    target.behave(gzip_page(target.fake))
    before = exporter.scrape().value("glassbox_last_scrape_success_timestamp_seconds")
    s = exporter.wait_for(
        lambda s: (
            (s.value("glassbox_last_scrape_success_timestamp_seconds") or 0)
            > (before or 0) + 2 * INTERVAL
        ),
        "polled successfully twice more",
    )
    assert s.value("glassbox_target_up") == 1.0
    assert s.names() >= DERIVED


# --- vLLM restarts ----------------------------------------------------------------------


def _expected_ratios(step: Step) -> dict[str, float]:
    """Every windowed ratio of a fake whose counters grow by `step` per poll, by hand."""
    decode_tokens = step.generation_tokens - step.ttft_count
    itl = step.itl_sum / step.itl_count
    return {
        "glassbox_time_per_output_token_seconds": step.itl_sum / decode_tokens,
        "glassbox_inter_token_latency_seconds": itl,
        "glassbox_tokens_per_forward_pass": decode_tokens / step.itl_count,
        "glassbox_tokens_per_engine_step": step.generation_tokens / step.engine_steps,
        "glassbox_time_to_first_token_seconds": step.ttft_sum / step.ttft_count,
        "glassbox_weight_bytes_per_output_token": WEIGHTS
        * step.engine_steps
        / step.generation_tokens,
        "glassbox_weight_read_bandwidth_bytes_per_second": WEIGHTS / itl,
        "glassbox_memory_bandwidth_utilization_ratio": WEIGHTS / itl / PEAK_BANDWIDTH,
        "glassbox_preemptions_per_second": 0.0,
    }


def _watch(exporter: Exporter, until: Callable[[Scrape], bool], what: str) -> list[Scrape]:
    seen: list[Scrape] = []

    def record(s: Scrape) -> bool:
        seen.append(s)
        return until(s)

    exporter.wait_for(record, what)
    return seen


def _assert_steady(scrapes: list[Scrape], step: Step) -> None:
    """Ratios equal their hand values at every scrape; rates never negative or spiking."""
    expected = _expected_ratios(step)
    # A poll the machine delays makes the next one come early, by less than an interval:
    # over a window of polls the rate stays under twice the steady one. A miscounted
    # restart adds a whole process's count at once: tens of times the steady rate.
    steps_per_second_max = 3 * step.engine_steps / INTERVAL
    for s in scrapes:
        for name, want in expected.items():
            got = s.value(name)
            if got is not None:
                assert got == pytest.approx(want, rel=1e-9, abs=1e-12), (name, got)
        rate = s.value("glassbox_engine_steps_per_second")
        if rate is not None:
            assert 0 < rate <= steps_per_second_max


def _full_window(s: Scrape) -> bool:
    covered = s.value("glassbox_window_covered_seconds")
    return covered is not None and covered >= WINDOW - INTERVAL - 0.05


def _restarts(s: Scrape) -> float:
    return s.value("glassbox_target_restarts_total") or 0.0


def test_vllm_restart_after_an_outage_is_counted_once_without_spikes(
    target: Misbehaving, exporter: Exporter
) -> None:
    scrapes = [exporter.wait_healthy()]
    scrapes += _watch(exporter, _full_window, "a full window")
    target.refuse()
    scrapes += _watch(exporter, lambda s: s.value("glassbox_target_up") == 0.0, "down")
    target.fake.restart()
    target.listen()
    scrapes += _watch(
        exporter,
        lambda s: _restarts(s) == 1 and s.names() >= DERIVED,
        "restart counted and derived series back",
    )
    scrapes += _watch(exporter, _full_window, "a full window after the restart")
    _assert_steady(scrapes, target.fake.step)
    assert _restarts(scrapes[-1]) == 1


def test_restart_without_process_start_time_is_seen_by_counters_going_down() -> None:
    # vLLM's multiprocess mode (several API servers) exposes no process_* series, and its
    # engine steps may be counted once per API server: those series are absent, flagged.
    with Misbehaving(FakeVllm(show_process_start=False)) as target, _exporter(target) as exporter:
        scrapes = [exporter.wait_healthy(DERIVED - STEP_SERIES)]
        assert not scrapes[0].names() & STEP_SERIES
        assert (
            scrapes[0].value(
                "glassbox_input_unrecognised", source="page", shape="steps_counted_per_api_server"
            )
            == 1.0
        )
        target.fake.restart()  # between two polls: the next page has lower counters
        scrapes += _watch(exporter, lambda s: _restarts(s) == 1, "restart counted")
        scrapes += _watch(exporter, _full_window, "a full window after the restart")
        _assert_steady(scrapes, target.fake.step)
        assert _restarts(scrapes[-1]) == 1


def test_restart_with_counters_already_past_the_old_values_is_seen_by_start_time(
    target: Misbehaving, exporter: Exporter
) -> None:
    scrapes = [exporter.wait_healthy()]
    # The new process has done more steps than the old one had by its last page: only
    # process_start_time_seconds tells; the whole new count is the increase.
    target.fake.restart(polls_before_first_page=target.fake.polls + 50)
    scrapes += _watch(exporter, lambda s: _restarts(s) == 1, "restart counted")
    expected = _expected_ratios(target.fake.step)
    for s in scrapes:
        for name, want in expected.items():
            got = s.value(name)
            if got is not None:
                assert got == pytest.approx(want, rel=1e-9, abs=1e-12), (name, got)


def test_a_failure_is_logged_when_it_starts_not_at_every_poll(
    target: Misbehaving, caplog: pytest.LogCaptureFixture
) -> None:
    poller = Poller(ExporterConfig(target=target.url, timeout_seconds=TIMEOUT))
    caplog.set_level(logging.DEBUG, logger="glassbox.exporter")
    try:
        assert poller.poll_once()
        target.behave(status(500))
        for _ in range(3):
            assert not poller.poll_once()
        target.behave(status(503))
        assert not poller.poll_once()
        target.behave(healthy(target.fake))
        assert poller.poll_once()
    finally:
        poller.fetcher.close()
    seen = [
        (r.levelname, r.getMessage().split(" err=")[0])
        for r in caplog.records
        if r.getMessage().startswith(("poll failed", "poll succeeded"))
    ]
    assert seen == [
        ("ERROR", f"poll failed target={target.url} reason=http_status"),
        ("DEBUG", f"poll failed target={target.url} reason=http_status"),
        ("DEBUG", f"poll failed target={target.url} reason=http_status"),
        ("DEBUG", f"poll failed target={target.url} reason=http_status"),
        ("INFO", f"poll succeeded again target={target.url}"),
    ]
