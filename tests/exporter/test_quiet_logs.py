"""The exporter is quiet for months: nothing logged per poll, each change of state once.

A real Poller polls a fake vLLM over loopback HTTP (tests/misbehaving.py) through httpx,
with the logging `glassbox exporter` sets up, and a scrape of its /metrics after every poll
(the findings are built then). Time is a fake clock, 5 s a poll: nothing waits. The
oracle of each line is what the test did to the target (failed it, restarted it, put a
second server behind it) and, for the findings, the set of `glassbox_finding_info`
kinds read back from each scrape with prometheus_client's parser.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families
from vllm_glassbox.core.logs import set_up_logging
from vllm_glassbox.exporter.server_trail import KEEP_FLAGGED
from vllm_glassbox.exporter.service import ExporterConfig, Poller, make_registry

from tests.misbehaving import FakeVllm, Misbehaving, healthy, status

INTERVAL = 5.0
WINDOW = 60.0
START_UP = int(WINDOW / INTERVAL) + 2  # polls until the window is full
POLLS = 1000


class Lines(logging.Handler):
    """Every line the exporter's logging writes (one record, one line), kept."""

    def __init__(self) -> None:
        super().__init__()
        self.lines: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record)

    def taken(self) -> list[str]:
        """The lines since the last call, as `logger: message`."""
        taken, self.lines = self.lines, []
        return [f"{r.name}: {r.getMessage()}" for r in taken]


@pytest.fixture
def logged(request: pytest.FixtureRequest) -> Iterator[Lines]:
    """The exporter's logging at --log-level info (or the level the test names), with
    the root's handlers and the libraries' levels given back afterwards."""
    level = getattr(request, "param", "info")
    root = logging.getLogger()
    saved = root.handlers[:], root.level
    libraries = {name: logging.getLogger(name).level for name in ("httpx", "httpcore")}
    set_up_logging(level)
    lines = Lines()
    root.addHandler(lines)
    try:
        yield lines
    finally:
        root.handlers[:], root.level = saved
        for name, was in libraries.items():
            logging.getLogger(name).setLevel(was)


@dataclass
class Clock:
    now: float = 1000.0

    def __call__(self) -> float:
        return self.now


@dataclass
class Exporter:
    poller: Poller
    clock: Clock
    findings: frozenset[tuple[str, str]] | None = None  # the latest scrape's, vLLM up

    def poll(self, scrape: bool = True) -> int:
        """One poll and one scrape; how many times the findings' kinds changed (0 or 1),
        read from the scrape, not counting the target's own (glassbox's diagnosis)."""
        self.clock.now += INTERVAL
        up = self.poller.poll_once()
        if not scrape:
            return 0
        text = generate_latest(make_registry(self.poller)).decode()
        if not up:
            return 0
        kinds = frozenset(
            (s.labels["diagnosis"], s.labels["finding"])
            for family in text_string_to_metric_families(text)
            if family.name == "glassbox_finding_info"
            for s in family.samples
            if s.labels["diagnosis"] != "glassbox"
        )
        before, self.findings = self.findings, kinds
        return int(kinds != before and (before is not None or bool(kinds)))


@pytest.fixture
def target() -> Iterator[Misbehaving]:
    with Misbehaving(FakeVllm()) as target:
        yield target


@pytest.fixture
def exporter(target: Misbehaving) -> Iterator[Exporter]:
    clock = Clock()
    config = ExporterConfig(
        target=target.url, interval_seconds=INTERVAL, window_seconds=WINDOW, timeout_seconds=30
    )
    poller = Poller(config, clock=clock)
    yield Exporter(poller, clock)
    poller.fetcher.close()


def test_a_thousand_healthy_polls_log_nothing_after_start_up(
    logged: Lines, exporter: Exporter
) -> None:
    changes = sum(exporter.poll() for _ in range(START_UP))
    start_up = logged.taken()
    # The findings of the first polls (nothing measured yet, then the weights unknown).
    assert len(start_up) == changes <= 2, start_up
    assert all(line.startswith("glassbox.exporter: findings changed") for line in start_up)
    for n in range(POLLS):
        # Prometheus scrapes every 15 s, the exporter polls every 5 s.
        exporter.poll(scrape=n % 3 == 0)
    assert logged.taken() == []


