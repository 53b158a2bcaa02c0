"""The rate sweep: vLLM's own benchmark at rising request rates, and why the server stops
keeping up.

Each step runs `vllm bench serve` (it ships with vLLM: the lab adds no load generator)
against one server: random prompts of given input and output lengths, Poisson or constant
arrivals (`--burstiness`) at the step's rate, optionally `--max-concurrency`, goodput
under the plan's SLOs. The benchmark's own JSON of each step is kept. Beside it, a
poller reads vLLM's page every `poll` seconds (the KV pool's usage and headroom, the
queue, preemptions), the exporter beside the server gives its headroom series, and the
counters around the step give the server's view through the derivation core (TPOT from
counters, tokens per engine step, preemptions per second, weight-read bandwidth).

What it finds: the knee (the highest rate the server keeps up with), the mechanism that
ends it, whether the client's and the counters' TPOT agree, and whether the headroom
series saw the first preemption coming, and how long before.

The phase's YAML, its run, its result (results.json: `steps[]`, `knee`, `forecast`), its
section of report.md and its plots.
"""

from __future__ import annotations

import json
import math
import os
import shlex
import statistics
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence, Set
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from vllm_glassbox.exporter import derive
from vllm_glassbox.exporter import snapshot as s
from vllm_glassbox.exporter.derive import Increase
from vllm_glassbox.exporter.snapshot import Snapshot
from vllm_glassbox.lab.backend import Deployed, FlagOverrides
from vllm_glassbox.lab.experiments.base import Experiment, PhaseFailed
from vllm_glassbox.lab.experiments.kv_pressure import SATURATED, TimelinePoint, act_names
from vllm_glassbox.lab.findings import difference, fit_line
from vllm_glassbox.lab.measure import LabError, Sampler, gauge_max, gauge_total, increase
from vllm_glassbox.lab.plan_yaml import (
    MISSING,
    Node,
    count,
    duration,
    fraction,
    kind_name,
    non_negative,
    positive_int,
    positive_number,
    read_flags,
    text,
)
from vllm_glassbox.lab.progress import number_text
from vllm_glassbox.lab.report_format import (
    gbs,
    integer,
    num,
    percent,
    plot_name,
    png,
    pyplot,
    server_facts,
    table,
)
from vllm_glassbox.lab.results import JSON, PhaseResult, Startup, startup_json

if TYPE_CHECKING:
    from vllm_glassbox.lab.runner import Lab, Served
    from vllm_glassbox.lab.sidecar import ExporterBeside

KIND = "rate-sweep"

#: `vllm bench serve` without the `vllm` console script, which some builds lack (the CPU
#: build's distribution is not named vllm, and its CLI asks for that name's version):
#: the same parser and main function the subcommand calls.
BENCH_LAUNCHER = (
    "import sys\n"
    "from vllm.benchmarks.serve import add_cli_args, main\n"
    "try:\n"
    "    from vllm.utils.argparse_utils import FlexibleArgumentParser\n"
    "except ImportError:  # vLLM <= 0.11\n"
    "    from vllm.utils import FlexibleArgumentParser\n"
    "parser = FlexibleArgumentParser(prog='vllm bench serve')\n"
    "add_cli_args(parser)\n"
    "main(parser.parse_args(sys.argv[1:]))\n"
)
DEFAULT_BENCH_COMMAND = (sys.executable, "-c", BENCH_LAUNCHER)

#: The exporter's series read at every poll: its forecast of the pool. (Not its
#: exhaustion time: beside the lab its window spans the whole segment, not the moment.)
HEADROOM = "glassbox_kv_cache_headroom_requests"
FREE_TOKENS = "glassbox_kv_cache_free_tokens"
#: Fewest requests a step needs for the backlog's growth to mean something.
MIN_JUDGED_REQUESTS = 8
#: The arrivals must span this many times the first requests' latency: a batching server
#: that keeps up reaches its steady state about one latency after the first arrival, and
#: in a shorter step every request is still in it together (they finish together at
#: the end, whatever the server's capacity).
MIN_SPAN_LATENCIES = 2.0
#: The client's TPOT and the counters' agree within this ratio.
TPOT_AGREEMENT = 0.10
#: Decode steps this much longer than at the lowest rate: the batch made them longer.
LONGER_STEPS = 1.25
#: The server must be idle before a step starts (the previous step's requests done).
IDLE_TIMEOUT_SECONDS = 300.0

# --- the phase ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Doubling:
    """Rates from `start`, doubled after every step the server keeps up with."""

    start: float
    max_steps: int


@dataclass(frozen=True)
class RateSweepPhase:
    name: str
    model: str | None
    flags: FlagOverrides
    rates: tuple[float, ...] | Doubling
    burstiness: float  # 1: Poisson arrivals; inf: constant
    input_len: int
    output_len: int
    step_seconds: float  # each step offers rate × step_seconds requests
    min_requests: int
    max_concurrency: int | None
    goodput: Mapping[str, float]  # SLO name (ttft, tpot, e2el) -> seconds
    temperature: float
    keep_up: float  # achieved / offered from which a step keeps up
    poll_seconds: float
    saturation: float  # KV usage from which the pool counts as full
    warmup: int
    step_timeout_seconds: float
    tokenizer: str | None  # when the lab cannot read the served checkpoint
    bench_command: tuple[str, ...]
    seed: int = 0
    kind: str = KIND

    @property
    def server_starts(self) -> int:
        return 1

    def models(self) -> list[tuple[str, str]]:
        return [("model", self.model)] if self.model is not None else []

    def without_models(self, models: Set[str]) -> tuple[RateSweepPhase, list[str]]:
        return self, []  # one server, no variants to leave out

    @property
    def arrivals(self) -> str:
        if self.burstiness == 1.0:
            return "Poisson"
        if math.isinf(self.burstiness):
            return "constant"
        return f"gamma (burstiness {self.burstiness:g})"

    def requests_at(self, rate: float) -> int:
        return max(self.min_requests, math.ceil(rate * self.step_seconds))

    def describe(self) -> str:
        rates = (
            f"from {self.rates.start:g} req/s doubling until it falls behind (at most "
            f"{self.rates.max_steps} steps)"
            if isinstance(self.rates, Doubling)
            else "at " + ", ".join(f"{r:g}" for r in self.rates) + " req/s"
        )
        limit = f", at most {self.max_concurrency} at once" if self.max_concurrency else ""
        slos = ", ".join(f"{k} ≤ {v * 1000:g} ms" for k, v in self.goodput.items())
        return (
            f"vllm bench serve {rates}, {self.arrivals} arrivals for {self.step_seconds:g}s "
            f"a step, {self.input_len} tokens in / {self.output_len} out{limit}"
            + (f", goodput {slos}" if slos else "")
        )


ARRIVALS = {"poisson": 1.0, "constant": math.inf}
SLOS = ("ttft", "tpot", "e2el")


