"""What the measurements mean: pure judgements that results.json and the report share.

Every number here is computed once and stored in the results; the report only words it.
The per-request numbers themselves come from the derivation core (`exporter/derive.py`);
this module adds the lab's own arithmetic over many of them:

- the spread of repeated measurements (median, extremes) and when it says "noisy";
- the line TPOT = a·GiB + b through the chosen variants, where every other variant sits
  against it (on the line within a tolerance, above or below it, and the likely reason),
  the bandwidth its slope implies against the hardware's peak, and quantized variants
  that vLLM loaded at full size;
- the KV-pressure timeline cut into the article's acts, each named only where its
  condition holds, and the gaps between polls;
- speculative decoding: which runs speculated, a baseline that drafted (no baseline), the
  speed-ups, and how the running vLLM treats a repetition penalty;
- agreement between the exporter's live series and the lab's numbers.
"""

from __future__ import annotations

import itertools
import statistics
from collections.abc import Callable, Sequence

from vllm_glassbox.exporter.derive import counter_increase, marginal_weight_read_bandwidth
from vllm_glassbox.lab.results import (
    ABOVE_LINE,
    BELOW_LINE,
    FITTED,
    FULL_SIZE,
    ON_LINE,
    Act,
    Fit,
    Prediction,
    RequestStats,
    SpecRunResult,
    Spread,
    TimelinePoint,
    VariantResult,
)

#: Repetitions further apart than this (relative to their median) mean a noisy machine.
NOISY_SPREAD = 0.10
#: A quantized variant with at least this share of an unquantized one's weights was
#: loaded at full size (vLLM did not quantize it).
FULL_SIZE_SHARE = 0.90
#: The exporter and the lab agree when their values differ by at most this ratio.
AGREEMENT = 0.01

# --- repeated measurements ------------------------------------------------------------------


def spread(values: Sequence[float | None]) -> Spread | None:
    """Median and extremes of the measured values (None ones were not measurable)."""
    present = [v for v in values if v is not None]
    if not present:
        return None
    return Spread(statistics.median(present), min(present), max(present), len(present))


def is_noisy(measured: Spread | None) -> bool:
    relative = measured.relative if measured else None
    return measured is not None and measured.n > 1 and (relative or 0.0) > NOISY_SPREAD


# --- the line through TPOT against weights ----------------------------------------------------


def fit_line(points: Sequence[tuple[float, float]]) -> tuple[float, float, float | None]:
    """Least squares y = a·x + b: (a, b, R²). Needs two distinct x.

    R² is None through two distinct x (any two points lie on a line: it would always be 1)
    and when every y is the same.
    """
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
    r_squared = None if len(set(xs)) < 3 or ss_tot == 0 else 1.0 - ss_res / ss_tot
    return slope, intercept, r_squared


def full_size_variants(variants: Sequence[VariantResult]) -> dict[str, str]:
    """Quantized variants that vLLM loaded at full size: name -> what they match.

    vLLM may serve a quantized checkpoint unquantized (a GPTQ folder whose quantized
    modules it cannot find): same weights, same KV pool as BF16. Such a variant is no
    point of the line. Its weights are compared with its own shape at 16 bits when the
    lab can read its config ("its 16-bit size"); else with the unquantized variants of
    the phase, taken to be the same model in another precision (as in a plan comparing
    precisions of one model).
    """
    weights = {
        v.name: (v.startup.weights_bytes, v.startup.quantization, v.startup.unquantized_bytes)
        for v in variants
        if v.startup and v.startup.weights_bytes
    }
    plain = sorted(
        ((size, name) for name, (size, quantized, _) in weights.items() if not quantized),
        reverse=True,
    )
    out: dict[str, str] = {}
    for name, (size, quantized, full) in weights.items():
        if not quantized:
            continue
        if full is not None:
            if size >= FULL_SIZE_SHARE * full:
                out[name] = "its 16-bit size"
            continue
        match = next((p for s, p in plain if size >= FULL_SIZE_SHARE * s), None)
        if match is not None:
            out[name] = match
    return out


