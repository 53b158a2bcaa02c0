"""What the rate sweep found: each poll, each step's client and server views, the knee,
the pool's forecasts judged, and the result's JSON (results.json: `steps[]`, `knee`,
`forecast`)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field

from vllm_glassbox.core.slo import Goodput
from vllm_glassbox.lab.experiments.pool_acts import TimelinePoint
from vllm_glassbox.lab.experiments.pool_forecasts import ForecastJudgement
from vllm_glassbox.lab.experiments.rate_sweep.phase import BENCH_LAUNCHER
from vllm_glassbox.lab.results import JSON, Startup, startup_json


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
    # The other forecasts (pool_forecasts.py), the lab's and the exporter's.
    headroom_at_completion: float | None = None
    exhaustion_seconds: float | None = None
    exporter_headroom_at_completion: float | None = None
    exporter_exhaustion_seconds: float | None = None

    def timeline_point(self) -> TimelinePoint:
        return TimelinePoint(
            self.t_step,
            self.running,
            self.waiting,
            self.kv_cache_usage,
            self.preemptions,
            self.generated_tokens,
            headroom_requests=self.headroom_requests,
            headroom_at_completion=self.headroom_at_completion,
            exhaustion_seconds=self.exhaustion_seconds,
            exporter_headroom_requests=self.exporter_headroom_requests,
            exporter_headroom_at_completion=self.exporter_headroom_at_completion,
            exporter_exhaustion_seconds=self.exporter_exhaustion_seconds,
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
    #: Per-request fields the benchmark's JSON lacks, without which the step is not judged.
    missing_fields: tuple[str, ...] = ()
    error: str | None = None  # the first failed request's error, its last line


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
    #: CPU seconds vLLM's API server used per second of the step (its page's
    #: process_cpu_seconds_total; absent with several API servers).
    api_server_cpu: float | None = None


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
    #: The requests by the phase's SLO file (its objectives of the served model).
    slo: Goodput | None = None


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
    forecast: ForecastJudgement  # the pool's forecasts against the first preemption
    missed_polls: int = 0
    exporter: bool = False  # whether an exporter beside gave its headroom series
    host_cpus: int | None = None  # of the lab's machine, beside the steps' host load
    bench_command: tuple[str, ...] = field(default_factory=tuple)
    slo_file: str | None = None  # the SLO file that judged the steps, when one did

    def to_json(self) -> JSON:
        body = asdict(self)
        body.pop("startup")
        body["burstiness"] = None if math.isinf(self.burstiness) else self.burstiness
        body["bench_command"] = [
            "<vllm bench serve launcher>" if w == BENCH_LAUNCHER else w for w in self.bench_command
        ]
        return {**startup_json(self.startup), **body}
