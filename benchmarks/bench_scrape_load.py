"""Many scrapers on the real exporter while it polls an 8-engine page; a 64-engine poll.

    flock /work/heavy.lock .venv/bin/python benchmarks/bench_scrape_load.py
        [--scrapers 50] [--seconds 60]

1. `glassbox exporter` (the real command, its own process) polls, every second, a cycle
   of real vLLM 0.32 pages grown to 8 data-parallel engines (counters grow and reset),
   served by a child process over loopback.
2. N scrapers (asyncio, raw HTTP/1.1 with keep-alive, in this process) scrape its
   /metrics for S seconds, twice: back to back (each sends its next scrape as soon as
   the last one is answered: the most the server can be asked), then paced (each every
   second, as Prometheus servers would). Latency is from sending the request to the
   last byte of the body; an error is anything but a complete 200.
3. The exporter's resident memory (VmRSS, and its peak VmHWM) before and after, and its
   own poll health during the load (glassbox_scrape_errors_total, poll duration).
4. A 64-engine page: CPU per poll (fetch, parse, derive) and the poll's peak of traced
   Python allocations, in this process, as benchmarks/bench_poll.py measures.

Numbers go to benchmarks/README.md by hand; this script is not a test.
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import re
import subprocess
import sys
import threading
import time
import tracemalloc
from multiprocessing.queues import SimpleQueue
from pathlib import Path

import httpx

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

from bench_poll import SOAK_CYCLE, _serve, cpu_per_call, poller_for, rss_bytes  # noqa: E402

from tests.fixtures import grow_engines, page  # noqa: E402

REQUEST = b"GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"


def memory_kib(pid: int) -> dict[str, int]:
    status = Path(f"/proc/{pid}/status").read_text()
    return {k: int(v) for k, v in re.findall(r"^(VmRSS|VmHWM):\s+(\d+) kB", status, flags=re.M)}


def start_exporter(target: str) -> tuple[subprocess.Popen[str], str]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "vllm_glassbox", "exporter", "--listen", "127.0.0.1:0",
         "--target", target, "--interval", "1s"],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert proc.stderr is not None
    for line in proc.stderr:
        if m := re.search(r"serving on (http://\S+)/metrics", line):
            threading.Thread(target=proc.stderr.read, daemon=True).start()
            return proc, m.group(1)
    raise RuntimeError("the exporter did not start")


async def scraper(
    port: int, until: float, pace: float | None, latencies: list[float], errors: list[str]
) -> None:
    loop = asyncio.get_running_loop()
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    next_at = loop.time()
    while loop.time() < until:
        started = time.perf_counter()
        try:
            writer.write(REQUEST)
            head = await reader.readuntil(b"\r\n\r\n")
            length = int(re.search(rb"Content-Length: (\d+)", head).group(1))  # type: ignore[union-attr]
            await reader.readexactly(length)
            if not head.startswith(b"HTTP/1.1 200"):
                errors.append(head.split(b"\r\n", 1)[0].decode())
            latencies.append(time.perf_counter() - started)
        except (OSError, asyncio.IncompleteReadError, AttributeError) as e:
            errors.append(type(e).__name__)
            writer.close()
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
        if pace is not None:
            next_at += pace
            await asyncio.sleep(max(0.0, next_at - loop.time()))
    writer.close()


async def load(
    port: int, scrapers: int, seconds: float, pace: float | None
) -> tuple[list[float], list[str]]:
    latencies: list[float] = []
    errors: list[str] = []
    until = asyncio.get_running_loop().time() + seconds
    tasks = []
    for _ in range(scrapers):
        tasks.append(asyncio.create_task(scraper(port, until, pace, latencies, errors)))
        if pace is not None:  # staggered, as independent Prometheus servers would be
            await asyncio.sleep(pace / scrapers)
    await asyncio.gather(*tasks)
    return latencies, errors


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def poll_health(url: str) -> tuple[float, str]:
    text = httpx.get(url + "/metrics", timeout=30).text
    errors = sum(
        float(v)
        for v in re.findall(r"^glassbox_scrape_errors_total\{.*\} (\S+)$", text, flags=re.M)
    )
    duration = re.search(r"^glassbox_scrape_duration_seconds (\S+)$", text, flags=re.M)
    return errors, duration.group(1) if duration else "?"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--scrapers", type=int, default=50)
    p.add_argument("--seconds", type=float, default=60.0)
    args = p.parse_args()

    eight = [grow_engines(page(name), 8).encode() for name in SOAK_CYCLE]
    sixty_four = grow_engines(page("cpu-0.32/spec-after-2x256.txt"), 64)
    ports: SimpleQueue[int] = multiprocessing.SimpleQueue()
    server = multiprocessing.Process(
        target=_serve,
        args=({"eight": eight, "sixtyfour": [sixty_four.encode()]}, ports),
        daemon=True,
    )
    server.start()
    base = f"http://127.0.0.1:{ports.get()}"
    exporter, url = start_exporter(f"{base}/eight")
    port = int(url.rsplit(":", 1)[1])
    try:
        print(f"python {sys.version.split()[0]}, {multiprocessing.cpu_count()} CPUs")
        while "glassbox_target_up 1.0" not in httpx.get(url + "/metrics", timeout=30).text:
            time.sleep(0.2)
        time.sleep(3)  # a few polls: the window fills, every family is built
        body = httpx.get(url + "/metrics", timeout=30).content
        lines = body.count(b"\n")
        print(f"exporter page: {len(body)} bytes, {lines} lines (8 engines, polled every 1 s)")
        before = memory_kib(exporter.pid)
        errors_before, _ = poll_health(url)
        for mode, pace in (("back to back", None), ("paced 1/s each", 1.0)):
            latencies, errors = asyncio.run(load(port, args.scrapers, args.seconds, pace))
            after = memory_kib(exporter.pid)
            p50, p99 = (percentile(latencies, q) * 1e3 for q in (0.5, 0.99))
            print(
                f"{args.scrapers} scrapers {mode}, {args.seconds:g} s: {len(latencies)} "
                f"scrapes ({len(latencies) / args.seconds:.0f}/s), errors {len(errors)}; "
                f"latency p50 {p50:.1f} ms, p99 {p99:.1f} ms, max {max(latencies) * 1e3:.1f} ms; "
                f"RSS {after['VmRSS'] / 1024:.1f} MiB (peak {after['VmHWM'] / 1024:.1f})"
            )
            if errors:
                print(f"  errors: {sorted(set(errors))}")
        errors_after, duration = poll_health(url)
        print(
            f"exporter RSS before {before['VmRSS'] / 1024:.1f} MiB; its polls during the load: "
            f"{errors_after - errors_before:g} failed, the last took {float(duration) * 1e3:.1f} ms"
        )

        poller = poller_for(f"{base}/sixtyfour")
        assert poller.poll_once(), "the 64-engine page did not poll cleanly"
        cpu = cpu_per_call(poller.poll_once, 20, batches=3)
        tracemalloc.start()
        poller.poll_once()
        _, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
        rss_before = rss_bytes()
        for _ in range(50):  # the history (14 polls) full several times over
            poller.poll_once()
        series = sum(1 for line in sixty_four.splitlines() if line and not line.startswith("#"))
        print(
            f"64-engine page: {len(sixty_four)} bytes, {series} series: {cpu * 1e3:.1f} ms CPU "
            f"per poll; peak of traced allocations during a poll {peak / 2**20:.1f} MiB; "
            f"RSS of the polling process {rss_before / 2**20:.1f} -> {rss_bytes() / 2**20:.1f} "
            "MiB over 50 more polls"
        )
        poller.fetcher.close()
    finally:
        exporter.terminate()
        exporter.wait(timeout=30)
        server.terminate()
    return 0


if __name__ == "__main__":
    sys.exit(main())
