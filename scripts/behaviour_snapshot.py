#!/usr/bin/env python3
"""Everything glassbox writes from its inputs, into one folder, so that two trees can be
compared byte for byte (`scripts/same-behaviour.sh BASE` runs this in both and diffs):

- the exporter's page after each poll of every captured page folder, polled in order
  (`pages/`), and its `/findings` after the last poll;
- the rules: `glassbox rules` with an aggregation label, and the example SLO file's rules;
- the dashboards' JSON, as `glassbox dashboards generate` writes it;
- explain's answers on every recorded Prometheus (three formats), on the scenes written
  by hand and on every lab run's results.json kept in docs/results (`--lab`);
- the lab's report.md of the synthetic results the report's tests use.

It imports what it needs through the names both sides of a move know (the `glassbox`
command, and each module's old or new place).
"""

from __future__ import annotations

import contextlib
import importlib
import io
import json
import logging
import re
import shutil
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))


def first(*modules: str) -> Any:
    """The first of `modules` that this tree's package holds (a module moved between two
    trees; an editable install of the other tree may still resolve its names)."""
    root = Path(importlib.import_module("vllm_glassbox").__file__ or "").parent.parent
    for name in modules:
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError:
            continue
        if Path(module.__file__ or "").is_relative_to(root):
            return module
    raise ModuleNotFoundError(modules[0])


def run_cli(argv: list[str]) -> str:
    cli = importlib.import_module("vllm_glassbox.cli")
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            status = cli.main(argv)
        except SystemExit as e:
            status = int(e.code or 0)
    text = f"status {status}\n--- stdout\n{out.getvalue()}--- stderr\n{err.getvalue()}"
    return text.replace(str(REPO), "REPO")


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def pages(out: Path) -> None:
    golden = importlib.import_module("tests.golden")
    errors = first("vllm_glassbox.core.errors", "vllm_glassbox.exporter.errors")
    fetch = first("vllm_glassbox.core.fetch", "vllm_glassbox.exporter.fetch")
    service = importlib.import_module("vllm_glassbox.exporter.service")
    prometheus_client = importlib.import_module("prometheus_client")

    class Pages(fetch.Fetcher):  # type: ignore[misc,name-defined]
        def __init__(self, texts: list[str], version: str) -> None:
            self.texts, self.version = list(texts), version

        def get_text(self, path: str, timeout_seconds: float | None = None) -> str:
            if path == "/version":
                return json.dumps({"version": self.version})
            if path != "/metrics" or not self.texts:
                raise errors.ScrapeError("http_status", f"{path}: HTTP 404")
            return self.texts.pop(0)

        def close(self) -> None:
            pass

    fixtures = REPO / "tests" / "fixtures"
    folders = sorted(
        {
            p.parent
            for root in ("metrics", "corpus", "matrix")
            for p in (fixtures / root).rglob("*.txt")
        }
    )
    for folder in folders:
        texts = [
            p
            for p in sorted(folder.glob("*.txt"))
            if not p.name.endswith(".exporter.txt") and not p.name.startswith("README")
        ]
        version = "0.11.0" if "0.11" in str(folder) else "0.32.0"
        clock = Clock()
        config = service.ExporterConfig(
            target="http://vllm.invalid:8000", interval_seconds=10.0, window_seconds=60.0
        )
        poller = service.Poller(
            config, fetcher=Pages([p.read_text() for p in texts], version), clock=clock
        )
        registry = service.make_registry(poller)
        name = str(folder.relative_to(fixtures)).replace("/", "__")
        rendered = []
        for text in texts:
            poller.poll_once()
            clock.now += 10.0
            page = prometheus_client.generate_latest(registry).decode()
            rendered.append(f"### after {text.name}\n{golden.strip_volatile(page)}")
        (out / "pages" / f"{name}.prom").write_text("".join(rendered))
        answer = service.findings_answer(poller.state)
        body = json.loads(answer.body) if answer.status == 200 else {"status": answer.status}
        # The scene's time is the wall clock's of the poll, not the pages'.
        text = re.sub(r'"at": [0-9.e+]+', '"at": "T"', json.dumps(body, indent=1))
        (out / "pages" / f"{name}.findings.json").write_text(text)


