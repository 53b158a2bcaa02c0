"""The real stack for end-to-end tests: vLLM (CPU build), the exporter, Prometheus.

One stack per test session (a vLLM CPU server takes about a minute to start). The
workload is fixed and runs before any test looks at the data:

  phase "spec"   right after startup: sequential requests on a repetitive prompt with
                 ngram speculation on (drafts get accepted). Nothing ran before it, so
                 any window that covers it and ends before "flood" sees only it. The
                 second request waits until the exporter has seen the first (the first
                 request after a start pays the ngram proposer's compilation).
  quiet          SPEC_QUIET_SECONDS with no traffic: compare windowed values at
                 `spec_compare_at` (end of spec + a few seconds).
  phase "flood"  concurrent long requests on a 4,096-token pool: the pool fills,
                 requests wait, vLLM preempts. vLLM runs in slices, held still after each
                 (tests/vllm_pause.py); once its page shows the pool full with a queue,
                 it is held until the exporter has polled it and Prometheus has scraped
                 both: the full pool and its queue are in every source the tests read, on
                 any machine.
  phase "fill"   sampled requests that would outgrow the pool, one token per step each,
                 until vLLM preempts one (then they are cancelled): the pool fills slowly
                 enough to watch the KV headroom run out. vLLM runs in slices, held still
                 after each while a second exporter core polls it (tests/fill_phase.py); what
                 each poll published is kept (`RealStack.fine_polls`).

Prometheus scrapes vLLM and the exporter every second and evaluates every rule file in
alerts/ every second, and the rules of STACK_SLO (an SLO file's objectives for the stack's
model; its budget groups too every second). The exporter runs as its own process (the
`glassbox exporter` command, as the sidecar does): in the test process it shared the
interpreter with the flood's client threads, and on a loaded machine Prometheus' scrapes
of it timed out.
`vllm_server`, `start_exporter` and `start_prometheus` are also what the chaos tests
kill and restart (tests/e2e/test_chaos.py).
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import functools
import math
import shutil
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import yaml
from vllm_glassbox.core import slo
from vllm_glassbox.core.own_page import read_exporter_page
from vllm_glassbox.core.prometheus import Prometheus, PrometheusError
from vllm_glassbox.lab.backends.prometheus_process import PrometheusProcess, scrape_config
from vllm_glassbox.lab.backends.server_process import (
    DEFAULT_COMMAND,
    ChildProcess,
    ServerProcess,
    free_port,
)
from vllm_glassbox.lab.backends.tinymodel import TinyModelSpec, generate
from vllm_glassbox.rules import slo_rule_file_text

from tests.fill_phase import WAITING, FinePoll, fill_until_preempted
from tests.vllm_pause import held, vllm_values

REPO = Path(__file__).resolve().parent.parent
GLASSBOX = str(Path(sys.executable).parent / "glassbox")
SPEC_CONFIG = (
    '{"method":"ngram","num_speculative_tokens":5,"prompt_lookup_max":4,"prompt_lookup_min":1}'
)
REPETITIVE_PROMPT = " ".join(["1 2 3 4 5"] * 10)
EXPORTER_WINDOW_SECONDS = 60.0
SPEC_QUIET_SECONDS = 12.0
# 16 sequences of ~620 tokens need ~9,900 tokens of KV: the 4,096-token pool overflows,
# vLLM preempts, and preempted requests wait at a full pool. (With 12 the full pool and
# the queue coincided too briefly for a 1 s scrape to catch it on a busy machine.)
# Greedy decoding of random weights repeats itself, so the ngram drafts are accepted
# and the flood stays short on two CPU cores.
FLOOD_REQUESTS = 16
FLOOD_MAX_TOKENS = 600  # the chaos test's flood, measured so
# The stack's: a longer full pool for the exporter's own 1 s polls to catch (at 600, a
# clean-clone run saw vLLM's page above 90 % once while the exporter's polls peaked at
# 74 %: no server out of headroom, no capacity alert pending).
STACK_FLOOD_MAX_TOKENS = 800
# Objectives for the stack's model. A flood request of 600 tokens sharing the engine
# with 15 others took 2 to 12 s end to end on this machine, most past stack-e2e's 2.5 s
# (14 and 16 of 16 in two runs; at 800 tokens, 16 of 16 beside a busy core); a spec
# request of 128 tokens alone takes half a second, the first one, which compiles the
# ngram proposer, one to two and a half.
# stack-tpot-custom names a bucket the stack's vLLM does not have (its default buckets
# have no 0.06).
STACK_SLO = {
    "buckets": {"inter_token_latency": [0.03, 0.06]},
    "objectives": [
        {"name": "stack-e2e", "model": "tiny", "sli": "e2e", "threshold": "2.5s", "target": "99%"},
        {
            "name": "stack-ttft",
            "model": "tiny",
            "sli": "ttft",
            "threshold": "2.5s",
            "target": "99%",
        },
        {"name": "stack-errors", "model": "tiny", "sli": "errors", "target": "99.9%"},
        {
            "name": "stack-tpot-custom",
            "model": "tiny",
            "sli": "tpot",
            "threshold": "60ms",
            "target": "99%",
        },
    ],
}
# Prometheus' scrape timeout in the stacks (they scrape every second).
SCRAPE_TIMEOUT_SECONDS = 0.9
VLLM_NICENESS = 10  # the load, below its observers (see vllm_server)
LATE_SECONDS = 0.1  # past the timeout: Prometheus was late (FailedScrape.prometheus_late)
STALL_WATCH = REPO / "tests" / "stall_watch.py"
KV_USAGE = "vllm:kv_cache_usage_perc"
FULL_POOL = 0.95  # the flood is frozen at this usage or more, with requests waiting
# How long vLLM runs between two reads of it held still during the flood: the pool is
# full with a queue for seconds of a flood of 8 to 24 s on two cores.
FLOOD_SLICE_SECONDS = 0.5


@dataclass
class RealStack:
    vllm: ServerProcess
    exporter_url: str
    prometheus_url: str
    model_dir: Path
    served_model_name: str
    stall_log: Path  # what the stall watch wrote (see machine_stalls)
    times: dict[str, float] = field(default_factory=dict)  # unix seconds of phase edges
    fine_polls: list[FinePoll] = field(default_factory=list)

    @property
    def spec_compare_at(self) -> float:
        """A time whose trailing windows (≤ 60 s) hold the spec phase and nothing else."""
        return self.times["spec_end"] + SPEC_QUIET_SECONDS - 2.0

    def query(self, expr: str, at: float | None = None) -> list[dict[str, Any]]:
        return prometheus_query(self.prometheus_url, expr, at)

    def machine_stalls(self) -> list[tuple[float, float]]:
        return machine_stalls(self.stall_log)

    def query_range(
        self, expr: str, start: float, end: float, step: float = 1.0
    ) -> list[dict[str, Any]]:
        with Prometheus(self.prometheus_url) as prometheus:
            return prometheus.query_range(expr, start, end, step)


def prometheus_query(url: str, expr: str, at: float | None = None) -> list[dict[str, Any]]:
    with Prometheus(url) as prometheus:
        return prometheus.query(expr, at)


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
        with contextlib.suppress(httpx.HTTPError, PrometheusError):
            if condition():
                return
        if time.monotonic() > deadline:
            raise RuntimeError(f"not {what} after {timeout_seconds:g}s")
        time.sleep(0.3)


def _http_ok(url: str) -> bool:
    return httpx.get(url, timeout=5).status_code == 200


def vllm_server(workdir: Path, model_dir: Path, port: int | None = None) -> ServerProcess:
    """The stack's vLLM (not started): ngram speculation, a 4,096-token pool (8 MiB of KV).

    At nice VLLM_NICENESS: on two cores the CPU build's load took the CPU from the exporter
    and Prometheus (a scrape of the exporter failed past 0.9 s; Prometheus noticed its own
    timeouts 1-3 s late) while a process that only sleeps ran on time. In production the
    sidecar's CPU request keeps its share, and vLLM's work is on the GPU."""
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
        command=f"nice -n {VLLM_NICENESS} {DEFAULT_COMMAND}",
    )


def start_exporter(vllm: ServerProcess, model_dir: Path, port: int, workdir: Path) -> ChildProcess:
    """`glassbox exporter` beside vLLM, polling every second; ready when it answers."""
    exporter = ChildProcess(
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
        name="the exporter",
    ).start()
    wait_until(lambda: _http_ok(f"http://127.0.0.1:{port}/healthz"), "the exporter serving")
    return exporter


def start_prometheus(
    workdir: Path, targets: dict[str, str], port: int, more_rule_files: tuple[str, ...] = ()
) -> PrometheusProcess:
    """Prometheus scraping `targets` (job -> host:port) and evaluating alerts/*.yaml (and
    `more_rule_files`) every second, its TSDB in workdir (kept across a restart); ready when
    it says so."""
    rule_files = sorted(str(p) for p in (REPO / "alerts").glob("*.yaml")) + list(more_rule_files)
    config = scrape_config(
        targets, timeout=f"{SCRAPE_TIMEOUT_SECONDS * 1000:g}ms", rule_files=rule_files
    )
    return PrometheusProcess(workdir, config, port).start()


def write_slo_rules(
    workdir: Path, objectives: dict[str, Any] = STACK_SLO, name: str = "stack"
) -> str:
    """An SLO file's rules (STACK_SLO's by default) as `glassbox rules --slo` writes them,
    every group at the global interval (a budget group's 5 minutes would outlast a run)."""
    document = yaml.safe_load(slo_rule_file_text(slo.parse(objectives, name), name, []))
    for group in document["groups"]:
        group.pop("interval", None)
    path = workdir / f"{name}-slo.rules.yaml"
    path.write_text(yaml.safe_dump(document, sort_keys=False, allow_unicode=True))
    return str(path)


@dataclass(frozen=True)
class FailedScrape:
    """A scrape Prometheus recorded as failed (`up` 0)."""

    job: str
    at: float  # unix seconds the scrape began (its samples' timestamp)
    seconds: float  # how long Prometheus took over it (`scrape_duration_seconds`)

    def the_targets_fault(self, stalls: Sequence[tuple[float, float]]) -> bool:
        """Whether the target is to blame: neither the machine nor Prometheus stopped
        during the scrape. (The exporter answers a scrape in 3-8 ms, 170 ms at most in the
        flood; no target answers a scraper that is not running.)"""
        return not (self.machine_stalled(stalls) or self.prometheus_late)

    def machine_stalled(self, stalls: Sequence[tuple[float, float]]) -> bool:
        """Whether the machine kept the stall watch (`stalls`, tests/stall_watch.py) off
        the CPU for at least half of the scrape's deadline (SCRAPE_TIMEOUT_SECONDS from
        its start): the target, a process at the same priority, had less than half of it
        to answer in."""
        end = self.at + SCRAPE_TIMEOUT_SECONDS
        stalled = sum(max(0.0, min(b, end) - max(a, self.at)) for a, b in stalls)
        return stalled >= SCRAPE_TIMEOUT_SECONDS / 2

    @property
    def prometheus_late(self) -> bool:
        """Whether Prometheus noticed the failure well after its own deadline: it did not
        run then (timeouts it kept took 0.900-0.904 s; failed scrapes that took it 1-7 s
        came while the stall watch ran on time)."""
        return self.seconds > SCRAPE_TIMEOUT_SECONDS + LATE_SECONDS


def failed_scrapes(prometheus_url: str, job: str, start: float, end: float) -> list[FailedScrape]:
    """Every failed scrape of `job` that began in [start, end], from the raw samples."""
    span = f"{math.ceil(end - start) + 1}s"

    def samples(name: str) -> dict[float, float]:
        result = prometheus_query(prometheus_url, f'{name}{{job="{job}"}}[{span}]', at=end)
        return {float(t): float(v) for series in result for t, v in series["values"]}

    took = samples("scrape_duration_seconds")  # written by the same scrape, stamped alike
    return [
        FailedScrape(job, at, took.get(at, math.nan))
        for at, up in sorted(samples("up").items())
        if up == 0 and at >= start
    ]


def stall_watch(workdir: Path) -> ChildProcess:
    """tests/stall_watch.py (not started), writing to its `log_path`."""
    return ChildProcess(
        [sys.executable, str(STALL_WATCH)], workdir / "stalls.log", name="the stall watch"
    )


def machine_stalls(log: Path) -> list[tuple[float, float]]:
    """The spans the stall watch writing `log` was kept off the CPU (whole lines only)."""
    lines = log.read_text().split("\n")[:-1]
    spans = (line.split() for line in lines if not line.startswith("#"))
    return [(float(start), float(end)) for start, end in spans]


def wait_scraped(prometheus_url: str, jobs: set[str], after: float | None = None) -> None:
    """Until Prometheus has a successful scrape of every job (after unix time `after`):
    "ready" comes first, and its target discovery hands over static targets on a 5 s tick."""

    def scraped() -> bool:
        # timestamp() of a plain selector is its sample's time; of `up == 1` it would be
        # the query's own time, which says nothing of when the scrape was.
        result = prometheus_query(prometheus_url, "timestamp(up) and up == 1")
        seen = {r["metric"]["job"] for r in result if float(r["value"][1]) > (after or 0.0)}
        return jobs <= seen

    wait_until(scraped, f"{sorted(jobs)} scraped by Prometheus")


def _wait_published(exporter_url: str, name: str, timeout_seconds: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_seconds
    while time.monotonic() < deadline:
        with contextlib.suppress(httpx.HTTPError):
            page = httpx.get(exporter_url + "/metrics", timeout=5).text
            if any(line.startswith(name + "{") for line in page.splitlines()):
                return
        time.sleep(0.2)
    raise RuntimeError(f"the exporter did not publish {name} within {timeout_seconds}s")


@contextlib.contextmanager
def real_stack(workdir: Path) -> Iterator[RealStack]:
    if shutil.which("prometheus") is None:
        raise RuntimeError("Debian's prometheus is not installed (scripts/setup.sh installs it)")
    model_dir = generate(TinyModelSpec("tiny-stack"), workdir / "models")
    exporter: ChildProcess | None = None
    prometheus: PrometheusProcess | None = None
    launched = time.time()
    with stall_watch(workdir) as watch, vllm_server(workdir, model_dir) as vllm:
        try:
            vllm.wait_ready()
            ready = time.time()
            exporter_port, prom_port = free_port(), free_port()
            exporter = start_exporter(vllm, model_dir, exporter_port, workdir)
            targets = {
                "vllm": vllm.url.removeprefix("http://"),
                "glassbox": f"127.0.0.1:{exporter_port}",
            }
            prometheus = start_prometheus(workdir, targets, prom_port, (write_slo_rules(workdir),))
            stack = RealStack(
                vllm,
                f"http://127.0.0.1:{exporter_port}",
                f"http://127.0.0.1:{prom_port}",
                model_dir,
                "tiny",
                watch.log_path,
            )
            stack.times.update(vllm_launch=launched, vllm_ready=ready)
            # A few scrapes of the idle server first.
            for _ in range(3):
                wait_scraped(stack.prometheus_url, set(targets), after=time.time())
            _run_workload(stack)
            stack.times["fill_start"] = time.time()
            fill_until_preempted(stack.vllm, stack.served_model_name, stack.fine_polls)
            stack.times["fill_end"] = time.time()
            yield stack
        finally:
            for service in (prometheus, exporter):
                if service is not None:
                    service.stop()


def _run_workload(stack: RealStack) -> None:
    t = stack.times
    t["spec_start"] = time.time()
    for i in range(3):
        complete(
            stack.vllm.url,
            stack.served_model_name,
            REPETITIVE_PROMPT,
            128,
            repetition_penalty=1.0,
            ignore_eos=True,
        )
        if i == 0:  # the exporter sees the first request after the start on its own
            _wait_published(stack.exporter_url, "glassbox_first_request_prefill_seconds")
    t["spec_end"] = time.time()
    time.sleep(SPEC_QUIET_SECONDS)
    # One client and a barrier: the requests reach vLLM together, however busy the
    # machine (a client per request costs a TLS context each, under the GIL, and a slow
    # start lets the first requests finish before the last ones arrive).
    together = threading.Barrier(FLOOD_REQUESTS)
    limits = httpx.Limits(max_connections=FLOOD_REQUESTS)
    with (
        httpx.Client(limits=limits, timeout=600) as client,
        concurrent.futures.ThreadPoolExecutor(max_workers=FLOOD_REQUESTS) as pool,
    ):

        def send(i: int) -> dict[str, Any]:
            body = {
                "model": stack.served_model_name,
                "prompt": f"Write an extremely long and detailed essay, number {i}.",
                "max_tokens": STACK_FLOOD_MAX_TOKENS,
                "temperature": 0,
                "ignore_eos": True,
            }
            together.wait()
            r = client.post(stack.vllm.url + "/v1/completions", json=body)
            r.raise_for_status()
            result: dict[str, Any] = r.json()
            return result

        t["flood_start"] = time.time()
        sent = [pool.submit(send, i) for i in range(FLOOD_REQUESTS)]
        _freeze_a_full_pool(stack, sent)
        for request in sent:
            request.result()
    t["flood_end"] = time.time()
    # Tests read the end state at flood_end + 2: let Prometheus scrape past it.
    wait_scraped(stack.prometheus_url, {"vllm", "glassbox"}, after=t["flood_end"] + 2)


def _exporter_polled_since(exporter_url: str, at: float) -> bool:
    return read_exporter_page(exporter_url, 30).polled_since(at)


def _freeze_a_full_pool(stack: RealStack, sent: Sequence[concurrent.futures.Future[Any]]) -> None:
    """vLLM runs the flood in slices of FLOOD_SLICE_SECONDS, held still after each
    (tests/vllm_pause.py) while the test reads it; once a read shows the pool full with
    requests waiting, it is held so until the exporter has polled it and Prometheus has
    scraped both since: every source the flood's tests read has seen the full pool and its
    queue, whatever the machine's load did to their timing (a read of a running vLLM's page
    took the whole flood to come back on this machine)."""
    seen: list[tuple[float, float]] = []  # (usage, waiting) of each still vLLM

    def full() -> bool:
        values = vllm_values(stack.vllm.url, (KV_USAGE, WAITING))
        seen.append((values[KV_USAGE], values[WAITING]))
        return values[KV_USAGE] >= FULL_POOL and values[WAITING] > 0

    with held(stack.vllm) as hold:
        while not all(request.done() for request in sent):
            still = hold.run(FLOOD_SLICE_SECONDS)
            if full():
                wait_until(functools.partial(_exporter_polled_since, stack.exporter_url, still),
                           "the exporter's poll of the full pool")  # fmt: skip
                wait_scraped(stack.prometheus_url, {"vllm", "glassbox"}, after=time.time())
                stack.times.update(flood_frozen=still, flood_resumed=time.time())
                return
    raise RuntimeError(f"the flood never filled the pool with a queue: {seen}")
