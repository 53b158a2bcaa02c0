"""What one poll of vLLM costs the exporter, against a naive full parse, in one run.

    .venv/bin/python benchmarks/bench_poll.py                 # poll and serving cost
    .venv/bin/python benchmarks/bench_poll.py --soak 100000   # + RSS over 100,000 polls

Pages: a real vLLM 0.32 CPU page captured after speculative requests
(tests/fixtures/metrics/cpu-0.32/spec-after-2x256.txt, one engine, ~54 KiB), and the
same page grown to 8 data-parallel engines (tests.fixtures.grow_engines). A separate
process serves them over loopback HTTP, so the CPU time measured here (process time of
this process, all threads) is the client's alone:

  glassbox   Poller.poll_once(): fetch (deadline watchdog, byte cap), targeted parse,
             snapshot, window history, every derived family.
  naive      httpx GET (one reused client, as glassbox has) + a full parse with
             prometheus_client.parser.text_string_to_metric_families.
  deployed   Poller.poll_once() as against vLLM: the page of the samples it reads.

The three are measured in interleaved rounds (a batch of each per round); each ratio is
the median of the per-round ratios, with the lowest and highest.

Then the cost of serving the exporter's own /metrics (encoding its latest publication),
and with --soak the resident memory before and after N polls of pages that keep
changing (the speculative server's pages in a cycle, so counters grow and reset).
Numbers go to benchmarks/README.md by hand; this script is not a test.
"""

from __future__ import annotations

import argparse
import functools
import multiprocessing
import re
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from multiprocessing.queues import SimpleQueue
from pathlib import Path
from urllib.parse import parse_qs

import httpx
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))  # for tests.fixtures (pages and grow_engines)

from vllm_glassbox.exporter.service import ExporterConfig, Poller, make_registry  # noqa: E402

from tests.fixtures import grow_engines, page  # noqa: E402

ONE_ENGINE = "cpu-0.32/spec-after-2x256.txt"
SOAK_CYCLE = [
    "cpu-0.32/spec-idle.txt",
    "cpu-0.32/spec-after-1x256.txt",
    "cpu-0.32/spec-after-2x256.txt",
    "cpu-0.32/flood-mid.txt",
    "cpu-0.32/flood-after.txt",
]
VERSION = b'{"version": "0.32.0"}'


def restricted(page: bytes, names: set[str]) -> bytes:
    """The page as prometheus_client renders it for `name[]=…`: the samples of those
    names, with the HELP and TYPE lines of their families."""
    lines = page.decode().splitlines(keepends=True)
    kept = [ln for ln in lines if not ln.startswith("#") and re.split(r"[{ ]", ln)[0] in names]
    families = {ln.split(" ")[2] for ln in lines if ln.startswith("# TYPE ")} & {
        n.removesuffix(s) for n in names for s in ("", "_total", "_count", "_sum")
    }
    head = [ln for ln in lines if ln.startswith("#") and ln.split(" ")[2] in families]
    return "".join(head + kept).encode()


def _serve(pages: dict[str, list[bytes]], port_out: SimpleQueue[int]) -> None:
    """Child process: GET /<name>/metrics answers the next page of `name` (cycling), and
    /<name>/metrics/?name[]=… that page restricted, as vLLM does (for `name` not ending
    in `-whole`: those stand for a server without the filtered page, 404)."""
    turn = dict.fromkeys([*pages, *(f"{n}-whole" for n in pages)], 0)

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_GET(self) -> None:
            path, _, query = self.path.partition("?")
            name, _, leaf = path.lstrip("/").partition("/")
            if leaf == "version":
                body = VERSION
            elif leaf == "metrics/" and name.endswith("-whole"):
                self.send_error(404)
                return
            else:
                cycle = pages[name.removesuffix("-whole")]
                body = cycle[turn[name] % len(cycle)]
                turn[name] += 1
                if query:
                    body = restricted(body, set(parse_qs(query).get("name[]", [])))
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    port_out.put(server.server_address[1])
    server.serve_forever()


def cpu_per_call(fn: Callable[[], object], calls: int, batches: int = 5) -> float:
    """Process CPU seconds per call: the best of a few batches (least disturbed by
    whatever else the machine is doing)."""
    fn()  # warm up: imports, compiled regexes, first connection
    per_call = []
    for _ in range(batches):
        started = time.process_time()
        for _ in range(calls):
            fn()
        per_call.append((time.process_time() - started) / calls)
    return min(per_call)


def interleaved(
    ways: dict[str, tuple[Callable[[], object], int]], rounds: int
) -> dict[str, list[float]]:
    """Process CPU seconds per call of each way, one batch of each in turn, round after
    round: whatever else the machine does lands on all of them alike, so the ratio of
    two ways within a round is fair even when the machine is busy."""
    for fn, _ in ways.values():
        fn()  # warm up: imports, compiled regexes, first connection
    per_call: dict[str, list[float]] = {name: [] for name in ways}
    for _ in range(rounds):
        for name, (fn, calls) in ways.items():
            started = time.process_time()
            for _ in range(calls):
                fn()
            per_call[name].append((time.process_time() - started) / calls)
    return per_call


def ratios(over: list[float], under: list[float]) -> str:
    """The median of the per-round ratios, with the lowest and highest."""
    each = [a / b for a, b in zip(over, under, strict=True)]
    return f"{statistics.median(each):.3f} ({min(each):.3f}-{max(each):.3f})"


def rss_bytes() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError("no VmRSS in /proc/self/status")