def off_line_reason(variant: VariantResult, slower: bool) -> str:
    """The likely reason a variant sits off the line, from what is known about it."""
    reasons = []
    quantization = variant.startup.quantization if variant.startup else None
    if slower and quantization:
        reasons.append(
            f"its decode step is not bound by weight reads: dequantizing {quantization} "
            "weights costs compute (compute-bound kernels, as FP8 was on the L40S)"
        )
    elif slower:
        reasons.append(
            "something besides reading its weights limits its decode step (compute, or "
            "other work on the machine)"
        )
    elif quantization:
        reasons.append(
            f"its {quantization} kernels read less per step than its weights count, or "
            "part of its weights stays in cache"
        )
    else:
        reasons.append(
            "part of its weights stays in cache, or its weight figure overstates what a "
            "decode step reads"
        )
    if variant.noisy and variant.tpot and variant.tpot.relative is not None:
        reasons.append(f"its requests varied by {variant.tpot.relative:.0%}: the machine was noisy")
    return "; ".join(reasons)


def fit_tpot(
    variants: Sequence[VariantResult],
    tolerance: float = 0.10,
    peak_bandwidth: float | None = None,
) -> tuple[Fit | None, str | None]:
    """TPOT against weight GiB through the `fit` variants; where every variant sits."""
    full_size = full_size_variants(variants)
    measured = [
        (v, v.weights_gib, v.tpot_seconds)
        for v in variants
        if v.weights_gib is not None and v.tpot_seconds is not None
    ]
    fitted = [(v, gib, tpot) for v, gib, tpot in measured if v.fit and v.name not in full_size]
    excluded = tuple(v.name for v, _, _ in measured if v.fit and v.name in full_size)
    names = tuple(v.name for v, _, _ in fitted)
    try:
        slope, intercept, r_squared = fit_line([(gib, tpot) for _, gib, tpot in fitted])
    except ValueError as e:
        return None, f"no fit: {e} (fitted variants measured: {list(names) or 'none'})"
    predictions = []
    for v, gib, tpot in measured:
        predicted = slope * gib + intercept
        error = predicted / tpot - 1.0
        verdict, reason = FITTED, None
        if v.name in full_size:
            verdict = FULL_SIZE
            like = full_size[v.name]
            like_words = like if like == "its 16-bit size" else f"{like}'s"
            reason = (
                f"its weights ({gib:.3g} GiB) are as large as {like_words}: vLLM did not "
                f"quantize it ({v.startup.quantization if v.startup else '?'}), so its TPOT "
                "and KV pool are those of the unquantized model — not a point of the line"
            )
        elif v.name not in names:
            if abs(error) <= tolerance:
                verdict = ON_LINE
            else:
                slower = error < 0  # the line predicted less time than it took
                verdict = ABOVE_LINE if slower else BELOW_LINE
                reason = off_line_reason(v, slower)
        predictions.append(Prediction(v.name, gib, tpot, predicted, error, verdict, reason))
    implied = marginal_weight_read_bandwidth(slope)
    exceeds = None
    if implied is not None and peak_bandwidth is not None:
        exceeds = implied > peak_bandwidth
    return (
        Fit(
            slope,
            intercept,
            r_squared,
            names,
            tuple(predictions),
            tolerance,
            implied,
            peak_bandwidth,
            exceeds,
            excluded,
            intercept_share(intercept, [(gib, tpot) for _, gib, tpot in fitted]),
        ),
        None,
    )


def above_peak(utilization: float | None) -> bool:
    """Weights read faster than the hardware's peak: impossible for a right weights figure,
    layout and peak."""
    return utilization is not None and utilization > 1.0


def intercept_share(intercept: float, fitted: Sequence[tuple[float, float]]) -> float | None:
    """The intercept's share of the largest fitted variant's TPOT (weights GiB, TPOT)."""
    largest = max(fitted, default=None)
    return intercept / largest[1] if largest is not None and largest[1] > 0 else None


# --- KV pressure -----------------------------------------------------------------------------

FILLING = "filling"
QUEUE_BEFORE_FULL = "queue before the pool is full"
SATURATED = "saturated with a queue"
FULL_NOBODY_WAITING = "full, nobody waiting"
STORM = "preemption storm"
DRAINING = "draining"
NEVER_FULL = "pool never full"

