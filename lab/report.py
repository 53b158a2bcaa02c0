"""The lab's outputs: report.md with the article's tables, PNG plots, results.json.

`render_markdown` and the plot functions are pure (results in, text or PNG bytes out);
`write_outputs` is the only I/O and writes every file atomically (a temporary file in
the same directory, then a rename), so a reader never sees half a report, even when the
run is interrupted while writing.
"""

from __future__ import annotations

import contextlib
import importlib
import io
import json
import os
import tempfile
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from .analysis import preemption_jumps
from .results import (
    GIB,
    KvPressureResult,
    LabResults,
    PhaseResult,
    QuantizationResult,
    SpecDecodeResult,
    Startup,
    TimelinePoint,
)

MAX_TIMELINE_ROWS = 40
EXPORTER_COLUMNS = (
    ("glassbox_time_per_output_token_seconds", "TPOT ms", 1000.0),
    ("glassbox_tokens_per_forward_pass", "tokens/pass", 1.0),
    ("glassbox_spec_decode_acceptance_ratio", "acceptance", 1.0),
    ("glassbox_kv_cache_capacity_tokens", "KV tokens", 1.0),
    ("glassbox_preemptions_per_second", "preemptions/s", 1.0),
    ("glassbox_weight_read_bandwidth_bytes_per_second", "weight reads GB/s", 1e-9),
)


# --- files -------------------------------------------------------------------------------


def write_atomic(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def dashboard_images(
    prometheus_url: str, out: Path, start: float, end: float
) -> tuple[dict[str, str], str | None]:
    """Dashboard PNGs drawn from Prometheus' data, when the dashboards package can."""
    try:
        snapshot = importlib.import_module("vllm_glassbox.dashboards.snapshot")
        files: list[Path] = snapshot.render_snapshots(
            prometheus_url, out / "dashboards", start, end
        )
    except Exception as e:  # pictures are a bonus: the report stands without them
        return {}, f"dashboard snapshots not drawn: {type(e).__name__}: {e}"
    # One picture per dashboard in the report; the panels' own PNGs stay beside them.
    whole = sorted(p for p in files if p.parent == out / "dashboards")
    return {f"dashboard {p.stem}": str(p.relative_to(out)) for p in whole}, None


def write_outputs(results: LabResults, out_dir: Path) -> None:
    """Plots, then results.json, then report.md (which links both)."""
    for name, png in render_plots(results).items():
        write_atomic(out_dir / name, png)
    write_atomic(
        out_dir / "results.json", (json.dumps(results.to_json(), indent=2) + "\n").encode()
    )
    write_atomic(out_dir / "report.md", render_markdown(results).encode())


# --- formatting --------------------------------------------------------------------------


def _n(value: float | None, digits: int = 3, scale: float = 1.0) -> str:
    if value is None:
        return "–"
    v = value * scale
    if v != 0 and abs(v) >= 10**digits:
        return f"{v:,.0f}"
    return f"{v:.{digits}g}"


def _int(value: float | None) -> str:
    return "–" if value is None else f"{value:,.0f}"


def _pct(value: float | None, signed: bool = False) -> str:
    if value is None:
        return "–"
    if signed:
        return f"{value:+.1%}" if abs(value) >= 0.0005 else "±0.0%"
    return f"{value:.0%}"


def _ratio(value: float | None, first: float | None) -> str:
    if value is None or not first:
        return "–"
    return f"{value / first:.2f}×"


def _table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(cell.replace("|", "\\|") for cell in row) + " |" for row in rows]
    return [*lines, ""]


