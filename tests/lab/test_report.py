"""The run's outputs (lab/report.py, lab/results.py), written from synthetic results of every
phase kind: results.json's contract keys, the report's tables and plots, a run interrupted
before any phase, and the reason a panel without data gives.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from vllm_glassbox.core.units import GIB
from vllm_glassbox.lab.experiments.kv_pressure import KvPressureResult, pressure_summary
from vllm_glassbox.lab.experiments.quantization import QuantizationResult, VariantResult, fit_tpot
from vllm_glassbox.lab.experiments.spec_decode import SpecDecodeResult, spec_runs
from vllm_glassbox.lab.report import render_markdown, why_empty, write_outputs
from vllm_glassbox.lab.results import LabResults, Peak, PhaseResult

from tests.lab_results import PNG, no_nan, point_at, spec_run, startup, stats, variant


def test_a_panel_without_data_gives_the_reason_its_description_states() -> None:
    assert (
        why_empty("Achieved bandwidth. Present only when the exporter is given --gpu. More.")
        == "Present only when the exporter is given --gpu."
    )
    assert why_empty("No reason here.") == "(its description does not say why)"


def synthetic_results() -> LabResults:
    l40s = 864e9
    quant_variants = (
        variant("BF16", 14.19, 0.0230, True, 487424, (0.0228, 0.0230, 0.0233), l40s),
        variant("AWQ", 5.19, 0.0095, True, 1_150_000, peak=l40s, quantization="awq"),
        variant("GPTQ-Int4", 5.19, 0.0096, False, 1_150_000, peak=l40s, quantization="gptq"),
        VariantResult("FP8", "org/FP8", False, error="server exited with code 1:\nCUDA error"),
    )
    fit, _ = fit_tpot(quant_variants, peak_bandwidth=l40s)
    timeline = (
        point_at(0, 32, 0, 0.3, 0),
        point_at(5, 32, 0, 0.9, 0),
        point_at(10, 28, 4, 1.0, 0),
        point_at(15, 24, 6, 1.0, 13),
        point_at(20, 30, 0, 0.7, 14),
        point_at(25, 0, 0, 0, 14),
    )
    pressure = KvPressureResult(
        startup=startup(5.19, 57344),
        requests=32,
        completed=32,
        failed=0,
        flood_seconds=25.0,
        timeline=timeline,
        poll_seconds=5.0,
        pressure=pressure_summary(timeline, 0.95),
    )
    runs, speedup, problem = spec_runs(
        [
            spec_run(
                "repetition_penalty 1.0",
                {"repetition_penalty": 1.0},
                False,
                True,
                stats(
                    0.004,
                    generated_tokens=256.0,
                    forward_passes=43.0,
                    drafts=43.0,
                    tokens_per_forward_pass=255 / 43,
                    draft_tokens=213.0,
                    accepted_tokens=213.0,
                    acceptance_ratio=1.0,
                    draft_coverage=1.0,
                ),
            ),
            spec_run(
                "no speculation",
                {"repetition_penalty": 1.0},
                True,
                False,
                stats(0.0136, generated_tokens=256.0, forward_passes=255.0),
            ),
        ]
    )
    spec = SpecDecodeResult(
        startup(5.19, 1_150_000),
        tuple(runs),
        speedup,
        1.9,
        2.0,
        0.2,
        startup_without_speculation=startup(5.19, 1_160_000),
        baseline_problem=problem,
    )
    results = LabResults("seed-l40s", "kubernetes", 1_764_400_000.0, version="0.1.0")
    results.peak = Peak(864e9, "from the L40S datasheet")
    results.phases = [
        PhaseResult(
            "quantization",
            "quantization",
            "ok",
            1_764_400_000.0,
            1_764_400_600.0,
            QuantizationResult(quant_variants, fit, None),
        ),
        PhaseResult("kv-pressure", "kv-pressure", "ok", 1_764_400_600.0, 1_764_400_700.0, pressure),
        PhaseResult("spec-decode", "spec-decode", "ok", 1_764_400_700.0, 1_764_400_800.0, spec),
        PhaseResult(
            "again",
            "spec-decode",
            "failed",
            1_764_400_800.0,
            1_764_400_900.0,
            error="server not ready after 600s:\nlast log line",
        ),
    ]
    results.status, results.ended_at = "failed", 1_764_400_900.0
    return results


def test_results_json_has_the_contract_keys(tmp_path: Path) -> None:
    write_outputs(synthetic_results(), tmp_path)
    data = json.loads((tmp_path / "results.json").read_text(), parse_constant=no_nan)
    quant, kv, spec, failed = data["phases"]
    assert [p["kind"] for p in data["phases"]] == [
        "quantization",
        "kv-pressure",
        "spec-decode",
        "spec-decode",
    ]
    for v in quant["variants"]:
        assert {
            "name",
            "weights_bytes",
            "kv_cache_tokens",
            "kv_cache_blocks",
            "block_size",
            "ttft_seconds",
            "tpot_seconds",
            "tpot_seconds_min",
            "tpot_seconds_max",
        } <= set(v)
    bf16 = quant["variants"][0]
    assert bf16["weights_bytes"] == pytest.approx(14.19 * GIB)
    assert (bf16["tpot_seconds"], bf16["tpot_seconds_min"], bf16["tpot_seconds_max"]) == (
        pytest.approx(0.0230),
        pytest.approx(0.0228),
        pytest.approx(0.0233),
    )
    assert [s["tpot_seconds"] for s in bf16["samples"]] == pytest.approx([0.0228, 0.0230, 0.0233])
    assert quant["variants"][3]["tpot_seconds"] is None  # failed: null, not 0
    assert quant["variants"][3]["error"].startswith("server exited with code 1")
    fit = quant["fit"]
    assert fit["slope_seconds_per_gib"] == pytest.approx((0.0230 - 0.0095) / 9.0)
    assert {"intercept_seconds", "r_squared", "predictions", "tolerance"} <= set(fit)
    assert [p["name"] for p in fit["predictions"]] == ["BF16", "AWQ", "GPTQ-Int4"]
    assert {"name", "predicted_tpot_seconds", "error_ratio", "verdict"} <= set(
        fit["predictions"][2]
    )
    assert kv["kv_cache_blocks"] == 57344 // 16 and kv["kv_cache_tokens"] == 57344
    assert kv["max_preemption_jump"] == 13
    assert (kv["duration_seconds"], kv["flood_seconds"]) == (100, 25)  # the phase, the flood
    assert kv["timeline"][3] == {
        "t": 15,
        "running": 24,
        "waiting": 6,
        "kv_cache_usage": 1.0,
        "preemptions": 13,
        "generated_tokens": 1500,
        "latency_seconds": 0.01,
        "delay_seconds": None,
        # The pool's forecasts: none in these results made by hand.
        "headroom_requests": None,
        "headroom_at_completion": None,
        "exhaustion_seconds": None,
        "exporter_headroom_requests": None,
        "exporter_headroom_at_completion": None,
        "exporter_exhaustion_seconds": None,
    }
    assert kv["missing_acts"] == [] and kv["max_gap_seconds"] == 5
    run = spec["runs"][0]
    assert {
        "label",
        "generated_tokens",
        "forward_passes",
        "tokens_per_forward_pass",
        "drafts",
        "draft_tokens",
        "accepted_tokens",
        "decode_seconds",
    } <= set(run)
    assert spec["speedup"] == pytest.approx(3.4)
    assert spec["first_request_prefill_seconds"] == 1.9
    assert failed["status"] == "failed" and "not ready after 600s" in failed["error"]
    assert data["status"] == "failed"
    assert data["peak_bandwidth"]["bytes_per_second"] == 864e9


def test_report_has_the_articles_tables_and_plots(tmp_path: Path) -> None:
    write_outputs(synthetic_results(), tmp_path)
    report = (tmp_path / "report.md").read_text()
    # Per variant: weights, KV, TTFT, TPOT (median, extremes) and ratios to the first.
    assert (
        "| BF16 (fit) | `org/BF16` | 14.2 (log) | – | 5 | 26.1 | 487,424 | 30,464 × 16 "
        "| 30 (30–30) | 23 (22.8–23.3) | 2% | 661 GB/s | 77% | 1.00× / 1.00× / 1.00× |"
    ) in report
    assert "| AWQ (fit) | `org/AWQ` | 5.19 (log) | awq |" in report
    assert "| 0.37× / 2.36× / 0.41× |" in report
    assert "failed: server exited with code 1:" in report
    assert "> **FP8 failed:** server exited with code 1:" in report
    assert "TPOT = 1.5 ms/GiB × weights + 1.71 ms through BF16, AWQ (two points: no R²)" in report
    assert "its slope implies weights read at 716 GB/s, 83% of the peak 864 GB/s" in report
    assert "| GPTQ-Int4 | 5.19 | 9.6 | 9.5 | -1.0% | on the line |" in report
    assert "Peak memory bandwidth: **864 GB/s**, from the L40S datasheet." in report
    # The pool: acts with their conditions, the timeline, the biggest jump, the polls.
    assert (
        "| preemption storm | from the first poll that counted preemptions to the last |" in report
    )
    assert "| 15.0 | 24 | 6 | 100% | 13 | +13 | 1,500 | 0.01 | – |" in report
    assert "the largest jump **13** in one poll" in report
    assert "All three of the article's acts happened, in order." in report
    assert "the largest gap between two pages 5 s." in report
    # Spec on and off, the baseline without speculation, and the cold request apart.
    assert (
        '| repetition_penalty 1.0 | on | `{"repetition_penalty": 1.0}` | 256 | 43 | 5.93 | 43 '
        "| 213 | 213 | 100% | 100% | 0.508 | 4 | 3.40× |"
    ) in report
    assert "| no speculation (baseline) | off |" in report
    assert "Server without speculation: weights 5.19 GiB" in report
    assert "prefill 1.9 s, TTFT 2 s; warm requests' prefill 0.2 s" in report
    assert "**again** failed: server not ready after 600s:" in report
    for name in ("quantization-tpot", "kv-pressure-timeline", "spec-decode-spec"):
        assert f"(plots/{name}.png)" in report
        assert (tmp_path / "plots" / f"{name}.png").read_bytes().startswith(PNG)
    assert not list(tmp_path.rglob("*.tmp"))  # written atomically, nothing left behind


def test_report_of_a_run_interrupted_before_any_phase(tmp_path: Path) -> None:
    results = LabResults(
        "p", "local", 1_764_400_000.0, ended_at=1_764_400_010.0, status="interrupted"
    )
    write_outputs(results, tmp_path)
    assert "status **interrupted**" in (tmp_path / "report.md").read_text()
    assert json.loads((tmp_path / "results.json").read_text())["phases"] == []
    assert render_markdown(results).count("##") == 0
