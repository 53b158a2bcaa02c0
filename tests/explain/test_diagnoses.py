"""Each diagnosis on a scene written by hand, its numbers worked out by hand."""

from __future__ import annotations

from dataclasses import replace

import pytest
from vllm_glassbox.core import derive
from vllm_glassbox.explain.diagnoses import explain
from vllm_glassbox.explain.findings import Finding
from vllm_glassbox.explain.render import render, sentence
from vllm_glassbox.explain.scene import Blind, LabBaseline, scene_from_json, scene_to_json

from tests.explain import scenes
from tests.explain.scenes import MIB, r


def only(scene: scenes.Scene, diagnosis: str) -> Finding:
    found = [f for f in explain(scene).findings if f.diagnosis == diagnosis]
    assert len(found) == 1, [f.finding for f in explain(scene).findings]
    return found[0]


def test_a_full_pool_preempting_while_requests_wait_is_a_storm() -> None:
    f = only(scenes.storm(), "kv_pool")
    assert (f.finding, f.severity) == ("preemption_storm", "critical")
    assert f.what.figures["preempted"].value == 58
    assert f.what.figures["capacity"].value == 4096
    assert f.what.figures["waiting"].value == 5
    change = {k: v.value for s in f.change for k, v in s.figures.items()}
    # 3,500 tokens over 10 running requests: 350 a request; 58 × 350 = 20,300 recomputed.
    assert change["mean"] == 350
    assert change["recomputed"] == 20300
    # 11 running and 5 waiting at 350 tokens: 5,600 tokens, 44 blocks of 128 (5,632 tokens)
    # at 2,048 bytes: 11,534,336 bytes for --kv-cache-memory-bytes.
    assert change["demanded"] == 5600
    assert change["memory"] == 44 * 128 * 2048
    assert change["per_token"] == 2048
    assert "--kv-cache-memory-bytes" in sentence(f.change[-1])


def test_a_pool_sized_by_the_utilization_names_the_utilization_that_holds_the_demand() -> None:
    scene = replace(
        scenes.storm(),
        kv_memory_fixed=False,
        gpu_memory_utilization=r(0.9),
        gpu_memory=r(64 * MIB),
    )
    f = only(scene, "kv_pool")
    last = f.change[-1]
    # 11,534,336 − 8,388,608 = 3,145,728 bytes more: 3 MiB of a 64 MiB GPU, 0.046875.
    assert last.figures["utilization"].value == pytest.approx(0.9 + 3 / 64)
    assert "--gpu-memory-utilization" in sentence(last)
    without = only(replace(scene, gpu_memory=None), "kv_pool")
    assert any("GPU's memory" in u for u in without.unseen)


def test_a_full_pool_with_nobody_waiting_is_no_storm() -> None:
    # 58 preemptions with nobody seen waiting: they happened between polls (a warning).
    f = only(replace(scenes.storm(), waiting_peak=r(0)), "kv_pool")
    assert (f.finding, f.severity) == ("preempted", "warning")
    quiet = replace(
        scenes.storm(),
        waiting_peak=r(0),
        decode=scenes.window(
            generated=9600, first=16, steps=9000, step_seconds=180.0, engine_steps=1200
        ),
    )
    f = only(quiet, "kv_pool")
    assert (f.finding, f.severity) == ("full", "info")
    nothing = explain(replace(quiet, kv_usage_peak=r(0.5)))
    assert [x for x in nothing.findings if x.diagnosis == "kv_pool"] == []


def test_requests_deferred_for_another_reason_are_not_kv_demand() -> None:
    scene = replace(
        scenes.storm(), waiting_capacity_peak=r(5), waiting_deferred_peak=r(3), waiting_peak=r(8)
    )
    f = only(scene, "kv_pool")
    assert f.what.figures["waiting"].value == 5  # waiting for room, not all 8
    assert any("deferred" in sentence(c) for c in f.change)


def test_speculation_drafting_on_no_step_under_vllm_0_11_is_the_penalty_bypass() -> None:
    f = only(scenes.bypassed("0.11.0"), "speculation")
    assert (f.finding, f.severity) == ("bypassed", "warning")
    assert f.what.figures["coverage"].value == 0.0
    assert f.what.figures["steps"].value == 255
    assert f.what.figures["per_pass"].value == 1.0  # (256 − 1) / 255
    assert "repetition" in f.assumes[0] and "0.11.0" in f.assumes[0]
    later = only(scenes.bypassed("0.32.0"), "speculation")
    assert "nothing to draft" in later.assumes[0]