#: Each act's condition, as the report states it.
ACT_CONDITIONS = {
    FILLING: "nobody waits; the pool grows (it may reach full)",
    QUEUE_BEFORE_FULL: "requests wait although the pool has not been full yet (an "
    "admission backlog, not the pool)",
    SATURATED: "requests wait, and the pool is full or has been (their KV does not fit)",
    FULL_NOBODY_WAITING: "the queue emptied while the pool stays full, before any preemption",
    STORM: "from the first poll that counted preemptions to the last",
    DRAINING: "no more preemptions or queue: the running requests finish",
    NEVER_FULL: "the pool never filled and nobody waited",
}

#: The article's three acts, in order.
THREE_ACTS = (FILLING, SATURATED, STORM)


def preemption_jumps(timeline: Sequence[TimelinePoint]) -> list[float]:
    """Preemptions seen by each poll (the first poll: since the flood started)."""
    previous = 0.0
    jumps = []
    for p in timeline:
        jumps.append(counter_increase(previous, p.preemptions))
        previous = p.preemptions
    return jumps


def act_names(timeline: Sequence[TimelinePoint], saturation: float) -> list[str]:
    """The act of each poll, named only where its condition holds (ACT_CONDITIONS).

    vLLM counts a preemption when the preempted request runs again, so requests queue at
    a full pool before the count moves: the storm follows the queue.
    """
    jumps = preemption_jumps(timeline)
    waiting = [(p.waiting or 0) > 0 for p in timeline]
    full = [(p.kv_cache_usage or 0.0) >= saturation for p in timeline]
    preempted = [i for i, j in enumerate(jumps) if j > 0]
    if not preempted and not any(waiting) and not any(full):
        return [NEVER_FULL] * len(timeline)
    storm = (preempted[0], preempted[-1]) if preempted else None
    names = []
    ever_full = False
    for i in range(len(timeline)):
        ever_full = ever_full or full[i]
        if storm and storm[0] <= i <= storm[1]:
            names.append(STORM)
        elif storm and i > storm[1]:
            names.append(DRAINING)
        elif waiting[i]:
            names.append(SATURATED if ever_full else QUEUE_BEFORE_FULL)
        elif any(waiting[:i]):
            queue_again = any(waiting[i + 1 :]) or storm is not None
            names.append(
                DRAINING if not queue_again else FULL_NOBODY_WAITING if ever_full else FILLING
            )
        else:
            names.append(FILLING)
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


def missing_acts(acts: Sequence[Act]) -> list[str]:
    """Which of the article's three acts did not happen, in their order. The first act
    counts only when it opens the flood (before anything waited)."""
    names = [a.name for a in acts]
    missing = []
    if not names or names[0] != FILLING:
        missing.append(FILLING)
    missing += [act for act in THREE_ACTS[1:] if act not in names]
    return missing


def largest_gap(timeline: Sequence[TimelinePoint]) -> tuple[float | None, float | None]:
    """The longest time between two consecutive polls' pages, and when the page that
    ended it came."""
    gaps = [(b.t - a.t, b.t) for a, b in itertools.pairwise(timeline)]
    gap, at = max(gaps, default=(None, None))
    return gap, at


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
    acts = tuple(name_acts(timeline, saturation))
    return {
        "acts": acts,
        "missing_acts": tuple(missing_acts(acts)),
        "max_preemption_jump": biggest,
        "max_preemption_jump_at": timeline[jumps.index(biggest)].t if biggest > 0 else None,
        "preemptions_total": timeline[-1].preemptions if timeline else 0.0,
        "peak_waiting": _max([p.waiting for p in timeline]),
        "peak_kv_cache_usage": _max([p.kv_cache_usage for p in timeline]),
        "first_full_at": first_time(timeline, lambda p: (p.kv_cache_usage or 0) >= saturation),
        "first_waiting_at": first_time(timeline, lambda p: (p.waiting or 0) > 0),
        "first_preemption_at": first_time(timeline, lambda p: p.preemptions > 0),
        "max_gap_seconds": largest_gap(timeline)[0],
        "max_gap_ended_at": largest_gap(timeline)[1],
    }


