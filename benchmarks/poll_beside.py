"""The exporter's poller beside a vLLM someone else started (the lab's, on a GPU machine):
how many polls succeed while it saturates, how late they answer, and whether the rates it
publishes are the raw pages' arithmetic over the times they came.

It waits for a vLLM API server process (`vllm.entrypoints` in its command line, `--port
N`), polls `http://127.0.0.1:N` with the exporter's own `Poller` every `--interval`
seconds under `--timeout`, and follows the next server when that one goes away, until
`--seconds` have passed or it is stopped (SIGTERM, SIGINT). It then prints and writes
(`--json`) per server: polls tried and read, failures by reason, answers later than the
interval, the answer time's median, 95th percentile and maximum, the most requests seen
running and waiting, and the engine steps per second the poller published at its last
poll beside the same number from the first and last pages it read (prometheus_client's
parser, not glassbox's).

    python benchmarks/poll_beside.py --seconds 600 --json out/polls.json &
    glassbox lab run PLAN ...

A script that prints numbers, not a test.
"""

from __future__ import annotations

import argparse
import json
import signal
import statistics
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from prometheus_client.parser import text_string_to_metric_families
from vllm_glassbox.core.fetch import Fetcher
from vllm_glassbox.exporter.service import ExporterConfig, Poller


def vllm_port() -> int | None:
    """The --port of a running vLLM API server, if one runs."""
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            argv = cmdline.read_bytes().split(b"\0")
        except OSError:
            continue
        words = [a.decode(errors="replace") for a in argv]
        if any("vllm.entrypoints" in w for w in words) and "--port" in words:
            i = words.index("--port")
            if i + 1 < len(words) and words[i + 1].isdigit():
                return int(words[i + 1])
    return None


class Recording(Fetcher):
    """The exporter's fetcher, keeping the first and the latest page and when they came."""

    def __init__(self, url: str, timeout_seconds: float) -> None:
        super().__init__(url, timeout_seconds)
        self.first: tuple[float, str] | None = None
        self.last: tuple[float, str] | None = None

    def get_text(self, path: str, timeout_seconds: float | None = None) -> str:
        text = super().get_text(path, timeout_seconds)
        if path != "/version":
            self.last = (time.monotonic(), text)
            self.first = self.first or self.last
        return text


def _raw(text: str, name: str) -> float:
    return sum(
        s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name == name
    )


def _published(poller: Poller, name: str) -> float | None:
    values = [s.value for f in poller.published for s in f.samples if s.name == name]
    return values[0] if values else None


@dataclass
class ServerPolls:
    port: int
    tried: int = 0
    answers: list[float] = field(default_factory=list)  # seconds, of the polls read
    peak_running: float = 0.0
    peak_waiting: float = 0.0
    failed: dict[str, int] = field(default_factory=dict)
    steps_per_second_published: float | None = None
    steps_per_second_raw: float | None = None

    def summary(self, interval: float) -> dict[str, Any]:
        answers = sorted(self.answers)
        read = len(answers)
        return {
            "port": self.port,
            "polls": self.tried,
            "read": read,
            "read_share": read / self.tried if self.tried else None,
            "failed": self.failed,
            "later_than_interval": sum(1 for a in answers if a > interval),
            "answer_median_s": statistics.median(answers) if answers else None,
            "answer_p95_s": answers[min(read - 1, int(0.95 * read))] if answers else None,
            "answer_max_s": answers[-1] if answers else None,
            "peak_running": self.peak_running,
            "peak_waiting": self.peak_waiting,
            "steps_per_second_published": self.steps_per_second_published,
            "steps_per_second_raw": self.steps_per_second_raw,
        }


def follow(port: int, args: argparse.Namespace, stop: threading.Event) -> ServerPolls:
    """Poll one server from its start until it has stopped answering for 30 s (gone), or
    its process went before it ever answered, or `stop`."""
    url = f"http://127.0.0.1:{port}"
    fetcher = Recording(url, args.timeout)
    config = ExporterConfig(
        target=url,
        interval_seconds=args.interval,
        window_seconds=3600.0,
        timeout_seconds=args.timeout,
    )
    poller = Poller(config, fetcher=fetcher)
    record = ServerPolls(port)
    last_read = time.monotonic()
    while not stop.is_set():
        if record.answers and time.monotonic() - last_read > 30.0:
            break  # gone
        if not record.answers and vllm_port() != port:
            break  # it never served
        started = time.monotonic()
        errors_before = dict(poller.errors)
        read = poller.poll_once()
        if not read and vllm_port() != port:
            break  # it was stopped: no failure of a saturated server
        if not read and not record.answers:
            stop.wait(args.interval)
            continue  # still starting: it has not served yet
        record.tried += 1
        for reason, n in poller.errors.items():
            if reason != "slow" and n > errors_before.get(reason, 0):
                record.failed[reason] = record.failed.get(reason, 0) + 1
        if read:
            record.answers.append(time.monotonic() - started)
            last_read = time.monotonic()
            text = fetcher.last[1] if fetcher.last else ""
            record.peak_running = max(record.peak_running, _raw(text, "vllm:num_requests_running"))
            record.peak_waiting = max(record.peak_waiting, _raw(text, "vllm:num_requests_waiting"))
            record.steps_per_second_published = _published(
                poller, "glassbox_engine_steps_per_second"
            )
            if fetcher.first and fetcher.last and fetcher.last[0] > fetcher.first[0]:
                steps = "vllm:iteration_tokens_total_count"
                grown = _raw(fetcher.last[1], steps) - _raw(fetcher.first[1], steps)
                record.steps_per_second_raw = grown / (fetcher.last[0] - fetcher.first[0])
        stop.wait(max(0.0, args.interval - (time.monotonic() - started)))
    fetcher.close()
    return record


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seconds", type=float, default=600.0)
    p.add_argument("--interval", type=float, default=1.0)
    p.add_argument("--timeout", type=float, default=10.0)
    p.add_argument("--json", type=Path)
    args = p.parse_args(argv)
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    deadline = time.monotonic() + args.seconds
    timer = threading.Timer(args.seconds, stop.set)
    timer.daemon = True
    timer.start()
    servers: list[ServerPolls] = []
    followed: set[int] = set()
    while not stop.is_set() and time.monotonic() < deadline:
        port = vllm_port()
        if port is None or port in followed:
            stop.wait(1.0)
            continue
        followed.add(port)
        record = follow(port, args, stop)
        if record.answers:
            servers.append(record)
    out = [s.summary(args.interval) for s in servers]
    print(json.dumps(out, indent=2))
    if args.json:
        args.json.write_text(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
