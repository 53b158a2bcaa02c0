"""The phases' arithmetic: pure functions over snapshots, increases and startup logs.

Every per-request number is a function of the derivation core (`exporter/derive.py`);
this module only adds what is the lab's own: the facts of one server start, the
least-squares line through TPOT against weight GiB, the KV-pressure timeline and its
acts, and the speed-up between speculative-decoding runs.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

from vllm_glassbox.exporter import derive
from vllm_glassbox.exporter import snapshot as s
from vllm_glassbox.exporter.derive import Increase
from vllm_glassbox.exporter.model import (
    Weights,
    read_checkpoint_weights,
    resolve_layout,
    resolve_weights,
)
from vllm_glassbox.exporter.snapshot import Snapshot
from vllm_glassbox.exporter.startup_log import read_facts

from .measure import Completion, gauge_max, gauge_total, increase
from .results import (
    GIB,
    Act,
    Fit,
    Prediction,
    RequestStats,
    SpecRunResult,
    Startup,
    TimelinePoint,
    VariantResult,
)

# --- one server start ----------------------------------------------------------------------


def checkpoint_weights(model_dir: str | None) -> Weights | None:
    """Weights from a readable checkpoint directory (safetensors headers, else config)."""
    if not model_dir or not Path(model_dir).is_dir():
        return None
    try:
        return read_checkpoint_weights(model_dir)
    except (OSError, ValueError):
        return None


def startup_facts(
    startup_log: str,
    snapshot: Snapshot | None,
    served_model_name: str,
    startup_seconds: float,
    checkpoint: Callable[[], Weights | None] = lambda: None,
    log_path: str | None = None,
) -> Startup:
    """Weights, KV memory and tokens, blocks and block size of the server just started.

    Weights and the KV pool as the exporter resolves them (the same functions): weights
    from the log (what was loaded, the whole model; absent on CPU), then the checkpoint;
    KV tokens from the cache config, then the log.
    """
    facts = read_facts(startup_log)
    engines = len(snapshot.engines) if snapshot is not None else None
    weights = resolve_weights(None, facts, checkpoint(), resolve_layout(facts, engines=engines))
    cache = None
    if snapshot is not None and snapshot.engines:
        cache = snapshot.cache_for(next(iter(snapshot.engines)))
    kv_tokens = derive.kv_cache_capacity_tokens(cache, facts.kv_cache_tokens)
    kv_memory = facts.kv_cache_memory_bytes
    if kv_memory is None and cache is not None and cache.kv_cache_memory_bytes is not None:
        kv_memory = float(cache.kv_cache_memory_bytes)
    return Startup(
        served_model_name=served_model_name,
        startup_seconds=startup_seconds,
        weights_bytes=weights.bytes if weights else None,
        weights_source=weights.source if weights else None,
        load_seconds=facts.model_load_seconds or facts.weights_load_seconds,
        kv_cache_memory_bytes=kv_memory,
        kv_cache_tokens=kv_tokens,
        kv_cache_blocks=derive.kv_cache_blocks(cache),
        block_size=cache.block_size if cache else None,
        vllm_version=facts.vllm_version,
        log_path=log_path,
    )


# --- requests ------------------------------------------------------------------------------


def request_stats(completions: Sequence[Completion], d: Increase) -> RequestStats:
    """Everything the core derives from the increase around some requests."""
    return RequestStats(
        requests=len(completions),
        prompt_tokens=sum(c.prompt_tokens for c in completions),
        generated_tokens=d[s.GENERATION_TOKENS],
        wall_seconds=sum(c.wall_seconds for c in completions),
        ttft_seconds=derive.time_to_first_token(d),
        tpot_seconds=derive.time_per_output_token(d),
        inter_token_latency_seconds=derive.inter_token_latency(d),
        forward_passes=d[s.ITL_COUNT],
        tokens_per_forward_pass=derive.tokens_per_forward_pass(d),
        decode_seconds=d[s.ITL_SUM],
        # The core has no prefill series; this is vLLM's own histogram mean.
        prefill_seconds=derive.request_prefill_seconds(d),
        engine_steps=d[s.ENGINE_STEPS],
        drafts=d[s.SPEC_DRAFTS],
        draft_tokens=d[s.SPEC_DRAFT_TOKENS],
        accepted_tokens=d[s.SPEC_ACCEPTED],
        acceptance_ratio=derive.spec_acceptance_ratio(d),
        draft_coverage=derive.spec_draft_coverage(d),
    )


# --- quantization --------------------------------------------------------------------------


def fit_line(points: Sequence[tuple[float, float]]) -> tuple[float, float, float | None]:
    """Least squares y = a·x + b: (a, b, R²). Needs two distinct x."""
    n = len(points)
    xs = [p[0] for p in points]
    ys = [p[1] for p in points]
    if n < 2 or len(set(xs)) < 2:
        raise ValueError("a line needs at least two points with different x")
    mean_x, mean_y = sum(xs) / n, sum(ys) / n
    sxx = sum((x - mean_x) ** 2 for x in xs)
    slope = sum((x - mean_x) * (y - mean_y) for x, y in points) / sxx
    intercept = mean_y - slope * mean_x
    ss_res = sum((y - (slope * x + intercept)) ** 2 for x, y in points)
    ss_tot = sum((y - mean_y) ** 2 for y in ys)
    r_squared = (1.0 if ss_res == 0 else None) if ss_tot == 0 else 1.0 - ss_res / ss_tot
    return slope, intercept, r_squared


def fit_tpot(variants: Sequence[VariantResult]) -> tuple[Fit | None, str | None]:
    """TPOT against weight GiB through the `fit` variants; predictions for every variant."""
    measured = [
        (v, v.weights_gib, v.tpot_seconds)
        for v in variants
        if v.weights_gib is not None and v.tpot_seconds is not None
    ]
    points = [(gib, tpot) for v, gib, tpot in measured if v.fit]
    names = tuple(v.name for v, _, _ in measured if v.fit)
    try:
        slope, intercept, r_squared = fit_line(points)
    except ValueError as e:
        return None, f"no fit: {e} (fitted variants measured: {list(names) or 'none'})"
    predictions = []
    for v, gib, tpot in measured:
        predicted = slope * gib + intercept
        predictions.append(
            Prediction(
                name=v.name,
                weights_gib=gib,
                tpot_seconds=tpot,
                predicted_tpot_seconds=predicted,
                error_ratio=predicted / tpot - 1.0,
            )
        )
    return Fit(slope, intercept, r_squared, names, tuple(predictions)), None


# --- KV pressure ---------------------------------------------------------------------------


def timeline_point(t: float, baseline: Snapshot, now: Snapshot) -> TimelinePoint:
    grown = increase(baseline, now, t)
    return TimelinePoint(
        t=t,
        running=gauge_total(now, s.RUNNING),
        waiting=gauge_total(now, s.WAITING),
        kv_cache_usage=gauge_max(now, s.KV_USAGE),
        preemptions=grown[s.PREEMPTIONS],
        generated_tokens=grown[s.GENERATION_TOKENS],
    )


def preemption_jumps(timeline: Sequence[TimelinePoint]) -> list[float]:
    """Preemptions seen by each poll (the first poll: since the flood started)."""
    previous = 0.0
    jumps = []
    for p in timeline:
        jumps.append(derive.counter_increase(previous, p.preemptions))
        previous = p.preemptions
    return jumps


def act_names(timeline: Sequence[TimelinePoint], saturation: float) -> list[str]:
    """The article's acts, poll by poll.

    The pool fills with nobody waiting ("filling"); from the first poll that finds it full
    or requests waiting, "saturated with a queue"; from the first preemption to the last,
    "preemption storm"; after it — or after the pressure ends, if nothing was preempted —
    "draining". A flood that never fills the pool is "pool never full" throughout.
    """
    jumps = preemption_jumps(timeline)
    pressure = [
        (p.waiting or 0) > 0 or (p.kv_cache_usage or 0.0) >= saturation or j > 0
        for p, j in zip(timeline, jumps, strict=True)
    ]
    if not any(pressure):
        return ["pool never full"] * len(timeline)
    first_pressed = pressure.index(True)
    last_pressed = len(pressure) - 1 - pressure[::-1].index(True)
    preempted = [i for i, j in enumerate(jumps) if j > 0]
    names = []
    for i in range(len(timeline)):
        if i < first_pressed:
            names.append("filling")
        elif preempted and preempted[0] <= i <= preempted[-1]:
            names.append("preemption storm")
        elif (preempted and i > preempted[-1]) or i > last_pressed:
            names.append("draining")
        else:
            names.append("saturated with a queue")
    return names


def name_acts(timeline: Sequence[TimelinePoint], saturation: float) -> list[Act]:
    """The timeline cut into its acts, each with its preemptions and peaks."""
    acts: list[Act] = []
    names = act_names(timeline, saturation)
    for point, jump, name in zip(timeline, preemption_jumps(timeline), names, strict=True):
        waiting, usage = point.waiting or 0.0, point.kv_cache_usage or 0.0
        if acts and acts[-1].name == name:
            last = acts[-1]
            acts[-1] = Act(
                name,
                last.start_t,
                point.t,
                last.polls + 1,
                last.preemptions + jump,
                max(last.peak_waiting, waiting),
                max(last.peak_kv_cache_usage, usage),
            )
        else:
            acts.append(Act(name, point.t, point.t, 1, jump, waiting, usage))
    return acts


def first_time(
    timeline: Sequence[TimelinePoint], cond: Callable[[TimelinePoint], bool]
) -> float | None:
    return next((p.t for p in timeline if cond(p)), None)


def _max(values: Sequence[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return max(present) if present else None


def pressure_summary(timeline: Sequence[TimelinePoint], saturation: float) -> dict[str, object]:
    jumps = preemption_jumps(timeline)
    biggest = max(jumps, default=0.0)
    return {
        "acts": tuple(name_acts(timeline, saturation)),
        "max_preemption_jump": biggest,
        "max_preemption_jump_at": timeline[jumps.index(biggest)].t if biggest > 0 else None,
        "preemptions_total": timeline[-1].preemptions if timeline else 0.0,
        "peak_waiting": _max([p.waiting for p in timeline]),
        "peak_kv_cache_usage": _max([p.kv_cache_usage for p in timeline]),
        "first_full_at": first_time(timeline, lambda p: (p.kv_cache_usage or 0) >= saturation),
        "first_waiting_at": first_time(timeline, lambda p: (p.waiting or 0) > 0),
        "first_preemption_at": first_time(timeline, lambda p: p.preemptions > 0),
    }


# --- speculative decoding ------------------------------------------------------------------


def spec_runs(
    runs: Sequence[tuple[str, dict[str, object], bool, RequestStats]],
) -> tuple[list[SpecRunResult], float | None]:
    """Each run's decode speed-up per token against the baseline run; the headline one."""
    baseline = next((stats for _, _, is_base, stats in runs if is_base), None)
    base_tpot = baseline.tpot_seconds if baseline else None
    results = []
    for label, extra, is_base, stats in runs:
        speedup = None
        if not is_base and base_tpot is not None and stats.tpot_seconds:
            speedup = base_tpot / stats.tpot_seconds
        results.append(SpecRunResult(label, dict(extra), is_base, stats, speedup))
    headline = next((r.speedup for r in results if not r.baseline), None)
    return results, headline


def gib(value: float | None) -> float | None:
    return None if value is None else value / GIB
