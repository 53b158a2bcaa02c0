"""What glassbox costs the vLLM it watches: the API server's CPU time per poll of /metrics.

Every poll makes vLLM's API server render its page. This benchmark starts the real vLLM
CPU build (a tiny generated model), finds the API server process in the process tree, and
reads its CPU time (utime + stime in /proc/<pid>/stat, all its threads) over blocks of
equal length: idle blocks, and blocks in which the API server is polled at a fixed rate
in one of several ways. The cost of one poll is the block's CPU time less the idle rate
over the same time, divided by the polls. Blocks run in rounds, each round in a rotated
order, so that a machine getting busier does not land on one way of polling; the result
is the median over the rounds with the lowest and highest beside it.

The ways of polling (`MODES`):

- `exporter`: the exporter's own fetch (`core/fetch.py` as configured by the exporter):
  GET /metrics on a fresh connection per poll, uncompressed;
- `keep-alive`: the same GET on one connection kept open;
- `gzip`: GET /metrics asking for gzip (as Prometheus does);
- `filtered`: GET /metrics/?name[]=… with the sample names glassbox reads, on the path
  where vLLM mounts prometheus_client's own ASGI app (which honours `name[]`).

Each server is measured alone, then beside a real Prometheus scraping it every second
(Debian's, `lab/backends/prometheus_process.py`): the idle blocks then contain Prometheus' scrapes,
whose own cost is the difference of the two idle rates. Pages: one engine, and two
data-parallel engines (`--data-parallel-size 2`, one API server).

    .venv/bin/python benchmarks/bench_vllm_cost.py                 # ~15 minutes
    .venv/bin/python benchmarks/bench_vllm_cost.py --only one --rounds 3 --seconds 10

Ports: vLLM and Prometheus on 127.0.0.1:18540-18549 (`--port-base`).
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote

import httpx
from vllm_glassbox.core.fetch import Fetcher
from vllm_glassbox.core.snapshot import WANTED_SAMPLES
from vllm_glassbox.lab.backends.prometheus_process import PrometheusProcess, scrape_config
from vllm_glassbox.lab.backends.server_process import ServerProcess
from vllm_glassbox.lab.backends.tinymodel import TinyModelSpec, generate

TICK = os.sysconf("SC_CLK_TCK")
MODES = ("exporter", "keep-alive", "gzip", "filtered")
SERVERS: dict[str, tuple[list[str], dict[str, str]]] = {
    "one": ([], {}),
    # Two engines on this machine's one NUMA node: each engine's worker gets one core.
    "dp2": (["--data-parallel-size", "2"], {"VLLM_CPU_OMP_THREADS_BIND": "0|1"}),
}
FILTERED_PATH = "/metrics/?" + "&".join(f"name[]={quote(n)}" for n in sorted(WANTED_SAMPLES))


# --- the API server process and its CPU time ---------------------------------------------


def _stat(pid: int) -> list[str]:
    text = Path(f"/proc/{pid}/stat").read_text()
    # The command name is in parentheses and may hold spaces: split after it.
    return text[text.rindex(")") + 2 :].split()


def cpu_seconds(pid: int) -> float:
    """utime + stime of the process, all its threads (fields 14 and 15 of stat)."""
    fields = _stat(pid)
    return (int(fields[11]) + int(fields[12])) / TICK


def children(pid: int) -> list[int]:
    out = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                if int(_stat(int(entry))[1]) == pid:
                    out.append(int(entry))
            except (OSError, ValueError, IndexError):
                continue
    return out


def cmdline(pid: int) -> str:
    return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()


def api_server_pid(root: int) -> int:
    """The API server: the topmost process of the tree under `root` that runs vLLM's
    OpenAI server (the engine cores and workers are its children)."""
    queue = [root]
    while queue:
        pid = queue.pop(0)
        if "vllm.entrypoints.openai.api_server" in cmdline(pid):
            return pid
        queue += children(pid)
    raise RuntimeError(f"no vLLM API server under pid {root}")


# --- polling --------------------------------------------------------------------------------


def pollers(url: str) -> dict[str, Callable[[], int]]:
    """Each mode: one poll, returning the bytes received (as sent on the wire)."""
    fetcher = Fetcher(url, timeout_seconds=10.0)
    kept = httpx.Client(timeout=10.0)

    def exporter() -> int:
        return len(fetcher.get_text("/metrics"))

    def raw(client: httpx.Client, path: str, headers: dict[str, str]) -> int:
        with client.stream("GET", url + path, headers=headers) as r:
            r.raise_for_status()
            return sum(len(c) for c in r.iter_raw())

    def keep_alive() -> int:
        return raw(kept, "/metrics", {"Accept-Encoding": "identity"})

    def gzipped() -> int:
        with httpx.Client(timeout=10.0) as client:
            return raw(client, "/metrics", {"Accept-Encoding": "gzip"})

    def filtered() -> int:
        with httpx.Client(timeout=10.0) as client:
            return raw(client, FILTERED_PATH, {"Accept-Encoding": "identity"})

    return {"exporter": exporter, "keep-alive": keep_alive, "gzip": gzipped, "filtered": filtered}


@dataclass
class Block:
    mode: str  # "idle" or one of MODES
    seconds: float
    cpu: float
    polls: int = 0
    page_bytes: int = 0


def run_block(
    pid: int, mode: str, seconds: float, rate: float, poll: Callable[[], int] | None
) -> Block:
    """CPU time of `pid` over `seconds`, polling at `rate` per second when `poll` is given."""
    polls, size = 0, 0
    start_cpu, start = cpu_seconds(pid), time.monotonic()
    while (now := time.monotonic()) - start < seconds:
        if poll is not None and polls < (now - start) * rate:
            size = poll()
            polls += 1
        else:
            time.sleep(min(0.005, 1 / rate))
    elapsed = time.monotonic() - start
    return Block(mode, elapsed, cpu_seconds(pid) - start_cpu, polls, size)


def per_poll_ms(block: Block, idle_rate: float) -> float:
    return (block.cpu - idle_rate * block.seconds) / block.polls * 1000


@dataclass
class Result:
    idle_rates: list[float]  # CPU seconds per second, one per round
    per_poll: dict[str, list[float]]  # mode -> ms per poll, one per round
    page_bytes: dict[str, int]


def measure(pid: int, url: str, rounds: int, seconds: float, rate: float) -> Result:
    ways = pollers(url)
    for poll in ways.values():  # warm: connections, the filtered path's first render
        poll()
    result = Result([], {m: [] for m in MODES}, {})
    for r in range(rounds):
        modes = MODES[r % len(MODES) :] + MODES[: r % len(MODES)]
        idle = [run_block(pid, "idle", seconds, rate, None)]
        blocks = []
        for mode in modes:
            blocks.append(run_block(pid, mode, seconds, rate, ways[mode]))
            idle.append(run_block(pid, "idle", seconds / 2, rate, None))
        idle_rate = sum(b.cpu for b in idle) / sum(b.seconds for b in idle)
        result.idle_rates.append(idle_rate)
        for b in blocks:
            result.per_poll[b.mode].append(per_poll_ms(b, idle_rate))
            result.page_bytes[b.mode] = b.page_bytes
        line = ", ".join(f"{b.mode} {per_poll_ms(b, idle_rate):.2f} ms" for b in blocks)
        print(f"    round {r + 1}: idle {idle_rate * 1000:.1f} ms/s; {line}", flush=True)
    return result


# --- the servers -----------------------------------------------------------------------------


@contextmanager
def vllm(name: str, workdir: Path, port: int) -> Iterator[ServerProcess]:
    model = generate(TinyModelSpec("tiny-cost"), workdir / "models")
    extra, env = SERVERS[name]
    args = ["--model", str(model), "--served-model-name", "tiny", "--max-model-len", "2048",
            "--kv-cache-memory-bytes", "33554432", "--enforce-eager", *extra]  # fmt: skip
    server = ServerProcess(args, workdir / f"vllm-{name}.log", port=port, env=env)
    server.start()
    try:
        server.wait_ready(900)
        # Two requests, so that every histogram has observations: the page as it is
        # once vLLM has served (about 50 KB for one engine).
        for _ in range(2):
            httpx.post(
                server.url + "/v1/completions",
                json={"model": "tiny", "prompt": "Kubernetes is", "max_tokens": 64,
                      "temperature": 0, "ignore_eos": True},
                timeout=300,
            ).raise_for_status()  # fmt: skip
        yield server
    finally:
        server.stop()


@contextmanager
def prometheus_beside(url: str, workdir: Path, port: int) -> Iterator[None]:
    config = scrape_config({"vllm": url.removeprefix("http://")}, "1s", "900ms")
    server = PrometheusProcess(workdir, config, tsdb=workdir / "data", port=port)
    server.start(ready_timeout_seconds=60)
    try:
        time.sleep(3)  # its first scrapes
        yield
    finally:
        server.stop()


def spread(values: list[float]) -> str:
    return f"{statistics.median(values):.2f} ({min(values):.2f}–{max(values):.2f})"


def report(name: str, where: str, result: Result, alone: Result | None = None) -> None:
    print(f"  {name}, {where}: idle {spread([r * 1000 for r in result.idle_rates])} ms of CPU/s")
    for mode in MODES:
        ms = statistics.median(result.per_poll[mode])
        print(
            f"    {mode:10s} {spread(result.per_poll[mode])} ms/poll, "
            f"{result.page_bytes[mode]:,} B; a core: {ms / 1000 * 100:.3f} % at 1 s, "
            f"{ms / 5000 * 100:.3f} % at 5 s"
        )
    if alone is not None:  # the idle rate beside Prometheus less the idle rate alone
        base = statistics.median(alone.idle_rates)
        scrape_ms = [(r - base) * 1000 for r in result.idle_rates]
        print(f"    Prometheus' own scrape (every 1 s): {spread(scrape_ms)} ms of CPU each")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", choices=list(SERVERS))
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=10.0, help="length of a polling block")
    parser.add_argument("--rate", type=float, default=20.0, help="polls per second in a block")
    parser.add_argument("--port-base", type=int, default=18540)
    args = parser.parse_args(argv)
    if shutil.which("prometheus") is None:
        print("needs Debian's prometheus (scripts/setup.sh)", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory(prefix="glassbox-cost-") as tmp:
        workdir = Path(tmp)
        for i, name in enumerate([args.only] if args.only else list(SERVERS)):
            with vllm(name, workdir, args.port_base + 2 * i) as server:
                assert server.pid is not None
                pid = api_server_pid(server.pid)
                print(f"{name}: vLLM API server pid {pid} ({cmdline(pid)[:60]}…)", flush=True)
                print("  alone:", flush=True)
                alone = measure(pid, server.url, args.rounds, args.seconds, args.rate)
                print("  beside Prometheus scraping vLLM every 1 s:", flush=True)
                prom_dir = workdir / f"prometheus-{name}"
                with prometheus_beside(server.url, prom_dir, args.port_base + 2 * i + 1):
                    beside = measure(pid, server.url, args.rounds, args.seconds, args.rate)
                report(name, "alone", alone)
                report(name, "beside Prometheus", beside, alone=alone)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
