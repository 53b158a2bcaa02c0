"""The real stack for end-to-end tests: vLLM (CPU build), the exporter, Prometheus.

One stack per test session (a vLLM CPU server takes about a minute to start). The
workload is fixed and runs before any test looks at the data:

  phase "spec"   right after startup: sequential requests on a repetitive prompt with
                 ngram speculation on (drafts get accepted). Nothing ran before it, so
                 any window that covers it and ends before "flood" sees only it.
  quiet          SPEC_QUIET_SECONDS with no traffic: compare windowed values at
                 `spec_compare_at` (end of spec + a few seconds).
  phase "flood"  concurrent long requests on a 4,096-token pool: the pool fills,
                 requests wait, vLLM preempts.

Prometheus scrapes vLLM and the exporter every second and evaluates every rule file in
alerts/ every second. The exporter runs as its own process (the `glassbox exporter`
command, as the sidecar does): in the test process it shared the interpreter with the
flood's client threads, and on a loaded machine Prometheus' scrapes of it timed out.
`Service`, `vllm_server`, `start_exporter` and `start_prometheus` are also what the chaos
tests kill and restart (tests/test_chaos_realdata.py).
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import yaml
from vllm_glassbox.lab.server_process import ServerProcess, free_port
from vllm_glassbox.lab.tinymodel import TinyModelSpec, generate

REPO = Path(__file__).resolve().parent.parent
GLASSBOX = str(Path(sys.executable).parent / "glassbox")
SPEC_CONFIG = (
    '{"method":"ngram","num_speculative_tokens":5,"prompt_lookup_max":4,"prompt_lookup_min":1}'
)
REPETITIVE_PROMPT = " ".join(["1 2 3 4 5"] * 10)
EXPORTER_WINDOW_SECONDS = 60.0
SPEC_QUIET_SECONDS = 12.0
# 16 sequences of ~620 tokens need ~9,900 tokens of KV: the 4,096-token pool overflows,
# vLLM preempts, and requests keep waiting at a full pool for several seconds (with 12
# the full-pool-and-a-queue moment was too short for 1 s scrapes to catch every time).
# Greedy decoding of random weights repeats itself, so the ngram drafts are accepted
# and the flood stays short on two CPU cores.
FLOOD_REQUESTS = 16
FLOOD_MAX_TOKENS = 600


@dataclass
class Service:
    """A command run as a child in its own session, its output in a file. Stopping it
    (SIGTERM, then SIGKILL) takes its whole process group; `kill()` is the crash."""

    argv: list[str]
    log_path: Path
    proc: subprocess.Popen[bytes] | None = None

    def start(self) -> Service:
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                self.argv,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        return self

    def stop(self, grace_seconds: float = 30.0) -> int | None:
        proc, self.proc = self.proc, None
        if proc is None:
            return None
        for sig, wait in ((signal.SIGTERM, grace_seconds), (signal.SIGKILL, 10.0)):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, sig)
            try:
                return proc.wait(timeout=wait)
            except subprocess.TimeoutExpired:
                continue
        return None

    def kill(self) -> None:
        proc, self.proc = self.proc, None
        if proc is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)

    def log_text(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""


@dataclass
class RealStack:
    vllm: ServerProcess
    exporter_url: str
    prometheus_url: str
    model_dir: Path
    served_model_name: str
    times: dict[str, float] = field(default_factory=dict)  # unix seconds of phase edges

    @property
    def spec_compare_at(self) -> float:
        """A time whose trailing windows (≤ 60 s) hold the spec phase and nothing else."""
        return self.times["spec_end"] + SPEC_QUIET_SECONDS - 2.0

    def query(self, expr: str, at: float | None = None) -> list[dict[str, Any]]:
        return prometheus_query(self.prometheus_url, expr, at)

    def query_range(
        self, expr: str, start: float, end: float, step: float = 1.0
    ) -> list[dict[str, Any]]:
        r = httpx.get(
            self.prometheus_url + "/api/v1/query_range",
            params={"query": expr, "start": start, "end": end, "step": step},
            timeout=30,
        )
        r.raise_for_status()
        result: list[dict[str, Any]] = r.json()["data"]["result"]
        return result


def prometheus_query(url: str, expr: str, at: float | None = None) -> list[dict[str, Any]]:
    params: dict[str, str | float] = {"query": expr}
    if at is not None:
        params["time"] = at
    r = httpx.get(url + "/api/v1/query", params=params, timeout=30)
    r.raise_for_status()
    body = r.json()
    assert body["status"] == "success", body
    result: list[dict[str, Any]] = body["data"]["result"]
    return result


def complete(url: str, model: str, prompt: str, max_tokens: int, **extra: Any) -> dict[str, Any]:
    body = {"model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0, **extra}
    r = httpx.post(url + "/v1/completions", json=body, timeout=600)
    r.raise_for_status()
    result: dict[str, Any] = r.json()
    return result


def wait_until(condition: Callable[[], bool], what: str, timeout_seconds: float = 120.0) -> None:
    """Poll `condition` (errors count as not yet) until it holds; fail naming `what`."""
    deadline = time.monotonic() + timeout_seconds
    while True:
        with contextlib.suppress(httpx.HTTPError):
            if condition():
                return
        if time.monotonic() > deadline:
            raise RuntimeError(f"not {what} after {timeout_seconds:g}s")
        time.sleep(0.3)


def _http_ok(url: str) -> bool:
    return httpx.get(url, timeout=5).status_code == 200


def vllm_server(workdir: Path, model_dir: Path, port: int | None = None) -> ServerProcess:
    """The stack's vLLM (not started): ngram speculation, a 4,096-token pool (8 MiB of KV)."""
    return ServerProcess(
        [
            "--model",
            str(model_dir),
            "--served-model-name",
            "tiny",
            "--max-model-len",
            "2048",
            "--kv-cache-memory-bytes",
            "8388608",
            "--speculative-config",
            SPEC_CONFIG,
            # No torch.compile: the server starts about a minute sooner on two cores.
            "--enforce-eager",
        ],
        log_path=workdir / "vllm.log",
        port=port,
    )


