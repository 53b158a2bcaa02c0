"""Findings as text, markdown or JSON: pure functions, findings in, one string out (the
command writes it whole, or nothing).

The numbers are the findings' figures, shown in their units; nothing is computed here but
a unit's scale (seconds as ms, a ratio as %, bytes as GiB).
"""

from __future__ import annotations

import datetime
import json
from collections.abc import Sequence
from typing import Any

from vllm_glassbox.explain.findings import Explained, Figure, Finding, Statement
from vllm_glassbox.explain.scene import Scope

FORMATS = ("text", "markdown", "json")


def _significant(value: float, digits: int = 3) -> str:
    """`value` to `digits` significant digits, thousands separated, no exponent."""
    if value == 0:
        return "0"
    magnitude = len(str(int(abs(value)))) if abs(value) >= 1 else 0
    decimals = max(digits - magnitude, 0)
    if abs(value) < 1:
        decimals = digits - 1
        scaled = abs(value)
        while scaled < 0.1 and decimals < 9:
            scaled *= 10
            decimals += 1
    return f"{value:,.{decimals}f}"


def seconds(value: float) -> str:
    if value >= 3600:
        return f"{value / 3600:.1f} h"
    if value >= 120:
        return f"{value / 60:.1f} min"
    if value >= 1:
        return f"{_significant(value)} s"
    if value >= 1e-3 or value == 0:
        return f"{_significant(value * 1e3)} ms"
    return f"{_significant(value * 1e6)} µs"


def size(value: float) -> str:
    for unit, scale in (("GiB", 1024**3), ("MiB", 1024**2), ("KiB", 1024)):
        if abs(value) >= scale:
            return f"{_significant(value / scale)} {unit}"
    return f"{value:,.0f} B"


def rate(value: float) -> str:
    for unit, scale in (("TB/s", 1e12), ("GB/s", 1e9), ("MB/s", 1e6)):
        if abs(value) >= scale:
            return f"{_significant(value / scale)} {unit}"
    return f"{value:,.0f} B/s"


def share(value: float) -> str:
    percent = value * 100
    if 99.5 <= percent < 100:  # nearly full is not full
        return f"{percent:.1f} %"
    if percent == 0 or abs(percent) >= 10:
        return f"{percent:.0f} %"
    return f"{_significant(percent, 2)} %"


def count(value: float) -> str:
    """A count; Prometheus' increase() extrapolates to the window's edges (35.99 for 36),
    so from 10 on a count is shown whole."""
    if value == int(value) or abs(value) >= 10:
        return f"{value:,.0f}"
    return _significant(value)


def show(figure: Figure) -> str:
    """A figure in its unit, as a person reads it."""
    unit, v = figure.unit, figure.value
    if unit == "seconds":
        return seconds(v)
    if unit == "bytes":
        return size(v)
    if unit == "bytes_per_second":
        return rate(v)
    if unit == "ratio":
        return share(v)
    if unit == "error":
        return ("+" if v >= 0 else "−") + share(abs(v))
    if unit == "times":
        return f"{_significant(v)}×"
    if unit in ("factor", "cost"):
        return _significant(v)
    if unit == "clock":
        return datetime.datetime.fromtimestamp(v, datetime.UTC).strftime("%H:%M:%S")
    return count(v)


def sentence(statement: Statement) -> str:
    text = statement.text(show)
    return text[:1].upper() + text[1:] + ("" if text.endswith(".") else ".")


def when(unix: float | None) -> str:
    if unix is None:
        return "now"
    moment = datetime.datetime.fromtimestamp(unix, datetime.UTC)
    return moment.strftime("%Y-%m-%d %H:%M:%S UTC")


def heading(scope: Scope) -> str:
    if scope.source == "lab":
        return f"{scope.name}: its measured requests ({seconds(scope.window_seconds)})"
    engines = f"{scope.engines} engine{'s' if scope.engines != 1 else ''}"
    where = f" {scope.where}" if scope.where else ""
    return (
        f"{scope.name}: {engines}, the {seconds(scope.window_seconds)} to {when(scope.at)} "
        f"({scope.source}{where})"
    )


def _behind(findings: Sequence[Finding], finding: Finding) -> list[tuple[int, Finding]]:
    """The findings `finding` names as usually behind it, with their place in the output."""
    return [(i, other) for i, other in enumerate(findings, 1) if other.key in finding.see]


def _confidence(finding: Finding) -> list[str]:
    lines = [f"assumes {a}" for a in finding.assumes]
    lines += [f"could not see {u}" for u in finding.unseen]
    return lines


