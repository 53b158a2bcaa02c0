"""The findings' timeline of a storm run (scripts/gpu/storm_timeline.py) as markdown.

    python3 scripts/gpu/storm_timeline_report.py DIR [--rejudge] [> DIR/timeline.md]

`--rejudge` adds, beside each exporter's recorded /findings, the KV pool as this
checkout's explain judges the same recorded window facts (each poll's `pools`): how a
change of the diagnosis reads on a storm recorded before it.

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


def _capacity(lines: list[dict[str, Any]]) -> float | None:
    """The pool's size in tokens, as the recorded findings quoted it."""
    sizes = [
        f["what"]["figures"]["capacity"]["value"]
        for x in lines
        for f in x.get("kv_pool", [])
        if "capacity" in f.get("what", {}).get("figures", {})
    ]
    return max(sizes) if sizes else None


def rejudged(lines: list[dict[str, Any]], run: dict[str, Any]) -> list[dict[str, Any]]:
    """Each exporter's recorded window facts judged again by this checkout's kv_pool."""
    from vllm_glassbox.explain.diagnoses.kv_pool import kv_pool
    from vllm_glassbox.explain.render import sentence
    from vllm_glassbox.explain.scene import Reading, Scene, Scope, pool_from_json

    capacity = _capacity(lines)
    windows = {e["name"]: e["window"] for e in run["exporters"]}
    again = []
    for x in lines:
        name = x["source"].removeprefix("findings/")
        if not x["source"].startswith("findings/") or "pools" not in x or capacity is None:
            continue
        pools = tuple(pool_from_json(p) for p in x["pools"])
        scope = Scope(
            "exporter", run["url"], None, run["model"], len(pools), windows[name], x["unix"]
        )
        scene = Scene(scope, kv_capacity=Reading(capacity, "recorded findings"), pools=pools)
        found = [{"finding": f.finding, "what": {"text": sentence(f.what)}} for f in kv_pool(scene)]
        again.append({**x, "source": f"rejudged/{name}", "kv_pool": found})
    return again


def report(out: Path, rejudge: bool = False) -> str:
    summary = json.loads((out / "summary.json").read_text())
    lines = [json.loads(x) for x in (out / "timeline.jsonl").read_text().splitlines() if x]
    if rejudge:
        lines = sorted(lines + rejudged(lines, summary["run"]), key=lambda x: x["t"])
        for x in lines:
            if x["source"].startswith("rejudged/"):
                named = summary["named"].setdefault(x["source"], {})
                for f in x["kv_pool"] or [{"finding": "(none)"}]:
                    named[f["finding"]] = named.get(f["finding"], 0) + 1
    sources = sorted(
        {
            x["source"]
            for x in lines
            if x["source"].startswith(("findings/", "explain/", "rejudged/"))
        }
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
    sys.stdout.write(report(Path(sys.argv[1]), rejudge="--rejudge" in sys.argv[2:]))
