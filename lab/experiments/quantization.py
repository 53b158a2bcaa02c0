"""The quantization experiment: decode time per token against the bytes of the weights.

Each variant (a model, maybe quantized, with its flags) is served by a server of its own,
warmed up and measured request by request, round after round with the order reversed
each round. TPOT is the median of a variant's requests. The line TPOT = a·GiB + b goes
through the chosen variants; every other variant sits on it within a tolerance, above it
(slower than its bytes predict) or below it, with the likely reason; a quantized variant
that vLLM loaded at full size is named and left out; the slope's inverse is the marginal
weight-read bandwidth, set against the hardware's peak (`derive`).

The phase's YAML, its run, its result (results.json: `variants[]`, `fit`), its section
of report.md and its plot.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence, Set
from dataclasses import asdict, dataclass, field, replace
from typing import TYPE_CHECKING

from vllm_glassbox.exporter import derive
from vllm_glassbox.exporter import snapshot as s
from vllm_glassbox.exporter.derive import Increase, marginal_weight_read_bandwidth
from vllm_glassbox.lab import findings
from vllm_glassbox.lab.analysis import request_stats
from vllm_glassbox.lab.backend import FlagOverrides
from vllm_glassbox.lab.experiments.base import STOPPED, Experiment, PhaseFailed, describe_error
from vllm_glassbox.lab.findings import fit_line
from vllm_glassbox.lab.measure import Completion
from vllm_glassbox.lab.plan_yaml import (
    MISSING,
    Node,
    Request,
    boolean,
    count,
    positive_int,
    ratio,
    read_flags,
    read_request,
    text,
    unique,
)
from vllm_glassbox.lab.report_format import (
    error_block,
    first_line,
    gbs,
    integer,
    ms,
    num,
    percent,
    plot_name,
    png,
    pyplot,
    table,
)
from vllm_glassbox.lab.results import (
    JSON,
    PhaseResult,
    RequestStats,
    Spread,
    Startup,
    startup_json,
)
from vllm_glassbox.units import GIB

if TYPE_CHECKING:
    from vllm_glassbox.lab.runner import Lab

KIND = "quantization"
#: The article's run (SPEC §1).
QUANTIZATION_PROMPT = "Kubernetes is"
#: A quantized variant with at least this share of an unquantized one's weights was
#: loaded at full size (vLLM did not quantize it).
FULL_SIZE_SHARE = 0.90

# --- the phase ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Variant:
    name: str
    model: str
    flags: FlagOverrides
    fit: bool  # a point the TPOT-vs-weights line is fitted through


@dataclass(frozen=True)
class QuantizationPhase:
    name: str
    flags: FlagOverrides
    request: Request
    variants: tuple[Variant, ...]
    warmup: int  # unmeasured requests after each server start
    requests: int  # measured requests per variant and round (TPOT: their median)
    rounds: int  # every variant started and measured once per round, the order reversed
    tolerance: float  # a predicted variant within this error ratio is on the line
    kind: str = KIND

    def order(self) -> list[tuple[int, Variant]]:
        """(round, variant) in the order they run: A B C, C B A, A B C…, so that a drift
        of the machine over the run does not land on one variant."""
        out: list[tuple[int, Variant]] = []
        for r in range(self.rounds):
            out += [(r, v) for v in (self.variants if r % 2 == 0 else self.variants[::-1])]
        return out

    @property
    def server_starts(self) -> int:
        """A variant that ends one round begins the next: the backends keep its server
        (the same args), so each turn of the rounds costs one start less."""
        if not self.variants:
            return 0
        return len(self.variants) * self.rounds - (self.rounds - 1)

    def models(self) -> list[tuple[str, str]]:
        return [(f"variants[{j}].model", v.model) for j, v in enumerate(self.variants)]

    def without_models(self, models: Set[str]) -> tuple[QuantizationPhase, list[str]]:
        kept = tuple(v for v in self.variants if v.model not in models)
        dropped = [v.name for v in self.variants if v.model in models]
        return replace(self, variants=kept), dropped

    def describe(self) -> str:
        fitted = [v.name for v in self.variants if v.fit]
        return (
            f"{len(self.variants)} variants × {self.rounds} round(s), "
            f"{self.warmup} warm-up + {self.requests} measured request(s) each; "
            f"line through {', '.join(fitted)}, on it within ±{self.tolerance:.0%}"
        )


def _variant(node: Node) -> Variant:
    return Variant(
        name=node.get("name", text),
        model=node.get("model", text),
        flags=read_flags(node, "flags"),
        fit=node.get("fit", boolean, False),
    )


def parse(node: Node, name: str) -> QuantizationPhase:
    """The phase from its YAML, the article's run as defaults."""
    request = read_request(node, QUANTIZATION_PROMPT, 128, 0.0)
    variants = node.each("variants", _variant)
    if not variants and node.raw("variants") is not MISSING:
        node.problem("variants", "needs at least one variant")
    elif node.raw("variants") is MISSING:
        node.problem("variants", "required")
    unique(node, "variants", [v.name for v in variants])
    if not any(v.fit for v in variants):  # no point chosen: fit through every variant
        variants = [Variant(v.name, v.model, v.flags, True) for v in variants]
    return QuantizationPhase(
        name=name,
        flags=read_flags(node, "flags"),
        request=request,
        variants=tuple(variants),
        warmup=node.get("warmup", count, 1),
        requests=node.get("requests", positive_int, 3),
        rounds=node.get("rounds", positive_int, 1),
        tolerance=node.get("tolerance", ratio, 0.10),
    )


