"""The exporter beside a saturated vLLM: how many polls succeed, and how late they answer.

When a vLLM server is saturated its API server is the bottleneck: one event loop sends
every request's tokens and renders /metrics, so the page answers late exactly when an
operator needs it. This starts the real vLLM CPU build (a tiny generated model), pins its
API server (every thread) to one core that a busy loop shares, floods it with long
requests, and polls it with the exporter's own `Poller` every second under several
deadlines (`--timeout`), one poller per deadline, side by side so that each sees the same
saturation and adds the same load. It prints, per deadline: polls tried, read, failed by
reason, answered later than the interval; the answer time's median, 95th percentile and
maximum; the longest time without a page.

    .venv/bin/python benchmarks/bench_saturation.py                  # ~3 minutes
    .venv/bin/python benchmarks/bench_saturation.py --timeouts 1.5 3 10 --seconds 90

A script that prints numbers, not a test. vLLM on 127.0.0.1 (a free port).
"""

from __future__ import annotations

import argparse
import concurrent.futures
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx
from vllm_glassbox.core.ticker import ticks
from vllm_glassbox.exporter.service import ExporterConfig, Poller
from vllm_glassbox.lab.backends.server_process import ServerProcess
from vllm_glassbox.lab.backends.tinymodel import TinyModelSpec, generate

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_vllm_cost import api_server_pid  # the same process tree walk


@dataclass
class Record:
    timeout: float
    answers: list[float] = field(default_factory=list)  # seconds, of the polls read
    read_at: list[float] = field(default_factory=list)  # monotonic, when each was read
    tried: int = 0


def poll_loop(poller: Poller, record: Record, stop: threading.Event) -> None:
    for _ in ticks(1.0, stop, after_overrun="a period later"):
        started = time.monotonic()
        ok = poller.poll_once()
        record.tried += 1
        if ok:
            record.answers.append(time.monotonic() - started)
            record.read_at.append(time.monotonic())


def flood(url: str, requests: int, max_tokens: int, stop: threading.Event) -> None:
    """Long requests, resent as each ends, until `stop`."""
    body = {
        "model": "tiny",
        "prompt": "Write an extremely long and detailed essay.",
        "max_tokens": max_tokens,
        "temperature": 0.7,
        "ignore_eos": True,
        "stream": True,  # a server-sent event per token: the API server's work per step
    }
    with httpx.Client(timeout=600, limits=httpx.Limits(max_connections=requests)) as client:

        def one(_: int) -> None:
            while not stop.is_set():
                try:
                    with client.stream("POST", url + "/v1/completions", json=body) as answer:
                        for _ in answer.iter_lines():
                            pass
                except httpx.HTTPError:
                    time.sleep(0.5)

        with concurrent.futures.ThreadPoolExecutor(requests) as pool:
            list(pool.map(one, range(requests)))


def summary(record: Record, poller: Poller, started: float, ended: float) -> str:
    answers = sorted(record.answers)
    read = len(answers)
    late = sum(1 for a in answers if a > 1.0)
    gaps = [
        b - a for a, b in zip([started, *record.read_at], [*record.read_at, ended], strict=True)
    ]
    failed = {reason: n for reason, n in poller.errors.items() if n and reason != "slow"}
    p95 = answers[min(read - 1, int(0.95 * read))] if read else float("nan")
    return (
        f"| {record.timeout:g} s | {record.tried} | {read} ({read / max(record.tried, 1):.0%}) "
        f"| {failed or '–'} | {late} | {statistics.median(answers) if read else float('nan'):.2f} "
        f"| {p95:.2f} | {max(answers, default=float('nan')):.2f} | {max(gaps):.1f} |"
    )


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--timeouts", type=float, nargs="+", default=[1.5, 3.0, 10.0])
    p.add_argument("--seconds", type=float, default=60.0, help="of flood, polled")
    p.add_argument("--requests", type=int, default=96)
    p.add_argument("--max-tokens", type=int, default=256)
    p.add_argument("--nice", type=int, default=19, help="the API server's niceness")
    args = p.parse_args(argv)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))  # vLLM stopped on the way out
    work = Path(tempfile.mkdtemp(prefix="glassbox-saturation-"))
    model = generate(TinyModelSpec("tiny-stack"), work / "models")
    vllm = ServerProcess(
        [
            *("--model", str(model), "--served-model-name", "tiny"),
            *("--max-model-len", "1024", "--kv-cache-memory-bytes", str(64 << 20)),
            "--enforce-eager",
        ],
        log_path=work / "vllm.log",
    )
    spinner = None
    try:
        vllm.start()
        vllm.wait_ready()
        assert vllm.pid is not None
        api = api_server_pid(vllm.pid)
        # The API server (all its threads) on core 0, beside a busy loop on the same core.
        pin = ["taskset", "-a", "-p", "-c", "0", str(api)]
        subprocess.run(pin, check=True, capture_output=True)
        # Its threads at the lowest priority (`--nice`): on a GPU the engine outruns the
        # API server; here the engine is the bottleneck, so the API server is starved.
        for task in Path(f"/proc/{api}/task").iterdir():
            subprocess.run(["renice", "-n", str(args.nice), "-p", task.name], capture_output=True)
        spinner = subprocess.Popen(["taskset", "-c", "0", sys.executable, "-c", "while True: pass"])
        stop = threading.Event()
        traffic = threading.Thread(
            target=flood, args=(vllm.url, args.requests, args.max_tokens, stop), daemon=True
        )
        traffic.start()
        time.sleep(10)  # the flood admitted, the pool filling
        pollers = {
            t: Poller(
                ExporterConfig(
                    target=vllm.url, interval_seconds=1.0, window_seconds=60.0, timeout_seconds=t
                )
            )
            for t in args.timeouts
        }
        records = {t: Record(t) for t in args.timeouts}
        threads = [
            threading.Thread(target=poll_loop, args=(pollers[t], records[t], stop), daemon=True)
            for t in args.timeouts
        ]
        started = time.monotonic()
        for thread in threads:
            thread.start()
        time.sleep(args.seconds)
        stop.set()
        ended = time.monotonic()
        for thread in threads:
            thread.join(timeout=max(args.timeouts) + 5)
        load = Path("/proc/loadavg").read_text().split()[0]
        print(
            f"\n{args.requests} streamed requests of {args.max_tokens} tokens resent for "
            f"{args.seconds:g} s; vLLM's API server (pid {api}) pinned to core 0 beside a busy "
            f"loop at nice {args.nice}; polls every 1 s; load average {load} at the end\n"
        )
        print(
            "| --timeout | polls | read | failed | later than 1 s | answer median s | p95 s "
            "| max s | longest without a page s |"
        )
        print("| ---: | ---: | ---: | --- | ---: | ---: | ---: | ---: | ---: |")
        for t in args.timeouts:
            print(summary(records[t], pollers[t], started, ended))
        for poller in pollers.values():
            poller.fetcher.close()
        traffic.join(timeout=1)
    finally:
        if spinner is not None:
            spinner.kill()
            spinner.wait()
        vllm.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
