"""The rate sweep against one server: each step's benchmark, the page polled beside it,
the pool's forecasts at each poll (the lab's and the exporter's), the counters around the
step."""

from __future__ import annotations

import json
import os
import subprocess
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from vllm_glassbox.core import derive, slo
from vllm_glassbox.core import snapshot as s
from vllm_glassbox.core.snapshot import Snapshot
from vllm_glassbox.lab.experiments.base import PhaseFailed, Served, Services
from vllm_glassbox.lab.experiments.pool_acts import act_names
from vllm_glassbox.lab.experiments.pool_forecasts import Forecaster, judge_timeline
from vllm_glassbox.lab.experiments.rate_sweep.bench import bench_args, run_bench
from vllm_glassbox.lab.experiments.rate_sweep.judge import (
    achieved_rate,
    find_knee,
    judge_steps,
    keeps_up,
    tpot_verdict,
)
from vllm_glassbox.lab.experiments.rate_sweep.phase import Doubling, RateSweepPhase
from vllm_glassbox.lab.experiments.rate_sweep.result import RateSweepResult, SweepPoint, SweepStep
from vllm_glassbox.lab.experiments.rate_sweep.views import (
    client_view,
    request_outcomes,
    server_view,
    sweep_point,
)
from vllm_glassbox.lab.progress import number_text
from vllm_glassbox.lab.report_format import num
from vllm_glassbox.lab.vllm.client import LabError, Sampler, gauge_total, increase

#: The server must be idle before a step starts (the previous step's requests done).
IDLE_TIMEOUT_SECONDS = 300.0


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


def run(lab: Services, phase: RateSweepPhase) -> RateSweepResult:
    """Every step against one server, the benchmark's JSON of each kept."""
    with lab.segment(phase, "", phase.overrides) as served:
        # Short requests first: one-time costs of the first ones (the API server's, the
        # kernels') must not land on the first step.
        warm = {
            "model": served.deployed.served_model_name,
            "prompt": "Kubernetes is",
            "max_tokens": 16,
            "temperature": 0,
        }
        lab.warm_up(served, warm, phase.warmup)
        sweep = Sweep(lab, phase, served, lab.out_dir or Path("lab-out"), time.monotonic())
        failure: str | None = None
        for index, rate in enumerate(_step_rates(phase)):
            step = sweep.step(index, rate)
            lab.progress.note(f"  {_step_line(step)}")
            if step.error:
                failure = f"step {index + 1} at {rate:g} req/s: {step.error}"
                break
            if isinstance(phase.rates, Doubling) and step.keeps_up is False:
                break
        result = sweep.result()
        if failure:
            raise PhaseFailed(failure, result)
        return result


