"""The findings' timeline of a storm run (scripts/gpu/storm_timeline.py) as markdown.

    python3 scripts/gpu/storm_timeline_report.py DIR [> DIR/timeline.md]

First the raw storm from vLLM's pages (first and last preemption, peaks, waiting), then
how often each source named each kv_pool finding and how often it changed its mind, then
one row a second: vLLM's page beside what each exporter's /findings and
`glassbox explain --exporter` said at their latest reading.
"""

from __future__ import annotations

import itertools
import json
import sys
from pathlib import Path
from typing import Any


def _named(line: dict[str, Any] | None) -> str:
    if line is None:
        return ""
    return ", ".join(f["finding"] for f in line["kv_pool"]) or "—"


def _number(value: Any, digits: int = 0) -> str:
    return "" if value is None else f"{value:.{digits}f}"


def _changes(lines: list[dict[str, Any]]) -> int:
    said = [_named(line) for line in lines]
    return sum(1 for a, b in itertools.pairwise(said) if a != b)


def report(out: Path) -> str:
    summary = json.loads((out / "summary.json").read_text())
    lines = [json.loads(x) for x in (out / "timeline.jsonl").read_text().splitlines() if x]
    sources = sorted(
        {x["source"] for x in lines if x["source"].startswith(("findings/", "explain/"))}
    )
    storm, run = summary["storm"], summary["run"]
    text = [
        f"# A storm's findings: {run['model']} ({run['profile']} profile)",
        "",
        "Exporters: "
        + "; ".join(
            f"{e['name']} ({e['interval']:g} s polls, {e['window']:g} s window)"
            for e in run["exporters"]
        ),
        "",
        "## vLLM's own pages (every second)",
        "",
        "| first preemption | last preemption | preemptions | peak usage | peak running | "
        "peak waiting | peak waiting for capacity |",
        "| --- | --- | --- | --- | --- | --- | --- |",
        f"| {_number(storm['first_preemption_t'], 1)} s "
        f"| {_number(storm['last_preemption_t'], 1)} s "
        f"| {_number(storm['preemptions'])} | {_number(storm['peak_usage'], 3)} "
        f"| {_number(storm['peak_running'])} | {_number(storm['peak_waiting'])} "
        f"| {_number(storm['peak_waiting_capacity'])} |",
        "",
        "## What each source named",
        "",
        "| source | readings | kv_pool findings (times named) | changes of mind |",
        "| --- | --- | --- | --- |",
    ]
    for source in sources:
        mine = [x for x in lines if x["source"] == source]
        counts = ", ".join(f"{k}: {v}" for k, v in sorted(summary["named"].get(source, {}).items()))
        text.append(f"| {source} | {len(mine)} | {counts} | {_changes(mine)} |")
    text += ["", "## Timeline", ""]
    text.append("| t (s) | usage | running | waiting | preemptions | " + " | ".join(sources) + " |")
    text.append("| --- " * (5 + len(sources)) + "|")
    latest: dict[str, dict[str, Any]] = {}
    for line in lines:
        if line["source"] != "vllm":
            latest[line["source"]] = line
            continue
        cells = [
            f"{line['t']:.0f}",
            _number(line.get("usage"), 3),
            _number(line.get("running")),
            _number(line.get("waiting")),
            _number(line.get("preemptions")),
        ]
        cells += [_named(latest.get(s)) for s in sources]
        text.append("| " + " | ".join(cells) + " |")
    last = {s: latest[s]["kv_pool"] for s in sources if s in latest and latest[s]["kv_pool"]}
    if last:
        text += ["", "## Their last words", ""]
        text += [f"- {s}: {f[0]['what']['text']}" for s, f in sorted(last.items())]
    return "\n".join(text) + "\n"


if __name__ == "__main__":
    sys.stdout.write(report(Path(sys.argv[1])))
