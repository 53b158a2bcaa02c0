"""The lab's outputs: report.md with the article's tables, PNG plots, results.json.

`render_markdown` and the plot functions are pure (results in, text or PNG bytes out);
`write_outputs` is the only I/O and writes every file atomically (a temporary file in
the same directory, then a rename), so a reader never sees half a report, even when the
run is interrupted while writing. The report computes nothing of its own: every number
and every judgement it words is in the results, or — the exporter against the lab — a
function of `findings.py`.
"""

from __future__ import annotations

import contextlib
import importlib
import io
import json
import os
import re
import tempfile
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from vllm_glassbox.prometheus import Prometheus

from . import findings
from .results import (
    ABOVE_LINE,
    BELOW_LINE,
    FULL_SIZE,
    GIB,
    ON_LINE,
    STARTUP_STAGES,
    KvPressureResult,
    LabResults,
    PhaseResult,
    QuantizationResult,
    SpecDecodeResult,
    Spread,
    Startup,
    TimelinePoint,
    VariantResult,
)
from .sidecar import COMPARED

MAX_TIMELINE_ROWS = 40
#: The exporter's series in the report: (name, title, scale).
SERIES_TITLES = {
    "glassbox_time_per_output_token_seconds": ("TPOT ms", 1000.0),
    "glassbox_tokens_per_forward_pass": ("tokens/pass", 1.0),
    "glassbox_spec_decode_acceptance_ratio": ("acceptance", 1.0),
    "glassbox_kv_cache_capacity_tokens": ("KV tokens", 1.0),
    "glassbox_model_weights_bytes": ("weights GiB", 1 / GIB),
    "glassbox_weight_read_bandwidth_bytes_per_second": ("weight reads GB/s", 1e-9),
    "glassbox_memory_bandwidth_utilization_ratio": ("of peak", 1.0),
}
STAGE_TITLES = {
    "weights_load": "weights load s",
    "compile": "compile s",
    "cuda_graphs": "graph capture s",
    "engine_init": "engine init s",
    "other": "other s",
}


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


#: How a panel's description says when the panel has no data: a sentence starting so.
_WHY_EMPTY = ("Empty ", "Present only ", "Absent ")


def why_empty(description: str) -> str:
    """The sentences of a panel's description that say when it has no data."""
    sentences = re.split(r"(?<=\.)\s+", (description or "").strip())
    found = [s for s in sentences if s.startswith(_WHY_EMPTY)]
    return " ".join(found) or "(its description does not say why)"


def dashboard_images(
    prometheus_url: str, out: Path, start: float, end: float
) -> tuple[dict[str, str], dict[str, str], str | None]:
    """Dashboard PNGs drawn from Prometheus' data, when the dashboards package can; the
    panels without data, each with its description's reason."""
    try:
        pictures = importlib.import_module("vllm_glassbox.dashboards.pictures")
        with Prometheus(prometheus_url) as prometheus:
            drawn = pictures.draw_pictures(prometheus, out / "dashboards", start, end)
    except Exception as e:  # pictures are a bonus: the report stands without them
        return {}, {}, f"dashboard snapshots not drawn: {type(e).__name__}: {e}"
    # One picture per dashboard in the report; the panels' own PNGs stay beside them.
    whole = sorted(p for p in drawn.files if p.parent == out / "dashboards")
    images = {f"dashboard {p.stem}": str(p.relative_to(out)) for p in whole}
    empty = {
        f"{data.dashboard_uid} / {data.title}": why_empty(str(data.panel.get("description", "")))
        for data in drawn.panels
        if not data.has_data
    }
    return images, empty, None


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


def _ms(sp: Spread | None) -> str:
    """A median in ms with its extremes."""
    if sp is None:
        return "–"
    if sp.n == 1:
        return _n(sp.median, scale=1000)
    return f"{_n(sp.median, scale=1000)} ({_n(sp.low, scale=1000)}–{_n(sp.high, scale=1000)})"