@dataclass
class Sweep:
    """One sweep against one server: what each step runs with, and what the steps have
    found so far (their results, every poll, the polls that failed)."""

    lab: Services
    phase: RateSweepPhase
    served: Served
    out: Path  # the run's output directory; the benchmark's files go under bench/
    started: float  # monotonic: the timeline's t = 0
    steps: list[SweepStep] = field(default_factory=list)
    timeline: list[SweepPoint] = field(default_factory=list)
    missed_polls: int = 0
    forecaster: Forecaster = field(init=False)

    def __post_init__(self) -> None:
        # Its sizes of finished requests count from the sweep's start, across its steps.
        self.forecaster = Forecaster(
            self.served.client.snapshot(), self.served.startup.kv_cache_tokens
        )

    @property
    def bench_dir(self) -> Path:
        return self.out / "bench" / self.phase.name

    def result(self) -> RateSweepResult:
        phase, exporter = self.phase, self.lab.exporter
        judged = tuple(
            judge_steps(self.steps, phase.saturation, phase.max_concurrency, phase.keep_up)
        )
        return RateSweepResult(
            startup=self.served.startup,
            arrivals=phase.arrivals,
            burstiness=phase.burstiness,
            input_len=phase.input_len,
            output_len=phase.output_len,
            max_concurrency=phase.max_concurrency,
            goodput_slos=dict(phase.goodput),
            keep_up=phase.keep_up,
            steps=judged,
            timeline=tuple(self.timeline),
            knee=find_knee(judged, phase.keep_up),
            forecast=judge_timeline(
                [replace(p.timeline_point(), t=p.t) for p in self.timeline], exporter is not None
            ),
            missed_polls=self.missed_polls,
            exporter=exporter is not None,
            host_cpus=os.cpu_count(),
            bench_command=phase.bench_command,
            slo_file=phase.slo.source if phase.slo else None,
        )

    def _bench(self, name: str, rate: float, requests: int) -> tuple[dict[str, Any], str | None]:
        """`vllm bench serve` at `rate`: its results file read, or what went wrong."""
        phase, served, bench_dir = self.phase, self.served, self.bench_dir
        client = served.client
        try:
            run_bench(
                phase.bench_command,
                bench_args(phase, served.deployed, rate, requests, bench_dir, f"{name}.json"),
                bench_dir / f"{name}.log",
                phase.step_timeout_seconds,
                client.api_key.value if client.api_key else None,
            )
            bench: dict[str, Any] = json.loads((bench_dir / f"{name}.json").read_text())
        except subprocess.TimeoutExpired:
            return {}, f"vllm bench serve ran past step_timeout ({phase.step_timeout_seconds:g}s)"
        except (LabError, OSError, ValueError) as e:
            return {}, str(e)
        return bench, None

    def step(self, index: int, rate: float) -> SweepStep:
        """One step: the benchmark at `rate`, the page polled beside it, the counters
        around it; kept with the others."""
        lab, phase, served = self.lab, self.phase, self.served
        exporter, capacity = lab.exporter, served.startup.kv_cache_tokens
        requests = phase.requests_at(rate)
        lab.progress.status(f"step {index + 1}: {requests} requests at {rate:g} req/s")
        _wait_idle(served, IDLE_TIMEOUT_SECONDS)
        client = served.client
        before = client.snapshot()
        points: list[SweepPoint] = []
        total = float(requests * phase.output_len)

        def on_sample(t: float, snap: Snapshot, latency: float, delay: float) -> None:
            seen = exporter.page() if exporter else None
            now = time.monotonic()
            forecast = self.forecaster.at(now, snap, now - self.started)
            point = sweep_point(
                index, now - self.started, t, before, snap, capacity, forecast, seen
            )
            points.append(point)
            lab.progress.tokens(point.generated_tokens, total)
            lab.progress.status(_point_line(point))

        def on_missed(t: float, error: str) -> None:
            self.missed_polls += 1

        name = f"step-{index + 1:02d}-{rate:g}rps"
        bench_dir = self.bench_dir
        with Sampler(client, phase.poll_seconds, on_sample, on_missed=on_missed):
            bench, error = self._bench(name, rate, requests)
        self.timeline.extend(points)
        view = client_view(bench) if bench else None
        after = client.settled_snapshot(
            before, int(bench.get("total_output_tokens") or 0), view.completed if view else 0
        )
        seconds = view.duration_seconds if view else 0.0
        cpu = derive.cpu_seconds_per_second(
            before.process_cpu_seconds, after.process_cpu_seconds, seconds
        )
        server = server_view(
            increase(before, after, seconds), points, served.startup, lab.peak_bandwidth, cpu
        )
        diff, agree, note = tpot_verdict(view, server)
        model = served.deployed.served_model_name
        judged = (
            slo.goodput(phase.slo, request_outcomes(bench), view.duration_seconds, model)
            if phase.slo and view
            else None
        )
        acts = act_names([p.timeline_point() for p in points], phase.saturation)
        step = SweepStep(
            index=index,
            rate=rate,
            requests=requests,
            bench_file=str((bench_dir / f"{name}.json").relative_to(self.out)) if bench else None,
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
            slo=judged,
        )
        self.steps.append(step)
        return step


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