def rules(out: Path) -> None:
    alerts = sorted(str(p) for p in (REPO / "alerts").glob("glassbox-*.yaml"))
    target = out / "rules"
    log = run_cli(["rules", "--aggregation-labels", "cluster", "--out", str(target), *alerts])
    slo = run_cli(["rules", "--slo", str(REPO / "alerts/slo/example.yaml"), "--out", str(target)])
    text = (log + slo).replace(str(out), "OUT").replace(str(REPO), "REPO")
    (target / "cli.txt").write_text(text)
    # The rules as Prometheus reads them: their comments name source files, which move.
    for path in target.glob("*.yaml"):
        lines = path.read_text().splitlines(keepends=True)
        path.write_text("".join(line for line in lines if not line.lstrip().startswith("#")))


def dashboards(out: Path) -> None:
    catalog = importlib.import_module("vllm_glassbox.dashboards.catalog")
    target = out / "dashboards"
    target.mkdir()
    for path in sorted((REPO / "dashboards" / "generated").glob("*.json")):
        shutil.copy(path, target / path.name)
    for name, text in sorted(catalog.expected_files().items()):
        (target / f"fresh-{name}").write_text(text)
    check = run_cli(["dashboards", "generate", "--check"])  # where it looked differs
    (target / "check.txt").write_text(re.sub(r"\S*/dashboards/generated", "GENERATED", check))


def explain(out: Path) -> None:
    replay = importlib.import_module("tests.prometheus_replay")
    target = out / "explain"
    target.mkdir()
    for path in sorted(replay.RECORDINGS.glob("*.json")):
        recording = replay.load(path.stem)
        with replay.serve_recording(recording) as url:
            args = ["explain", "--prometheus", url, "--at", repr(recording["at"])]
            args += ["--since", f"{recording['since']:g}s"]
            for flag in ("namespace", "model"):
                if recording.get(flag):
                    args += [f"--{flag}", recording[flag]]
            if recording.get("slo"):
                args += ["--slo", str(replay.RECORDINGS / recording["slo"])]
            for fmt in ("text", "markdown", "json"):
                text = run_cli([*args, "--format", fmt]).replace(url, "URL")
                text = text.replace(f"{replay.RECORDINGS}/", "")
                (target / f"{path.stem}.{fmt}").write_text(text)
    scenes = importlib.import_module("tests.explain.scenes")
    diagnoses = importlib.import_module("vllm_glassbox.explain.diagnoses")
    render = importlib.import_module("vllm_glassbox.explain.render")
    for name in ("storm", "bypassed", "speculating", "bf16", "idle"):
        explained = diagnoses.explain(getattr(scenes, name)())
        (target / f"scene-{name}.txt").write_text(render.text([explained]))
    from_lab = importlib.import_module("vllm_glassbox.explain.from_lab")
    for path in sorted((REPO / "docs" / "results").rglob("results.json")):
        name = str(path.parent.relative_to(REPO / "docs" / "results")).replace("/", "__")
        try:
            lab = from_lab.baseline(from_lab.load_results(str(path)), str(path))
            (target / f"lab-{name}.txt").write_text(repr(lab).replace(str(REPO), "REPO"))
        except Exception as e:  # a results file the baseline cannot read: its message
            (target / f"lab-{name}.txt").write_text(
                f"{type(e).__name__}: {e}".replace(str(REPO), "REPO")
            )


def lab(out: Path) -> None:
    target = out / "lab"
    target.mkdir()
    test_report = importlib.import_module("tests.lab.test_report")
    report = importlib.import_module("vllm_glassbox.lab.report")
    results = test_report.synthetic_results()
    (target / "report.md").write_text(report.render_markdown(results))
    (target / "results.json").write_text(json.dumps(results.to_json(), indent=1))


def main() -> int:
    logging.disable(logging.CRITICAL)  # the polls' warnings are not what is compared
    out = Path(sys.argv[1])
    if out.exists():
        shutil.rmtree(out)
    (out / "pages").mkdir(parents=True)
    for part in (pages, rules, dashboards, explain, lab):
        part(out)
    print(f"behaviour written to {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