def text(explained: Sequence[Explained]) -> str:
    out: list[str] = []
    for scene in explained:
        out += [heading(scene.scope), ""]
        if not scene.findings:
            out += ["  Nothing to report: no diagnosis found anything to say.", ""]
        for i, f in enumerate(scene.findings, 1):
            out.append(f"{i}. [{f.severity}] {f.title}")
            out.append(f"   {sentence(f.what)}")
            for change in f.change:
                out.append(f"   → {sentence(change)}")
            behind = _behind(scene.findings, f)
            if behind:
                out.append(
                    "   usually behind it: " + "; ".join(f"{i}. {b.title}" for i, b in behind)
                )
            evidence = f.evidence
            if evidence:
                out.append("   evidence: " + "; ".join(evidence))
            for line in _confidence(f):
                out.append(f"   {line}")
            if f.runbook:
                out.append(f"   runbook: {f.runbook}")
            out.append("")
    return "\n".join(out)


def markdown(explained: Sequence[Explained], level: int = 2) -> str:
    h = "#" * level
    out: list[str] = []
    for scene in explained:
        out += [f"{h} {heading(scene.scope)}", ""]
        if not scene.findings:
            out += ["Nothing to report: no diagnosis found anything to say.", ""]
        for f in scene.findings:
            out += [f"**[{f.severity}] {f.title}.** {sentence(f.what)}", ""]
            if f.change:
                out += ["What would change it:", ""]
                out += [f"- {sentence(c)}" for c in f.change]
                out.append("")
            behind = _behind(scene.findings, f)
            if behind:
                named = "; ".join(f"*[{b.severity}] {b.title}*" for _, b in behind)
                out += [f"Usually behind it: {named}.", ""]
            if f.evidence:
                out += ["Evidence: " + "; ".join(f"`{e}`" for e in f.evidence), ""]
            confidence = _confidence(f)
            if confidence:
                out += ["Confidence: " + "; ".join(confidence) + ".", ""]
            if f.runbook:
                out += [f"Runbook: <{f.runbook}>", ""]
    return "\n".join(out)


def closing_section(explained: Sequence[Explained], title: str = "What this run says") -> str:
    """The lab report's closing section: each server's findings, most severe first, with
    what would change them; the evidence is the run's own results.json. Empty when
    nothing was found."""
    if not any(scene.findings for scene in explained):
        return ""
    out = [
        f"## {title}",
        "",
        "What `glassbox explain` finds in each server of this run (the same diagnoses as for "
        "a live server; every number from `results.json`, computed by the derivation core).",
        "",
    ]
    for scene in explained:
        if not scene.findings:
            continue
        out += [f"### {scene.scope.name}", ""]
        for f in scene.findings:
            out.append(f"- **[{f.severity}] {f.title}.** {sentence(f.what)}")
            out += [f"  - {sentence(c)}" for c in f.change]
            if f.unseen:
                out.append("  - Could not see " + "; ".join(f.unseen) + ".")
        out.append("")
    return "\n".join(out)


def _figure_json(figure: Figure) -> dict[str, Any]:
    return {
        "value": figure.value,
        "unit": figure.unit,
        "shown": show(figure),
        "by": figure.by,
        "sources": list(figure.sources),
    }


def _statement_json(statement: Statement) -> dict[str, Any]:
    return {
        "text": sentence(statement),
        "template": statement.template,
        "figures": {k: _figure_json(v) for k, v in statement.figures.items()},
    }


def finding_json(f: Finding) -> dict[str, Any]:
    return {
        "diagnosis": f.diagnosis,
        "finding": f.finding,
        "severity": f.severity,
        "title": f.title,
        "what": _statement_json(f.what),
        "change": [_statement_json(c) for c in f.change],
        "evidence": list(f.evidence),
        "assumes": list(f.assumes),
        "unseen": list(f.unseen),
        "runbook": f.runbook,
        "see": list(f.see),
    }


def explained_json(explained: Sequence[Explained]) -> list[dict[str, Any]]:
    return [
        {"scope": vars(e.scope).copy(), "findings": [finding_json(f) for f in e.findings]}
        for e in explained
    ]


def as_json(explained: Sequence[Explained]) -> str:
    return json.dumps({"scenes": explained_json(explained)}, indent=2) + "\n"


def render(explained: Sequence[Explained], format: str) -> str:
    if format == "text":
        return text(explained)
    if format == "markdown":
        return markdown(explained)
    if format == "json":
        return as_json(explained)
    raise ValueError(f"unknown format {format!r}; one of {', '.join(FORMATS)}")