# --- what it found -------------------------------------------------------------------------


@dataclass(frozen=True)
class Sample:
    """One measured request: what its own increase says."""

    round: int
    ttft_seconds: float | None
    tpot_seconds: float | None
    decode_seconds: float
    generated_tokens: float
    wall_seconds: float


@dataclass(frozen=True)
class Bandwidth:
    """A variant's decode step against the hardware: weights / step time, vs the peak."""

    weight_read_bytes_per_second: float | None
    utilization: float | None  # of the peak
    decode_floor_seconds: float | None  # weights / peak


@dataclass(frozen=True)
class VariantResult:
    name: str
    model: str
    fit: bool
    startup: Startup | None = None
    stats: RequestStats | None = None  # over every measured request (their increases summed)
    error: str | None = None
    samples: tuple[Sample, ...] = ()
    tpot: Spread | None = None  # over the samples
    ttft: Spread | None = None
    noisy: bool = False  # the TPOT spread is large: the machine was busy with other work
    bandwidth: Bandwidth | None = None

    @property
    def weights_gib(self) -> float | None:
        return self.startup.weights_gib if self.startup else None

    @property
    def tpot_seconds(self) -> float | None:
        return self.tpot.median if self.tpot else None

    def to_json(self) -> JSON:
        stats = asdict(self.stats) if self.stats else {}
        return {
            "name": self.name,
            "model": self.model,
            "fit": self.fit,
            "error": self.error,
            **(startup_json(self.startup)),
            **stats,
            # The medians over the requests (SPEC §6), the extremes beside them.
            "ttft_seconds": self.ttft.median if self.ttft else None,
            "tpot_seconds": self.tpot_seconds,
            "tpot_seconds_min": self.tpot.low if self.tpot else None,
            "tpot_seconds_max": self.tpot.high if self.tpot else None,
            "tpot_spread_ratio": self.tpot.relative if self.tpot else None,
            "noisy": self.noisy,
            "samples": [asdict(s) for s in self.samples],
            "weight_read_bandwidth_bytes_per_second": (
                self.bandwidth.weight_read_bytes_per_second if self.bandwidth else None
            ),
            "memory_bandwidth_utilization_ratio": (
                self.bandwidth.utilization if self.bandwidth else None
            ),
            "decode_floor_seconds": self.bandwidth.decode_floor_seconds if self.bandwidth else None,
        }


# Where a measured variant sits against the fitted line.
FITTED = "fitted"
ON_LINE = "on the line"
ABOVE_LINE = "above the line"  # slower than its bytes predict
BELOW_LINE = "below the line"  # faster than its bytes predict
FULL_SIZE = "loaded at full size"  # meant to be quantized, loaded as large as unquantized