def _gbs(value: float | None) -> str:
    """Bytes per second as GB/s, or TB/s from 1,000 GB/s."""
    if value is None:
        return "–"
    if value >= 1e12:
        return f"{value / 1e12:.3g} TB/s"
    return f"{value / 1e9:.3g} GB/s"


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
    if results.description:
        out += [f"> {results.description.strip()}", ""]
    if results.peak:
        out += [
            f"Peak memory bandwidth: **{_gbs(results.peak.bytes_per_second)}**, "
            f"{results.peak.source}.",
            "",
        ]
    dummy_segments = [
        s.segment for s in results.segments if s.startup and s.startup.load_format == "dummy"
    ]
    # One name per variant, not per round.
    dummy = list(dict.fromkeys(re.sub(r" \(round \d+\)$", "", s) for s in dummy_segments))
    if dummy:
        everywhere = len(dummy_segments) == len(results.segments)
        out += [
            ("The weights were" if everywhere else f"The weights of {', '.join(dummy)} were")
            + " filled by vLLM's dummy loader (`--load-format dummy`: random values, real "
            "shapes and dtypes): memory, KV capacity, decode time and bandwidth are real; "
            "output quality and speculative acceptance on real text are not shown (random "
            "weights repeat themselves, which ngram drafts match).",
            "",
        ]
    summary = summary_lines(results)
    if summary:
        out += ["## Summary", "", *[f"- {line}" for line in summary], ""]
    for phase in results.phases:
        out += _phase_section(phase)
    if results.segments:
        out += _cold_starts(results)
    if results.exporter:
        out += _exporter_section(results)
    dashboards = {t: p for t, p in results.images.items() if t.startswith("dashboard")}
    if dashboards:
        out += ["## Dashboards over the run", ""]
        out += [f"![{title}]({path})" for title, path in dashboards.items()] + [""]
        if results.empty_panels:
            out += ["Panels without data on this run, and why:", ""]
            out += [f"- {panel}: {why}" for panel, why in results.empty_panels.items()]
            out += [""]
        else:
            out += ["Every panel of these dashboards has data over the run.", ""]
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
            lines.append(f"**{phase.name}**: " + _quantization_summary(body))
        elif isinstance(body, KvPressureResult):
            lines.append(f"**{phase.name}**: " + _pressure_summary(body))
        elif isinstance(body, SpecDecodeResult):
            lines.append(f"**{phase.name}**: " + _spec_summary(body))
    return lines


def _line_words(fit: Any) -> str:
    points = (
        "two points: no R²"
        if fit.r_squared is None and len(fit.fitted) == 2
        else f"R² {_n(fit.r_squared, 4)}"
    )
    return (
        f"TPOT = {fit.slope_seconds_per_gib * 1000:.3g} ms/GiB × weights + "
        f"{fit.intercept_seconds * 1000:.3g} ms through {', '.join(fit.fitted)} ({points})"
    )


def _bandwidth_words(fit: Any) -> str:
    implied = fit.marginal_bandwidth_bytes_per_second
    if implied is None:
        return "the slope implies no bandwidth (it is not positive)"
    if fit.exceeds_peak:
        share = fit.intercept_share
        return (
            f"the slope would mean weights read at {_gbs(implied)}, more than the peak "
            f"{_gbs(fit.peak_bandwidth_bytes_per_second)}: **not a bandwidth** — much of a "
            "decode step here is not weight reads (the intercept is "
            + (f"{share:.0%} of the largest variant's TPOT" if share is not None else "large")
            + "); the achieved bandwidth of each variant is in its row"
        )
    of_peak = (
        f", {implied / fit.peak_bandwidth_bytes_per_second:.0%} of the peak "
        f"{_gbs(fit.peak_bandwidth_bytes_per_second)}"
        if fit.peak_bandwidth_bytes_per_second
        else " (no peak known to compare with)"
    )
    return f"its slope implies weights read at {_gbs(implied)}{of_peak}"


