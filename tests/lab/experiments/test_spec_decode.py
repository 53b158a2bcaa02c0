"""The speculative-decoding experiment (lab/experiments/spec_decode/): the speed-up over the
baseline without speculation, and a baseline that drafts refused as a baseline.
"""

from __future__ import annotations

import pytest
from vllm_glassbox.lab.experiments.spec_decode import penalty_finding, spec_runs

from tests.lab_results import spec_run, stats


def test_spec_speedup_is_the_baseline_without_speculation_over_each_run() -> None:
    on = stats(0.004, forward_passes=43.0, drafts=43.0, draft_coverage=1.0)
    off = stats(0.0136, forward_passes=255.0)
    runs, speedup, problem = spec_runs(
        [
            spec_run("rp 1.0", {"repetition_penalty": 1.0}, False, True, on),
            spec_run("no speculation", {"repetition_penalty": 1.0}, True, False, off),
        ]
    )
    assert problem is None
    assert speedup == pytest.approx(3.4)
    assert [r.speedup for r in runs] == [pytest.approx(3.4), None]
    assert runs[0].finding == "speculated on 100% of decode steps, – of draft tokens accepted"
    assert runs[1].finding == "no speculation (server without --speculative-config)"


def test_a_baseline_that_drafts_is_refused_as_a_baseline() -> None:
    # vLLM 0.24 speculates under the model's default penalty: both runs drafted, 46 passes
    # each. "1.39×" between them would compare speculation with speculation.
    with_rp = stats(0.004, forward_passes=46.0, drafts=44.0, draft_coverage=44 / 46)
    defaults = stats(0.0056, forward_passes=46.0, drafts=44.0, draft_coverage=44 / 46)
    runs, speedup, problem = spec_runs(
        [
            spec_run("repetition_penalty 1.0", {"repetition_penalty": 1.0}, False, True, with_rp),
            spec_run("model defaults", {}, True, True, defaults),
        ]
    )
    assert speedup is None and [r.speedup for r in runs] == [None, None]
    assert problem == (
        "the baseline drafted 44 times (96% of its decode steps): it speculated, so it is "
        "no baseline; no speed-up is given"
    )
    assert penalty_finding(runs, 1.05, "0.24.0") == (
        "vLLM 0.24.0 speculates under a repetition penalty: run 'model defaults' (the "
        "model's default 1.05) drafted 44 times in 46 decode steps (v0.11 skipped "
        "speculation for such requests)"
    )
    skipped = stats(0.0136, forward_passes=255.0, draft_coverage=0.0)
    runs, _, _ = spec_runs(
        [
            spec_run("repetition_penalty 1.0", {"repetition_penalty": 1.0}, False, True, with_rp),
            spec_run("model defaults", {}, True, True, skipped),
        ]
    )
    assert penalty_finding(runs, 1.05, "0.11.0") == (
        "vLLM 0.11.0 skips speculation under a repetition penalty, as v0.11 did: run "
        "'model defaults' (the model's default 1.05) drafted nothing in 255 decode steps"
    )
