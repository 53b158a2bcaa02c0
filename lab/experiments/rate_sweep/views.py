"""A step as the client and the server saw it: the benchmark's JSON as seconds, the
counters around the step and each poll of vLLM's page through the derivation core."""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from typing import Any

from vllm_glassbox import slo
from vllm_glassbox.exporter import derive, series
from vllm_glassbox.exporter import snapshot as s
from vllm_glassbox.exporter.derive import Increase
from vllm_glassbox.exporter.snapshot import Snapshot
from vllm_glassbox.lab.experiments.rate_sweep.result import ClientView, ServerView, SweepPoint
from vllm_glassbox.lab.findings import fit_line
from vllm_glassbox.lab.measure import gauge_max, gauge_total, increase
from vllm_glassbox.lab.results import Startup

#: The exporter's series read at every poll: its forecast of the pool. (Not its
#: exhaustion time: beside the lab its window spans the whole segment, not the moment.)
HEADROOM = "glassbox_kv_cache_headroom_requests"
FREE_TOKENS = "glassbox_kv_cache_free_tokens"
#: Fewest requests a step needs for the backlog's growth to mean something.
MIN_JUDGED_REQUESTS = 8


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
    """The step's counters through the derivation core (the exporter's derivation context:
    a mixture-of-experts model's active weights), the polls' peaks beside them."""
    context = series.derivation_context(
        startup.weights if startup else None, peak, startup.tensor_parallel if startup else 1
    )
    weights, tp = context.weights_bytes, context.tensor_parallel
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


def _at(values: Sequence[Any], i: int) -> float | None:
    value = values[i] if i < len(values) else None
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def request_outcomes(bench: Mapping[str, Any]) -> list[slo.RequestOutcome]:
    """Each request of the benchmark's JSON (`--save-detailed`), for an SLO file's
    objectives: failed or not, its TTFT and end-to-end latency, its output tokens."""
    errors = bench.get("errors") or []
    ttfts, latencies = bench.get("ttfts") or [], bench.get("latencies") or []
    tokens = bench.get("output_lens") or []
    return [
        slo.RequestOutcome(
            failed=bool(error),
            ttft_seconds=None if error else _at(ttfts, i),
            e2e_seconds=None if error else _at(latencies, i),
            output_tokens=int(_at(tokens, i) or 0),
        )
        for i, error in enumerate(errors)
    ]