def _rates(node: Node) -> tuple[float, ...] | Doubling:
    value = node.raw("rates")
    if value is MISSING or value is None:
        node.problem(
            "rates", "required: a list of requests per second, or {double_from, max_steps}"
        )
        return ()
    if isinstance(value, list):
        rates: list[float] = []
        for i, r in enumerate(value):
            try:
                rates.append(positive_number(r))
            except ValueError as e:
                node.problem("rates", f"[{i}] {e}")
        if not value:
            node.problem("rates", "needs at least one rate")
        if rates != sorted(set(rates)):
            node.problem("rates", "must rise from step to step, each rate once")
        return tuple(rates)
    if isinstance(value, dict):
        doubling = node.child("rates")
        found = Doubling(
            doubling.get("double_from", positive_number),
            doubling.get("max_steps", positive_int, 6),
        )
        doubling.done()
        return found
    node.problem(
        "rates", f"must be a list of rates or {{double_from, max_steps}}, not {kind_name(value)}"
    )
    return ()


def _burstiness(value: object) -> float:
    if isinstance(value, str) and value in ARRIVALS:
        return ARRIVALS[value]
    try:
        return positive_number(value)
    except ValueError:
        raise ValueError(
            f"must be poisson, constant or a burstiness > 0 (gamma arrivals), not {value!r}"
        ) from None


def _goodput(node: Node) -> dict[str, float]:
    slos = {}
    for key in list(node.data):
        if key not in SLOS:
            node.problem(str(key), f"unknown SLO (known: {', '.join(SLOS)})")
            continue
        slos[key] = node.get(key, duration)
    return slos


def _command(value: object) -> tuple[str, ...]:
    if isinstance(value, str):
        words = shlex.split(value)
    elif isinstance(value, list) and all(isinstance(w, str) for w in value):
        words = list(value)
    else:
        raise ValueError(f"must be a command (a string or a list of words), not {value!r}")
    if not words:
        raise ValueError("must not be empty")
    return tuple(words)


def parse(node: Node, name: str) -> RateSweepPhase:
    phase = RateSweepPhase(
        name=name,
        model=node.get("model", text, None),
        flags=read_flags(node, "flags"),
        rates=_rates(node),
        burstiness=node.get("arrivals", _burstiness, 1.0),
        input_len=node.get("input_len", positive_int, 128),
        output_len=node.get("output_len", positive_int, 256),
        step_seconds=node.get("step_duration", duration, 60.0),
        min_requests=node.get("min_requests", positive_int, 8),
        max_concurrency=node.get("max_concurrency", positive_int, None),
        goodput=_goodput(node.child("goodput")),
        temperature=node.get("temperature", non_negative, 0.0),
        keep_up=node.get("keep_up", fraction, 0.9),
        poll_seconds=node.get("poll", duration, 2.0),
        saturation=node.get("saturation", fraction, 0.95),
        warmup=node.get("warmup", count, 1),
        step_timeout_seconds=node.get("step_timeout", duration, 1800.0),
        tokenizer=node.get("tokenizer", text, None),
        bench_command=node.get("bench_command", _command, DEFAULT_BENCH_COMMAND),
        seed=node.get("seed", count, 0),
    )
    return phase


# --- what it found -------------------------------------------------------------------------


@dataclass(frozen=True)
class SweepPoint:
    """One poll of vLLM's page during a step, with the exporter's forecast beside it."""

    step: int
    t: float  # seconds since the sweep's first step started
    t_step: float  # seconds since this step's poller started
    running: float | None
    waiting: float | None
    kv_cache_usage: float | None  # 0–1
    preemptions: float  # since this step started
    generated_tokens: float  # since this step started
    headroom_requests: float | None  # the derivation core over this page
    free_tokens: float | None
    exporter_headroom_requests: float | None = None  # the exporter beside, as it last saw
    exporter_free_tokens: float | None = None

    def timeline_point(self) -> TimelinePoint:
        return TimelinePoint(
            self.t_step,
            self.running,
            self.waiting,
            self.kv_cache_usage,
            self.preemptions,
            self.generated_tokens,
        )


@dataclass(frozen=True)
class ClientView:
    """The benchmark's numbers of one step (its JSON, milliseconds made seconds)."""

    completed: int
    failed: int
    duration_seconds: float
    request_throughput: float | None
    output_throughput: float | None
    request_goodput: float | None
    ttft_p50: float | None
    ttft_p99: float | None
    tpot_mean: float | None
    tpot_p50: float | None
    tpot_p99: float | None
    itl_p50: float | None
    itl_p99: float | None
    e2el_p50: float | None
    e2el_p99: float | None
    max_concurrent_requests: float | None
    arrival_rate: float | None  # the rate the requests actually arrived at
    #: Seconds the time from the k-th arrival to the k-th completion grows per second of
    #: arrivals: 0 for a server that keeps up, > 0 while a backlog builds.
    backlog_growth: float | None
    arrival_span_seconds: float | None = None  # from the first request sent to the last
    early_latency_seconds: float | None = None  # median latency of the first quarter


@dataclass(frozen=True)
class ServerView:
    """The counters around one step through the derivation core."""

    tpot_seconds: float | None
    inter_token_latency_seconds: float | None
    ttft_seconds: float | None
    tokens_per_engine_step: float | None
    engine_steps_per_second: float | None
    generation_tokens_per_second: float | None
    preemptions: float
    preemptions_per_second: float | None
    weight_read_bandwidth: float | None
    memory_bandwidth_utilization: float | None
    peak_kv_cache_usage: float | None
    peak_waiting: float | None
    peak_running: float | None
    min_headroom_requests: float | None
    min_exporter_headroom_requests: float | None


@dataclass(frozen=True)
class SweepStep:
    index: int
    rate: float  # offered, requests per second
    requests: int
    bench_file: str | None  # the benchmark's JSON, relative to the output directory
    client: ClientView | None
    server: ServerView | None
    achieved_rate: float | None  # completions per second, the drain taken off
    keeps_up: bool | None
    tpot_difference: float | None  # client / counters − 1
    tpot_agree: bool | None
    tpot_note: str | None  # why they differ, when they do
    acts: tuple[str, ...] = ()  # the KV-pressure acts the step's polls show, in order
    limit: str | None = None  # the mechanism holding the server back (LIMITS)
    decode_slowdown: float | None = None  # decode step time over the lowest rate's
    #: The 1-minute load average of the lab's machine at the step's end (the server's too,
    #: with the local backend): a shared machine's other work slows every step.
    host_load: float | None = None
    error: str | None = None


@dataclass(frozen=True)
class Knee:
    rate: float | None  # the highest rate kept up with (None: not even the first)
    first_unsustained_rate: float | None
    limit: str | None  # what ends it (LIMITS), at the first step that did not keep up
    limit_text: str | None
    #: The highest rate before the first step whose share of requests within the SLOs
    #: fell below keep_up (None without SLOs, or when not even the first step held them).
    slo_rate: float | None = None
    #: Rates above the knee, before the first step that fell behind, that could not be
    #: judged: the knee lies somewhere among them.
    unjudged: tuple[float, ...] = ()


