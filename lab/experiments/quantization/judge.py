"""The quantization numbers and what they mean.

A variant's TPOT is the median of its requests (each from its own increase, by the
derivation core). The line TPOT = a·GiB + b goes through the chosen variants; every
other variant sits on it within a tolerance, above it (slower than its bytes predict) or
below it, with the likely reason; a quantized variant that vLLM loaded at full size is
named and left out; the slope's inverse is the marginal weight-read bandwidth, set
against the hardware's peak.
"""

from __future__ import annotations

from collections.abc import Sequence

from vllm_glassbox.core import derive, series
from vllm_glassbox.core import snapshot as s
from vllm_glassbox.core.derive import Increase, marginal_weight_read_bandwidth
from vllm_glassbox.lab import findings
from vllm_glassbox.lab.analysis import request_stats
from vllm_glassbox.lab.experiments.quantization.phase import Variant
from vllm_glassbox.lab.experiments.quantization.result import (
    ABOVE_LINE,
    BELOW_LINE,
    FITTED,
    FULL_SIZE,
    ON_LINE,
    Bandwidth,
    Fit,
    Prediction,
    Sample,
    VariantResult,
)
from vllm_glassbox.lab.findings import fit_line
from vllm_glassbox.lab.results import Startup
from vllm_glassbox.lab.vllm.client import Completion

#: A quantized variant with at least this share of an unquantized one's weights was
#: loaded at full size (vLLM did not quantize it).
FULL_SIZE_SHARE = 0.90


# --- its arithmetic (derive's numbers) -----------------------------------------------------


def sample(round_index: int, completion: Completion, d: Increase) -> Sample:
    """One measured request, from its own increase."""
    return Sample(
        round=round_index,
        ttft_seconds=derive.time_to_first_token(d),
        tpot_seconds=derive.time_per_output_token(d),
        decode_seconds=d[s.ITL_SUM],
        generated_tokens=d[s.GENERATION_TOKENS],
        wall_seconds=completion.wall_seconds,
    )


def bandwidth(d: Increase, startup: Startup, peak: float | None) -> Bandwidth:
    """The decode step against the hardware, from the core (one GPU's share of the weights
    / mean step time), with the exporter's derivation context (a mixture-of-experts
    model's active weights)."""
    context = series.derivation_context(startup.weights, peak, startup.tensor_parallel)
    weights, tp = context.weights_bytes, context.tensor_parallel
    return Bandwidth(
        weight_read_bytes_per_second=derive.weight_read_bandwidth_per_gpu(d, weights, tp),
        utilization=derive.memory_bandwidth_utilization(d, weights, peak, tp),
        decode_floor_seconds=derive.decode_floor_seconds(weights, peak, tp),
    )


def variant_result(
    variant: Variant,
    startup: Startup,
    measured: Sequence[tuple[int, Completion, Increase]],
    peak: float | None,
) -> VariantResult:
    """A variant from its measured requests (every round): TPOT is their median."""
    total = Increase({}, 0.0)
    for _, _, d in measured:
        total = total.then(d)  # the requests one after another
    samples = tuple(sample(r, c, d) for r, c, d in measured)
    tpot = findings.spread([x.tpot_seconds for x in samples])
    return VariantResult(
        variant.name,
        variant.model,
        variant.fit,
        startup,
        request_stats([c for _, c, _ in measured], total),
        samples=samples,
        tpot=tpot,
        ttft=findings.spread([x.ttft_seconds for x in samples]),
        noisy=findings.is_noisy(tpot),
        bandwidth=bandwidth(total, startup, peak),
    )


# --- what the numbers mean -----------------------------------------------------------------


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
