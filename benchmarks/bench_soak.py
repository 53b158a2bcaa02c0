"""A sidecar's months, compressed: the exporter's own `Poller` over a real two-engine H200
page through restarts, a flapping target and a slow one, its resources read every 1,000
polls.

    .venv/bin/python benchmarks/bench_soak.py                      # 60,000 polls, ~10 minutes
    .venv/bin/python benchmarks/bench_soak.py --polls 2400 --life 200 --json soak.json

The target is a page server of its own process on loopback, serving the pages captured
from vLLM 0.24.0 with two data-parallel engines on two H200s
(tests/fixtures/metrics/cuda-0.24.0-h200x2/dp2-*.txt) as vLLM serves them (the filtered
page too). Each of its lives (`--life` polls, 1,000 by default) is one vLLM process:

  steady    the captured pages in the order they were captured (idle, after four
            requests, four moments of a flood, after it), each for a stretch of polls;
  flapping  10 % of the life: every other poll fails, in turn an HTTP 503, a connection
            closed without an answer, a page cut in half, a page that is not exposition;
  slow      2 % of the life: every other poll answered after the interval (read, counted
            `slow`), and the last one past the deadline (`timeout`);
  restart   at its end the process is killed: polls are refused until a new one listens,
            with a later `process_start_time_seconds` and counters from zero, and vLLM's log
            (`--vllm-log`, the same run's captured log) gets the new start appended.

Time is compressed: the poller's clock runs `SCALE` times as fast as the machine's during
a poll, and the rest of each 5 s interval is skipped, so 60,000 polls are 83 hours of a
sidecar's life at the default interval and window. The deadline is the default 10 s, in
compressed time (0.5 s of the machine's). A scrape every third poll (15 s) encodes the
exporter's own page with its findings, as Prometheus would ask for it.

Every `--every` polls (at the same moment of each life: its last poll before the restart)
a row: RSS, open file descriptors, threads, Python objects alive (gc), the own page's
bytes and lines, the history's and the KV trend's length, failed polls by reason.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import logging
import multiprocessing
import os
import re
import sys
import tempfile
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from multiprocessing.sharedctypes import Synchronized
from pathlib import Path
from urllib.parse import parse_qs

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

from bench_poll import restricted, rss_bytes  # noqa: E402
from prometheus_client import generate_latest  # noqa: E402
from vllm_glassbox.exporter.service import ExporterConfig, Poller, make_registry  # noqa: E402
from vllm_glassbox.lab.backends.server_process import free_port  # noqa: E402

from tests.fixtures import LOGS, METRICS  # noqa: E402

CAPTURE = METRICS / "cuda-0.24.0-h200x2"
PAGES = [
    f"dp2-{name}.txt"
    for name in (
        "idle",
        "after-4x128",
        "flood-005",
        "flood-006",
        "flood-008",
        "flood-013",
        "after-flood",
    )
]
LOG = LOGS / "cuda-0.24.0-h200x2-dp2.log"
VERSION = b'{"version": "0.24.0"}'
INTERVAL, WINDOW = 5.0, 60.0  # `glassbox exporter`'s defaults
SCALE = 20.0  # compressed seconds per second of the machine's, within a poll
DEADLINE = 10.0 / SCALE  # the default 10 s deadline, compressed
SLOW_SECONDS = 6.0 / SCALE  # after the 5 s interval, before the deadline
SILENT_SECONDS = 12.0 / SCALE  # past it
SCRAPE_EVERY = 3  # polls: a 15 s scrape of a 5 s poll
H200_BANDWIDTH = 4.8e12

# What the target does with the next request (a shared value the page server reads).
NORMAL, ERROR_503, CLOSE, CUT, NOT_A_PAGE, SLOW, SILENT = range(7)
FLAPS = (ERROR_503, CLOSE, CUT, NOT_A_PAGE)
_START_LINE = re.compile(rb"^process_start_time_seconds .*$", re.M)


def act_at(position: int, life: int) -> int:
    """What the target does at a poll `position` into a life of `life` polls."""
    flapping = range(life // 2, life // 2 + life // 10)
    slow = range(flapping.stop, flapping.stop + max(life // 50, 2))
    if position in flapping:
        offset = position - flapping.start
        return FLAPS[offset // 2 % len(FLAPS)] if offset % 2 else NORMAL
    if position in slow:
        return SILENT if position == slow[-1] else SLOW if position % 2 == 0 else NORMAL
    return NORMAL


def page_at(position: int, life: int) -> int:
    """Which captured page the target serves a poll `position` into its life."""
    return min(position * len(PAGES) // life, len(PAGES) - 1)


def _serve(
    port: int,
    started_at: float,
    act: Synchronized,  # type: ignore[type-arg]
    page: Synchronized,  # type: ignore[type-arg]
    listening: threading.Event,
) -> None:
    """Child process: one vLLM process' pages (its start time written in), as `act` says."""
    start = f"process_start_time_seconds {started_at:.9e}".encode()
    pages = [_START_LINE.sub(start, (CAPTURE / name).read_bytes()) for name in PAGES]

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_GET(self) -> None:
            path, _, query = self.path.partition("?")
            if path == "/version":
                self._answer(VERSION)
                return
            doing = act.value
            if doing == ERROR_503:
                self.send_error(503)
                return
            if doing == CLOSE:
                self.close_connection = True
                return
            body = pages[page.value]
            if query:  # the filtered page, as vLLM's prometheus_client renders it
                body = restricted(body, set(parse_qs(query).get("name[]", [])))
            if doing in (SLOW, SILENT):
                time.sleep(SLOW_SECONDS if doing == SLOW else SILENT_SECONDS)
            elif doing == CUT:
                body = body[: len(body) // 2]
            elif doing == NOT_A_PAGE:
                body = b"<html><body>502 Bad Gateway</body></html>\n"
            self._answer(body)

        def _answer(self, body: bytes) -> None:
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            with contextlib.suppress(OSError):  # a poll past its deadline hung up
                self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:
            pass

    ThreadingHTTPServer.allow_reuse_address = True
    server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
    listening.set()
    server.serve_forever()


class Target:
    """The page server, one process per vLLM life: `restart()` kills it and starts the next."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.act = multiprocessing.Value("i", NORMAL)
        self.page = multiprocessing.Value("i", 0)
        self.process: multiprocessing.Process | None = None

    def start(self, started_at: float) -> None:
        listening = multiprocessing.Event()
        self.process = multiprocessing.Process(
            target=_serve,
            args=(self.port, started_at, self.act, self.page, listening),
            daemon=True,
        )
        self.process.start()
        if not listening.wait(60):
            raise RuntimeError("the page server did not listen within 60 s")

    def kill(self) -> None:
        if self.process is not None:
            self.process.kill()
            self.process.join()
            self.process.close()
            self.process = None


class CompressedClock:
    """The poller's monotonic clock: the machine's, `scale` times as fast during a poll,
    with the rest of each interval skipped (`next_poll`)."""

    def __init__(self, scale: float) -> None:
        self.scale = scale
        self._real, self._virtual = time.monotonic(), 0.0
        self._poll_start = 0.0

    def __call__(self) -> float:
        return self._virtual + (time.monotonic() - self._real) * self.scale

    def next_poll(self, interval: float) -> None:
        """On to the next poll's start: an interval after this one's, or an interval after
        now when it overran (as `Poller.run` does)."""
        now = self()
        due = self._poll_start + interval
        self._poll_start = due if now <= due else now + interval
        self._real, self._virtual = time.monotonic(), self._poll_start

    @property
    def hours(self) -> float:
        return self() / 3600


@dataclass(frozen=True)
class Row:
    polls: int
    hours: float  # of the sidecar's compressed life
    rss_mib: float
    fds: int
    threads: int
    objects: int  # alive after a collection, tracked by the garbage collector
    page_bytes: int  # the exporter's own /metrics, findings included
    page_lines: int
    history: int  # polls the window history keeps
    kv_trend: int  # polls the KV pool's trend keeps
    restarts: int  # seen by the exporter
    errors: dict[str, int]  # failed (and slow) polls by reason, so far


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def soak(polls: int, life: int, every: int, work: Path) -> Iterator[Row]:
    """Poll `polls` times through lives of `life` polls; a Row every `every` polls."""
    log = work / "vllm.log"
    log.write_bytes(LOG.read_bytes())
    target = Target(free_port())
    started_at = 1.8e9
    target.start(started_at)
    clock = CompressedClock(SCALE)
    poller = Poller(
        ExporterConfig(
            target=f"http://127.0.0.1:{target.port}",
            interval_seconds=INTERVAL,
            window_seconds=WINDOW,
            timeout_seconds=DEADLINE,
            vllm_log=str(log),
            peak_bandwidth=H200_BANDWIDTH,
        ),
        clock=clock,
    )
    registry = make_registry(poller)
    page = b""
    try:
        for i in range(polls):
            position = i % life
            target.page.value = page_at(position, life)
            target.act.value = act_at(position, life)
            poller.poll_once()
            if i % SCRAPE_EVERY == 0:
                page = generate_latest(registry)
            if (i + 1) % every == 0:
                page = generate_latest(registry)
                gc.collect()  # what stays alive, not what awaits collection
                yield Row(
                    i + 1,
                    round(clock.hours, 2),
                    round(rss_bytes() / 2**20, 2),
                    open_fds(),
                    threading.active_count(),
                    len(gc.get_objects()) - ((i + 1) // every - 1),  # less the rows yielded
                    len(page),
                    page.count(b"\n"),
                    len(poller.history),
                    len(poller.used_tokens),
                    poller.history.restarts,
                    dict(sorted(poller.errors.items())),
                )
            clock.next_poll(INTERVAL)
            if position == life - 1:  # vLLM restarts: gone, then a new process
                target.kill()
                for _ in range(3):
                    poller.poll_once()
                    clock.next_poll(INTERVAL)
                started_at = 1.8e9 + clock()
                with log.open("ab") as appended:
                    appended.write(LOG.read_bytes())
                target.act.value = NORMAL
                target.page.value = 0
                target.start(started_at)
    finally:
        poller.fetcher.close()
        target.kill()


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--polls", type=int, default=60_000, help="how many (default 60,000)")
    p.add_argument("--life", type=int, default=1000, help="polls per vLLM process (1,000)")
    p.add_argument("--every", type=int, default=0, help="polls per row (default: --life)")
    p.add_argument("--json", type=Path, help="also write the rows to this file")
    args = p.parse_args(argv)
    every = args.every or args.life
    # The exporter logs each failure as it would (the cost stays), to nowhere.
    quiet = logging.getLogger("glassbox")
    quiet.addHandler(logging.NullHandler())
    quiet.propagate = False
    print(
        f"python {sys.version.split()[0]}, {os.cpu_count()} CPUs, load average "
        f"{' '.join(Path('/proc/loadavg').read_text().split()[:3])}; {args.polls} polls, "
        f"a restart every {args.life}, compressed {SCALE:g}x in a poll",
        flush=True,
    )
    header = (
        f"{'polls':>7} {'hours':>6} {'RSS MiB':>8} {'fds':>4} {'thr':>4} {'objects':>8} "
        f"{'page B':>7} {'lines':>5} {'hist':>4} {'kv':>3} {'restarts':>8}  failed polls"
    )
    print(header, flush=True)
    rows = []
    wall = time.monotonic()
    cpu = time.process_time()
    with tempfile.TemporaryDirectory(prefix="glassbox-soak-") as work:
        for row in soak(args.polls, args.life, every, Path(work)):
            rows.append(row)
            errors = " ".join(f"{k}={v}" for k, v in row.errors.items())
            print(
                f"{row.polls:>7} {row.hours:>6.1f} {row.rss_mib:>8.2f} {row.fds:>4} "
                f"{row.threads:>4} {row.objects:>8} {row.page_bytes:>7} {row.page_lines:>5} "
                f"{row.history:>4} {row.kv_trend:>3} {row.restarts:>8}  {errors}",
                flush=True,
            )
    seconds = time.monotonic() - wall
    print(
        f"soak: {args.polls} polls in {seconds:.0f} s "
        f"({(time.process_time() - cpu) / args.polls * 1e3:.2f} ms CPU each); load average "
        f"{' '.join(Path('/proc/loadavg').read_text().split()[:3])}"
    )
    if args.json:
        args.json.write_text(json.dumps([asdict(r) for r in rows], indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
