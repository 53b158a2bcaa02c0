"""The KV-pressure phase against a server: many long requests at once, the pool polled.

The flood is sent all at once; a sampler polls vLLM's page every `poll` seconds for the
pool's usage, the queue and preemptions, from the empty pool to the last answer.
"""

from __future__ import annotations

import concurrent.futures
import threading
import time
from collections.abc import Mapping, Sequence
from concurrent.futures import Future
from typing import Any

from vllm_glassbox.core.snapshot import Snapshot
from vllm_glassbox.lab.experiments.base import PhaseFailed, Services, describe_error
from vllm_glassbox.lab.experiments.kv_pressure.judge import pressure_summary, timeline_point
from vllm_glassbox.lab.experiments.kv_pressure.phase import KvPressurePhase
from vllm_glassbox.lab.experiments.kv_pressure.result import KvPressureResult, MissedPoll
from vllm_glassbox.lab.experiments.pool_acts import TimelinePoint
from vllm_glassbox.lab.experiments.pool_forecasts import (
    Forecaster,
    exporter_forecast,
    judge_timeline,
)
from vllm_glassbox.lab.progress import number_text
from vllm_glassbox.lab.vllm.client import Completion, Sampler, VllmClient


def run(lab: Services, phase: KvPressurePhase) -> KvPressureResult:
    """The flood on one server, polled from the empty pool to the last answer."""
    with lab.segment(phase, "", phase.overrides) as served:
        client = served.client
        model = served.deployed.served_model_name
        bodies = [phase.request.body(model, i=i) for i in range(phase.concurrency)]
        # A short request first: one-time costs of the first request (in vLLM's API
        # server and its kernels) must not hold back the flood's admission.
        lab.warm_up(served, bodies[0], phase.warmup)
        total = float(phase.request.max_tokens * phase.concurrency)
        baseline = client.snapshot()
        timeline: list[TimelinePoint] = []
        missed: list[MissedPoll] = []

        forecaster = Forecaster(baseline, served.startup.kv_cache_tokens)
        exporter = lab.exporter

        def on_sample(t: float, snap: Snapshot, latency: float, delay: float) -> None:
            forecast = forecaster.at(time.monotonic(), snap, t)
            seen = exporter_forecast(exporter.page()) if exporter else None
            point = timeline_point(t, baseline, snap, latency, delay, forecast, seen)
            timeline.append(point)
            lab.progress.tokens(point.generated_tokens, total)
            lab.progress.status(_pressure_line(point))

        def on_missed(t: float, error: str) -> None:
            missed.append(MissedPoll(t, error))
            lab.progress.note(f"  poll at {t:.1f}s failed: {error}")

        lab.progress.status(f"flood of {phase.concurrency} requests")
        started = time.monotonic()
        # The sampler's first poll is the empty pool at t = 0; the flood follows.
        with Sampler(client, phase.poll_seconds, on_sample, on_missed=on_missed):
            done, pending = _flood(client, bodies, phase.timeout_seconds)
        completions = [f.result() for f in done if f.exception() is None]
        errors = [describe_error(e) for f in done if (e := f.exception()) is not None]
        final = client.settled_snapshot(
            baseline, sum(c.completion_tokens for c in completions), len(completions)
        )
        timeline.append(timeline_point(time.monotonic() - started, baseline, final))
        result = KvPressureResult(
            startup=served.startup,
            requests=phase.concurrency,
            completed=len(completions),
            failed=len(errors) + len(pending),
            flood_seconds=time.monotonic() - started,
            timeline=tuple(timeline),
            pressure=pressure_summary(timeline, phase.saturation),
            forecast=judge_timeline(timeline, exporter is not None),
            request_errors=tuple(sorted(set(errors)))[:10],
            poll_seconds=phase.poll_seconds,
            missed_polls=tuple(missed),
            late_polls=sum(
                1
                for p in timeline
                if p.latency_seconds is not None and p.latency_seconds > phase.poll_seconds
            ),
        )
        lab.progress.note(_flood_line(result))
        if pending:
            raise PhaseFailed(
                f"{len(pending)} request(s) still running after "
                f"{phase.timeout_seconds:g}s (timeout)",
                result,
            )
        if errors:
            raise PhaseFailed(f"{len(errors)} request(s) failed: {errors[0]}", result)
        return result


def _flood(
    client: VllmClient, bodies: Sequence[Mapping[str, Any]], timeout: float
) -> tuple[set[Future[Completion]], set[Future[Completion]]]:
    """Every request sent at once: the requests done within `timeout`, and those still
    running (never waited for: restore() stops the server under them)."""
    pool = concurrent.futures.ThreadPoolExecutor(len(bodies), "flood")
    together = threading.Barrier(len(bodies))

    def send(body: Mapping[str, Any]) -> Completion:
        # Sent together, however busy the client's machine: threads that start late
        # found the first requests finished and the pool never full (seen on 2 cores:
        # 12 requests, at most 4 running, no preemption).
        together.wait(timeout=timeout)
        return client.complete(body)

    try:
        futures = [pool.submit(send, b) for b in bodies]
        done, pending = concurrent.futures.wait(futures, timeout)
    finally:
        pool.shutdown(wait=False, cancel_futures=True)
    return done, pending


def _flood_line(result: KvPressureResult) -> str:
    return (
        f"  flood: {result.completed}/{result.requests} done, "
        f"{result.pressure.preemptions_total:g} preemptions, "
        f"largest jump {result.pressure.max_preemption_jump:g} in one poll, "
        f"acts: {' → '.join(a.name for a in result.pressure.acts)}"
    )


def _pressure_line(p: TimelinePoint) -> str:
    usage = "–" if p.kv_cache_usage is None else f"{p.kv_cache_usage:.0%}"
    return (
        f"running {number_text(p.running)}, waiting {number_text(p.waiting)}, KV {usage}, "
        f"preemptions {p.preemptions:g}"
    )