def test_speculation_that_drafts_and_is_accepted_works() -> None:
    f = only(scenes.speculating(), "speculation")
    assert (f.finding, f.severity) == ("working", "ok")
    # (512 − 2) / 104 = 4.9038 tokens per pass; 96 / 104 = 92.3 % of steps; 414 / 446.
    assert f.what.figures["per_pass"].value == pytest.approx(510 / 104)
    assert f.what.figures["coverage"].value == pytest.approx(96 / 104)
    assert f.what.figures["acceptance"].value == pytest.approx(414 / 446)
    assert any("speed-up" in u for u in f.unseen)  # no plain step: no speed-up claimed


def test_a_lab_baseline_gives_speculations_speed_up_and_the_coverage_it_needs() -> None:
    lab = LabBaseline("lab/results.json", plain_step_seconds=6.125e-3)
    f = only(replace(scenes.speculating(), lab=lab), "speculation")
    # A step: 0.6 / 104 = 5.769 ms for 4.9038 tokens (1.1765 ms a token); plain 6.125 ms:
    # 6.125 / 1.1765 = 5.206×.
    assert f.what.figures["speedup"].value == pytest.approx(6.125e-3 / (0.6 / 510))
    # A speculative step costs 5.769 / 6.125 = 0.942 plain ones: cheaper, so any coverage
    # pays: 0 needed.
    needed = f.change[0].figures
    assert needed["needed"].value == pytest.approx((0.6 / 104) / 6.125e-3)
    assert needed["cover"].value == 0.0


def test_drafts_mostly_rejected_do_not_pay() -> None:
    scene = replace(
        scenes.speculating(),
        decode=scenes.window(
            generated=3000,
            first=10,
            steps=2900,
            step_seconds=58.0,
            engine_steps=2950,
            drafts=2800,
            draft_tokens=14000,
            accepted=90,
        ),
    )
    f = only(scene, "speculation")
    assert (f.finding, f.severity) == ("not_paying", "warning")
    assert f.what.figures["acceptance"].value == pytest.approx(90 / 14000)
    assert f.what.figures["per_pass"].value == pytest.approx(2990 / 2900)


def test_decode_at_two_thirds_of_the_peak_is_bound_by_weight_reads() -> None:
    f = only(scenes.bf16(), "decode")
    assert (f.finding, f.severity) == ("weight_bound", "info")
    step = 1.7957383069999935 / 381  # 4.7132 ms
    assert f.what.figures["bandwidth"].value == pytest.approx(15343770664.96 / step)
    assert f.what.figures["share"].value == pytest.approx(15343770664.96 / step / 4.8e12)
    assert f.what.figures["floor"].value == pytest.approx(15343770664.96 / 4.8e12)
    # 8 and 4 bits of these weights at this bandwidth: half and a quarter of the step.
    steps = [c.figures["predicted"].value for c in f.change]
    assert steps == pytest.approx([step / 2, step / 4])


def test_decode_far_below_the_peak_is_not_bound_by_weight_reads() -> None:
    scene = replace(scenes.bf16(), peak_bandwidth=r(20e12))
    f = only(scene, "decode")
    assert (f.finding, f.severity) == ("not_weight_bound", "warning")


def test_unknown_weights_are_said_and_nothing_is_advised() -> None:
    f = only(replace(scenes.bf16(), weights=None), "decode")
    assert f.finding == "weights_unknown"
    assert f.change == ()
    assert any("glassbox_model_weights_bytes" in u for u in f.unseen)


def test_an_unknown_peak_gives_the_bandwidth_and_no_share() -> None:
    f = only(replace(scenes.bf16(), peak_bandwidth=None), "decode")
    assert f.finding == "bandwidth_only"
    assert "share" not in f.what.figures
    assert any("peak bandwidth" in u for u in f.unseen)


