"""The quantization phase in report.md: its summary line (the line, where the variants
sit against it, the noise) and its section (the variants' table, the line, the
predictions)."""

from __future__ import annotations

from collections.abc import Callable

from vllm_glassbox.core.units import GIB
from vllm_glassbox.lab import findings
from vllm_glassbox.lab.experiments.quantization.judge import above_peak
from vllm_glassbox.lab.experiments.quantization.result import (
    ABOVE_LINE,
    BELOW_LINE,
    FULL_SIZE,
    ON_LINE,
    Fit,
    Prediction,
    QuantizationResult,
    VariantResult,
)
from vllm_glassbox.lab.report_format import (
    Column,
    error_block,
    first_line,
    gbs,
    integer,
    ms,
    num,
    percent,
    plot_name,
    table_of,
)
from vllm_glassbox.lab.results import PhaseResult, Startup


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


def _variant_columns(
    q: QuantizationResult, first: VariantResult | None
) -> tuple[Column[VariantResult], ...]:
    """The variants' table: a variant that measured nothing has its name, model and note."""
    base = first.startup if first else None

    def measured(cell: Callable[[Startup, VariantResult], str]) -> Callable[[VariantResult], str]:
        return lambda v: cell(v.startup, v) if v.startup and v.stats else "–"

    def against_first(st: Startup, v: VariantResult) -> str:
        return " / ".join(
            (
                _times(st.weights_bytes, base.weights_bytes if base else None),
                _times(st.kv_cache_tokens, base.kv_cache_tokens if base else None),
                _times(v.tpot_seconds, first.tpot_seconds if first else None),
            )
        )

    return (
        Column("variant", lambda v: v.name + (" (fit)" if v.fit and v.startup and v.stats else "")),
        Column("model", lambda v: f"`{v.model}`"),
        Column(
            "weights GiB",
            measured(lambda st, v: f"{num(st.weights_gib)} ({st.weights_source or '?'})"),
        ),
        Column("quantization", measured(lambda st, v: st.quantization or "–")),
        Column("load s", measured(lambda st, v: num(st.load_seconds))),
        Column("KV GiB", measured(lambda st, v: num(st.kv_cache_memory_bytes, scale=1 / GIB))),
        Column("KV tokens", measured(lambda st, v: integer(st.kv_cache_tokens))),
        Column(
            "blocks",
            measured(lambda st, v: f"{integer(st.kv_cache_blocks)} × {integer(st.block_size)}"),
        ),
        Column("TTFT ms", measured(lambda st, v: ms(v.ttft))),
        Column("TPOT ms", measured(lambda st, v: ms(v.tpot))),
        Column("spread", measured(lambda st, v: percent(v.tpot.relative if v.tpot else None))),
        Column(
            "weight reads",
            measured(
                lambda st, v: gbs(v.bandwidth.weight_read_bytes_per_second if v.bandwidth else None)
            ),
        ),
        Column(
            "of peak",
            measured(lambda st, v: percent(v.bandwidth.utilization if v.bandwidth else None)),
        ),
        Column("weights × / KV × / TPOT ×", measured(against_first)),
        Column("startup s", measured(lambda st, v: num(st.startup_seconds, 3))),
        Column("note", lambda v: _variant_note(v, q)),
    )


PREDICTION_COLUMNS: tuple[Column[Prediction], ...] = (
    Column("variant", lambda p: p.name),
    Column("weights GiB", lambda p: num(p.weights_gib)),
    Column("measured TPOT ms", lambda p: num(p.tpot_seconds, 4, 1000)),
    Column("predicted TPOT ms", lambda p: num(p.predicted_tpot_seconds, 4, 1000)),
    Column("error", lambda p: percent(p.error_ratio, signed=True)),
    Column("where", lambda p: p.verdict + (f": {p.reason}" if p.reason else "")),
)


def section(phase: PhaseResult, q: QuantizationResult) -> list[str]:
    first = next((v for v in q.variants if v.startup and v.stats), None)
    requests = max((len(v.samples) for v in q.variants), default=0)
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
    out += table_of(_variant_columns(q, first), q.variants)
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
        out += table_of(PREDICTION_COLUMNS, f.predictions)
        out += [f"![TPOT against weight GiB]({plot_name(phase, 'tpot')})", ""]
    elif q.fit_problem:
        out += [f"No fitted line: {q.fit_problem}", ""]
    return out


def _times(value: float | None, first: float | None) -> str:
    if value is None or not first:
        return "–"
    return f"{value / first:.2f}×"
