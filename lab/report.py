"""The lab's outputs: report.md with the article's tables, PNG plots, results.json.

`render_markdown` and the plot functions are pure (results in, text or PNG bytes out);
`write_outputs` is the only I/O and writes every file atomically (a temporary file in
the same directory, then a rename), so a reader never sees half a report, even when the
run is interrupted while writing. The report computes nothing of its own: every number
and every judgement it words is in the results, or — the exporter against the lab — a
function of `findings.py`. Each phase's section, summary line and plots are its kind's
(`lab/experiments/`); this module writes what is around them.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import os
import re
import tempfile
from pathlib import Path

from vllm_glassbox.core.prometheus import Prometheus
from vllm_glassbox.explain.from_lab import report_section
from vllm_glassbox.lab import findings
from vllm_glassbox.lab.compared import BY_NAME, SLOW_POLLS
from vllm_glassbox.lab.experiments import for_body
from vllm_glassbox.lab.report_format import (
    error_block,
    first_line,
    gbs,
    num,
    percent,
    table,
    when,
)
from vllm_glassbox.lab.results import STARTUP_STAGES, LabResults, PhaseResult

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
    not_drawn = "; ".join(f"{panel} ({why})" for panel, why in drawn.not_drawn.items())
    return images, empty, f"dashboard panels not drawn: {not_drawn}" if not_drawn else None


def write_outputs(results: LabResults, out_dir: Path) -> None:
    """Plots, then results.json, then report.md (which links both)."""
    for name, png in render_plots(results).items():
        write_atomic(out_dir / name, png)
    write_atomic(
        out_dir / "results.json", (json.dumps(results.to_json(), indent=2) + "\n").encode()
    )
    write_atomic(out_dir / "report.md", render_markdown(results).encode())


# --- markdown ------------------------------------------------------------------------------


def render_markdown(results: LabResults) -> str:
    duration = (results.ended_at or results.started_at) - results.started_at
    out = [
        f"# glassbox lab: {results.plan}",
        "",
        f"Backend **{results.backend}**, started {when(results.started_at)}, "
        f"{duration / 60:.1f} min, status **{results.status}**"
        + (f", glassbox {results.version}" if results.version else "")
        + ". Every number below is also in `results.json`.",
        "",
    ]
    if results.description:
        out += [f"> {results.description.strip()}", ""]
    if results.peak:
        out += [
            f"Peak memory bandwidth: **{gbs(results.peak.bytes_per_second)}**, "
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
    out += report_section(results.to_json())
    return "\n".join(out)


def summary_lines(results: LabResults) -> list[str]:
    lines = []
    for phase in results.phases:
        body = phase.body
        if phase.status != "ok":
            lines.append(f"**{phase.name}** {phase.status}: {first_line(phase.error)}")
        line = for_body(body).summary(body) if body is not None else None
        if line is not None:
            lines.append(f"**{phase.name}**: " + line)
    return lines


def _phase_section(phase: PhaseResult) -> list[str]:
    out = [f"## {phase.name} ({phase.kind})", ""]
    out.append(
        f"{when(phase.started_at)}, {(phase.ended_at - phase.started_at) / 60:.1f} min, "
        f"status **{phase.status}**."
    )
    out.append("")
    if phase.error:
        out += error_block("Error", phase.error)
    if phase.body is not None:
        out += for_body(phase.body).section(phase, phase.body)
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
                *[num(st.stages.get(stage)) for stage in STARTUP_STAGES],
                num(st.startup_seconds),
            ]
        )
    out += table(["segment", *[STAGE_TITLES[s] for s in STARTUP_STAGES], "total s"], rows)
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
    rows = []
    disagreements = []
    stale = []
    for c in results.compared:
        if c.stale:
            stale.append(c.label)
        for row in c.rows:
            compared = BY_NAME[row.name]
            if row.agree is False:
                disagreements.append(f"{c.label} {compared.title}")
            verdict = {True: "yes", False: "**no**", None: "–"}[row.agree]
            rows.append(
                [
                    c.label,
                    compared.title,
                    compared.text(row.exporter),
                    compared.text(row.lab),
                    percent(row.difference, signed=True),
                    "stale" if c.stale else verdict,
                ]
            )
    out += table(["segment", "series", "exporter", "lab", "difference", "agree"], rows)
    failed = {
        e.segment: e.values.get("glassbox_scrape_errors_total", 0.0)
        for e in results.exporter
        if e.values.get("glassbox_scrape_errors_total")
    }
    if failed:
        out += [
            "Polls of vLLM that failed on the exporter's side (no answer within its "
            "deadline, or none at all; its windowed series span them): "
            + ", ".join(f"{seg} {n:g}" for seg, n in failed.items())
            + ".",
            "",
        ]
    late = {e.segment: n for e in results.exporter if (n := e.values.get(SLOW_POLLS))}
    if late:
        out += [
            "Polls of vLLM the exporter read although they answered after its interval (a "
            "loaded server answering `/metrics` late): "
            + ", ".join(f"{seg} {n:g}" for seg, n in late.items())
            + ".",
            "",
        ]
    if stale:
        out += [
            "**Stale**: the exporter had not polled vLLM since the workload of "
            + ", ".join(stale)
            + " ended when its page was read: its values there are older than the lab's, "
            "not compared.",
            "",
        ]
    if disagreements:
        closing = f"**They disagree** on: {', '.join(disagreements)}."
    elif stale:
        closing = "The exporter and the lab agree on every series both have on a fresh page."
    else:
        closing = "The exporter and the lab agree on every series both have."
    out += [closing, ""]
    series = {t: p for t, p in results.images.items() if t.startswith("exporter")}
    out += [f"![{title}]({path})" for title, path in series.items()]
    return [*out, ""]


# --- plots -------------------------------------------------------------------------------


def render_plots(results: LabResults) -> dict[str, bytes]:
    """PNG bytes by path in the output directory, for every phase that has data."""
    plots: dict[str, bytes] = {}
    for phase in results.phases:
        if phase.body is not None:
            plots.update(for_body(phase.body).plots(phase, phase.body))
    return plots
