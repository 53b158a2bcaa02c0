"""The rate sweep judged by an SLO file (`slo: FILE`): the same objectives, and the same
counting, as the file's rules (core/slo/); goodput, each objective's attainment and
the knee within the SLOs, over steps captured from `vllm bench serve` against the vLLM CPU
build (tests/fixtures/bench)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from vllm_glassbox.core import slo
from vllm_glassbox.lab.experiments.pool_forecasts import judge_forecasts
from vllm_glassbox.lab.experiments.rate_sweep import (
    RateSweepPhase,
    RateSweepResult,
    ServerView,
    SweepStep,
    client_view,
    find_knee,
    judge_steps,
)
from vllm_glassbox.lab.experiments.rate_sweep.views import request_outcomes
from vllm_glassbox.lab.plan import PlanError, parse_plan
from vllm_glassbox.lab.report import write_outputs

from tests.fixtures import FIXTURES
from tests.lab_results import results_with

LOCAL = {"local": {"args": ["--model", "m"]}}
# TTFT 300 ms is no boundary of vLLM's: counted at 250 ms, as the rules count it.
SLO_FILE = {
    "objectives": [
        {"name": "ttft", "sli": "ttft", "threshold": "300ms", "target": "40%"},
        {"name": "e2e", "sli": "e2e", "threshold": "12s", "target": "50%"},
        {"name": "tpot", "sli": "tpot", "threshold": "100ms", "target": "90%"},
        {"name": "errors", "sli": "errors", "target": "99%"},
        {"name": "other", "sli": "e2e", "threshold": "1s", "target": "99%", "model": "other"},
    ]
}


def bench_json(name: str) -> dict[str, Any]:
    return dict(json.loads((FIXTURES / "bench" / name).read_text()))


@pytest.fixture
def slo_path(tmp_path: Path) -> Path:
    path = tmp_path / "slo.yaml"
    path.write_text(yaml.safe_dump(SLO_FILE))
    return path


def sweep(path: Path, **more: Any) -> dict[str, Any]:
    return {"kind": "rate-sweep", "rates": [0.5, 2], "slo": str(path), **more}


def test_a_sweep_reads_its_slo_file_with_the_plan(slo_path: Path) -> None:
    plan = parse_plan({"target": LOCAL, "phases": [sweep(slo_path)]})
    (phase,) = plan.phases
    assert isinstance(phase, RateSweepPhase) and phase.slo is not None
    assert [o.name for o in phase.slo.objectives] == ["ttft", "e2e", "tpot", "errors", "other"]
    assert "the objectives of" in phase.describe()


def test_an_slo_file_and_the_benchmarks_goodput_are_two_definitions_refused(
    slo_path: Path, tmp_path: Path
) -> None:
    with pytest.raises(PlanError) as both:
        parse_plan({"target": LOCAL, "phases": [sweep(slo_path, goodput={"ttft": "1s"})]})
    assert both.value.problems == [
        "phases[0].slo: give an SLO file or the benchmark's goodput SLOs, not both"
    ]
    broken = tmp_path / "broken.yaml"
    broken.write_text("objectives:\n  - {name: a, sli: ttft, target: 99%}\n")
    with pytest.raises(PlanError) as bad:
        parse_plan({"target": LOCAL, "phases": [sweep(broken)]})
    (problem,) = bad.value.problems
    assert problem.startswith(f"phases[0].slo: {broken}: 1 problem(s):")
    assert "objectives[0].threshold: required for a latency objective (ttft)" in problem


def by_hand(bench: dict[str, Any]) -> dict[str, tuple[int, int]]:
    """(good, counted) per objective from the benchmark's lists, written out apart from
    core/slo/: TTFT within 0.25 s (the boundary below 300 ms), end to end within
    10 s (below 12 s), each request's TPOT (latency - TTFT) / (tokens - 1) within 0.1 s."""
    answered = [
        (ttft, latency, tokens)
        for ttft, latency, tokens, error in zip(
            bench["ttfts"], bench["latencies"], bench["output_lens"], bench["errors"], strict=True
        )
        if not error
    ]
    tpots = [(latency - ttft) / (tokens - 1) for ttft, latency, tokens in answered]
    return {
        "ttft": (sum(ttft <= 0.25 for ttft, _, _ in answered), len(answered)),
        "e2e": (sum(latency <= 10.0 for _, latency, _ in answered), len(answered)),
        "tpot": (sum(t <= 0.1 for t in tpots), len(answered)),
        "errors": (len(answered), len(bench["errors"])),
    }


