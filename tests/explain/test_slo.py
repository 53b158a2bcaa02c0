"""The SLO diagnosis on objectives written by hand (tests/explain/scenes.py), each burn rate
worked out by hand from its error ratio and target: the severities, the objective that
cannot be read, the mechanisms named behind a burn, and an SLO file beside the records."""

from __future__ import annotations

from dataclasses import replace

import pytest
from vllm_glassbox.core import slo as objectives
from vllm_glassbox.explain.diagnoses import BEHIND, BURNS, explain
from vllm_glassbox.explain.findings import Finding
from vllm_glassbox.explain.from_prometheus import with_slo_file
from vllm_glassbox.explain.render import render, sentence
from vllm_glassbox.explain.scene import scene_from_json, scene_to_json

from tests.explain import scenes
from tests.explain.scenes import objective, r, with_objectives


def slo_findings(scene: scenes.Scene) -> list[Finding]:
    return [f for f in explain(scene).findings if f.diagnosis == "slo"]


def only_slo(*states: scenes.ObjectiveState) -> Finding:
    (found,) = slo_findings(with_objectives(scenes.idle(), *states))
    return found


def test_a_fast_burn_is_critical_with_both_windows_burn_rates_and_the_budget_left() -> None:
    f = only_slo(scenes.fast_e2e())
    assert (f.finding, f.severity) == ("fast_burn", "critical")
    figures = {k: v.value for k, v in f.what.figures.items()}
    # 0.8 / (1 − 0.95) = 16 over the hour, 0.9 / 0.05 = 18 over five minutes.
    assert figures["burn_long"] == pytest.approx(16.0)
    assert figures["burn_short"] == pytest.approx(18.0)
    assert figures["factor"] == 14.4
    assert figures["missed"] == 0.8
    assert figures["threshold"] == 20.0
    assert figures["left"] == 0.2
    text = sentence(f.what)
    assert text.startswith(
        "Over the last hour 80 % of requests missed a whole answer within 20.0 s"
    )
    assert "16.0× as fast as the objective allows, and 18.0× over the last five minutes" in text
    assert "above VLLMSLOFastBurn's 14.4× (VLLMSLOFastBurn, VLLMSLOSlowBurn firing)" in text
    assert text.endswith("; 20 % of the error budget is left.")
    assert f.title == "SLO chat-e2e (job vllm): its error budget burns fast"
    assert f.runbook is not None and f.runbook.endswith("#vllmslofastburn")
    assert any("ALERTS" in e for e in f.evidence)
    assert any("error_ratio:rate1h" in e for e in f.evidence)


def test_a_slow_burn_is_a_warning_and_an_overspent_budget_says_how_many_times() -> None:
    f = only_slo(scenes.slow_ttft())
    assert (f.finding, f.severity) == ("slow_burn", "warning")
    figures = {k: v.value for k, v in f.what.figures.items()}
    # 0.07 / 0.01 = 7 over six hours, 0.08 / 0.01 = 8 over thirty minutes; the hour's 10 is
    # under the fast burn's 14.4.
    assert figures["burn_long"] == pytest.approx(7.0)
    assert figures["burn_short"] == pytest.approx(8.0)
    assert figures["factor"] == 6.0
    # 0.03 of the period missed at a budget of 0.01: three times the budget spent.
    assert figures["spent"] == pytest.approx(3.0)
    assert "it has spent 3.00× its error budget" in sentence(f.what)


def test_a_ticket_burn_is_a_warning_and_says_when_prometheus_shows_no_alert() -> None:
    f = only_slo(scenes.ticket_tpot())
    assert (f.finding, f.severity) == ("ticket_burn", "warning")
    figures = {k: v.value for k, v in f.what.figures.items()}
    # The second clause: 0.015 / 0.01 = 1.5 over three days, 0.02 / 0.01 = 2 over six
    # hours, above 1; the first (a day above 3) does not hold at 1.5.
    assert figures["burn_long"] == pytest.approx(1.5)
    assert figures["burn_short"] == pytest.approx(2.0)
    assert figures["factor"] == 1.0
    assert sentence(f.what).startswith("Over the last three days 1.5 % of requests missed")
    assert "firing" not in sentence(f.what)
    assert any(u.startswith("VLLMSLOTicketBurn firing: Prometheus shows it not") for u in f.unseen)


def test_an_objective_kept_is_ok_with_its_burn_and_budget() -> None:
    f = only_slo(scenes.kept_errors())
    assert (f.finding, f.severity) == ("kept", "ok")
    # 0.0005 / 0.001 = 0.5 over the hour.
    assert f.what.figures["burn"].value == pytest.approx(0.5)
    text = sentence(f.what)
    assert text.startswith("Over the last hour 0.05 % of requests were aborted, failed or")
    assert "under every burn alert's factor; 90 % of the error budget is left" in text
    assert f.see == () and f.runbook is None


def test_an_objective_without_its_bucket_cannot_be_read_and_is_never_advised_on() -> None:
    f = only_slo(scenes.missing_tpot())
    assert (f.finding, f.severity) == ("boundary_missing", "warning")
    assert f.what.figures["missing"].value == 8.0
    assert f.what.figures["threshold"].value == 0.06
    assert sentence(f.what).startswith(
        "This model's vLLM histogram has no bucket at 60.0 ms, the boundary this objective "
        "counts, in 8 of its series"
    )
    assert f.change == () and f.see == ()
    assert f.runbook is not None and f.runbook.endswith("#vllmsloboundarymissing")
    assert any("VLLMSLOBoundaryMissing" in e for e in f.evidence)