@dataclass(frozen=True)
class Forecast:
    """Did the headroom series reach 0 before the first preemption, and how long before."""

    first_preemption_at: float | None  # sweep seconds of the poll that first counted one
    first_preemption_step: int | None
    headroom_zero_at: float | None  # the lab's polls (the derivation core)
    lead_seconds: float | None
    exporter_headroom_zero_at: float | None  # the exporter beside
    exporter_lead_seconds: float | None
    verdict: str


@dataclass(frozen=True)
class RateSweepResult:
    startup: Startup | None
    arrivals: str
    burstiness: float
    input_len: int
    output_len: int
    max_concurrency: int | None
    goodput_slos: Mapping[str, float]
    keep_up: float
    steps: tuple[SweepStep, ...]
    timeline: tuple[SweepPoint, ...]
    knee: Knee
    forecast: Forecast
    missed_polls: int = 0
    exporter: bool = False  # whether an exporter beside gave its headroom series
    host_cpus: int | None = None  # of the lab's machine, beside the steps' host load
    bench_command: tuple[str, ...] = field(default_factory=tuple)

    def to_json(self) -> JSON:
        body = asdict(self)
        body.pop("startup")
        body["burstiness"] = None if math.isinf(self.burstiness) else self.burstiness
        body["bench_command"] = [
            "<vllm bench serve launcher>" if w == BENCH_LAUNCHER else w for w in self.bench_command
        ]
        return {**startup_json(self.startup), **body}


# --- its arithmetic (derive's numbers) -----------------------------------------------------


def sweep_point(
    step: int,
    t: float,
    t_step: float,
    baseline: Snapshot,
    now: Snapshot,
    capacity: int | None,
    exporter: Mapping[str, float] | None = None,
) -> SweepPoint:
    """One poll: the pool, the queue and the headroom by the derivation core."""
    grown = increase(baseline, now, t_step)
    usage = gauge_max(now, s.KV_USAGE)
    running = gauge_total(now, s.RUNNING)
    used = derive.kv_cache_used_tokens(usage, capacity)
    exporter = exporter or {}
    return SweepPoint(
        step=step,
        t=t,
        t_step=t_step,
        running=running,
        waiting=gauge_total(now, s.WAITING),
        kv_cache_usage=usage,
        preemptions=grown[s.PREEMPTIONS],
        generated_tokens=grown[s.GENERATION_TOKENS],
        headroom_requests=derive.kv_cache_headroom_requests(used, capacity, running),
        free_tokens=derive.kv_cache_free_tokens(used, capacity),
        exporter_headroom_requests=exporter.get(HEADROOM),
        exporter_free_tokens=exporter.get(FREE_TOKENS),
    )


def server_view(
    d: Increase, points: Sequence[SweepPoint], startup: Startup | None, peak: float | None
) -> ServerView:
    """The step's counters through the derivation core, the polls' peaks beside them."""
    weights = startup.weights_bytes if startup else None
    tp = startup.tensor_parallel if startup else 1
    return ServerView(
        tpot_seconds=derive.time_per_output_token(d),
        inter_token_latency_seconds=derive.inter_token_latency(d),
        ttft_seconds=derive.time_to_first_token(d),
        tokens_per_engine_step=derive.tokens_per_engine_step(d),
        engine_steps_per_second=derive.engine_steps_per_second(d),
        generation_tokens_per_second=derive.generation_tokens_per_second(d),
        preemptions=d[s.PREEMPTIONS],
        preemptions_per_second=derive.preemptions_per_second(d),
        weight_read_bandwidth=derive.weight_read_bandwidth_per_gpu(d, weights, tp),
        memory_bandwidth_utilization=derive.memory_bandwidth_utilization(d, weights, peak, tp),
        peak_kv_cache_usage=_max(p.kv_cache_usage for p in points),
        peak_waiting=_max(p.waiting for p in points),
        peak_running=_max(p.running for p in points),
        min_headroom_requests=_min(p.headroom_requests for p in points),
        min_exporter_headroom_requests=_min(p.exporter_headroom_requests for p in points),
    )


def _max(values: Any) -> float | None:
    present = [v for v in values if v is not None]
    return max(present) if present else None


def _min(values: Any) -> float | None:
    present = [v for v in values if v is not None]
    return min(present) if present else None


def _seconds(data: Mapping[str, Any], key: str) -> float | None:
    value = data.get(key)
    return float(value) / 1000.0 if isinstance(value, int | float) else None


def _number(data: Mapping[str, Any], key: str) -> float | None:
    value = data.get(key)
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def arrival_rate(start_times: Sequence[float]) -> float | None:
    """Requests per second the arrivals came at: (n − 1) over their span."""
    if len(start_times) < 2:
        return None
    return derive.ratio(len(start_times) - 1, max(start_times) - min(start_times))


def backlog_growth(start_times: Sequence[float], latencies: Sequence[float]) -> float | None:
    """How fast a backlog builds: the slope, against arrival time, of the time from the
    k-th arrival to the k-th completion (both in order). A server that keeps up finishes
    the k-th request about one latency after the k-th arrived, whatever the arrivals'
    randomness: the gap stays level. One that serves μ of r requests per second falls
    behind by r/μ − 1 seconds per second. None below MIN_JUDGED_REQUESTS requests."""
    if len(start_times) < MIN_JUDGED_REQUESTS or len(start_times) != len(latencies):
        return None
    arrivals = sorted(start_times)
    completions = sorted(a + latency for a, latency in zip(start_times, latencies, strict=True))
    gaps = [(a, c - a) for a, c in zip(arrivals, completions, strict=True)]
    try:
        return fit_line(gaps)[0]
    except ValueError:  # every request arrived at once
        return None


def _succeeded(bench: Mapping[str, Any]) -> tuple[list[float], list[float]]:
    """Arrival times and end-to-end latencies of the requests that succeeded."""
    starts = bench.get("start_times") or []
    latencies = bench.get("latencies") or []
    errors = bench.get("errors") or [""] * len(starts)
    kept = [
        (float(t), float(latency))
        for t, latency, error in zip(starts, latencies, errors, strict=False)
        if not error and isinstance(t, int | float) and isinstance(latency, int | float)
    ]
    return [t for t, _ in kept], [latency for _, latency in kept]


