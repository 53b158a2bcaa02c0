"""`glassbox explain` on captured Prometheus data, in all three formats, against golden
files (tests/golden/explain/; `pytest --update-golden` rewrites them after review).

The recordings (tests/fixtures/prometheus/, made by tests/capture_prometheus.py) are a
real Prometheus' answers: the fleet benchmark's simulator at 20 pods, and the end-to-end
tests' real stack (vLLM's CPU build, the exporter) at each moment of its workload. They
are served again over HTTP (tests/prometheus_replay.py), so the command runs as it does
against Prometheus; a query it did not record fails the run.
"""

from __future__ import annotations

import functools
import json
import re
from pathlib import Path
from typing import Any

import pytest
from vllm_glassbox.exporter import derive

from tests.explain.run import Ran, explain
from tests.golden import check_golden
from tests.prometheus_replay import RECORDINGS, load, serve_recording

#: The recordings of a selection with something in it (the others: test_cli.py).
NAMES = sorted(
    p.stem for p in RECORDINGS.glob("*.json") if "refused" not in json.loads(p.read_text())
)
FORMATS = {"text": ".txt", "markdown": ".md", "json": ".json"}


@functools.cache
def replayed(name: str, *more: str) -> Ran:
    recording = load(name)
    with serve_recording(recording) as url:
        args = ["--prometheus", url, "--at", repr(recording["at"])]
        args += ["--since", f"{recording['since']:g}s"]
        if recording.get("namespace"):
            args += ["--namespace", recording["namespace"]]
        if recording.get("model"):
            args += ["--model", recording["model"]]
        ran = explain([*args, *more])
    # The replay's port changes from run to run; nothing else does.
    return Ran(ran.status, ran.out.replace(url, "http://prometheus.invalid"), ran.err)


def test_there_are_recordings_of_the_fleet_and_of_the_real_stack() -> None:
    assert {"fleet", "fleet-one"} <= set(NAMES)


@pytest.mark.parametrize("fmt", sorted(FORMATS))
@pytest.mark.parametrize("name", NAMES)
def test_explain_on_captured_prometheus_data_matches_golden(
    name: str, fmt: str, update_golden: bool
) -> None:
    ran = replayed(name, "--format", fmt)
    assert (ran.status, ran.err) == (0, "")
    check_golden(f"explain/{name}", ran.out, update_golden, FORMATS[fmt])


def _figures(body: dict[str, Any]) -> list[dict[str, Any]]:
    out = []
    for scene in body["scenes"]:
        for f in scene["findings"]:
            for statement in [f["what"], *f["change"]]:
                out += statement["figures"].values()
    return out


@pytest.mark.parametrize("name", NAMES)
def test_every_number_in_a_finding_is_read_or_computed_by_the_core(name: str) -> None:
    body = json.loads(replayed(name, "--format", "json").out)
    figures = _figures(body)
    assert figures
    for figure in figures:
        if figure["by"] == "read":
            assert figure["sources"], figure
            continue
        module, _, function = figure["by"].partition(".")
        assert module == "derive" and callable(getattr(derive, function)), figure


#: The only digits a sentence's template holds: names, not numbers of this server.
FIXED = {
    "0.11",  # vLLM 0.11, which skips speculation under penalties
    "0.20",  # vLLM 0.20, which splits the queue by reason
    "2.5",  # Qwen2.5
    "1.05",  # its default repetition penalty
    "1.0",  # the penalty to send instead
    "16",  # 16-bit weights
    "8",  # 8-bit weights
    "4",  # 4-bit weights
    "200",  # the H200
    "4–6",  # its compile cache's starts, seconds
    "20",
}


@pytest.mark.parametrize("name", NAMES)
def test_every_number_in_the_text_is_a_figure(name: str) -> None:
    """A sentence is its template with the figures shown in place, and a template holds no
    number of its own (only the fixed names above)."""
    body = json.loads(replayed(name, "--format", "json").out)
    for scene in body["scenes"]:
        for f in scene["findings"]:
            for statement in [f["what"], *f["change"]]:
                template = statement["template"]
                shown = {k: v["shown"] for k, v in statement["figures"].items()}
                filled = template.format(**shown)
                assert statement["text"] == filled[:1].upper() + filled[1:] + ".", statement
                assert set(re.findall(r"\d[\d.–]*\d|\d", template)) <= FIXED, template


def test_the_fleets_pressured_model_is_a_preemption_storm_first() -> None:
    body = json.loads(replayed("fleet-one", "--format", "json").out)
    findings = body["scenes"][0]["findings"]
    assert (findings[0]["diagnosis"], findings[0]["finding"]) == ("kv_pool", "preemption_storm")
    # tests/fleet.py: a pod under pressure preempts 0.2 a second, 97 % full, 3 waiting.
    figures = findings[0]["what"]["figures"]
    assert figures["fill"]["value"] == pytest.approx(0.97)
    assert figures["waiting"]["value"] == 3
    recording = load("fleet-one")
    assert figures["preempted"]["value"] == pytest.approx(0.2 * recording["since"], rel=0.05)


def test_golden_files_have_no_stray_entries() -> None:
    folder = Path(__file__).resolve().parent.parent / "golden" / "explain"
    expected = {f"{n}{suffix}" for n in NAMES for suffix in FORMATS.values()}
    assert {p.name for p in folder.iterdir()} == expected