def poller_for(url: str) -> Poller:
    # The defaults of `glassbox exporter` (5 s interval, 60 s window): the history keeps
    # 14 polls however fast this loop runs.
    return Poller(ExporterConfig(target=url, weights_bytes=6955520.0, peak_bandwidth=20e9))


def naive_poll(client: httpx.Client, url: str) -> int:
    text = client.get(url + "/metrics").text
    return sum(len(family.samples) for family in text_string_to_metric_families(text))


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--calls", type=int, default=20, help="polls per batch (default 20)")
    p.add_argument("--rounds", type=int, default=25, help="rounds of batches (default 25)")
    p.add_argument("--soak", type=int, default=0, metavar="N", help="also poll N times for RSS")
    args = p.parse_args(argv)

    one = page(ONE_ENGINE)
    pages = {
        "one": [one.encode()],
        "eight": [grow_engines(one, 8).encode()],
        "cycle": [page(name).encode() for name in SOAK_CYCLE],
    }
    ports: SimpleQueue[int] = multiprocessing.SimpleQueue()
    server = multiprocessing.Process(target=_serve, args=(pages, ports), daemon=True)
    server.start()
    base = f"http://127.0.0.1:{ports.get()}"
    try:
        print(f"python {sys.version.split()[0]}, {multiprocessing.cpu_count()} CPUs")
        print(f"load average before: {' '.join(Path('/proc/loadavg').read_text().split()[:3])}")
        print(
            f"{'page':<6} {'bytes':>8} {'series':>7} {'glassbox':>9} {'naive':>9}"
            f" {'ratio (min-max)':>21} {'deployed':>9} {'ratio (min-max)':>21}"
        )
        client = httpx.Client(trust_env=False)
        for name in ("one", "eight"):
            # The same page for both: a server without the filtered page.
            whole = poller_for(f"{base}/{name}-whole")
            assert whole.poll_once() and whole.filtered_page is False, "not a clean poll"
            url = f"{base}/{name}"
            # As deployed against vLLM: the page of the samples glassbox reads.
            filtered = poller_for(url)
            assert filtered.poll_once() and filtered.filtered_page, "not a clean poll"
            naive_calls = max(args.calls // 5, 2)  # it is slow: fewer calls per batch
            cpu = interleaved(
                {
                    "glassbox": (whole.poll_once, args.calls),
                    "naive": (functools.partial(naive_poll, client, url), naive_calls),
                    "deployed": (filtered.poll_once, args.calls),
                },
                args.rounds,
            )
            size = len(pages[name][0])
            series = naive_poll(client, url)
            median = {way: statistics.median(times) * 1e3 for way, times in cpu.items()}
            print(
                f"{name:<6} {size:>8} {series:>7} {median['glassbox']:>7.2f}ms "
                f"{median['naive']:>7.2f}ms {ratios(cpu['glassbox'], cpu['naive']):>21} "
                f"{median['deployed']:>7.2f}ms {ratios(cpu['deployed'], cpu['naive']):>21}"
            )
            whole.fetcher.close()
            filtered.fetcher.close()
        print(f"load average after: {' '.join(Path('/proc/loadavg').read_text().split()[:3])}")

        # Serving: the exporter's own /metrics after polls of the 8-engine page.
        poller = poller_for(f"{base}/eight-whole")
        for _ in range(3):
            poller.poll_once()
        registry = make_registry(poller)
        text = generate_latest(registry)
        encode = cpu_per_call(lambda: generate_latest(registry), 100)
        lines = text.count(b"\n")
        print(f"serving own /metrics (8 engines, {lines} lines): {encode * 1e3:.2f} ms CPU")
        wall = _wall_per_scrape(poller)
        print(f"  scraped over loopback HTTP: median {wall * 1e3:.2f} ms wall")
        poller.fetcher.close()

        if args.soak:
            soak(f"{base}/cycle", args.soak)
    finally:
        server.terminate()
    return 0


def _wall_per_scrape(poller: Poller, scrapes: int = 200) -> float:
    import threading

    from vllm_glassbox.exporter.service import make_server

    server = make_server(poller, "127.0.0.1", 0)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}/metrics"
    times = []
    with httpx.Client(trust_env=False) as client:
        for _ in range(scrapes):
            started = time.perf_counter()
            client.get(url).raise_for_status()
            times.append(time.perf_counter() - started)
    server.shutdown()
    server.server_close()
    return statistics.median(times)


def soak(url: str, polls: int) -> None:
    poller = poller_for(url)
    for _ in range(100):  # fill the history and every lazily built structure first
        poller.poll_once()
    before = rss_bytes()
    started = time.monotonic()
    cpu = time.process_time()
    failures = 0
    for i in range(polls):
        failures += not poller.poll_once()
        if (i + 1) % (polls // 10 or 1) == 0:
            print(f"  soak {i + 1:>7} polls  RSS {rss_bytes() / 2**20:7.1f} MiB", flush=True)
    after = rss_bytes()
    print(
        f"soak: {polls} polls in {time.monotonic() - started:.0f} s "
        f"({(time.process_time() - cpu) / polls * 1e3:.2f} ms CPU each), {failures} failed; "
        f"RSS {before / 2**20:.1f} -> {after / 2**20:.1f} MiB "
        f"({(after - before) / 2**20:+.1f} MiB), restarts seen {poller.history.restarts}"
    )
    poller.fetcher.close()


if __name__ == "__main__":
    sys.exit(main())