def early_latency(start_times: Sequence[float], latencies: Sequence[float]) -> float | None:
    """The median end-to-end latency of the first quarter of the requests to arrive."""
    ordered = [latency for _, latency in sorted(zip(start_times, latencies, strict=True))]
    first = ordered[: max(len(ordered) // 4, 1)]
    return statistics.median(first) if first else None


def client_view(bench: Mapping[str, Any]) -> ClientView:
    """The benchmark's JSON (`--save-result --save-detailed`) as seconds."""
    starts, latencies = _succeeded(bench)
    return ClientView(
        completed=int(bench.get("completed") or 0),
        failed=int(bench.get("failed") or 0),
        duration_seconds=float(bench.get("duration") or 0.0),
        request_throughput=_number(bench, "request_throughput"),
        output_throughput=_number(bench, "output_throughput"),
        request_goodput=_number(bench, "request_goodput"),
        ttft_p50=_seconds(bench, "p50_ttft_ms"),
        ttft_p99=_seconds(bench, "p99_ttft_ms"),
        tpot_mean=_seconds(bench, "mean_tpot_ms"),
        tpot_p50=_seconds(bench, "p50_tpot_ms"),
        tpot_p99=_seconds(bench, "p99_tpot_ms"),
        itl_p50=_seconds(bench, "p50_itl_ms"),
        itl_p99=_seconds(bench, "p99_itl_ms"),
        e2el_p50=_seconds(bench, "p50_e2el_ms"),
        e2el_p99=_seconds(bench, "p99_e2el_ms"),
        max_concurrent_requests=_number(bench, "max_concurrent_requests"),
        arrival_rate=arrival_rate(starts),
        backlog_growth=backlog_growth(starts, latencies),
        arrival_span_seconds=max(starts) - min(starts) if starts else None,
        early_latency_seconds=early_latency(starts, latencies),
    )


def achieved_rate(client: ClientView) -> float | None:
    """Requests per second the server served while they arrived: the arrival rate over
    1 + the backlog's growth (a server that keeps up serves them as they come)."""
    if client.arrival_rate is None or client.backlog_growth is None:
        return None
    return derive.ratio(client.arrival_rate, 1.0 + max(client.backlog_growth, 0.0))


def judged(client: ClientView) -> bool:
    """Enough requests, over long enough a span, to tell keeping up from ramping up."""
    span, early = client.arrival_span_seconds, client.early_latency_seconds
    return (
        client.backlog_growth is not None
        and span is not None
        and early is not None
        and span >= MIN_SPAN_LATENCIES * early
    )


def keeps_up(client: ClientView, threshold: float) -> bool | None:
    """Served at least `threshold` of the arrival rate, every request answered; None when
    the step cannot tell (`judged`)."""
    achieved = achieved_rate(client)
    if achieved is None or client.arrival_rate is None or not judged(client):
        return None
    return client.failed == 0 and achieved >= threshold * client.arrival_rate


def slo_share(client: ClientView) -> float | None:
    """The share of requests within the plan's SLOs (goodput over throughput)."""
    if client.request_goodput is None or client.request_throughput is None:
        return None
    return derive.ratio(client.request_goodput, client.request_throughput)


def tpot_verdict(
    client: ClientView | None, server: ServerView | None
) -> tuple[float | None, bool | None, str | None]:
    """The client's mean TPOT against the counters': their difference, whether they agree
    (TPOT_AGREEMENT), and why not when they do not."""
    if client is None or server is None:
        return None, None, None
    d = difference(client.tpot_mean, server.tpot_seconds)
    if d is None:
        return None, None, "one side has no TPOT (no request of more than one token)"
    if abs(d) <= TPOT_AGREEMENT:
        return d, True, None
    if client.failed:
        return (
            d,
            False,
            (
                f"{client.failed} request(s) failed: the counters count their tokens, the "
                "client's mean leaves them out"
            ),
        )
    if d > 0:
        return (
            d,
            False,
            (
                "the client times tokens as they arrive over HTTP; vLLM's inter-token "
                "histogram is stamped by the engine. The difference is the API server's delay "
                "in sending them (it streams several tokens at once when it falls behind the "
                "engine, its CPU shared with it) and the benchmark's own event loop"
            ),
        )
    return (
        d,
        False,
        (
            "the counters' TPOT is higher: tokens of the step that the client did not time "
            "(requests still running at the step's first or last poll) are in the counters"
        ),
    )


# --- what the numbers mean: the knee and its mechanism --------------------------------------

KV_POOL = "kv-pool"
CLIENT_LIMIT = "client-limit"
ADMISSION = "admission"
DECODE_STEPS = "decode-steps"
FIRST_STEP = "first-step"
UNEXPLAINED = "unexplained"

#: Each mechanism's condition, as the report states it.
LIMITS = {
    KV_POOL: "the KV pool full, then requests queue and vLLM preempts",
    CLIENT_LIMIT: "the benchmark's --max-concurrency holds the requests back (vLLM's queue "
    "stays empty)",
    ADMISSION: "requests queue while the pool has room: the scheduler's batch limits "
    "(--max-num-seqs, --max-num-batched-tokens) or the prefill time",
    DECODE_STEPS: f"decode steps {LONGER_STEPS - 1:.0%} or more longer than at the lowest "
    "rate as the batch grows, the pool not full: the hardware's compute or bandwidth",
    FIRST_STEP: "the lowest rate already falls behind, the pool not full and nobody "
    "waiting: nothing to hold its decode steps against (start the sweep lower; on a "
    "shared machine, see the host's load)",
    UNEXPLAINED: "none of the mechanisms above holds",
}


def limit_of(
    step: SweepStep, first: SweepStep, saturation: float, max_concurrency: int | None
) -> str:
    """What holds the server back at `step` (LIMITS), `first` the lowest rate's step."""
    server = step.server
    if server is None:
        return UNEXPLAINED
    queued = (server.peak_waiting or 0) > 0
    # vLLM preempts only when a running request finds no free block: a preemption proves
    # the pool ran full even where no poll landed on that moment.
    full = (server.peak_kv_cache_usage or 0.0) >= saturation or server.preemptions > 0
    if full and (queued or server.preemptions > 0):
        return KV_POOL
    client = step.client
    if (
        max_concurrency is not None
        and client is not None
        and (client.max_concurrent_requests or 0) >= max_concurrency
        and not queued
    ):
        return CLIENT_LIMIT
    if queued and not full:
        return ADMISSION
    slower = decode_slowdown(step, first)
    if slower is not None and slower >= LONGER_STEPS:
        return DECODE_STEPS
    return FIRST_STEP if step.index == first.index else UNEXPLAINED


def find_knee(steps: Sequence[SweepStep], keep_up: float) -> Knee:
    """The highest rate kept up with before the first step that was not; and the highest
    before the first whose share of requests within the SLOs fell below `keep_up`."""
    slo_rate = None
    for step in steps:
        share = slo_share(step.client) if step.client else None
        if share is None or share < keep_up:
            break
        slo_rate = step.rate
    kept = None
    unjudged: list[float] = []
    for step in steps:
        if step.keeps_up is False:
            limit = step.limit
            return Knee(kept, step.rate, limit, LIMITS.get(limit or ""), slo_rate, tuple(unjudged))
        if step.keeps_up:
            kept, unjudged = step.rate, []
        else:
            unjudged.append(step.rate)
    return Knee(kept, None, None, None, slo_rate, tuple(unjudged))


def _first_zero(points: Sequence[SweepPoint], value: str, until: int) -> float | None:
    """When the headroom (`value`) first read 0 in the step of the poll `until`, at or
    before it: the first warning (the pool may free room again as requests finish or are
    evicted, and fill again)."""
    step = points[until].step
    return next(
        (
            p.t
            for p in points[: until + 1]
            if p.step == step and (v := getattr(p, value)) is not None and v <= 0
        ),
        None,
    )


def forecast(points: Sequence[SweepPoint]) -> Forecast:
    """Whether the headroom series were at 0 (no more request of the current mean size
    fits) before the first poll that counted a preemption, and for how long."""
    at = next((i for i, p in enumerate(points) if p.preemptions > 0), None)
    if at is None:
        return Forecast(None, None, None, None, None, None, "no preemption happened")
    first = points[at]
    lab_zero = _first_zero(points, "headroom_requests", at)
    exp_zero = _first_zero(points, "exporter_headroom_requests", at)
    lead = first.t - lab_zero if lab_zero is not None else None
    exp_lead = first.t - exp_zero if exp_zero is not None else None
    seen = exp_lead if exp_lead is not None else lead
    who = "the exporter's" if exp_lead is not None else "the lab's"
    if seen is None:
        verdict = "no: the headroom did not reach 0 before the first preemption was counted"
    elif seen > 0:
        verdict = f"yes: {who} headroom reached 0 {seen:.1f} s before the first preemption"
    else:
        verdict = "at once: the headroom reached 0 at the same poll as the first preemption"
    return Forecast(first.t, first.step, lab_zero, lead, exp_zero, exp_lead, verdict)


def judge_steps(
    steps: Sequence[SweepStep], saturation: float, max_concurrency: int | None
) -> list[SweepStep]:
    """Each step with its decode steps against the lowest rate's, and the mechanism that
    held it back (for those not seen to keep up)."""
    if not steps:
        return []
    first = steps[0]
    return [
        replace(
            step,
            decode_slowdown=decode_slowdown(step, first),
            limit=None if step.keeps_up else limit_of(step, first, saturation, max_concurrency),
        )
        for step in steps
    ]


def decode_slowdown(step: SweepStep, first: SweepStep) -> float | None:
    """How many times as long a decode step took as at the lowest rate (the counters' ITL)."""
    base = first.server.inter_token_latency_seconds if first.server else None
    now = step.server.inter_token_latency_seconds if step.server else None
    return None if base is None or now is None else derive.ratio(now, base)


# --- the run -------------------------------------------------------------------------------


def bench_args(
    phase: RateSweepPhase,
    deployed: Deployed,
    rate: float,
    requests: int,
    result_dir: Path,
    result_file: str,
) -> list[str]:
    """`vllm bench serve`'s flags for one step."""
    tokenizer = phase.tokenizer or deployed.model_dir
    args = [
        "--backend", "openai",
        "--base-url", deployed.url,
        "--endpoint", "/v1/completions",
        "--served-model-name", deployed.served_model_name,
        "--model", tokenizer or deployed.served_model_name,
        "--dataset-name", "random",
        "--random-input-len", str(phase.input_len),
        "--random-output-len", str(phase.output_len),
        "--random-range-ratio", "0",
        "--ignore-eos",
        "--num-prompts", str(requests),
        "--request-rate", f"{rate:g}",
        "--burstiness", "inf" if math.isinf(phase.burstiness) else f"{phase.burstiness:g}",
        "--temperature", f"{phase.temperature:g}",
        "--seed", str(phase.seed),
        "--percentile-metrics", "ttft,tpot,itl,e2el",
        "--metric-percentiles", "50,99",
        "--disable-tqdm",
        "--save-result", "--save-detailed",
        "--result-dir", str(result_dir),
        "--result-filename", result_file,
    ]  # fmt: skip
    if tokenizer:
        args += ["--tokenizer", tokenizer]
    if phase.max_concurrency:
        args += ["--max-concurrency", str(phase.max_concurrency)]
    if phase.goodput:
        args += ["--goodput", *(f"{k}:{v * 1000:g}" for k, v in phase.goodput.items())]
    return args


def run_bench(
    command: Sequence[str],
    args: Sequence[str],
    log_path: Path,
    timeout: float,
    api_key: str | None,
) -> None:
    """One benchmark run, its output in `log_path`; LabError when it fails or outlasts
    `timeout`. The API key goes in its environment (OPENAI_API_KEY), never its flags."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONUNBUFFERED": "1"}
    env.pop("OPENAI_API_KEY", None)
    if api_key:
        env["OPENAI_API_KEY"] = api_key
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            [*command, *args],
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=env,
            start_new_session=True,
        )
        try:
            code = proc.wait(timeout=timeout)
        except BaseException:
            proc.kill()
            proc.wait()
            raise
    if code != 0:
        tail = "\n".join(log_path.read_text(errors="replace").splitlines()[-15:])
        raise LabError(f"vllm bench serve exited with code {code} (log {log_path}):\n{tail}")


def _wait_idle(served: Served, timeout: float) -> None:
    """Until vLLM runs and queues nothing: each step starts from an empty server."""
    deadline = time.monotonic() + timeout
    while True:
        page = served.client.snapshot()
        busy = (gauge_total(page, s.RUNNING) or 0) + (gauge_total(page, s.WAITING) or 0)
        if busy == 0:
            return
        if time.monotonic() > deadline:
            raise LabError(f"vLLM still busy ({busy:g} requests) {timeout:g}s after a step")
        time.sleep(0.5)


def _step_rates(phase: RateSweepPhase) -> list[float]:
    if isinstance(phase.rates, Doubling):
        return [phase.rates.start * 2**i for i in range(phase.rates.max_steps)]
    return list(phase.rates)


def run(lab: Lab, phase: RateSweepPhase) -> RateSweepResult:
    """Every step against one server, the benchmark's JSON of each kept."""
    overrides = {**phase.flags, **({"--model": phase.model} if phase.model else {})}
    # Here, not at the top: the lab loads the exporter's service only when it runs one.
    from vllm_glassbox.lab.sidecar import ExporterBeside

    exporter = next((o for o in lab.observers if isinstance(o, ExporterBeside)), None)
    out = lab.out_dir or Path("lab-out")
    bench_dir = out / "bench" / phase.name
    steps: list[SweepStep] = []
    timeline: list[SweepPoint] = []
    missed = [0]
    with lab.segment(phase, "", overrides) as served:
        capacity = served.startup.kv_cache_tokens
        # Short requests first: one-time costs of the first ones (the API server's, the
        # kernels') must not land on the first step.
        warm = {
            "model": served.deployed.served_model_name,
            "prompt": "Kubernetes is",
            "max_tokens": 16,
            "temperature": 0,
        }
        lab.warm_up(served, warm, phase.warmup)
        started = time.monotonic()
        failure: str | None = None
        for index, rate in enumerate(_step_rates(phase)):
            step = _run_step(
                lab, phase, served, index, rate, started, capacity, exporter, timeline,
                missed, bench_dir, out,
            )  # fmt: skip
            steps.append(step)
            lab.progress.note(f"  {_step_line(step)}")
            if step.error:
                failure = f"step {index + 1} at {rate:g} req/s: {step.error}"
                break
            if isinstance(phase.rates, Doubling) and step.keeps_up is False:
                break
        result = _result(phase, served.startup, steps, timeline, missed[0], exporter, lab)
        if failure:
            raise PhaseFailed(failure, result)
        return result


def _result(
    phase: RateSweepPhase,
    startup: Startup | None,
    steps: list[SweepStep],
    timeline: list[SweepPoint],
    missed: int,
    exporter: ExporterBeside | None,
    lab: Lab,
) -> RateSweepResult:
    judged = tuple(judge_steps(steps, phase.saturation, phase.max_concurrency))
    return RateSweepResult(
        startup=startup,
        arrivals=phase.arrivals,
        burstiness=phase.burstiness,
        input_len=phase.input_len,
        output_len=phase.output_len,
        max_concurrency=phase.max_concurrency,
        goodput_slos=dict(phase.goodput),
        keep_up=phase.keep_up,
        steps=judged,
        timeline=tuple(timeline),
        knee=find_knee(judged, phase.keep_up),
        forecast=forecast(timeline),
        missed_polls=missed,
        exporter=exporter is not None,
        host_cpus=os.cpu_count(),
        bench_command=phase.bench_command,
    )


def _run_step(
    lab: Lab,
    phase: RateSweepPhase,
    served: Served,
    index: int,
    rate: float,
    started: float,
    capacity: int | None,
    exporter: ExporterBeside | None,
    timeline: list[SweepPoint],
    missed: list[int],
    bench_dir: Path,
    out: Path,
) -> SweepStep:
    requests = phase.requests_at(rate)
    lab.progress.status(f"step {index + 1}: {requests} requests at {rate:g} req/s")
    _wait_idle(served, IDLE_TIMEOUT_SECONDS)
    client = served.client
    before = client.snapshot()
    points: list[SweepPoint] = []
    total = float(requests * phase.output_len)

    def on_sample(t: float, snap: Snapshot, latency: float, delay: float) -> None:
        seen = exporter.read((HEADROOM, FREE_TOKENS)) if exporter else None
        point = sweep_point(index, time.monotonic() - started, t, before, snap, capacity, seen)
        points.append(point)
        lab.progress.tokens(point.generated_tokens, total)
        lab.progress.status(_point_line(point))

    def on_missed(t: float, error: str) -> None:
        missed[0] += 1

    name = f"step-{index + 1:02d}-{rate:g}rps"
    error = None
    bench: dict[str, Any] = {}
    with Sampler(client, phase.poll_seconds, on_sample, on_missed=on_missed):
        try:
            run_bench(
                phase.bench_command,
                bench_args(phase, served.deployed, rate, requests, bench_dir, f"{name}.json"),
                bench_dir / f"{name}.log",
                phase.step_timeout_seconds,
                client.api_key.value if client.api_key else None,
            )
            bench = json.loads((bench_dir / f"{name}.json").read_text())
        except subprocess.TimeoutExpired:
            error = f"vllm bench serve ran past step_timeout ({phase.step_timeout_seconds:g}s)"
        except (LabError, OSError, ValueError) as e:
            error = str(e)
    timeline.extend(points)
    view = client_view(bench) if bench else None
    after = client.settled_snapshot(
        before, int(bench.get("total_output_tokens") or 0), view.completed if view else 0
    )
    seconds = view.duration_seconds if view else 0.0
    server = server_view(
        increase(before, after, seconds), points, served.startup, lab.peak_bandwidth
    )
    diff, agree, note = tpot_verdict(view, server)
    acts = act_names([p.timeline_point() for p in points], phase.saturation)
    return SweepStep(
        index=index,
        rate=rate,
        requests=requests,
        bench_file=str((bench_dir / f"{name}.json").relative_to(out)) if bench else None,
        client=view,
        server=server,
        achieved_rate=achieved_rate(view) if view else None,
        keeps_up=keeps_up(view, phase.keep_up) if view else None,
        tpot_difference=diff,
        tpot_agree=agree,
        tpot_note=note,
        acts=tuple(dict.fromkeys(acts)),
        error=error,
        host_load=os.getloadavg()[0],
    )


def _point_line(p: SweepPoint) -> str:
    usage = "–" if p.kv_cache_usage is None else f"{p.kv_cache_usage:.0%}"
    return (
        f"step {p.step + 1}: running {number_text(p.running)}, waiting "
        f"{number_text(p.waiting)}, KV {usage}, headroom {number_text(p.headroom_requests)}, "
        f"preemptions {p.preemptions:g}"
    )


def _step_line(step: SweepStep) -> str:
    if step.client is None:
        return f"step {step.index + 1} at {step.rate:g} req/s: {step.error}"
    verdict = {True: "keeps up", False: "falls behind", None: "–"}[step.keeps_up]
    return (
        f"step {step.index + 1} at {step.rate:g} req/s: {step.client.completed} done, "
        f"{num(step.achieved_rate)} req/s achieved ({verdict}), preemptions "
        f"{step.server.preemptions if step.server else 0:g}"
    )


# --- the report ----------------------------------------------------------------------------


def summary(r: RateSweepResult) -> str:
    knee = r.knee
    if knee.rate is None and knee.first_unsustained_rate is None:
        head = "no step long enough to judge"
    elif knee.rate is None:
        head = f"not even {knee.first_unsustained_rate:g} req/s kept up with"
    elif knee.first_unsustained_rate is None:
        head = f"kept up with every step judged, up to {knee.rate:g} req/s: the knee is higher"
    else:
        head = f"knee at {knee.rate:g} req/s"
        if knee.unjudged:
            head = (
                f"knee between {knee.rate:g} and {knee.first_unsustained_rate:g} req/s "
                f"({', '.join(f'{r:g}' for r in knee.unjudged)} not judged)"
            )
    if knee.first_unsustained_rate is not None and knee.limit:
        head += f" (at {knee.first_unsustained_rate:g} req/s: {LIMITS[knee.limit]})"
    return f"{head}; first preemption forecast: {r.forecast.verdict}."


def _ms(value: float | None) -> str:
    return num(value, scale=1000)


def section(phase: PhaseResult, r: RateSweepResult) -> list[str]:
    out = server_facts(r.startup)
    slos = ", ".join(f"{k} ≤ {v * 1000:g} ms" for k, v in r.goodput_slos.items()) or "none"
    out += [
        f"`vllm bench serve` at each rate: {r.arrivals} arrivals, random prompts of "
        f"{r.input_len} tokens, {r.output_len} generated (EOS ignored)"
        + (f", at most {r.max_concurrency} at once" if r.max_concurrency else "")
        + f"; goodput SLOs: {slos}. Its JSON of each step is kept beside the report.",
        "",
        "**The client's view** (the benchmark). Backlog: how many seconds the time from the "
        "k-th arrival to the k-th completion grows per second of arrivals — level (0) for "
        "a server that keeps up, whatever the arrivals' randomness; achieved: the rate the "
        "requests actually arrived at over 1 + that growth. A step keeps up when it "
        f"serves at least {percent(r.keep_up)} of the arrival rate and every request is "
        f"answered. A step is not judged (–) with fewer than {MIN_JUDGED_REQUESTS} requests, "
        f"or when its arrivals span less than {MIN_SPAN_LATENCIES:g}× the latency of its "
        "first requests: a batching server is still filling up then, every request in it "
        "at once.",
        "",
    ]
    out += table(
        [
            "rate req/s", "arrived req/s", "backlog s/s", "achieved req/s", "keeps up", "done",
            "failed", "goodput req/s", "within SLOs", "TTFT p50/p99 ms", "TPOT p50/p99 ms",
            "ITL p50/p99 ms", "E2E p50/p99 s",
        ],
        [
            [
                f"{st.rate:g}",
                num(c.arrival_rate),
                num(c.backlog_growth, 2),
                num(st.achieved_rate),
                {True: "yes", False: "**no**", None: "–"}[st.keeps_up],
                str(c.completed),
                str(c.failed),
                num(c.request_goodput),
                percent(slo_share(c)),
                f"{_ms(c.ttft_p50)} / {_ms(c.ttft_p99)}",
                f"{_ms(c.tpot_p50)} / {_ms(c.tpot_p99)}",
                f"{_ms(c.itl_p50)} / {_ms(c.itl_p99)}",
                f"{num(c.e2el_p50)} / {num(c.e2el_p99)}",
            ]
            for st in r.steps
            if (c := st.client) is not None
        ],
    )  # fmt: skip
    out += [
        "**The server's view** (vLLM's counters around each step through the derivation "
        "core; peaks and headroom from the polls of its page"
        + (", the exporter beside it for its headroom series" if r.exporter else "")
        + "). TPOT from counters against the client's mean TPOT; the host's 1-minute load "
        f"average at each step's end ({integer(r.host_cpus)} CPUs):",
        "",
    ]
    out += table(
        [
            "rate req/s", "TPOT counters ms", "client mean ms", "agree", "tokens/engine step",
            "preemptions/s", "peak KV", "peak waiting", "peak running", "min headroom",
            "weight reads", "host load", "acts", "limit",
        ],
        [
            [
                f"{st.rate:g}",
                _ms(sv.tpot_seconds),
                _ms(st.client.tpot_mean if st.client else None),
                _agree_cell(st),
                num(sv.tokens_per_engine_step),
                num(sv.preemptions_per_second),
                percent(sv.peak_kv_cache_usage),
                integer(sv.peak_waiting),
                integer(sv.peak_running),
                integer(sv.min_headroom_requests)
                + (
                    f" (exporter {integer(sv.min_exporter_headroom_requests)})"
                    if r.exporter
                    else ""
                ),
                gbs(sv.weight_read_bandwidth),
                num(st.host_load, 2),
                " → ".join(st.acts),
                st.limit or "",
            ]
            for st in r.steps
            if (sv := st.server) is not None
        ],
    )  # fmt: skip
    notes = [st for st in r.steps if st.tpot_note]
    for st in notes:
        out += [f"- At {st.rate:g} req/s the two TPOTs differ: {st.tpot_note}."]
    if notes:
        out += [""]
    elif any(st.tpot_agree for st in r.steps):
        out += [f"The two TPOTs agree within {TPOT_AGREEMENT:.0%} at every step.", ""]
    out += ["**The knee.** " + _knee_words(r), "", "**The first preemption.** "]
    out[-1] += _forecast_words(r)
    out += [""]
    if SATURATED in {a for st in r.steps for a in st.acts}:
        rates = [f"{st.rate:g}" for st in r.steps if SATURATED in st.acts]
        out += [f"The act *{SATURATED}* happened at {', '.join(rates)} req/s.", ""]
    for st in r.steps:
        if st.error:
            out += [f"- step at {st.rate:g} req/s: {st.error.splitlines()[0]}"]
    if r.missed_polls:
        out += [f"{r.missed_polls} poll(s) of vLLM's page failed (kept out of the timeline).", ""]
    out += [
        f"![rate sweep]({plot_name(phase, 'sweep')})",
        "",
        f"![rate sweep timeline]({plot_name(phase, 'timeline')})",
        "",
    ]
    return out


def _agree_cell(st: SweepStep) -> str:
    if st.tpot_agree is None:
        return "–"
    return ("yes" if st.tpot_agree else "**no**") + f" ({percent(st.tpot_difference, signed=True)})"


def _knee_words(r: RateSweepResult) -> str:
    k = r.knee
    if k.first_unsustained_rate is None:
        top = max((st.rate for st in r.steps if st.keeps_up), default=None)
        words = (
            f"Every step judged kept up (up to {top:g} req/s): the knee lies higher."
            if top is not None
            else "No step could be judged."
        )
    else:
        where = (
            f"The server keeps up with {k.rate:g} req/s and falls behind at "
            f"{k.first_unsustained_rate:g} req/s"
            if k.rate is not None
            else f"The server falls behind already at {k.first_unsustained_rate:g} req/s"
        )
        words = f"{where}. What ends it: **{k.limit}** — {k.limit_text}."
        if k.unjudged:
            words += (
                f" The steps between, at {', '.join(f'{r:g}' for r in k.unjudged)} req/s, "
                "could not be judged (arrivals spanning less than twice their first "
                "requests' latency): the knee lies among them."
            )
        step = next(st for st in r.steps if st.rate == k.first_unsustained_rate)
        if step.index > r.steps[0].index and step.decode_slowdown and step.server:
            words += (
                f" There, decode steps took {step.decode_slowdown:.2f}× as long as at the "
                f"lowest rate, {num(step.server.tokens_per_engine_step)} tokens per engine "
                f"step; peak KV usage {percent(step.server.peak_kv_cache_usage)}, peak queue "
                f"{integer(step.server.peak_waiting)}, "
                f"{step.server.preemptions:g} preemptions."
            )
    if r.goodput_slos:
        words += (
            f" Within the SLOs ({percent(r.keep_up)} of requests or more): up to "
            f"{k.slo_rate:g} req/s."
            if k.slo_rate is not None
            else " Not even the first step kept its requests within the SLOs."
        )
    return words


def _forecast_words(r: RateSweepResult) -> str:
    f = r.forecast
    if f.first_preemption_at is None:
        return "No preemption happened in the sweep."
    rate = next((st.rate for st in r.steps if st.index == f.first_preemption_step), None)
    lab = (
        f"the lab's polls (the derivation core) had it at 0 from t = {f.headroom_zero_at:.1f} s, "
        f"{f.lead_seconds:.1f} s before"
        if f.headroom_zero_at is not None and f.lead_seconds is not None
        else "the lab's polls had it above 0 until then"
    )
    exporter = ""
    if r.exporter:
        exporter = (
            f"; the exporter's series was 0 from t = {f.exporter_headroom_zero_at:.1f} s, "
            f"{f.exporter_lead_seconds:.1f} s before"
            if f.exporter_headroom_zero_at is not None and f.exporter_lead_seconds is not None
            else "; the exporter's series was above 0 until then"
        )
    return (
        f"First counted at t = {f.first_preemption_at:.1f} s (the step at {num(rate)} req/s). "
        f"Did the headroom series (requests of the current mean size that still fit) see it "
        f"coming? {f.verdict}: {lab}{exporter}. vLLM counts a preemption when the "
        "preempted request runs again, so the count trails the eviction itself."
    )


# --- the plots -----------------------------------------------------------------------------


def plot_sweep(r: RateSweepResult, title: str) -> bytes:
    """Throughput and latency percentiles against rate, the pool and the queue beside."""
    plt = pyplot()
    steps = [st for st in r.steps if st.client is not None and st.server is not None]
    rates = [st.rate for st in steps]
    fig, (top, middle, bottom) = plt.subplots(3, 1, figsize=(8, 9), sharex=True)
    top.plot(rates, rates, color="grey", ls=":", label="offered")
    top.plot(rates, [st.achieved_rate for st in steps], marker="o", label="achieved")
    unjudged = [st for st in steps if st.keeps_up is None and st.achieved_rate is not None]
    if unjudged:  # a step too short for its latency: its estimate is no verdict
        top.plot(
            [st.rate for st in unjudged], [st.achieved_rate for st in unjudged], ls="",
            marker="o", mfc="white", color="tab:blue", label="achieved (step not judged)",
        )  # fmt: skip
    top.plot(
        rates, [st.client.request_goodput for st in steps if st.client], marker="s",
        label="goodput",
    )  # fmt: skip
    if r.knee.rate is not None:
        for ax in (top, middle, bottom):
            ax.axvline(r.knee.rate, color="tab:green", ls="--", lw=1)
    top.set_ylabel("requests/s")
    top.set_title(f"{title}: throughput, latency and the pool against the offered rate")
    top.legend(fontsize=8)
    for key, label, color in (("ttft", "TTFT", "tab:blue"), ("tpot", "TPOT", "tab:orange")):
        for pct, style in (("p50", "-"), ("p99", "--")):
            values = [getattr(st.client, f"{key}_{pct}") for st in steps]
            middle.plot(
                rates, [v * 1000 if v else None for v in values], ls=style, marker=".",
                color=color, label=f"{label} {pct}",
            )  # fmt: skip
    middle.plot(
        rates, [(st.server.tpot_seconds or 0) * 1000 for st in steps if st.server],
        color="black", marker="x", ls="", label="TPOT from counters",
    )  # fmt: skip
    middle.set_yscale("log")
    middle.set_ylabel("ms")
    middle.legend(fontsize=7, ncol=3)
    bottom.plot(
        rates, [(st.server.peak_kv_cache_usage or 0) * 100 for st in steps if st.server],
        color="tab:red", marker="o", label="peak KV usage %",
    )  # fmt: skip
    bottom.set_ylabel("KV usage %")
    bottom.set_ylim(0, 105)
    queue = bottom.twinx()
    queue.plot(
        rates, [st.server.peak_waiting or 0 for st in steps if st.server],
        color="tab:purple", marker="s", label="peak waiting",
    )  # fmt: skip
    queue.plot(
        rates, [st.server.preemptions_per_second or 0 for st in steps if st.server],
        color="black", marker="^", label="preemptions/s",
    )  # fmt: skip
    queue.set_ylabel("requests / per second")
    lines = bottom.get_legend_handles_labels()
    more = queue.get_legend_handles_labels()
    bottom.legend(lines[0] + more[0], lines[1] + more[1], fontsize=8, loc="upper left")
    bottom.set_xlabel("offered request rate, req/s" + (" (log)" if len(rates) > 2 else ""))
    if len(rates) > 2:
        bottom.set_xscale("log", base=2)
    for ax in (top, middle, bottom):
        ax.grid(alpha=0.3)
    return png(fig)


def plot_timeline(r: RateSweepResult, title: str) -> bytes:
    """The whole sweep in time: the pool, the queue, the headroom and the preemptions."""
    plt = pyplot()
    points = r.timeline
    t = [p.t for p in points]
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(9, 5.5), sharex=True)
    for st in r.steps:
        mine = [p.t for p in points if p.step == st.index]
        if mine:
            top.axvline(mine[0], color="grey", lw=0.8, ls=":")
            top.annotate(
                f"{st.rate:g}/s", (mine[0], 1.0), xycoords=("data", "axes fraction"),
                xytext=(2, -10), textcoords="offset points", fontsize=7, color="#555555",
            )  # fmt: skip
    top.plot(
        t, [(p.kv_cache_usage or 0) * 100 for p in points], color="tab:red", label="KV usage %"
    )
    top.set_ylabel("KV usage %")
    top.set_ylim(0, 105)
    queue = top.twinx()
    queue.step(
        t, [p.waiting or 0 for p in points], where="post", color="tab:purple", label="waiting"
    )
    queue.step(t, [p.running or 0 for p in points], where="post", color="tab:blue", label="running")
    queue.set_ylabel("requests")
    lines = top.get_legend_handles_labels()
    more = queue.get_legend_handles_labels()
    top.legend(lines[0] + more[0], lines[1] + more[1], fontsize=8, loc="upper left")
    top.set_title(f"{title}: the pool, the queue and the headroom through the sweep")
    bottom.plot(t, [p.headroom_requests for p in points], color="tab:green", label="headroom (lab)")
    if r.exporter:
        bottom.plot(
            t, [p.exporter_headroom_requests for p in points], color="tab:olive", ls="--",
            label="headroom (exporter)",
        )  # fmt: skip
    bottom.set_ylabel("requests that still fit")
    if r.forecast.first_preemption_at is not None:
        for ax in (top, bottom):
            ax.axvline(r.forecast.first_preemption_at, color="black", lw=1.2)
        bottom.annotate(
            "first preemption", (r.forecast.first_preemption_at, 0.9),
            xycoords=("data", "axes fraction"), xytext=(3, 0), textcoords="offset points",
            fontsize=7,
        )  # fmt: skip
    bottom.set_xlabel("seconds since the sweep started")
    bottom.legend(fontsize=8, loc="upper left")
    for ax in (top, bottom):
        ax.grid(alpha=0.3)
    return png(fig)


def plots(phase: PhaseResult, r: RateSweepResult) -> dict[str, bytes]:
    out = {}
    if any(st.client is not None for st in r.steps):
        out[plot_name(phase, "sweep")] = plot_sweep(r, phase.name)
    if r.timeline:
        out[plot_name(phase, "timeline")] = plot_timeline(r, phase.name)
    return out


EXPERIMENT = Experiment(KIND, RateSweepPhase, RateSweepResult, parse, run, summary, section, plots)