def _quantization_summary(q: QuantizationResult) -> str:
    assert q.fit is not None
    fit = q.fit
    parts = [f"{_line_words(fit)}; {_bandwidth_words(fit)}."]
    by_verdict: dict[str, list[str]] = {}
    for p in fit.predictions:
        if p.verdict == ON_LINE:
            by_verdict.setdefault(ON_LINE, []).append(
                f"{p.name} ({_pct(p.error_ratio, signed=True)})"
            )
        elif p.verdict in (ABOVE_LINE, BELOW_LINE):
            slower = p.verdict == ABOVE_LINE
            factor = p.tpot_seconds / p.predicted_tpot_seconds if slower else None
            how = (
                f"{factor:.2g}× slower than its bytes predict"
                if factor
                else f"faster than its bytes predict ({_pct(p.error_ratio, signed=True)})"
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
                f"{v.name}'s requests varied by {_pct(v.tpot.relative if v.tpot else None)}"
                for v in noisy
            )
            + "."
        )
    kv = [v.startup.kv_cache_tokens for v in q.variants if v.startup and v.startup.kv_cache_tokens]
    if len(set(kv)) > 1:
        parts.append(f"KV pool from {min(kv):,} to {max(kv):,} tokens.")
    return " ".join(parts)


def _pressure_summary(k: KvPressureResult) -> str:
    pool = _int(k.startup.kv_cache_tokens if k.startup else None)
    acts = " → ".join(a.name for a in k.acts)
    story = (
        "the article's three acts"
        if not k.missing_acts
        else f"missing act(s): {', '.join(k.missing_acts)}"
    )
    gap = (
        f"; largest gap between polls {k.max_gap_seconds:.1f} s (poll every {_n(k.poll_seconds)} s)"
        if k.max_gap_seconds is not None
        else ""
    )
    return (
        f"pool of {pool} tokens; {acts} ({story}); full after {_n(k.first_full_at)} s, "
        f"queue peaked at {_int(k.peak_waiting)}, {k.preemptions_total:g} preemptions, the "
        f"largest jump {k.max_preemption_jump:g} in one poll"
        + (
            f" (t = {k.max_preemption_jump_at:.0f} s)"
            if k.max_preemption_jump_at is not None
            else ""
        )
        + gap
        + (f"; {len(k.missed_polls)} poll(s) failed" if k.missed_polls else "")
        + "."
    )


def _spec_summary(sd: SpecDecodeResult) -> str:
    parts = [
        f"{r.label}: {r.stats.forward_passes:g} forward passes for "
        f"{r.stats.generated_tokens:g} tokens ({r.stats.requests} request(s)), "
        f"{r.stats.drafts:g} drafts"
        for r in sd.runs
    ]
    text = "; ".join(parts)
    if sd.baseline_problem:
        text += f". **No speed-up**: {sd.baseline_problem}"
    else:
        baseline = next((r for r in sd.runs if r.baseline), None)
        speedups = [f"{r.label} {r.speedup:.2f}×" for r in sd.runs if r.speedup is not None]
        if baseline and speedups:
            text += f". Decode per token against {baseline.label}: {', '.join(speedups)}"
    if sd.penalty_finding:
        text += f". {sd.penalty_finding}"
    return (
        text + f". The cold first request's prefill took "
        f"{_n(sd.first_request_prefill_seconds)} s (warm: {_n(sd.warm_prefill_seconds)} s)."
    )


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


def _variant_note(v: VariantResult, q: QuantizationResult) -> str:
    notes = []
    if findings.above_peak(v.bandwidth.utilization if v.bandwidth else None):
        notes.append("reads faster than the peak: its weights figure or the peak is wrong")
    if v.name in q.full_size:
        notes.append(f"loaded at full size (like {q.full_size[v.name]})")
    if v.noisy:
        notes.append("noisy")
    if v.error:
        notes.append(f"failed: {_first_line(v.error)}")
    return "; ".join(notes)