@dataclass(frozen=True)
class Prediction:
    name: str
    weights_gib: float
    tpot_seconds: float  # measured (median)
    predicted_tpot_seconds: float
    error_ratio: float  # predicted / measured − 1
    verdict: str = FITTED  # FITTED, ON_LINE, ABOVE_LINE, BELOW_LINE or FULL_SIZE
    reason: str | None = None  # why it is off the line, in words


@dataclass(frozen=True)
class Fit:
    """TPOT = slope · GiB + intercept, least squares through the fitted variants."""

    slope_seconds_per_gib: float
    intercept_seconds: float
    r_squared: float | None  # None through two points (always 1) or equal TPOTs
    fitted: tuple[str, ...]
    predictions: tuple[Prediction, ...]
    tolerance: float = 0.10  # |error ratio| within which a variant is on the line
    #: The slope read as a bandwidth (`derive.marginal_weight_read_bandwidth`): what one
    #: more byte of weights costs per step — not the exporter's per-GPU bandwidth from the
    #: mean step, and not a bandwidth at all when much of a step is not weight reads
    #: (see exceeds_peak).
    marginal_bandwidth_bytes_per_second: float | None = None
    peak_bandwidth_bytes_per_second: float | None = None
    #: The slope implies more than the hardware can read: not a bandwidth.
    exceeds_peak: bool | None = None
    excluded: tuple[str, ...] = ()  # marked `fit` but not usable (loaded at full size)
    #: The intercept's share of the largest fitted variant's TPOT: how much of a decode
    #: step is not weight reads.
    intercept_share: float | None = None

    def to_json(self) -> JSON:
        return {
            **asdict(self),
            "fitted": list(self.fitted),
            "excluded": list(self.excluded),
            "points": len(self.fitted),
        }