# --- speculative decoding ------------------------------------------------------------------


def run_finding(stats: RequestStats, speculation: bool) -> str:
    """Whether a run speculated, in words."""
    if not speculation:
        return "no speculation (server without --speculative-config)"
    if stats.drafts <= 0:
        return f"speculation bypassed: no draft in {stats.forward_passes:g} decode steps"
    coverage = f"{stats.draft_coverage:.0%}" if stats.draft_coverage is not None else "–"
    accepted = f"{stats.acceptance_ratio:.0%}" if stats.acceptance_ratio is not None else "–"
    return f"speculated on {coverage} of decode steps, {accepted} of draft tokens accepted"


def baseline_problem(baseline: RequestStats) -> str | None:
    """A baseline that drafted is no baseline: its speed-ups would compare speculation
    with speculation."""
    if baseline.drafts <= 0:
        return None
    coverage = (
        f" ({baseline.draft_coverage:.0%} of its decode steps)"
        if baseline.draft_coverage is not None
        else ""
    )
    return (
        f"the baseline drafted {baseline.drafts:g} times{coverage}: it speculated, so it is "
        "no baseline; no speed-up is given"
    )


def spec_runs(
    runs: Sequence[tuple[str, dict[str, object], bool, bool, RequestStats, Spread | None]],
) -> tuple[list[SpecRunResult], float | None, str | None]:
    """Each run's decode speed-up per token against the baseline (when it is one): the
    runs, the headline speed-up, and why there is none."""
    baseline = next(((stats, tpot) for _, _, is_base, _, stats, tpot in runs if is_base), None)
    problem = baseline_problem(baseline[0]) if baseline else "no baseline run"
    base_tpot = None
    if baseline is not None and problem is None:
        base_tpot = baseline[1].median if baseline[1] else baseline[0].tpot_seconds
    results = []
    for label, extra, is_base, speculation, stats, tpot in runs:
        run_tpot = tpot.median if tpot else stats.tpot_seconds
        speedup = None
        if not is_base and base_tpot is not None and run_tpot:
            speedup = base_tpot / run_tpot
        results.append(
            SpecRunResult(
                label,
                dict(extra),
                is_base,
                stats,
                speedup,
                speculation,
                tpot,
                run_finding(stats, speculation),
            )
        )
    headline = next((r.speedup for r in results if not r.baseline and r.speculation), None)
    return results, headline, problem


def penalty_finding(
    runs: Sequence[SpecRunResult], default_penalty: float | None, version: str | None
) -> str | None:
    """How the running vLLM treats speculation for a request with a repetition penalty
    (v0.11 skipped speculation for such requests)."""
    for r in runs:
        penalty = r.extra.get("repetition_penalty", default_penalty)
        if not r.speculation or not isinstance(penalty, int | float) or penalty == 1.0:
            continue
        where = "the request's" if "repetition_penalty" in r.extra else "the model's default"
        vllm = f"vLLM {version}" if version else "this vLLM"
        if r.stats.drafts > 0:
            return (
                f"{vllm} speculates under a repetition penalty: run '{r.label}' "
                f"({where} {penalty:g}) drafted {r.stats.drafts:g} times in "
                f"{r.stats.forward_passes:g} decode steps (v0.11 skipped speculation for "
                "such requests)"
            )
        return (
            f"{vllm} skips speculation under a repetition penalty, as v0.11 did: run "
            f"'{r.label}' ({where} {penalty:g}) drafted nothing in "
            f"{r.stats.forward_passes:g} decode steps"
        )
    return None


# --- the exporter against the lab ------------------------------------------------------------


def difference(exporter: float | None, lab: float | None) -> float | None:
    """exporter / lab − 1; None when either is unknown or the lab's is 0."""
    if exporter is None or lab is None or lab == 0:
        return None
    return exporter / lab - 1.0


def agree(exporter: float | None, lab: float | None) -> bool | None:
    d = difference(exporter, lab)
    if d is None:
        return None if exporter is None or lab is None else exporter == lab
    return abs(d) <= AGREEMENT
