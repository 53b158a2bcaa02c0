"""The speculative-decoding phase's plot: forward passes and TPOT of each run, on and off."""

from __future__ import annotations

from vllm_glassbox.lab.experiments.spec_decode.result import SpecDecodeResult
from vllm_glassbox.lab.report_format import plot_name, png, pyplot
from vllm_glassbox.lab.results import PhaseResult


def plot_spec(sd: SpecDecodeResult, title: str) -> bytes:
    plt = pyplot()
    labels = [r.label for r in sd.runs]
    fig, (left, right) = plt.subplots(1, 2, figsize=(9, 3.8))
    colors = [
        "tab:gray" if r.baseline else "tab:green" if r.stats.drafts > 0 else "tab:orange"
        for r in sd.runs
    ]
    left.bar(labels, [r.stats.forward_passes for r in sd.runs], color=colors)
    left.set_title("forward passes (decode steps)")
    for i, r in enumerate(sd.runs):
        left.annotate(
            f"{r.stats.generated_tokens:g} tokens",
            (i, r.stats.forward_passes),
            ha="center",
            va="bottom",
            fontsize=8,
        )
    right.bar(labels, [(r.tpot_seconds or 0) * 1000 for r in sd.runs], color=colors)
    right.set_title("TPOT (ms, median)")
    for i, r in enumerate(sd.runs):
        if r.speedup is not None:
            right.annotate(
                f"{r.speedup:.2f}× faster" if r.speedup >= 1 else f"{1 / r.speedup:.2f}× slower",
                (i, (r.tpot_seconds or 0) * 1000),
                ha="center",
                va="bottom",
                fontsize=8,
            )
    for ax in (left, right):
        ax.tick_params(axis="x", labelsize=7, rotation=15)
        ax.grid(alpha=0.3, axis="y")
    fig.suptitle(f"{title}: speculation on and off")
    return png(fig)


def plots(phase: PhaseResult, sd: SpecDecodeResult) -> dict[str, bytes]:
    return {plot_name(phase, "spec"): plot_spec(sd, phase.name)} if sd.runs else {}