def test_an_idle_server_is_said_plainly() -> None:
    found = explain(scenes.idle()).findings
    assert [(f.diagnosis, f.severity) for f in found] == [("idle", "ok")]
    assert "Nothing to judge; nothing wrong" in sentence(found[0].what)


def test_a_start_mostly_compiling_says_so_and_what_it_would_take_without() -> None:
    scene = scenes.with_startup(
        scenes.idle(), total=117.0, compile=70.0, weights_load=2.0, engine_init=10.0, other=35.0
    )
    f = only(scene, "cold_start")
    assert f.finding == "compile"
    assert f.what.figures["share"].value == pytest.approx(70 / 117)
    assert f.change[1].figures["without"].value == 47.0
    # "other" (processes starting) dominating is no finding: nothing to change there.
    other = scenes.with_startup(scenes.idle(), total=117.0, compile=10.0, other=100.0)
    assert [x for x in explain(other).findings if x.diagnosis == "cold_start"] == []


def test_what_glassbox_cannot_read_comes_first() -> None:
    scene = replace(
        scenes.storm(),
        blind=(Blind("failed_polls", "timeout 3", 3.0, "glassbox_scrape_errors_total"),),
    )
    found = explain(scene).findings
    assert [(f.diagnosis, f.severity) for f in found][:2] == [
        ("glassbox", "warning"),
        ("kv_pool", "critical"),
    ]


def test_every_number_of_every_finding_is_read_or_from_the_core() -> None:
    for scene in (
        scenes.storm(),
        scenes.bypassed(),
        scenes.speculating(),
        scenes.bf16(),
        scenes.idle(),
    ):
        for f in explain(scene).findings:
            for name, figure in f.figures.items():
                if figure.by == "read":
                    continue
                module, _, function = figure.by.partition(".")
                assert module == "derive" and callable(getattr(derive, function)), name


def test_a_scene_survives_json() -> None:
    for scene in (scenes.storm(), scenes.bypassed(), scenes.with_startup(scenes.idle(), total=3)):
        assert scene_from_json(scene_to_json(scene)) == scene


def test_the_three_formats_say_the_same_findings() -> None:
    explained = [explain(scenes.storm())]
    text, md, js = (render(explained, f) for f in ("text", "markdown", "json"))
    what = sentence(explained[0].findings[0].what)
    assert what in text and what in md and what in js.replace("\\u2026", "…")


def test_an_exporter_that_cannot_read_vllm_is_critical_and_named_with_its_count() -> None:
    scene = replace(
        scenes.idle(),
        blind=(
            Blind("target_down", "glassbox_target_up 0", 2.0, "count(glassbox_target_up == 0)"),
            Blind(
                "input_unrecognised", "vLLM's log has a shape {x} glassbox does not read", None, "q"
            ),
        ),
    )
    found = explain(scene).findings
    assert [(f.finding, f.severity) for f in found[:2]] == [
        ("target_down", "critical"),
        ("input_unrecognised", "warning"),
    ]
    assert found[0].what.figures["count"].value == 2.0
    assert sentence(found[0].what).startswith("2 exporters of this model cannot read their vLLM")
    assert "a shape {x} glassbox" in sentence(found[1].what)  # braces are words, not fields


def test_a_flagged_input_is_never_advised_on() -> None:
    """A V0 page's speculative counters are running totals glassbox drops
    (v0_spec_counters): the speculation they would show is not judged."""
    flag = Blind(
        "input_unrecognised",
        "vLLM's page has a shape glassbox does not read, v0_spec_counters",
        None,
        'glassbox_input_unrecognised{source="page",shape="v0_spec_counters"}',
        "v0_spec_counters",
    )
    found = {f.diagnosis: f for f in explain(replace(scenes.bypassed(), blind=(flag,))).findings}
    assert (found["speculation"].finding, found["speculation"].change) == ("not_judged", ())
    assert "v0_spec_counters" in sentence(found["speculation"].what)
    assert found["glassbox"].finding == "input_unrecognised"


def test_a_window_without_two_scrapes_judges_nothing_and_says_so() -> None:
    scene = replace(scenes.idle(), decode=scenes.window())
    found = explain(scene).findings
    assert [(f.diagnosis, f.finding) for f in found] == [("idle", "no_increase")]
    assert "fewer than two scrapes" in sentence(found[0].what)