@pytest.mark.parametrize("logged", ["debug"], indirect=True)
def test_at_debug_each_request_is_logged(logged: Lines, exporter: Exporter) -> None:
    """The other side of the quiet: at --log-level debug httpx tells every request it
    made, so the healthy polls above are quiet because of the level, not by luck."""
    for _ in range(START_UP):
        exporter.poll()
    requests = [line for line in logged.taken() if line.startswith("httpx: HTTP Request: GET")]
    assert len(requests) >= START_UP


def test_a_flapping_target_logs_one_line_per_change(
    logged: Lines, target: Misbehaving, exporter: Exporter
) -> None:
    for _ in range(START_UP):
        exporter.poll()
    logged.taken()
    url = target.url

    def expect(*lines: str, findings: int = 0) -> None:
        """The lines of one poll: those given (their beginnings), then one for each change
        of the findings."""
        got = logged.taken()
        want = list(lines) + ["glassbox.exporter: findings changed"] * findings
        assert len(got) == len(want), got
        for line, start in zip(got, want, strict=True):
            assert line.startswith(start), (line, start)

    failed = f"glassbox.exporter: poll failed target={url} reason="
    for _ in range(4):  # (each refusal costs the fake's server half a second to close)
        target.behave(status(500))
        expect(failed + "http_status", findings=exporter.poll())
        expect(findings=exporter.poll())  # the same failure again: nothing new
        target.refuse()
        expect(failed + "connect", findings=exporter.poll())  # another reason
        target.listen()
        target.behave(healthy(target.fake))
        expect(f"glassbox.exporter: poll succeeded again target={url}", findings=exporter.poll())
        expect(findings=exporter.poll())

    first_start = target.fake.process_start
    target.fake.restart()
    expect(f"glassbox.exporter: vLLM restarted target={url} restarts=1", findings=exporter.poll())
    for _ in range(START_UP):
        expect(findings=exporter.poll())

    # A second server behind the target: the first process answers again.
    target.fake.process_start = first_start
    shape = "source=page shape=several_servers_behind_the_target"
    expect(f"glassbox.exporter: input glassbox does not read {shape}", findings=exporter.poll())
    for _ in range(KEEP_FLAGGED - 1):
        expect(findings=exporter.poll())
    expect(f"glassbox.exporter: input read again {shape}", findings=exporter.poll())

    # The pool full, then a quarter full again: findings raised and cleared.
    target.fake.kv_usage = 0.99
    storm = sum(exporter.poll() for _ in range(START_UP))
    target.fake.kv_usage = 0.25
    calm = sum(exporter.poll() for _ in range(2 * START_UP))
    lines = logged.taken()
    assert storm >= 1 and calm >= 1
    assert len(lines) == storm + calm, lines
    assert all(line.startswith("glassbox.exporter: findings changed") for line in lines)
    for _ in range(START_UP):
        expect(findings=exporter.poll())


def test_an_unreadable_vllm_log_is_told_once_and_again_when_read(
    logged: Lines, target: Misbehaving, tmp_path: Path
) -> None:
    path = tmp_path / "vllm.log"
    path.mkdir()  # a directory where the log should be: every read fails
    config = ExporterConfig(target=target.url, vllm_log=str(path), timeout_seconds=30)
    clock = Clock()
    exporter = Exporter(Poller(config, clock=clock), clock)
    try:
        for _ in range(5):
            exporter.poll(scrape=False)
        unreadable = logged.taken()
        path.rmdir()
        path.write_text("")
        for _ in range(5):
            exporter.poll(scrape=False)
        again = logged.taken()
    finally:
        exporter.poller.fetcher.close()
    assert len(unreadable) == 1 and unreadable[0].startswith(
        f"glassbox.exporter: cannot read vLLM log path={path} err="
    )
    assert again == [f"glassbox.exporter: vLLM log read again path={path}"]