def start_exporter(vllm: ServerProcess, model_dir: Path, port: int, workdir: Path) -> Service:
    """`glassbox exporter` beside vLLM, polling every second; ready when it answers."""
    exporter = Service(
        [
            GLASSBOX,
            "exporter",
            "--target",
            vllm.url,
            "--listen",
            f"127.0.0.1:{port}",
            "--interval",
            "1s",
            "--window",
            f"{EXPORTER_WINDOW_SECONDS:g}s",
            "--model-dir",
            str(model_dir),
            "--vllm-log",
            str(vllm.log_path),
            "--gpu-memory-bandwidth",
            "20e9",
        ],
        workdir / "exporter.log",
    ).start()
    wait_until(lambda: _http_ok(f"http://127.0.0.1:{port}/healthz"), "the exporter serving")
    return exporter


def start_prometheus(workdir: Path, targets: dict[str, str], port: int) -> Service:
    """Prometheus scraping `targets` (job -> host:port) and evaluating alerts/*.yaml every
    second, its TSDB in workdir (kept across a restart); ready when it says so."""
    config = workdir / "prometheus.yml"
    rule_files = sorted(str(p) for p in (REPO / "alerts").glob("*.yaml"))
    config.write_text(yaml.safe_dump(_prometheus_config(targets, rule_files)))
    prometheus = Service(
        [
            "prometheus",
            f"--config.file={config}",
            f"--storage.tsdb.path={workdir / 'tsdb'}",
            f"--web.listen-address=127.0.0.1:{port}",
        ],
        workdir / "prometheus.log",
    ).start()
    wait_until(lambda: _http_ok(f"http://127.0.0.1:{port}/-/ready"), "Prometheus ready")
    return prometheus


def wait_scraped(prometheus_url: str, jobs: set[str], after: float | None = None) -> None:
    """Until Prometheus has a successful scrape of every job (after unix time `after`):
    "ready" comes first, and its target discovery hands over static targets on a 5 s tick."""

    def scraped() -> bool:
        result = prometheus_query(prometheus_url, "timestamp(up == 1)")
        seen = {r["metric"]["job"] for r in result if float(r["value"][1]) > (after or 0.0)}
        return jobs <= seen

    wait_until(scraped, f"{sorted(jobs)} scraped by Prometheus")


def _prometheus_config(targets: dict[str, str], rule_files: list[str]) -> dict[str, Any]:
    return {
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s", "scrape_timeout": "900ms"},
        "rule_files": rule_files,
        "scrape_configs": [
            {"job_name": job, "static_configs": [{"targets": [hostport]}]}
            for job, hostport in targets.items()
        ],
    }


@contextlib.contextmanager
def real_stack(workdir: Path) -> Iterator[RealStack]:
    if shutil.which("prometheus") is None:
        raise RuntimeError("Debian's prometheus is not installed (scripts/setup.sh installs it)")
    model_dir = generate(TinyModelSpec("tiny-stack"), workdir / "models")
    exporter: Service | None = None
    prometheus: Service | None = None
    with vllm_server(workdir, model_dir) as vllm:
        try:
            vllm.wait_ready()
            exporter_port, prom_port = free_port(), free_port()
            exporter = start_exporter(vllm, model_dir, exporter_port, workdir)
            targets = {
                "vllm": vllm.url.removeprefix("http://"),
                "glassbox": f"127.0.0.1:{exporter_port}",
            }
            prometheus = start_prometheus(workdir, targets, prom_port)
            stack = RealStack(
                vllm,
                f"http://127.0.0.1:{exporter_port}",
                f"http://127.0.0.1:{prom_port}",
                model_dir,
                "tiny",
            )
            # A few scrapes of the idle server first.
            for _ in range(3):
                wait_scraped(stack.prometheus_url, set(targets), after=time.time())
            _run_workload(stack)
            yield stack
        finally:
            for service in (prometheus, exporter):
                if service is not None:
                    service.stop()


def _run_workload(stack: RealStack) -> None:
    t = stack.times
    t["spec_start"] = time.time()
    for _ in range(3):
        complete(
            stack.vllm.url,
            stack.served_model_name,
            REPETITIVE_PROMPT,
            128,
            repetition_penalty=1.0,
            ignore_eos=True,
        )
    t["spec_end"] = time.time()
    time.sleep(SPEC_QUIET_SECONDS)
    t["flood_start"] = time.time()
    with concurrent.futures.ThreadPoolExecutor(max_workers=FLOOD_REQUESTS) as pool:
        futures = [
            pool.submit(
                complete,
                stack.vllm.url,
                stack.served_model_name,
                f"Write an extremely long and detailed essay, number {i}.",
                FLOOD_MAX_TOKENS,
                ignore_eos=True,
            )
            for i in range(FLOOD_REQUESTS)
        ]
        for f in futures:
            f.result()
    t["flood_end"] = time.time()
    # Tests read the end state at flood_end + 2: let Prometheus scrape past it.
    wait_scraped(stack.prometheus_url, {"vllm", "glassbox"}, after=t["flood_end"] + 2)