def _when(unix: float | None) -> str:
    if unix is None:
        return "–"
    return datetime.fromtimestamp(unix, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def _first_line(text: str | None) -> str:
    lines = (text or "").strip().splitlines()
    return lines[0] if lines else "–"


def _error_block(title: str, text: str) -> list[str]:
    """An error in the report: its first line, then the rest (a log's tail) verbatim."""
    first, _, rest = text.strip().partition("\n")
    out = [f"> **{title}:** {first}", ""]
    if rest.strip():
        out += ["```text", rest.strip("\n").replace("```", "` ` `"), "```", ""]
    return out


def _slug(text: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "-" for c in text)


def plot_name(phase: PhaseResult, what: str) -> str:
    return f"plots/{_slug(phase.name)}-{what}.png"


# --- markdown ------------------------------------------------------------------------------


def render_markdown(results: LabResults) -> str:
    duration = (results.ended_at or results.started_at) - results.started_at
    out = [
        f"# glassbox lab: {results.plan}",
        "",
        f"Backend **{results.backend}**, started {_when(results.started_at)}, "
        f"{duration / 60:.1f} min, status **{results.status}**"
        + (f", glassbox {results.version}" if results.version else "")
        + ". Every number below is also in `results.json`.",
        "",
    ]
    summary = summary_lines(results)
    if summary:
        out += ["## Summary", "", *[f"- {line}" for line in summary], ""]
    for phase in results.phases:
        out += _phase_section(phase)
    if results.exporter:
        out += _exporter_section(results)
    dashboards = {t: p for t, p in results.images.items() if t.startswith("dashboard")}
    if dashboards:
        out += ["## Dashboards over the run", ""]
        out += [f"![{title}]({path})" for title, path in dashboards.items()] + [""]
    if results.notes:
        out += ["## Notes", "", *[f"- {n}" for n in results.notes], ""]
    return "\n".join(out)


def summary_lines(results: LabResults) -> list[str]:
    lines = []
    for phase in results.phases:
        body = phase.body
        if phase.status != "ok":
            lines.append(f"**{phase.name}** {phase.status}: {_first_line(phase.error)}")
        if isinstance(body, QuantizationResult) and body.fit:
            fit = body.fit
            worst = max((abs(p.error_ratio) for p in fit.predictions), default=0.0)
            kv = [v.startup.kv_cache_tokens for v in body.variants if v.startup]
            kv_known = [k for k in kv if k]
            lines.append(
                f"**{phase.name}**: TPOT = {fit.slope_seconds_per_gib * 1000:.3g} ms/GiB × "
                f"weights + {fit.intercept_seconds * 1000:.3g} ms (R² {_n(fit.r_squared)}), "
                "i.e. a marginal weight-read bandwidth of "
                f"{_n(fit.marginal_bandwidth_bytes_per_second, scale=1e-9)} GB/s; "
                f"predictions within {worst:.1%} of the measured TPOT"
                + (
                    f"; KV pool from {min(kv_known):,} to {max(kv_known):,} tokens"
                    if len(set(kv_known)) > 1
                    else ""
                )
                + "."
            )
        elif isinstance(body, KvPressureResult):
            lines.append(
                f"**{phase.name}**: pool of "
                f"{_int(body.startup.kv_cache_tokens if body.startup else None)} tokens; "
                f"full after {_n(body.first_full_at)} s, queue peaked at "
                f"{_int(body.peak_waiting)}, {body.preemptions_total:g} preemptions, the "
                f"largest jump {body.max_preemption_jump:g} in one poll"
                + (
                    f" (t = {body.max_preemption_jump_at:.0f} s)"
                    if body.max_preemption_jump_at is not None
                    else ""
                )
                + "."
            )
        elif isinstance(body, SpecDecodeResult):
            parts = [
                f"{r.label}: {r.stats.forward_passes:g} forward passes for "
                f"{r.stats.generated_tokens:g} tokens, {r.stats.drafts:g} drafts"
                for r in body.runs
            ]
            lines.append(
                f"**{phase.name}**: "
                + "; ".join(parts)
                + f"; decode {_n(body.speedup)}× faster per token; the cold first request's "
                f"prefill took {_n(body.first_request_prefill_seconds)} s "
                f"(warm: {_n(body.warm_prefill_seconds)} s)."
            )
    return lines


def _phase_section(phase: PhaseResult) -> list[str]:
    out = [f"## {phase.name} ({phase.kind})", ""]
    out.append(
        f"{_when(phase.started_at)}, {(phase.ended_at - phase.started_at) / 60:.1f} min, "
        f"status **{phase.status}**."
    )
    out.append("")
    if phase.error:
        out += _error_block("Error", phase.error)
    body = phase.body
    if isinstance(body, QuantizationResult):
        out += _quantization(phase, body)
    elif isinstance(body, KvPressureResult):
        out += _kv_pressure(phase, body)
    elif isinstance(body, SpecDecodeResult):
        out += _spec_decode(phase, body)
    return out


def _quantization(phase: PhaseResult, q: QuantizationResult) -> list[str]:
    first = next((v for v in q.variants if v.startup and v.stats), None)
    rows = []
    for v in q.variants:
        st, rq = v.startup, v.stats
        if st is None or rq is None:
            rows.append([v.name, f"`{v.model}`", *["–"] * 11, f"failed: {_first_line(v.error)}"])
            continue
        base_st = first.startup if first else None
        base_rq = first.stats if first else None
        rows.append(
            [
                v.name + (" (fit)" if v.fit else ""),
                f"`{v.model}`",
                f"{_n(st.weights_gib)} ({st.weights_source or '?'})",
                _n(st.load_seconds),
                _n(st.kv_cache_memory_bytes, scale=1 / GIB),
                _int(st.kv_cache_tokens),
                f"{_int(st.kv_cache_blocks)} × {_int(st.block_size)}",
                _n(rq.ttft_seconds, scale=1000),
                _n(rq.tpot_seconds, scale=1000),
                _ratio(st.weights_bytes, base_st.weights_bytes if base_st else None),
                _ratio(st.kv_cache_tokens, base_st.kv_cache_tokens if base_st else None),
                _ratio(rq.tpot_seconds, base_rq.tpot_seconds if base_rq else None),
                _n(st.startup_seconds, 3),
                "",
            ]
        )
    out = [
        "Per variant: weights (and where the number comes from), weight loading time, KV "
        "cache memory and tokens, blocks × block size, TTFT and TPOT of the measured "
        f"request(s), and ratios against the first variant ({first.name if first else '–'}).",
        "",
    ]
    out += _table(
        [
            "variant",
            "model",
            "weights GiB",
            "load s",
            "KV GiB",
            "KV tokens",
            "blocks",
            "TTFT ms",
            "TPOT ms",
            "weights ×",
            "KV tokens ×",
            "TPOT ×",
            "startup s",
            "note",
        ],
        rows,
    )
    for v in q.variants:
        if v.error:
            out += _error_block(f"{v.name} failed", v.error)
    if q.fit:
        f = q.fit
        out += [
            f"**Fit** through {', '.join(f.fitted)}: TPOT = "
            f"{f.slope_seconds_per_gib * 1000:.4g} ms/GiB × weights GiB + "
            f"{f.intercept_seconds * 1000:.4g} ms, R² = {_n(f.r_squared, 4)}. "
            "Each decode step reads every weight once, so the slope's inverse is the "
            "marginal bandwidth, what one more byte of weights costs (fixed costs are in the "
            f"intercept): {_n(f.marginal_bandwidth_bytes_per_second, scale=1e-9)} GB/s.",
            "",
        ]
        out += _table(
            ["variant", "weights GiB", "measured TPOT ms", "predicted TPOT ms", "error"],
            [
                [
                    p.name,
                    _n(p.weights_gib),
                    _n(p.tpot_seconds, 4, 1000),
                    _n(p.predicted_tpot_seconds, 4, 1000),
                    _pct(p.error_ratio, signed=True),
                ]
                for p in f.predictions
            ],
        )
        out += [f"![TPOT against weight GiB]({plot_name(phase, 'tpot')})", ""]
    elif q.fit_problem:
        out += [f"No fitted line: {q.fit_problem}", ""]
    return out


def _startup_facts(st: Startup | None) -> list[str]:
    if st is None:
        return []
    return [
        f"Server: weights {_n(st.weights_gib)} GiB ({st.weights_source or 'unknown'}), "
        f"KV pool {_int(st.kv_cache_tokens)} tokens = {_int(st.kv_cache_blocks)} blocks × "
        f"{_int(st.block_size)} tokens, KV memory {_n(st.kv_cache_memory_bytes, scale=1 / GIB)}"
        f" GiB, ready after {st.startup_seconds:.0f} s"
        + (f", log `{st.log_path}`" if st.log_path else "")
        + ".",
        "",
    ]


def _sampled(timeline: Sequence[TimelinePoint], keep: set[int]) -> list[int]:
    if len(timeline) <= MAX_TIMELINE_ROWS:
        return list(range(len(timeline)))
    step = len(timeline) / MAX_TIMELINE_ROWS
    picked = {int(i * step) for i in range(MAX_TIMELINE_ROWS)} | keep | {len(timeline) - 1}
    return sorted(picked)


def _kv_pressure(phase: PhaseResult, k: KvPressureResult) -> list[str]:
    out = _startup_facts(k.startup)
    out += [
        f"{k.requests} concurrent requests, {k.completed} completed, {k.failed} failed, "
        f"in {k.flood_seconds:.0f} s. Preemptions: {k.preemptions_total:g} in total, "
        f"the largest jump **{k.max_preemption_jump:g}** in one poll. Peak KV usage "
        f"{_pct(k.peak_kv_cache_usage)}, peak queue {_int(k.peak_waiting)}.",
        "",
        "The acts: the pool fills with nobody waiting; it is full and requests queue; "
        "vLLM preempts (from the first preemption to the last); the rest drains.",
        "",
    ]
    out += _table(
        ["act", "from s", "to s", "polls", "preemptions", "peak waiting", "peak KV usage"],
        [
            [
                a.name,
                f"{a.start_t:.0f}",
                f"{a.end_t:.0f}",
                str(a.polls),
                f"{a.preemptions:g}",
                _int(a.peak_waiting),
                _pct(a.peak_kv_cache_usage),
            ]
            for a in k.acts
        ],
    )
    jumps = preemption_jumps(k.timeline)
    biggest = {jumps.index(max(jumps))} if jumps and max(jumps) > 0 else set()
    rows = [
        [
            f"{k.timeline[i].t:.0f}",
            _n(k.timeline[i].running),
            _n(k.timeline[i].waiting),
            _pct(k.timeline[i].kv_cache_usage),
            f"{k.timeline[i].preemptions:g}",
            f"+{jumps[i]:g}" if jumps[i] else "",
            _int(k.timeline[i].generated_tokens),
        ]
        for i in _sampled(k.timeline, biggest)
    ]
    out += [
        "The pool timeline"
        + (
            " (sampled; every poll is in results.json)"
            if len(k.timeline) > MAX_TIMELINE_ROWS
            else ""
        )
        + ":",
        "",
    ]
    out += _table(
        ["t s", "running", "waiting", "KV usage", "preemptions", "this poll", "tokens"], rows
    )
    if k.request_errors:
        out += ["Request errors: " + "; ".join(k.request_errors), ""]
    out += [f"![KV pressure timeline]({plot_name(phase, 'timeline')})", ""]
    return out


def _spec_decode(phase: PhaseResult, sd: SpecDecodeResult) -> list[str]:
    out = _startup_facts(sd.startup)
    rows = [
        [
            r.label + (" (baseline)" if r.baseline else ""),
            "`" + json.dumps(r.extra) + "`" if r.extra else "–",
            _int(r.stats.generated_tokens),
            _int(r.stats.forward_passes),
            _n(r.stats.tokens_per_forward_pass),
            _int(r.stats.drafts),
            _int(r.stats.draft_tokens),
            _int(r.stats.accepted_tokens),
            _pct(r.stats.acceptance_ratio),
            _pct(r.stats.draft_coverage),
            _n(r.stats.decode_seconds),
            _n(r.stats.tpot_seconds, scale=1000),
            "–" if r.speedup is None else f"{r.speedup:.2f}×",
        ]
        for r in sd.runs
    ]
    out += _table(
        [
            "run",
            "request extras",
            "tokens",
            "forward passes",
            "tokens/pass",
            "drafts",
            "draft tokens",
            "accepted",
            "acceptance",
            "draft coverage",
            "decode s",
            "TPOT ms",
            "speed-up",
        ],
        rows,
    )
    out += [
        "Draft coverage is the share of decode steps that speculated at all: a request "
        "that bypasses speculation decodes one token per forward pass and drafts nothing.",
        "",
        f"The cold first request after startup (not in the runs): prefill "
        f"{_n(sd.first_request_prefill_seconds)} s, TTFT {_n(sd.first_request_ttft_seconds)} s; "
        f"warm requests' prefill {_n(sd.warm_prefill_seconds)} s.",
        "",
        f"![speculative decoding on and off]({plot_name(phase, 'spec')})",
        "",
    ]
    return out


def _exporter_section(results: LabResults) -> list[str]:
    out = [
        "## The exporter's live series",
        "",
        "What `glassbox exporter` published beside each server at the end of its segment "
        "(windowed over its last minute): the same numbers, computed live by the sidecar.",
        "",
    ]
    rows = [
        [e.segment, *[_n(e.values.get(name), scale=scale) for name, _, scale in EXPORTER_COLUMNS]]
        for e in results.exporter
    ]
    out += _table(["segment", *[title for _, title, _ in EXPORTER_COLUMNS]], rows)
    series = {t: p for t, p in results.images.items() if t.startswith("exporter")}
    out += [f"![{title}]({path})" for title, path in series.items()]
    return [*out, ""]


# --- plots -------------------------------------------------------------------------------


def render_plots(results: LabResults) -> dict[str, bytes]:
    """PNG bytes by path in the output directory, for every phase that has data."""
    plots: dict[str, bytes] = {}
    for phase in results.phases:
        body = phase.body
        if isinstance(body, QuantizationResult) and body.fit:
            plots[plot_name(phase, "tpot")] = plot_quantization(body, phase.name)
        elif isinstance(body, KvPressureResult) and body.timeline:
            plots[plot_name(phase, "timeline")] = plot_kv_timeline(body, phase.name)
        elif isinstance(body, SpecDecodeResult) and body.runs:
            plots[plot_name(phase, "spec")] = plot_spec(body, phase.name)
    return plots


def _png(fig: Any) -> bytes:
    plt = _pyplot()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110, bbox_inches="tight")
    plt.close(fig)
    return buf.getvalue()


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_quantization(q: QuantizationResult, title: str) -> bytes:
    plt = _pyplot()
    assert q.fit is not None
    fit = q.fit
    fig, ax = plt.subplots(figsize=(7, 4.5))
    xs = [p.weights_gib for p in fit.predictions]
    span = [0.0, max(xs) * 1.1]
    ax.plot(
        span,
        [(fit.slope_seconds_per_gib * x + fit.intercept_seconds) * 1000 for x in span],
        color="tab:blue",
        lw=1,
        label=f"fit: R² {_n(fit.r_squared, 4)}",
    )
    fitted = set(fit.fitted)
    for i, p in enumerate(fit.predictions):
        filled = p.name in fitted
        ax.scatter(
            [p.weights_gib],
            [p.tpot_seconds * 1000],
            s=50,
            zorder=3,
            color="tab:blue" if filled else "white",
            edgecolors="tab:blue",
        )
        ax.scatter(
            [p.weights_gib],
            [p.predicted_tpot_seconds * 1000],
            marker="x",
            color="tab:orange",
            zorder=4,
        )
        ax.annotate(
            f"{p.name} ({_pct(p.error_ratio, signed=True)})",
            (p.weights_gib, p.tpot_seconds * 1000),
            textcoords="offset points",
            xytext=(6, -14 if i % 2 == 0 else 8),  # alternate: close points stay legible
            fontsize=8,
        )
    ax.scatter([], [], color="tab:blue", label="measured (fitted)")
    ax.scatter([], [], color="white", edgecolors="tab:blue", label="measured (not fitted)")
    ax.scatter([], [], marker="x", color="tab:orange", label="predicted")
    ax.set_xlabel("weights (GiB)")
    ax.set_ylabel("TPOT (ms per decode token)")
    ax.set_title(f"{title}: decode time per token against weight bytes")
    ax.set_xlim(left=0)
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="upper left")
    return _png(fig)


