"""A step as the client and the server saw it: the benchmark's JSON as seconds, the
counters around the step and each poll of vLLM's page through the derivation core."""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from typing import Any

from vllm_glassbox.core import derive, series, slo
from vllm_glassbox.core import snapshot as s
from vllm_glassbox.core.derive import Increase
from vllm_glassbox.core.own_page import ExporterPage
from vllm_glassbox.core.series import KV_FREE
from vllm_glassbox.core.snapshot import Snapshot
from vllm_glassbox.lab.experiments.pool_forecasts import PoolForecast, exporter_forecast
from vllm_glassbox.lab.experiments.rate_sweep.result import ClientView, ServerView, SweepPoint
from vllm_glassbox.lab.findings import fit_line
from vllm_glassbox.lab.results import Startup
from vllm_glassbox.lab.vllm.client import gauge_max, gauge_total, increase

FREE_TOKENS = KV_FREE.name
#: Fewest requests a step needs for the backlog's growth to mean something.
MIN_JUDGED_REQUESTS = 8


def sweep_point(
    step: int,
    t: float,
    t_step: float,
    baseline: Snapshot,
    now: Snapshot,
    capacity: int | None,
    forecast: PoolForecast,
    exporter: ExporterPage | None = None,
) -> SweepPoint:
    """One poll: the pool, the queue and the forecasts (`forecast`, the derivation core's
    over the lab's polls; the exporter's on its page). The free tokens are each engine's
    pool (`capacity` is one engine's) summed over the engines, as the exporter's
    per-engine series add up; the usage is the fullest pool's, whose acts the timeline
    names."""
    grown = increase(baseline, now, t_step)
    seen = exporter_forecast(exporter) if exporter is not None else PoolForecast()
    return SweepPoint(
        step=step,
        t=t,
        t_step=t_step,
        running=gauge_total(now, s.RUNNING),
        waiting=gauge_total(now, s.WAITING),
        kv_cache_usage=gauge_max(now, s.KV_USAGE),
        preemptions=grown[s.PREEMPTIONS],
        generated_tokens=grown[s.GENERATION_TOKENS],
        headroom_requests=forecast.headroom_requests,
        free_tokens=_sum(
            derive.kv_cache_free_tokens(
                derive.kv_cache_used_tokens(e.gauges.get(s.KV_USAGE), capacity), capacity
            )
            for e in now.engines.values()
        ),
        exporter_headroom_requests=seen.headroom_requests,
        exporter_free_tokens=exporter.totals((FREE_TOKENS,)).get(FREE_TOKENS) if exporter else None,
        headroom_at_completion=forecast.headroom_at_completion,
        exhaustion_seconds=forecast.exhaustion_seconds,
        exporter_headroom_at_completion=seen.headroom_at_completion,
        exporter_exhaustion_seconds=seen.exhaustion_seconds,
    )


def server_view(
    d: Increase,
    points: Sequence[SweepPoint],
    startup: Startup | None,
    peak: float | None,
    api_server_cpu: float | None = None,
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
        api_server_cpu=api_server_cpu,
    )


def _max(values: Any) -> float | None:
    present = [v for v in values if v is not None]
    return max(present) if present else None


def _sum(values: Any) -> float | None:
    present = [v for v in values if v is not None]
    return sum(present) if present else None


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


def _numbers(values: Any) -> list[float | None]:
    return [
        float(v) if isinstance(v, int | float) and not isinstance(v, bool) else None
        for v in (values if isinstance(values, list) else [])
    ]


def request_latencies(bench: Mapping[str, Any]) -> list[float | None] | None:
    """Each request's end-to-end latency: the JSON's `latencies` where the benchmark
    writes them (0.32), else its time to the first token plus its inter-token latencies
    (`ttfts`, `itls`: 0.11 and 0.24 write no `latencies`); None without either."""
    if isinstance(bench.get("latencies"), list):
        return _numbers(bench["latencies"])
    ttfts, itls = bench.get("ttfts"), bench.get("itls")
    if not isinstance(ttfts, list) or not isinstance(itls, list) or len(ttfts) != len(itls):
        return None
    return [_latency(first, gaps) for first, gaps in zip(_numbers(ttfts), itls, strict=True)]


def _latency(first_token: float | None, gaps: Any) -> float | None:
    """One request's latency: its first token's time plus every gap after it."""
    seconds = _numbers(gaps)
    if first_token is None or not isinstance(gaps, list) or None in seconds:
        return None
    return first_token + sum(s for s in seconds if s is not None)


def missing_fields(bench: Mapping[str, Any]) -> tuple[str, ...]:
    """The per-request fields of `--save-detailed` a step needs to be judged and the
    benchmark did not write (vLLM 0.11's JSON has no `start_times`)."""
    missing = [] if isinstance(bench.get("start_times"), list) else ["start_times"]
    if request_latencies(bench) is None:
        missing.append("latencies (or ttfts and itls)")
    return tuple(missing)


def _succeeded(bench: Mapping[str, Any]) -> tuple[list[float], list[float]]:
    """Arrival times and end-to-end latencies of the requests that succeeded."""
    starts = _numbers(bench.get("start_times"))
    latencies = request_latencies(bench) or []
    errors = bench.get("errors") or [""] * len(starts)
    kept = [
        (start, latency)
        for start, latency, error in zip(starts, latencies, errors, strict=False)
        if not error and start is not None and latency is not None
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
        missing_fields=missing_fields(bench),
        error=first_error(bench),
    )


def first_error(bench: Mapping[str, Any]) -> str | None:
    """The first failed request's error as the benchmark wrote it, its last line (a
    traceback ends with the exception)."""
    errors = bench.get("errors")
    for error in errors if isinstance(errors, list) else []:
        if isinstance(error, str) and error.strip():
            return error.strip().splitlines()[-1][:200]
    return None


def _at(values: Sequence[Any], i: int) -> float | None:
    value = values[i] if i < len(values) else None
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def request_outcomes(bench: Mapping[str, Any]) -> list[slo.RequestOutcome]:
    """Each request of the benchmark's JSON (`--save-detailed`), for an SLO file's
    objectives: failed or not, its TTFT and end-to-end latency, its output tokens."""
    errors = bench.get("errors") or []
    ttfts, latencies = bench.get("ttfts") or [], request_latencies(bench) or []
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