@pytest.mark.parametrize("name", ["cpu-0.32-step-0.5rps.json", "cpu-0.32-step-2rps.json"])
def test_goodput_of_a_captured_step_equals_the_hand_count(name: str) -> None:
    bench = bench_json(name)
    objectives = slo.parse(SLO_FILE, "slo.yaml")
    judged = slo.goodput(objectives, request_outcomes(bench), bench["duration"], "tiny")
    counts = {a.objective: (a.good, a.counted) for a in judged.attainments}
    assert counts == by_hand(bench)  # "other" serves another model: not judged here
    ttft = next(a for a in judged.attainments if a.objective == "ttft")
    assert ttft.threshold_seconds == 0.25


def test_the_two_steps_by_hand_meet_then_miss_the_objectives() -> None:
    objectives = slo.parse(SLO_FILE, "slo.yaml")
    slow, fast = (
        slo.goodput(objectives, request_outcomes(b), b["duration"], "tiny")
        for b in (bench_json("cpu-0.32-step-0.5rps.json"), bench_json("cpu-0.32-step-2rps.json"))
    )
    # 0.5 req/s: every request's TTFT under 0.25 s (the slowest 0.191), end to end under 10 s
    # (the slowest 3.9): 5 good of 5 in 13.9 s.
    assert (slow.good_requests, slow.requests, slow.met) == (5, 5, True)
    assert slow.per_second == pytest.approx(5 / 13.903745266999977)
    # 2 req/s: no request within 10 s end to end (the fastest 12.0 s): none good, e2e missed.
    assert (fast.good_requests, fast.requests, fast.met) == (0, 20, False)
    e2e = next(a for a in fast.attainments if a.objective == "e2e")
    assert (e2e.share, e2e.met, e2e.burn_rate) == (0.0, False, pytest.approx(2.0))


def _server() -> ServerView:
    base: dict[str, Any] = {name: None for name in ServerView.__dataclass_fields__}
    return ServerView(**{**base, "preemptions": 0.0, "inter_token_latency_seconds": 0.01})


def _step(index: int, rate: float, name: str) -> SweepStep:
    bench = bench_json(name)
    objectives = slo.parse(SLO_FILE, "slo.yaml")
    return SweepStep(
        index, rate, 10, None, client_view(bench), _server(), None, True, None, None, None,
        slo=slo.goodput(objectives, request_outcomes(bench), bench["duration"], "tiny"),
    )  # fmt: skip


def test_the_knee_within_the_slos_and_the_report_follow_the_slo_file(tmp_path: Path) -> None:
    steps = tuple(
        judge_steps(
            [_step(0, 0.5, "cpu-0.32-step-0.5rps.json"), _step(1, 2.0, "cpu-0.32-step-2rps.json")],
            0.95,
            None,
        )
    )
    knee = find_knee(steps, 0.9)
    assert knee.slo_rate == 0.5  # 2 req/s missed e2e (and ttft: 9 of 20 within 0.25 s)
    result = RateSweepResult(
        None, "Poisson", 1.0, 32, 200, None, {}, 0.9, steps, (), knee, judge_forecasts([]),
        slo_file="slo.yaml",
    )  # fmt: skip
    write_outputs(results_with(result, kind="rate-sweep"), tmp_path)
    report = (tmp_path / "report.md").read_text()
    assert "goodput SLOs: the objectives of slo.yaml (below)" in report
    assert "Within the SLOs (every objective of slo.yaml at its target): up to 0.5 req/s." in report
    assert "| 2 | e2e (e2e) | 10000 ms | 0 / 20 | 0% | 50% | 2 | **no** |" in report
    assert "| 0.5 | ttft (ttft) | 250 ms | 5 / 5 | 100% | 40% | 0 | yes |" in report
    data = json.loads((tmp_path / "results.json").read_text())
    (phase,) = data["phases"]
    assert phase["slo_file"] == "slo.yaml"
    assert phase["steps"][0]["slo"]["good_requests"] == 5
    assert phase["steps"][1]["slo"]["attainments"][1]["objective"] == "e2e"
