"""The rate sweep's plots: throughput, latency and the pool against the offered rate;
the whole sweep in time with the headroom and the first preemption."""

from __future__ import annotations

from vllm_glassbox.lab.experiments.rate_sweep.judge import step_goodput
from vllm_glassbox.lab.experiments.rate_sweep.result import RateSweepResult
from vllm_glassbox.lab.report_format import plot_name, png, pyplot
from vllm_glassbox.lab.results import PhaseResult


def plot_sweep(r: RateSweepResult, title: str) -> bytes:
    """Throughput and latency percentiles against rate, the pool and the queue beside."""
    plt = pyplot()
    steps = [st for st in r.steps if st.client is not None and st.server is not None]
    rates = [st.rate for st in steps]
    fig, (top, middle, bottom) = plt.subplots(3, 1, figsize=(8, 9), sharex=True)
    top.plot(rates, rates, color="grey", ls=":", label="offered")
    top.plot(rates, [st.achieved_rate for st in steps], marker="o", label="achieved")
    unjudged = [st for st in steps if st.keeps_up is None and st.achieved_rate is not None]
    if unjudged:  # a step too short for its latency: its estimate is no verdict
        top.plot(
            [st.rate for st in unjudged], [st.achieved_rate for st in unjudged], ls="",
            marker="o", mfc="white", color="tab:blue", label="achieved (step not judged)",
        )  # fmt: skip
    top.plot(rates, [step_goodput(st)[0] for st in steps], marker="s", label="goodput")
    if r.knee.rate is not None:
        for ax in (top, middle, bottom):
            ax.axvline(r.knee.rate, color="tab:green", ls="--", lw=1)
    top.set_ylabel("requests/s")
    top.set_title(f"{title}: throughput, latency and the pool against the offered rate")
    top.legend(fontsize=8)
    for key, label, color in (("ttft", "TTFT", "tab:blue"), ("tpot", "TPOT", "tab:orange")):
        for pct, style in (("p50", "-"), ("p99", "--")):
            values = [getattr(st.client, f"{key}_{pct}") for st in steps]
            middle.plot(
                rates, [v * 1000 if v else None for v in values], ls=style, marker=".",
                color=color, label=f"{label} {pct}",
            )  # fmt: skip
    middle.plot(
        rates, [(st.server.tpot_seconds or 0) * 1000 for st in steps if st.server],
        color="black", marker="x", ls="", label="TPOT from counters",
    )  # fmt: skip
    middle.set_yscale("log")
    middle.set_ylabel("ms")
    middle.legend(fontsize=7, ncol=3)
    bottom.plot(
        rates, [(st.server.peak_kv_cache_usage or 0) * 100 for st in steps if st.server],
        color="tab:red", marker="o", label="peak KV usage %",
    )  # fmt: skip
    bottom.set_ylabel("KV usage %")
    bottom.set_ylim(0, 105)
    queue = bottom.twinx()
    queue.plot(
        rates, [st.server.peak_waiting or 0 for st in steps if st.server],
        color="tab:purple", marker="s", label="peak waiting",
    )  # fmt: skip
    queue.plot(
        rates, [st.server.preemptions_per_second or 0 for st in steps if st.server],
        color="black", marker="^", label="preemptions/s",
    )  # fmt: skip
    queue.set_ylabel("requests / per second")
    lines = bottom.get_legend_handles_labels()
    more = queue.get_legend_handles_labels()
    bottom.legend(lines[0] + more[0], lines[1] + more[1], fontsize=8, loc="upper left")
    bottom.set_xlabel("offered request rate, req/s" + (" (log)" if len(rates) > 2 else ""))
    if len(rates) > 2:
        bottom.set_xscale("log", base=2)
    for ax in (top, middle, bottom):
        ax.grid(alpha=0.3)
    return png(fig)


def plot_timeline(r: RateSweepResult, title: str) -> bytes:
    """The whole sweep in time: the pool, the queue, the headroom and the preemptions."""
    plt = pyplot()
    points = r.timeline
    t = [p.t for p in points]
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(9, 5.5), sharex=True)
    for st in r.steps:
        mine = [p.t for p in points if p.step == st.index]
        if mine:
            top.axvline(mine[0], color="grey", lw=0.8, ls=":")
            top.annotate(
                f"{st.rate:g}/s", (mine[0], 1.0), xycoords=("data", "axes fraction"),
                xytext=(2, -10), textcoords="offset points", fontsize=7, color="#555555",
            )  # fmt: skip
    top.plot(
        t, [(p.kv_cache_usage or 0) * 100 for p in points], color="tab:red", label="KV usage %"
    )
    top.set_ylabel("KV usage %")
    top.set_ylim(0, 105)
    queue = top.twinx()
    queue.step(
        t, [p.waiting or 0 for p in points], where="post", color="tab:purple", label="waiting"
    )
    queue.step(t, [p.running or 0 for p in points], where="post", color="tab:blue", label="running")
    queue.set_ylabel("requests")
    lines = top.get_legend_handles_labels()
    more = queue.get_legend_handles_labels()
    top.legend(lines[0] + more[0], lines[1] + more[1], fontsize=8, loc="upper left")
    top.set_title(f"{title}: the pool, the queue and the headroom through the sweep")
    bottom.plot(t, [p.headroom_requests for p in points], color="tab:green", label="headroom (lab)")
    if r.exporter:
        bottom.plot(
            t, [p.exporter_headroom_requests for p in points], color="tab:olive", ls="--",
            label="headroom (exporter)",
        )  # fmt: skip
    bottom.set_ylabel("requests that still fit")
    if r.forecast.first_preemption_at is not None:
        for ax in (top, bottom):
            ax.axvline(r.forecast.first_preemption_at, color="black", lw=1.2)
        bottom.annotate(
            "first preemption", (r.forecast.first_preemption_at, 0.9),
            xycoords=("data", "axes fraction"), xytext=(3, 0), textcoords="offset points",
            fontsize=7,
        )  # fmt: skip
    bottom.set_xlabel("seconds since the sweep started")
    bottom.legend(fontsize=8, loc="upper left")
    for ax in (top, bottom):
        ax.grid(alpha=0.3)
    return png(fig)


def plots(phase: PhaseResult, r: RateSweepResult) -> dict[str, bytes]:
    out = {}
    if any(st.client is not None for st in r.steps):
        out[plot_name(phase, "sweep")] = plot_sweep(r, phase.name)
    if r.timeline:
        out[plot_name(phase, "timeline")] = plot_timeline(r, phase.name)
    return out
