"""What `glassbox exporter` costs before it polls, and while it polls, in one run.

    .venv/bin/python benchmarks/bench_start.py              # ~1 minute
    .venv/bin/python benchmarks/bench_start.py --polls 500

Three measurements, each in fresh processes of this Python, so that nothing this script
imported counts:

  import     `import vllm_glassbox.exporter.cli, vllm_glassbox.exporter.service` (what
             `glassbox exporter` loads before it starts), timed inside the process:
             seconds, how many of glassbox's modules and source lines it loaded (and how
             many of them explain's and the SLO file's), every module, the peak RSS.
             Beside it, in the same rounds, the import of the libraries the exporter
             stands on alone (prometheus_client, httpx, yaml): glassbox's share is the
             ratio of the two.
  start-up   `python -m vllm_glassbox exporter` against a page server in this process
             (a real vLLM 0.32 CPU page, tests/fixtures/metrics/cpu-0.32/, the
             speculative server's pages in a cycle, served restricted to the samples
             glassbox asks for, as vLLM does): its RSS once its first poll is published.
  polls      then N polls (--interval 100ms, a window of 16 polls as the defaults keep:
             5 s and 60 s), first with nobody scraping, then with a scrape of /metrics
             after every poll (each scrape builds glassbox_finding_info from that poll):
             the exporter's CPU per poll in each phase (/proc/PID/stat), its RSS after
             each and its peak.

Then, in this process against the same pages, what a scrape's findings cost beside a
poll: one poll, the findings over it, the rest of the scrape, one answer of /findings.

The import and start-up numbers vary with the machine's load: the medians of several
rounds are printed with their lowest and highest. Results go to docs/results/ by hand;
this script is not a test. Run it against another tree's code by putting that tree's
installed copy first on PYTHONPATH (pip install --no-deps --target DIR TREE), as
scripts/same-behaviour.sh does.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs

import httpx

REPO = Path(__file__).resolve().parent.parent
PAGES = REPO / "tests" / "fixtures" / "metrics" / "cpu-0.32"
CYCLE = ["spec-idle.txt", "spec-after-1x256.txt", "spec-after-2x256.txt"]
VERSION = b'{"version": "0.32.0"}'

IMPORT_EXPORTER = """
import sys, time, resource
started = time.perf_counter()
import vllm_glassbox.exporter.cli, vllm_glassbox.exporter.service
seconds = time.perf_counter() - started
ours = {n: m for n, m in sys.modules.items() if n.startswith("vllm_glassbox")}
lines = {n: sum(1 for _ in open(m.__file__, "rb")) for n, m in ours.items() if m.__file__}
lazy = [n for n in lines if n.startswith(("vllm_glassbox.explain", "vllm_glassbox.core.slo"))]
print(json.dumps({
    "seconds": seconds, "modules": len(ours), "lines": sum(lines.values()),
    "explain_slo_modules": len(lazy), "explain_slo_lines": sum(lines[n] for n in lazy),
    "all_modules": len(sys.modules),
    "max_rss": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
}))
"""
IMPORT_LIBRARIES = """
import sys, time, resource
started = time.perf_counter()
import prometheus_client, prometheus_client.core, prometheus_client.process_collector
import httpx, yaml
seconds = time.perf_counter() - started
print(json.dumps({
    "seconds": seconds, "all_modules": len(sys.modules),
    "max_rss": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
}))
"""


def fresh(code: str) -> dict[str, float]:
    """`code` run in a new interpreter (with this environment: PYTHONPATH included); the
    JSON object it printed."""
    out = subprocess.run(
        [sys.executable, "-c", "import json\n" + code],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    result: dict[str, float] = json.loads(out)
    return result


def spread(values: Sequence[float], scale: float = 1.0, form: str = ".3f") -> str:
    """The median, with the lowest and highest."""
    median, low, high = (v * scale for v in (statistics.median(values), min(values), max(values)))
    return f"{median:{form}} ({low:{form}}-{high:{form}})"


def restricted(page: bytes, names: set[str]) -> bytes:
    """The samples of `names` with their families' HELP and TYPE lines (vLLM's answer to
    /metrics/?name[]=…, as prometheus_client renders it)."""
    lines = page.decode().splitlines(keepends=True)
    bases = {n.removesuffix(s) for n in names for s in ("", "_total", "_count", "_sum")}
    kept = [
        ln
        for ln in lines
        if (ln.startswith("#") and ln.split(" ")[2] in bases)
        or (not ln.startswith("#") and ln.split("{")[0].split(" ")[0] in names)
    ]
    return "".join(kept).encode()


class PageServer:
    """vLLM's page on loopback: the cycle's pages in turn, one per poll, counted."""

    def __init__(self, pages: Sequence[bytes]) -> None:
        self.polls = 0
        served = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_GET(self) -> None:
                path, _, query = self.path.partition("?")
                if path == "/version":
                    body = VERSION
                else:
                    body = pages[served.polls % len(pages)]
                    if query:
                        body = restricted(body, set(parse_qs(query).get("name[]", [])))
                    served.polls += 1
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"

    def wait_for_polls(self, count: int, timeout: float = 120.0) -> None:
        deadline = time.monotonic() + timeout
        while self.polls < count:
            if time.monotonic() > deadline:
                raise TimeoutError(f"the exporter polled {self.polls} times, not {count}")
            time.sleep(0.01)


def proc_status(pid: int, field: str) -> int:
    """A /proc/PID/status field in bytes (VmRSS, VmHWM)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"no {field} in /proc/{pid}/status")


