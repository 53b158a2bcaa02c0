"""The quantization phase's plot: TPOT against weight GiB, with the fitted line, each
variant's spread and the line's predictions."""

from __future__ import annotations

from vllm_glassbox.lab.experiments.quantization.result import (
    ABOVE_LINE,
    BELOW_LINE,
    FULL_SIZE,
    ON_LINE,
    QuantizationResult,
)
from vllm_glassbox.lab.report_format import plot_name, png, pyplot
from vllm_glassbox.lab.results import PhaseResult

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