def _quantization(phase: PhaseResult, q: QuantizationResult) -> list[str]:
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
                f"{_n(st.weights_gib)} ({st.weights_source or '?'})",
                st.quantization or "–",
                _n(st.load_seconds),
                _n(st.kv_cache_memory_bytes, scale=1 / GIB),
                _int(st.kv_cache_tokens),
                f"{_int(st.kv_cache_blocks)} × {_int(st.block_size)}",
                _ms(v.ttft),
                _ms(v.tpot),
                _pct(v.tpot.relative if v.tpot else None),
                _gbs(bw.weight_read_bytes_per_second if bw else None),
                _pct(bw.utilization if bw else None),
                _ratio(st.weights_bytes, base_st.weights_bytes if base_st else None)
                + " / "
                + _ratio(st.kv_cache_tokens, base_st.kv_cache_tokens if base_st else None)
                + " / "
                + _ratio(v.tpot_seconds, base),
                _n(st.startup_seconds, 3),
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
    out += _table(
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
            out += _error_block(f"{v.name} failed", v.error)
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
        out += _table(
            ["variant", "weights GiB", "measured TPOT ms", "predicted TPOT ms", "error", "where"],
            [
                [
                    p.name,
                    _n(p.weights_gib),
                    _n(p.tpot_seconds, 4, 1000),
                    _n(p.predicted_tpot_seconds, 4, 1000),
                    _pct(p.error_ratio, signed=True),
                    p.verdict + (f": {p.reason}" if p.reason else ""),
                ]
                for p in f.predictions
            ],
        )
        out += [f"![TPOT against weight GiB]({plot_name(phase, 'tpot')})", ""]
    elif q.fit_problem:
        out += [f"No fitted line: {q.fit_problem}", ""]
    return out


def _startup_facts(st: Startup | None, title: str = "Server") -> list[str]:
    if st is None:
        return []
    return [
        f"{title}: weights {_n(st.weights_gib)} GiB ({st.weights_source or 'unknown'}"
        + (f", {st.quantization}" if st.quantization else "")
        + f"), KV pool {_int(st.kv_cache_tokens)} tokens = {_int(st.kv_cache_blocks)} blocks × "
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
        "The acts, each named only where its condition holds. vLLM counts a preemption "
        "when the preempted request runs again, so at a full pool requests queue before "
        "the count moves.",
        "",
    ]
    out += _table(
        ["act", "condition", "from s", "to s", "polls", "preemptions", "peak waiting", "peak KV"],
        [
            [
                a.name,
                findings.ACT_CONDITIONS.get(a.name, ""),
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
    if k.missing_acts:
        out += [
            f"**Missing act(s)** of the article's three ({' → '.join(findings.THREE_ACTS)}): "
            f"{', '.join(k.missing_acts)}.",
            "",
        ]
    else:
        out += ["All three of the article's acts happened, in order.", ""]
    if k.poll_seconds is not None:
        hole = k.max_gap_seconds is not None and k.max_gap_seconds > 2 * k.poll_seconds
        out += [
            f"Polled every {_n(k.poll_seconds)} s by a process of its own: "
            f"{len(k.timeline)} pages, {k.late_polls} late (vLLM took longer than a period "
            f"to answer), {len(k.missed_polls)} failed; the largest gap between two pages "
            f"{_n(k.max_gap_seconds)} s"
            + (" — **a hole in the timeline** (more than two periods)" if hole else "")
            + _gap_cause(k)
            + ".",
            "",
        ]
        for m in k.missed_polls[:10]:
            out += [f"- poll at {m.t:.1f} s failed: {m.error}"]
        if k.missed_polls:
            out += [""]
    jumps = findings.preemption_jumps(k.timeline)
    biggest = {jumps.index(max(jumps))} if jumps and max(jumps) > 0 else set()
    rows = [
        [
            f"{k.timeline[i].t:.1f}",
            _n(k.timeline[i].running),
            _n(k.timeline[i].waiting),
            _pct(k.timeline[i].kv_cache_usage),
            f"{k.timeline[i].preemptions:g}",
            f"+{jumps[i]:g}" if jumps[i] else "",
            _int(k.timeline[i].generated_tokens),
            _n(k.timeline[i].latency_seconds, 2),
            _n(k.timeline[i].delay_seconds, 2),
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
        [
            "t s",
            "running",
            "waiting",
            "KV usage",
            "preemptions",
            "this poll",
            "tokens",
            "answer s",
            "sent late s",
        ],
        rows,
    )
    if k.request_errors:
        out += ["Request errors: " + "; ".join(k.request_errors), ""]
    out += [f"![KV pressure timeline]({plot_name(phase, 'timeline')})", ""]
    return out


def _gap_cause(k: KvPressureResult) -> str:
    """Why the largest gap: the page ending it was sent late, or vLLM answered late."""
    end = next((p for p in k.timeline if p.t == k.max_gap_ended_at), None)
    if end is None or k.poll_seconds is None or end.latency_seconds is None:
        return ""
    parts = []
    if (end.delay_seconds or 0.0) > 0.5 * k.poll_seconds:
        parts.append(
            f"its closing poll was sent {end.delay_seconds:.1f} s after its tick (this "
            "machine's CPU was taken)"
        )
    if end.latency_seconds > 0.5 * k.poll_seconds:
        parts.append(f"vLLM took {end.latency_seconds:.1f} s to answer it")
    return f": {' and '.join(parts)}" if parts else ""


def _spec_decode(phase: PhaseResult, sd: SpecDecodeResult) -> list[str]:
    out = _startup_facts(sd.startup, "Server with speculation")
    out += _startup_facts(sd.startup_without_speculation, "Server without speculation")
    rows = [
        [
            r.label + (" (baseline)" if r.baseline else ""),
            "on" if r.speculation else "off",
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
            _ms(r.tpot),
            "–" if r.speedup is None else f"{r.speedup:.2f}×",
            r.finding or "",
        ]
        for r in sd.runs
    ]
    out += _table(
        [
            "run",
            "speculation",
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
            "what it did",
        ],
        rows,
    )
    requests = max((r.stats.requests for r in sd.runs), default=0)
    out += [
        f"Tokens, passes, drafts and decode seconds are summed over each run's {requests} "
        "request(s); TPOT is their median (extremes in brackets). Draft coverage is the "
        "share of decode steps that speculated at all: a request that bypasses speculation "
        "decodes one token per forward pass and drafts nothing. The speed-up is the "
        "baseline's TPOT over each run's; a baseline must not speculate.",
        "",
    ]
    if sd.baseline_problem:
        out += [f"**No speed-up:** {sd.baseline_problem}.", ""]
    if sd.penalty_finding:
        out += [f"**Repetition penalty:** {sd.penalty_finding}.", ""]
    out += [
        f"The cold first request after startup (not in the runs): prefill "
        f"{_n(sd.first_request_prefill_seconds)} s, TTFT {_n(sd.first_request_ttft_seconds)} s; "
        f"warm requests' prefill {_n(sd.warm_prefill_seconds)} s.",
        "",
        f"![speculative decoding on and off]({plot_name(phase, 'spec')})",
        "",
    ]
    return out


def _cold_starts(results: LabResults) -> list[str]:
    out = [
        "## Cold starts",
        "",
        "Each server start's stages as vLLM's log tells them (the exporter's "
        "`glassbox_startup_stage_seconds`; a stage this version does not log is –; *other* is "
        "the rest of vLLM's own start-to-ready time: processes starting, the API server), "
        "and the whole start as the lab timed it: from asking for the server to `/health` "
        "answering.",
        "",
    ]
    rows = []
    for seg in results.segments:
        st = seg.startup
        if st is None:
            continue
        rows.append(
            [
                seg.segment,
                *[_n(st.stages.get(stage)) for stage in STARTUP_STAGES],
                _n(st.startup_seconds),
            ]
        )
    out += _table(["segment", *[STAGE_TITLES[s] for s in STARTUP_STAGES], "total s"], rows)
    return out


def _exporter_section(results: LabResults) -> list[str]:
    out = [
        "## The exporter's live series",
        "",
        "What `glassbox exporter` published beside each server at the end of its segment, "
        "its window covering the whole segment, against the lab's own numbers over the "
        "same requests (the same core functions on the lab's snapshots). They agree when "
        f"they differ by at most {findings.AGREEMENT:.0%}.",
        "",
    ]
    lab_values = {s.segment: s.values for s in results.segments}
    rows = []
    disagreements = []
    for e in results.exporter:
        mine = lab_values.get(e.segment, {})
        for name in COMPARED:
            title, scale = SERIES_TITLES[name]
            exported, measured = e.values.get(name), mine.get(name)
            if exported is None and measured is None:
                continue
            agreed = findings.agree(exported, measured)
            if agreed is False:
                disagreements.append(f"{e.segment} {title}")
            rows.append(
                [
                    e.segment,
                    title,
                    _int(exported) if title == "KV tokens" else _n(exported, 4, scale),
                    _int(measured) if title == "KV tokens" else _n(measured, 4, scale),
                    _pct(findings.difference(exported, measured), signed=True),
                    {True: "yes", False: "**no**", None: "–"}[agreed],
                ]
            )
    out += _table(["segment", "series", "exporter", "lab", "difference", "agree"], rows)
    failed = {
        e.segment: e.values.get("glassbox_scrape_errors_total", 0.0)
        for e in results.exporter
        if e.values.get("glassbox_scrape_errors_total")
    }
    if failed:
        out += [
            "Polls of vLLM that failed on the exporter's side (a loaded server answering "
            "`/metrics` late; its windowed series span them): "
            + ", ".join(f"{seg} {n:g}" for seg, n in failed.items())
            + ".",
            "",
        ]
    out += [
        (
            "The exporter and the lab agree on every series both have."
            if not disagreements
            else f"**They disagree** on: {', '.join(disagreements)}."
        ),
        "",
    ]
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


_VERDICT_COLOURS = {
    ON_LINE: "tab:green",
    ABOVE_LINE: "tab:red",
    BELOW_LINE: "tab:purple",
    FULL_SIZE: "tab:gray",
}


def plot_quantization(q: QuantizationResult, title: str) -> bytes:
    plt = _pyplot()
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
    return _png(fig)


_ACT_SHADES = {
    findings.FILLING: "#e8f4e8",
    findings.QUEUE_BEFORE_FULL: "#fdf0d5",
    findings.SATURATED: "#fde2c8",
    findings.FULL_NOBODY_WAITING: "#f5f5dc",
    findings.STORM: "#f8d0d0",
    findings.DRAINING: "#e0e8f8",
    findings.NEVER_FULL: "#f0f0f0",
}


def plot_kv_timeline(k: KvPressureResult, title: str) -> bytes:
    plt = _pyplot()
    t = [p.t for p in k.timeline]
    fig, (top, bottom) = plt.subplots(
        2, 1, figsize=(8, 5.5), sharex=True, gridspec_kw={"height_ratios": [3, 2]}
    )
    # Each act shaded from its first poll to the next act's first poll.
    ends = [a.start_t for a in k.acts[1:]] + [k.acts[-1].end_t if k.acts else 0.0]
    for act, end in zip(k.acts, ends, strict=True):
        for ax in (top, bottom):
            ax.axvspan(act.start_t, end, color=_ACT_SHADES.get(act.name, "#f0f0f0"), lw=0)
        top.annotate(
            act.name,
            (act.start_t, 1.0),
            xycoords=("data", "axes fraction"),
            xytext=(2, -10),
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
    jumps = findings.preemption_jumps(k.timeline)
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
    return _png(fig)