def cpu_seconds(pid: int) -> float:
    """User and system CPU of the process, all threads."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def run_exporter(polls: int) -> dict[str, float]:
    """One `glassbox exporter` against the page server: RSS at start-up, CPU per poll
    unscraped and scraped, RSS after each phase and its peak."""
    pages = PageServer([(PAGES / name).read_bytes() for name in CYCLE])
    port = free_port()
    exporter = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "vllm_glassbox",
            "exporter",
            f"--target={pages.url}",
            f"--listen=127.0.0.1:{port}",
            "--interval=100ms",
            "--window=1400ms",  # 14 polls a window, as 60 s of 5 s polls
            "--weights-bytes=6955520",
            "--gpu-memory-bandwidth=20e9",
            "--log-level=warning",
        ],
        stdin=subprocess.DEVNULL,
    )
    own = f"http://127.0.0.1:{port}"
    try:
        with httpx.Client(trust_env=False, timeout=10.0) as client:
            deadline = time.monotonic() + 60.0
            while True:
                try:
                    if "glassbox_target_up 1.0" in client.get(own + "/metrics").text:
                        break
                except httpx.TransportError:
                    pass
                if time.monotonic() > deadline:
                    raise TimeoutError("the exporter did not start")
                time.sleep(0.05)
            out = {"rss_started": float(proc_status(exporter.pid, "VmRSS"))}
            start, cpu = pages.polls, cpu_seconds(exporter.pid)
            pages.wait_for_polls(start + polls)
            out["cpu_per_poll"] = (cpu_seconds(exporter.pid) - cpu) / (pages.polls - start)
            out["rss_polled"] = float(proc_status(exporter.pid, "VmRSS"))
            start, cpu = pages.polls, cpu_seconds(exporter.pid)
            while pages.polls < start + polls:
                seen = pages.polls
                client.get(own + "/metrics").raise_for_status()
                pages.wait_for_polls(seen + 1)
            out["cpu_per_scraped_poll"] = (cpu_seconds(exporter.pid) - cpu) / (pages.polls - start)
            out["rss_scraped"] = float(proc_status(exporter.pid, "VmRSS"))
            out["rss_peak"] = float(proc_status(exporter.pid, "VmHWM"))
        return out
    finally:
        exporter.terminate()
        exporter.wait(timeout=30)
        pages.server.shutdown()


def cpu_per_call(fn: Callable[[], object], calls: int, rounds: int = 5) -> float:
    """Process CPU seconds per call: the best of a few rounds."""
    best = math.inf
    for _ in range(rounds):
        started = time.process_time()
        for _ in range(calls):
            fn()
        best = min(best, (time.process_time() - started) / calls)
    return best


def findings_share(calls: int) -> dict[str, float]:
    """In this process, against the page server: the CPU of one poll (`Poller.poll_once`,
    fetch included), of the findings one scrape builds over it (`finding_families`), of
    the rest of a scrape (encoding the publication: `generate_latest` with the findings
    already built) and of one answer of /findings."""
    from prometheus_client import generate_latest
    from vllm_glassbox.exporter import exposition, service

    pages = PageServer([(PAGES / name).read_bytes() for name in CYCLE])
    config = service.ExporterConfig(
        target=pages.url,
        interval_seconds=0.1,
        window_seconds=1.4,
        weights_bytes=6955520.0,
        peak_bandwidth=20e9,
    )
    poller = service.Poller(config)
    for _ in range(20):  # a full window first
        poller.poll_once()
    registry = service.make_registry(poller)
    generate_latest(registry)  # the findings of this poll, built once and kept
    assert poller.state is not None
    state = poller.state
    out = {
        "poll": cpu_per_call(poller.poll_once, calls),
        "findings": cpu_per_call(lambda: exposition.finding_families(state), calls),
    }
    generate_latest(registry)
    out["scrape_encoding"] = cpu_per_call(lambda: generate_latest(registry), calls)
    out["findings_page"] = cpu_per_call(lambda: service.findings_answer(poller.state), calls)
    poller.fetcher.close()
    pages.server.shutdown()
    return out


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=9, help="fresh imports of each (default 9)")
    p.add_argument("--polls", type=int, default=200, help="polls in each phase (default 200)")
    p.add_argument("--runs", type=int, default=3, help="exporters started (default 3)")
    p.add_argument("--calls", type=int, default=100, help="calls per round in one process")
    args = p.parse_args(argv)

    import vllm_glassbox

    print(f"python {sys.version.split()[0]}, {os.cpu_count()} CPUs, glassbox from", end=" ")
    print(Path(vllm_glassbox.__file__).parent)
    print(f"load average before: {' '.join(Path('/proc/loadavg').read_text().split()[:3])}")
    ours, libraries = [], []
    for _ in range(args.rounds):  # interleaved: the machine's load lands on both alike
        ours.append(fresh(IMPORT_EXPORTER))
        libraries.append(fresh(IMPORT_LIBRARIES))
    first = ours[0]
    print(
        f"import of the exporter: {spread([r['seconds'] for r in ours])} s, "
        f"{first['modules']:.0f} glassbox modules, {first['lines']:,.0f} source lines "
        f"(explain and SLO: {first['explain_slo_modules']:.0f} modules, "
        f"{first['explain_slo_lines']:,.0f} lines), {first['all_modules']:.0f} modules in all; "
        f"peak RSS {spread([r['max_rss'] for r in ours], 2**-20, '.1f')} MiB"
    )
    print(
        f"import of its libraries alone: {spread([r['seconds'] for r in libraries])} s, "
        f"{libraries[0]['all_modules']:.0f} modules; peak RSS "
        f"{spread([r['max_rss'] for r in libraries], 2**-20, '.1f')} MiB"
    )
    share = [a["seconds"] / b["seconds"] for a, b in zip(ours, libraries, strict=True)]
    print(f"  exporter / libraries: {spread(share, form='.2f')}")

    runs = [run_exporter(args.polls) for _ in range(args.runs)]
    mib = 2**-20
    print(f"glassbox exporter, {args.runs} runs of {args.polls} polls in each phase:")
    print(f"  RSS after start-up   {spread([r['rss_started'] for r in runs], mib, '.1f')} MiB")
    print(
        f"  CPU per poll, unscraped      "
        f"{spread([r['cpu_per_poll'] for r in runs], 1e3, '.2f')} ms; "
        f"RSS after {spread([r['rss_polled'] for r in runs], mib, '.1f')} MiB"
    )
    print(
        f"  CPU per poll, each scraped   "
        f"{spread([r['cpu_per_scraped_poll'] for r in runs], 1e3, '.2f')} ms; "
        f"RSS after {spread([r['rss_scraped'] for r in runs], mib, '.1f')} MiB, "
        f"peak {spread([r['rss_peak'] for r in runs], mib, '.1f')} MiB"
    )
    share = findings_share(args.calls)
    print(
        f"in one process: a poll {share['poll'] * 1e3:.2f} ms CPU; the findings a scrape "
        f"builds over it {share['findings'] * 1e3:.3f} ms "
        f"({share['findings'] / share['poll']:.1%} of the poll); the rest of the scrape "
        f"{share['scrape_encoding'] * 1e3:.2f} ms; /findings {share['findings_page'] * 1e3:.2f} ms"
    )
    print(f"load average after: {' '.join(Path('/proc/loadavg').read_text().split()[:3])}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
