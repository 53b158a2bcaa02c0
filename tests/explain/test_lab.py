"""The lab report's closing section ("What this run says") and `--lab`: a run's servers
through the same diagnoses, on the H200 run's own results.json."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest
from vllm_glassbox.explain.from_lab import LabFileError, baseline, load_results, report_section
from vllm_glassbox.lab.report import render_markdown
from vllm_glassbox.lab.results import LabResults

REPO = Path(__file__).resolve().parents[2]
H200 = REPO / "docs" / "results" / "h200" / "run-1" / "results.json"


@pytest.fixture(scope="module")
def h200() -> dict[str, Any]:
    return load_results(str(H200))


def test_the_closing_section_names_each_servers_findings(h200: dict[str, Any]) -> None:
    section = "\n".join(report_section(h200))
    assert section.startswith("## What this run says")
    assert "### phase quantization variant BF16" in section
    assert "**[info] Decode is bound by weight reads.**" in section
    # The flood of the 58,000-token pool: 18 preemptions while up to 18 waited.
    assert "### phase kv-pressure" in section
    assert (
        "Over the 33.2 s window vLLM preempted requests 18 times; its KV pool (58,000 tokens "
        "an engine) ran 99.7 % full at most (0 % now), while up to 18 requests waited" in section
    )
    # vLLM 0.24 speculates under the model's default penalty: the run works.
    assert "### phase spec-decode run model defaults (1.05)" in section


def test_a_penalized_run_on_vllm_0_11_reads_as_bypassed(h200: dict[str, Any]) -> None:
    """The same run as vLLM 0.11 would have made it: the penalized run drafts nothing."""
    run = copy.deepcopy(h200)
    spec = next(p for p in run["phases"] if p["kind"] == "spec-decode")
    spec["vllm_version"] = "0.11.0"
    penalized = next(r for r in spec["runs"] if r["label"] == "model defaults (1.05)")
    penalized.update(drafts=0.0, draft_tokens=0.0, accepted_tokens=0.0, forward_passes=765.0)
    section = "\n".join(report_section(run))
    block = section.split("### phase spec-decode run model defaults (1.05)")[1].split("###")[0]
    assert "**[warning] Speculation is configured but bypassed.**" in block
    assert "0 % of 765 decode steps drafted" in block
    # The lab's speed-up with drafts is set beside it.
    assert "the lab measured decode 3.74× faster with drafts" in block.lower()


def test_the_report_closes_with_it_and_a_run_without_phases_has_none() -> None:
    empty = LabResults("p", "local", 1_764_400_000.0, ended_at=1_764_400_010.0, status="ok")
    assert "What this run says" not in render_markdown(empty)


def test_lab_gives_a_live_server_the_runs_precisions_and_plain_step(h200: dict[str, Any]) -> None:
    lab = baseline(h200, "run-1/results.json")
    assert [v.name for v in lab.variants] == ["BF16", "AWQ", "GPTQ-Int4", "FP8-dynamic"]
    assert [v.fitted for v in lab.variants] == [True, True, False, False]
    spec = next(p for p in h200["phases"] if p["kind"] == "spec-decode")
    plain = next(r for r in spec["runs"] if r["baseline"])
    assert lab.plain_step_seconds == plain["inter_token_latency_seconds"]
    assert lab.speculative_speedup == spec["speedup"]


def test_a_results_json_without_what_explain_needs_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "results.json"
    path.write_text(json.dumps({"phases": [{"kind": "kv-pressure"}]}))
    with pytest.raises(LabFileError, match="neither a quantization phase"):
        baseline(load_results(str(path)), str(path))
