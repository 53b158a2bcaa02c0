"""The KV-pressure phase's plot: the timeline with running, waiting, usage and
preemptions, each act shaded."""

from __future__ import annotations

from vllm_glassbox.lab.experiments.kv_pressure.result import KvPressureResult
from vllm_glassbox.lab.experiments.pool_acts import (
    DRAINING,
    FILLING,
    FULL_NOBODY_WAITING,
    NEVER_FULL,
    QUEUE_BEFORE_FULL,
    SATURATED,
    STORM,
    preemption_jumps,
)
from vllm_glassbox.lab.report_format import plot_name, png, pyplot
from vllm_glassbox.lab.results import PhaseResult

_ACT_SHADES = {
    FILLING: "#e8f4e8",
    QUEUE_BEFORE_FULL: "#fdf0d5",
    SATURATED: "#fde2c8",
    FULL_NOBODY_WAITING: "#f5f5dc",
    STORM: "#f8d0d0",
    DRAINING: "#e0e8f8",
    NEVER_FULL: "#f0f0f0",
}


def plot_kv_timeline(k: KvPressureResult, title: str) -> bytes:
    plt = pyplot()
    t = [p.t for p in k.timeline]
    fig, (top, bottom) = plt.subplots(
        2, 1, figsize=(8, 5.5), sharex=True, gridspec_kw={"height_ratios": [3, 2]}
    )
    # Each act shaded from its first poll to the next act's first poll.
    acts = k.pressure.acts
    ends = [a.start_t for a in acts[1:]] + [acts[-1].end_t if acts else 0.0]
    for i, (act, end) in enumerate(zip(acts, ends, strict=True)):
        for ax in (top, bottom):
            ax.axvspan(act.start_t, end, color=_ACT_SHADES.get(act.name, "#f0f0f0"), lw=0)
        top.annotate(
            act.name,
            (act.start_t, 1.0),
            xycoords=("data", "axes fraction"),
            xytext=(2, -10 - 9 * (i % 2)),  # a short act's name clears its neighbours
            textcoords="offset points",
            fontsize=7,
            color="#555555",
        )
    top.step(t, [p.running or 0 for p in k.timeline], where="post", label="running")
    top.step(t, [p.waiting or 0 for p in k.timeline], where="post", label="waiting")
    top.set_ylabel("requests")
    usage = top.twinx()
    usage.plot(
        t,
        [(p.kv_cache_usage or 0) * 100 for p in k.timeline],
        color="tab:red",
        lw=1.5,
        marker=".",
        ms=3,
        label="KV cache usage",
    )
    for m in k.missed_polls:
        usage.axvline(m.t, color="black", ls=":", lw=1)
    usage.set_ylabel("KV cache usage %")
    usage.set_ylim(0, 105)
    lines = top.get_legend_handles_labels()
    more = usage.get_legend_handles_labels()
    top.legend(lines[0] + more[0], lines[1] + more[1], fontsize=8, loc="center right")
    top.set_title(f"{title}: the pool fills, requests queue, vLLM preempts")
    top.grid(alpha=0.3)
    jumps = preemption_jumps(k.timeline)
    width = (t[-1] - t[0]) / max(len(t), 1) * 0.8 if len(t) > 1 else 1.0
    bottom.bar(t, jumps, width=width, color="tab:purple", label="preemptions in the poll")
    cumulative = bottom.twinx()
    cumulative.plot(
        t, [p.preemptions for p in k.timeline], color="black", lw=1, label="preemptions, total"
    )
    bottom.set_ylabel("per poll")
    cumulative.set_ylabel("total")
    bottom.set_xlabel("seconds since the flood started")
    bottom.grid(alpha=0.3)
    lines = bottom.get_legend_handles_labels()
    more = cumulative.get_legend_handles_labels()
    bottom.legend(lines[0] + more[0], lines[1] + more[1], fontsize=8, loc="upper left")
    return png(fig)


def plots(phase: PhaseResult, k: KvPressureResult) -> dict[str, bytes]:
    return {plot_name(phase, "timeline"): plot_kv_timeline(k, phase.name)} if k.timeline else {}