def plot_kv_timeline(k: KvPressureResult, title: str) -> bytes:
    plt = _pyplot()
    t = [p.t for p in k.timeline]
    fig, (top, bottom) = plt.subplots(
        2, 1, figsize=(8, 5.5), sharex=True, gridspec_kw={"height_ratios": [3, 2]}
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
        label="KV cache usage",
    )
    usage.set_ylabel("KV cache usage %")
    usage.set_ylim(0, 105)
    lines = top.get_legend_handles_labels()
    more = usage.get_legend_handles_labels()
    top.legend(lines[0] + more[0], lines[1] + more[1], fontsize=8, loc="upper right")
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
    return _png(fig)


def plot_spec(sd: SpecDecodeResult, title: str) -> bytes:
    plt = _pyplot()
    labels = [r.label for r in sd.runs]
    fig, (left, right) = plt.subplots(1, 2, figsize=(8, 3.8))
    colors = ["tab:green" if not r.baseline else "tab:gray" for r in sd.runs]
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
    right.bar(labels, [r.stats.decode_seconds for r in sd.runs], color=colors)
    right.set_title("decode time (s)")
    for i, r in enumerate(sd.runs):
        if r.speedup is not None:
            right.annotate(
                f"{r.speedup:.2f}× faster",
                (i, r.stats.decode_seconds),
                ha="center",
                va="bottom",
                fontsize=8,
            )
    for ax in (left, right):
        ax.tick_params(axis="x", labelsize=8)
        ax.grid(alpha=0.3, axis="y")
    fig.suptitle(f"{title}: speculation on and off")
    return _png(fig)