@dataclass(frozen=True)
class QuantizationResult:
    variants: tuple[VariantResult, ...]
    fit: Fit | None
    fit_problem: str | None  # why there is no fit
    #: Variants meant to be quantized but loaded as large as an unquantized one: name ->
    #: the unquantized variant they match.
    full_size: Mapping[str, str] = field(default_factory=dict)
    rounds: int = 1

    def to_json(self) -> JSON:
        return {
            "variants": [
                {**v.to_json(), "full_size_of": self.full_size.get(v.name)} for v in self.variants
            ],
            "fit": self.fit.to_json() if self.fit else None,
            "fit_problem": self.fit_problem,
            "rounds": self.rounds,
        }


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
    / mean step time)."""
    weights, tp = startup.weights_bytes, startup.tensor_parallel
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


# --- the run -------------------------------------------------------------------------------


def run(lab: Lab, phase: QuantizationPhase) -> QuantizationResult:
    """Every variant on a server of its own, round after round; a variant that fails
    is recorded and the others still run."""
    measured: dict[str, list[tuple[int, Completion, Increase]]] = {
        v.name: [] for v in phase.variants
    }
    startups: dict[str, Startup] = {}
    errors: dict[str, list[str]] = {v.name: [] for v in phase.variants}
    for round_index, v in phase.order():
        overrides = {**phase.flags, "--model": v.model, **v.flags}
        label = v.name if phase.rounds == 1 else f"{v.name} (round {round_index + 1})"
        try:
            with lab.segment(phase, label, overrides) as served:
                body = phase.request.body(served.deployed.served_model_name)
                lab.warm_up(served, body, phase.warmup)
                this_round = [
                    (round_index, m.completions[0], m.increase)
                    for m in lab.measure_each(served, [body] * phase.requests)
                ]
                measured[v.name] += this_round
                startups.setdefault(v.name, served.startup)
                tpot = findings.spread([sample(*m).tpot_seconds for m in this_round])
                lab.progress.note(f"  {label}: TPOT {_spread_line(tpot)}")
        except STOPPED:
            raise
        except Exception as e:  # the other variants still run
            lab.progress.note(f"✗ {phase.name} › {label}: {describe_error(e)}")
            prefix = f"round {round_index + 1}: " if phase.rounds > 1 else ""
            errors[v.name].append(prefix + describe_error(e))
    variants: list[VariantResult] = []
    for v in phase.variants:
        error = "\n".join(errors[v.name]) or None
        if measured[v.name]:
            done = variant_result(v, startups[v.name], measured[v.name], lab.peak_bandwidth)
            variants.append(replace(done, error=error))
        else:
            variants.append(VariantResult(v.name, v.model, v.fit, error=error))
    fit, problem = fit_tpot(variants, phase.tolerance, lab.peak_bandwidth)
    result = QuantizationResult(
        tuple(variants), fit, problem, full_size_variants(variants), phase.rounds
    )
    if all(not measured[v.name] for v in phase.variants):
        raise PhaseFailed("every variant failed", result)
    return result


def _spread_line(sp: Spread | None) -> str:
    if sp is None:
        return "–"
    return f"{sp.median * 1000:.3g} ms (median of {sp.n}, {sp.low * 1000:.3g}–{sp.high * 1000:.3g})"


# --- the report ----------------------------------------------------------------------------


def summary(q: QuantizationResult) -> str | None:
    """The line, where the variants sit against it, and the noise; none without a line."""
    fit = q.fit
    if fit is None:
        return None
    parts = [f"{_line_words(fit)}; {_bandwidth_words(fit)}."]
    by_verdict: dict[str, list[str]] = {}
    for p in fit.predictions:
        if p.verdict == ON_LINE:
            by_verdict.setdefault(ON_LINE, []).append(
                f"{p.name} ({percent(p.error_ratio, signed=True)})"
            )
        elif p.verdict in (ABOVE_LINE, BELOW_LINE):
            slower = p.verdict == ABOVE_LINE
            factor = p.tpot_seconds / p.predicted_tpot_seconds if slower else None
            how = (
                f"{factor:.2g}× slower than its bytes predict"
                if factor
                else f"faster than its bytes predict ({percent(p.error_ratio, signed=True)})"
            )
            by_verdict.setdefault("off", []).append(f"{p.name} {how} — {p.reason}")
        elif p.verdict == FULL_SIZE:
            by_verdict.setdefault(FULL_SIZE, []).append(f"{p.name}: {p.reason}")
    if ON_LINE in by_verdict:
        parts.append(f"On the line (±{fit.tolerance:.0%}): {', '.join(by_verdict[ON_LINE])}.")
    if "off" in by_verdict:
        parts.append("Off the line: " + "; ".join(by_verdict["off"]) + ".")
    if FULL_SIZE in by_verdict:
        parts.append("Loaded at full size: " + "; ".join(by_verdict[FULL_SIZE]) + ".")
    noisy = [v for v in q.variants if v.noisy]
    if noisy:
        parts.append(
            "The machine was noisy: "
            + ", ".join(
                f"{v.name}'s requests varied by {percent(v.tpot.relative if v.tpot else None)}"
                for v in noisy
            )
            + "."
        )
    kv = [v.startup.kv_cache_tokens for v in q.variants if v.startup and v.startup.kv_cache_tokens]
    if len(set(kv)) > 1:
        parts.append(f"KV pool from {min(kv):,} to {max(kv):,} tokens.")
    return " ".join(parts)


def _line_words(fit: Fit) -> str:
    points = (
        "two points: no R²"
        if fit.r_squared is None and len(fit.fitted) == 2
        else f"R² {num(fit.r_squared, 4)}"
    )
    return (
        f"TPOT = {fit.slope_seconds_per_gib * 1000:.3g} ms/GiB × weights + "
        f"{fit.intercept_seconds * 1000:.3g} ms through {', '.join(fit.fitted)} ({points})"
    )


def _bandwidth_words(fit: Fit) -> str:
    implied = fit.marginal_bandwidth_bytes_per_second
    if implied is None:
        return "the slope implies no bandwidth (it is not positive)"
    if fit.exceeds_peak:
        share = fit.intercept_share
        return (
            f"the slope would mean weights read at {gbs(implied)}, more than the peak "
            f"{gbs(fit.peak_bandwidth_bytes_per_second)}: **not a bandwidth** — much of a "
            "decode step here is not weight reads (the intercept is "
            + (f"{share:.0%} of the largest variant's TPOT" if share is not None else "large")
            + "); the achieved bandwidth of each variant is in its row"
        )
    of_peak = (
        f", {implied / fit.peak_bandwidth_bytes_per_second:.0%} of the peak "
        f"{gbs(fit.peak_bandwidth_bytes_per_second)}"
        if fit.peak_bandwidth_bytes_per_second
        else " (no peak known to compare with)"
    )
    return f"its slope implies weights read at {gbs(implied)}{of_peak}"


def _variant_note(v: VariantResult, q: QuantizationResult) -> str:
    notes = []
    if above_peak(v.bandwidth.utilization if v.bandwidth else None):
        notes.append("reads faster than the peak: its weights figure or the peak is wrong")
    if v.name in q.full_size:
        notes.append(f"loaded at full size (like {q.full_size[v.name]})")
    if v.noisy:
        notes.append("noisy")
    if v.error:
        notes.append(f"failed: {first_line(v.error)}")
    return "; ".join(notes)


def section(phase: PhaseResult, q: QuantizationResult) -> list[str]:
    first = next((v for v in q.variants if v.startup and v.stats), None)
    requests = max((len(v.samples) for v in q.variants), default=0)
    rows = []
    for v in q.variants:
        st, rq = v.startup, v.stats
        if st is None or rq is None:
            rows.append([v.name, f"`{v.model}`", *["–"] * 13, _variant_note(v, q)])
            continue
        base_st = first.startup if first else None
        base = first.tpot_seconds if first else None
        bw = v.bandwidth
        rows.append(
            [
                v.name + (" (fit)" if v.fit else ""),
                f"`{v.model}`",
                f"{num(st.weights_gib)} ({st.weights_source or '?'})",
                st.quantization or "–",
                num(st.load_seconds),
                num(st.kv_cache_memory_bytes, scale=1 / GIB),
                integer(st.kv_cache_tokens),
                f"{integer(st.kv_cache_blocks)} × {integer(st.block_size)}",
                ms(v.ttft),
                ms(v.tpot),
                percent(v.tpot.relative if v.tpot else None),
                gbs(bw.weight_read_bytes_per_second if bw else None),
                percent(bw.utilization if bw else None),
                _times(st.weights_bytes, base_st.weights_bytes if base_st else None)
                + " / "
                + _times(st.kv_cache_tokens, base_st.kv_cache_tokens if base_st else None)
                + " / "
                + _times(v.tpot_seconds, base),
                num(st.startup_seconds, 3),
                _variant_note(v, q),
            ]
        )
    out = [
        "Per variant: weights (and where the number comes from), the quantization vLLM "
        "applied, weight loading time, KV cache memory and tokens, blocks × block size; "
        f"TTFT and TPOT as the median of the measured requests ({requests} per variant"
        + (f" over {q.rounds} rounds, the order reversed each round" if q.rounds > 1 else "")
        + ") with their extremes and spread; the achieved weight-read bandwidth (weights / "
        "mean decode step) and its share of the peak; weights, KV tokens and TPOT against "
        f"the first variant ({first.name if first else '–'}). A spread above "
        f"{findings.NOISY_SPREAD:.0%} marks the variant noisy: the machine was busy.",
        "",
    ]
    out += table(
        [
            "variant",
            "model",
            "weights GiB",
            "quantization",
            "load s",
            "KV GiB",
            "KV tokens",
            "blocks",
            "TTFT ms",
            "TPOT ms",
            "spread",
            "weight reads",
            "of peak",
            "weights × / KV × / TPOT ×",
            "startup s",
            "note",
        ],
        rows,
    )
    for v in q.variants:
        if v.error:
            out += error_block(f"{v.name} failed", v.error)
    if q.fit:
        f = q.fit
        out += [
            f"**The line** {_line_words(f)}: each decode step reads every weight once, so "
            "the slope's inverse is the marginal bandwidth, what one more byte of weights "
            f"costs (fixed costs are in the intercept) — {_bandwidth_words(f)}.",
            "",
        ]
        if f.excluded:
            out += [
                f"Left out of the line though marked `fit`: {', '.join(f.excluded)} "
                "(loaded at full size).",
                "",
            ]
        out += [
            f"Every other variant against the line: on it when the prediction is within "
            f"±{f.tolerance:.0%} of the measured TPOT, else above it (slower than its bytes "
            "predict) or below it (faster), with the likely reason.",
            "",
        ]
        out += table(
            ["variant", "weights GiB", "measured TPOT ms", "predicted TPOT ms", "error", "where"],
            [
                [
                    p.name,
                    num(p.weights_gib),
                    num(p.tpot_seconds, 4, 1000),
                    num(p.predicted_tpot_seconds, 4, 1000),
                    percent(p.error_ratio, signed=True),
                    p.verdict + (f": {p.reason}" if p.reason else ""),
                ]
                for p in f.predictions
            ],
        )
        out += [f"![TPOT against weight GiB]({plot_name(phase, 'tpot')})", ""]
    elif q.fit_problem:
        out += [f"No fitted line: {q.fit_problem}", ""]
    return out


def _times(value: float | None, first: float | None) -> str:
    if value is None or not first:
        return "–"
    return f"{value / first:.2f}×"


# --- the plot ------------------------------------------------------------------------------


_VERDICT_COLOURS = {
    ON_LINE: "tab:green",
    ABOVE_LINE: "tab:red",
    BELOW_LINE: "tab:purple",
    FULL_SIZE: "tab:gray",
}


def plot_quantization(q: QuantizationResult, title: str) -> bytes:
    plt = pyplot()
    assert q.fit is not None
    fit = q.fit
    spreads = {v.name: v.tpot for v in q.variants}
    fig, ax = plt.subplots(figsize=(7, 4.5))
    xs = [p.weights_gib for p in fit.predictions]
    span = [0.0, max(xs) * 1.1]
    ax.plot(
        span,
        [(fit.slope_seconds_per_gib * x + fit.intercept_seconds) * 1000 for x in span],
        color="tab:blue",
        lw=1,
        label=f"line through {', '.join(fit.fitted)}",
    )
    for i, p in enumerate(fit.predictions):
        colour = _VERDICT_COLOURS.get(p.verdict, "tab:blue")
        sp = spreads.get(p.name)
        if sp is not None and sp.n > 1:
            ax.errorbar(
                [p.weights_gib],
                [p.tpot_seconds * 1000],
                yerr=[
                    [(p.tpot_seconds - sp.low) * 1000],
                    [(sp.high - p.tpot_seconds) * 1000],
                ],
                fmt="none",
                ecolor=colour,
                capsize=3,
                zorder=2,
            )
        ax.scatter(
            [p.weights_gib],
            [p.tpot_seconds * 1000],
            s=50,
            zorder=3,
            color=colour if p.name in fit.fitted else "white",
            edgecolors=colour,
        )
        ax.scatter(
            [p.weights_gib],
            [p.predicted_tpot_seconds * 1000],
            marker="x",
            color="tab:orange",
            zorder=4,
        )
        ax.annotate(
            f"{p.name} ({p.verdict if p.name not in fit.fitted else 'fitted'})",
            (p.weights_gib, p.tpot_seconds * 1000),
            textcoords="offset points",
            xytext=(6, -14 if i % 2 == 0 else 8),  # alternate: close points stay legible
            fontsize=8,
        )
    ax.scatter([], [], color="tab:blue", label="measured median (fitted), min–max bar")
    ax.scatter([], [], color="white", edgecolors="tab:green", label="on the line")
    ax.scatter([], [], color="white", edgecolors="tab:red", label="above it (slower)")
    ax.scatter([], [], marker="x", color="tab:orange", label="predicted by the line")
    ax.set_xlabel("weights (GiB)")
    ax.set_ylabel("TPOT (ms per decode token)")
    ax.set_title(f"{title}: decode time per token against weight bytes")
    ax.set_xlim(left=0)
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="lower right")
    return png(fig)


def plots(phase: PhaseResult, q: QuantizationResult) -> dict[str, bytes]:
    return {plot_name(phase, "tpot"): plot_quantization(q, phase.name)} if q.fit else {}


EXPERIMENT = Experiment(
    KIND, QuantizationPhase, QuantizationResult, parse, run, summary, section, plots
)