def test_a_burn_names_the_preemption_storm_of_the_same_scene_behind_it() -> None:
    found = explain(with_objectives(scenes.storm(), scenes.fast_e2e())).findings
    # Both critical: the objective missed first, then the mechanism.
    assert [(f.diagnosis, f.finding) for f in found][:2] == [
        ("slo", "fast_burn"),
        ("kv_pool", "preemption_storm"),
    ]
    assert found[0].see == ("kv_pool/preemption_storm",)
    text = render([explain(with_objectives(scenes.storm(), scenes.fast_e2e()))], "text")
    assert "   usually behind it: 2. The KV pool is full: vLLM preempts" in text
    md = render([explain(with_objectives(scenes.storm(), scenes.fast_e2e()))], "markdown")
    assert "Usually behind it: *[critical] The KV pool is full: vLLM preempts*." in md


def test_a_burn_with_no_mechanism_here_says_so_and_errors_name_none() -> None:
    (ttft,) = slo_findings(with_objectives(scenes.bf16(), scenes.slow_ttft()))
    # bf16's decode finding explains a time per token, not a first token.
    assert ttft.see == ()
    assert any(u.startswith("what is behind it: none of the findings") for u in ttft.unseen)
    errors = replace(scenes.fast_e2e(), name="chat-errors", sli="errors", threshold=None)
    (f,) = slo_findings(with_objectives(scenes.storm(), errors))
    assert f.see == () and BEHIND["errors"] == ()
    assert "were aborted, failed or refused" in sentence(f.what)
    assert any("finished_reason" in u for u in f.unseen)


def test_a_threshold_counted_at_a_lower_boundary_says_so_from_the_slo_file() -> None:
    """An SLO file's 25 s end-to-end objective is counted at vLLM's 20 s boundary: the
    finding names both, and says the burn is overstated; without the file it cannot tell."""
    parsed = objectives.parse(
        {"objectives": [{"name": "chat-e2e", "sli": "e2e", "threshold": "25s", "target": "95%"}]},
        "slo.yaml",
    )
    scene = with_slo_file(with_objectives(scenes.idle(), scenes.fast_e2e()), parsed)
    (f,) = slo_findings(scene)
    assert f.what.figures["asked"].value == 25.0
    assert "within 20.0 s (the bucket boundary counted, below the objective's 25.0 s)" in (
        sentence(f.what)
    )
    assert any("overstated, never understated" in a for a in f.assumes)
    (without,) = slo_findings(with_objectives(scenes.idle(), scenes.fast_e2e()))
    assert any("--slo with its SLO file says" in u for u in without.unseen)


def test_an_slo_files_objective_without_records_is_said_only_when_asked() -> None:
    parsed = objectives.parse(
        {
            "objectives": [
                {"name": "chat-ttft", "model": "tiny", "sli": "ttft", "threshold": "500ms",
                 "target": "99%"},
                {"name": "other-model", "model": "other", "sli": "errors", "target": "99%"},
                {"name": "other-team", "namespace": "team-b", "sli": "errors", "target": "99%"},
            ]
        },
        "slo.yaml",
    )  # fmt: skip
    assert slo_findings(scenes.idle()) == []
    (f,) = slo_findings(with_slo_file(scenes.idle(), parsed))
    assert (f.finding, f.severity, f.title) == ("no_records", "info", "SLO chat-ttft: no records")
    assert "glassbox rules --slo slo.yaml" in f.unseen[0]


def test_every_burn_alert_of_the_rules_is_a_finding_and_only_those() -> None:
    assert list(BURNS) == list(objectives.BURN_ALERTS)


def test_the_scene_of_objectives_survives_json() -> None:
    scene = with_objectives(
        scenes.storm(),
        scenes.fast_e2e(),
        scenes.missing_tpot(),
        replace(scenes.kept_errors(), asked_in="slo.yaml", asked_threshold=r(1.0)),
    )
    assert scene_from_json(scene_to_json(scene)) == scene


def test_every_slo_number_is_read_or_from_the_core() -> None:
    scene = with_objectives(
        scenes.storm(),
        scenes.fast_e2e(),
        scenes.slow_ttft(),
        scenes.ticket_tpot(),
        scenes.kept_errors(),
        scenes.missing_tpot(),
    )
    found = slo_findings(scene)
    assert len(found) == 5
    for f in found:
        for figure in f.figures.values():
            assert figure.by in ("read", "derive.burn_rate"), figure
            assert figure.sources, figure


def test_an_objective_no_request_missed_says_so_without_a_burn() -> None:
    f = only_slo(replace(scenes.kept_errors(), error_ratios={"rate1h": r(0.0, "q")}))
    assert (f.finding, f.severity) == ("kept", "ok")
    assert sentence(f.what) == (
        "Over the last hour no request was aborted, failed or refused, against a target of "
        "99.9 %; 90 % of the error budget is left."
    )


def test_an_objective_that_counted_no_request_says_nothing() -> None:
    quiet = objective("quiet", "ttft", 0.99, threshold=0.5, budget=1.0, period=0.0)
    assert slo_findings(with_objectives(scenes.idle(), quiet)) == []
