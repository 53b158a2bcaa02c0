"""The lab's arithmetic and outputs.

Fast: the phases' computations over real pages and logs captured from vLLM
(tests/fixtures), and the report written from synthetic results. End to end (marked
vllm): the local backend with the real vLLM CPU build running all three phases.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from vllm_glassbox.exporter.model import Weights
from vllm_glassbox.exporter.snapshot import read_snapshot
from vllm_glassbox.lab.analysis import (
    fit_line,
    fit_tpot,
    name_acts,
    pressure_summary,
    request_stats,
    spec_runs,
    startup_facts,
    timeline_point,
)
from vllm_glassbox.lab.cli import main as lab_main
from vllm_glassbox.lab.measure import Completion, increase
from vllm_glassbox.lab.report import render_markdown, write_outputs
from vllm_glassbox.lab.results import (
    GIB,
    KvPressureResult,
    LabResults,
    PhaseResult,
    QuantizationResult,
    RequestStats,
    SpecDecodeResult,
    Startup,
    TimelinePoint,
    VariantResult,
)

from tests.fixtures import log, page

PNG = b"\x89PNG\r\n\x1a\n"


# --- the arithmetic, over real pages --------------------------------------------------------


def test_request_stats_of_a_speculative_request_from_real_pages() -> None:
    before = read_snapshot(page("cpu-0.32/spec-idle.txt"))
    after = read_snapshot(page("cpu-0.32/spec-after-1x256.txt"))
    stats = request_stats([Completion(99, 256, 3.0, "")], increase(before, after, 3.0))
    assert stats.generated_tokens == 256
    assert stats.forward_passes == 52  # decode steps: one ITL sample per step
    assert stats.tokens_per_forward_pass == pytest.approx(255 / 52)
    assert (stats.drafts, stats.draft_tokens, stats.accepted_tokens) == (48, 223, 207)
    assert stats.acceptance_ratio == pytest.approx(207 / 223)
    assert stats.draft_coverage == pytest.approx(48 / 52)
    assert stats.decode_seconds == pytest.approx(0.5882807239997874)
    assert stats.tpot_seconds == pytest.approx(0.5882807239997874 / 255)
    assert stats.prefill_seconds == pytest.approx(1.9472951570000987)  # the cold request
    assert stats.engine_steps == 53


def test_increase_across_a_restart_counts_from_zero() -> None:
    busy = read_snapshot(page("cpu-0.32/plain-after-3x64.txt"))
    restarted = read_snapshot(
        page("cpu-0.32/plain-after-1x64.txt").replace(
            "process_start_time_seconds 1.79596897276e+09", "process_start_time_seconds 1.8e+09"
        )
    )
    d = increase(busy, restarted, 10.0)
    assert d["generation_tokens"] == 64  # not 64 − 192
    assert d["itl_count"] == 63


def test_startup_facts_of_the_cpu_build_come_from_log_cache_config_and_checkpoint() -> None:
    snapshot = read_snapshot(page("cpu-0.32/plain-idle.txt"))
    facts = startup_facts(
        log("cpu-0.32-plain-startup.log"),
        snapshot,
        "tiny",
        42.0,
        checkpoint=lambda: Weights(6955520.0, "safetensors"),
        log_path="logs/01.log",
    )
    assert facts.weights_bytes == 6955520.0 and facts.weights_source == "safetensors"
    assert facts.kv_cache_tokens == 16384  # "CPU KV cache size: 16,384 tokens"
    assert (facts.kv_cache_blocks, facts.block_size) == (128, 128)
    assert facts.kv_cache_memory_bytes == 33554432  # the cache config's label (set by flag)
    assert facts.vllm_version == "0.32.0"
    assert facts.startup_seconds == 42.0


def test_startup_facts_prefer_the_logged_weights_over_tp_ranks() -> None:
    facts = startup_facts(
        log("v0.11.0-tp2.log"),
        None,
        "m",
        90.0,
        checkpoint=lambda: Weights(1.0, "safetensors"),  # the log wins over it
    )
    assert facts.weights_bytes == pytest.approx(2 * 2.6037 * GIB)
    assert facts.weights_source == "log"
    assert facts.load_seconds == pytest.approx(4.118342)  # the latest rank's
    assert facts.kv_cache_memory_bytes == pytest.approx(35.07 * GIB)
    assert facts.kv_cache_tokens == 1313328
    assert facts.kv_cache_blocks is None  # no page read


def test_the_flood_page_shows_the_pool_full_with_a_queue_and_preemptions() -> None:
    baseline = read_snapshot(page("cpu-0.32/spec-after-2x256.txt"))
    mid = read_snapshot(page("cpu-0.32/flood-mid.txt"))
    point = timeline_point(20.0, baseline, mid)
    assert (point.running, point.waiting, point.kv_cache_usage) == (11, 1, 1.0)
    assert point.preemptions == 2
    assert point.generated_tokens == 3436 - 512


def test_line_fit_is_least_squares_with_r_squared() -> None:
    assert fit_line([(1.0, 3.0), (3.0, 7.0)]) == (2.0, 1.0, 1.0)
    slope, intercept, r2 = fit_line([(0.0, 0.0), (1.0, 1.0), (2.0, 1.0)])
    assert (slope, intercept) == pytest.approx((0.5, 1 / 6))
    assert r2 == pytest.approx(0.75)
    with pytest.raises(ValueError, match="two points with different x"):
        fit_line([(1.0, 2.0), (1.0, 3.0)])


def _stats(tpot: float | None, **kw: Any) -> RequestStats:
    values: dict[str, Any] = {
        "requests": 1,
        "prompt_tokens": 3,
        "generated_tokens": 128.0,
        "wall_seconds": 1.0,
        "ttft_seconds": 0.03,
        "tpot_seconds": tpot,
        "inter_token_latency_seconds": tpot,
        "forward_passes": 127.0,
        "tokens_per_forward_pass": 1.0,
        "decode_seconds": (tpot or 0) * 127,
        "prefill_seconds": 0.02,
        "engine_steps": 128.0,
        "drafts": 0.0,
        "draft_tokens": 0.0,
        "accepted_tokens": 0.0,
        "acceptance_ratio": None,
        "draft_coverage": None,
    }
    return RequestStats(**{**values, **kw})


def _startup(weights_gib: float, kv_tokens: int, **kw: Any) -> Startup:
    values: dict[str, Any] = {
        "served_model_name": "m",
        "startup_seconds": 60.0,
        "weights_bytes": weights_gib * GIB,
        "weights_source": "log",
        "load_seconds": 5.0,
        "kv_cache_memory_bytes": 26.05 * GIB,
        "kv_cache_tokens": kv_tokens,
        "kv_cache_blocks": kv_tokens // 16,
        "block_size": 16,
        "vllm_version": "0.11.0",
        "log_path": None,
    }
    return Startup(**{**values, **kw})


def _variant(
    name: str, gib: float, tpot: float | None, fit: bool, kv: int = 100000
) -> VariantResult:
    return VariantResult(name, f"org/{name}", fit, _startup(gib, kv), _stats(tpot))


def test_the_fit_goes_through_the_chosen_variants_and_predicts_the_others() -> None:
    # TPOT = 1.5 ms/GiB × GiB + 2 ms through BF16 and AWQ; GPTQ 1 % slow; FP8 off the line.
    variants = [
        _variant("BF16", 14.0, 0.023, True),
        _variant("AWQ", 5.0, 0.0095, True),
        _variant("GPTQ", 5.5, 0.010_25 * 1.01, False),
        _variant("FP8", 8.0, 0.020, False),
        VariantResult("broken", "org/broken", False, error="did not start"),
    ]
    fit, problem = fit_tpot(variants)
    assert problem is None and fit is not None
    assert fit.slope_seconds_per_gib == pytest.approx(0.0015)
    assert fit.intercept_seconds == pytest.approx(0.002)
    assert fit.r_squared == 1.0
    assert fit.fitted == ("BF16", "AWQ")
    assert fit.marginal_bandwidth_bytes_per_second == pytest.approx(GIB / 0.0015)
    by_name = {p.name: p for p in fit.predictions}
    assert set(by_name) == {"BF16", "AWQ", "GPTQ", "FP8"}
    assert by_name["GPTQ"].predicted_tpot_seconds == pytest.approx(0.010_25)
    assert by_name["GPTQ"].error_ratio == pytest.approx(1 / 1.01 - 1)
    assert by_name["FP8"].error_ratio == pytest.approx(0.014 / 0.020 - 1)


def test_no_fit_without_two_measured_points() -> None:
    fit, problem = fit_tpot([_variant("a", 1.0, 0.01, True), _variant("b", 2.0, None, True)])
    assert fit is None
    assert problem == (
        "no fit: a line needs at least two points with different x "
        "(fitted variants measured: ['a'])"
    )


def _point(
    t: float, running: float, waiting: float, usage: float, preempted: float
) -> TimelinePoint:
    return TimelinePoint(t, running, waiting, usage, preempted, t * 100)


def test_the_timeline_is_cut_into_the_articles_acts() -> None:
    timeline = [
        _point(0, 32, 0, 0.10, 0),
        _point(5, 32, 0, 0.60, 0),
        _point(10, 30, 2, 0.99, 0),
        _point(15, 28, 4, 1.00, 0),
        _point(20, 20, 3, 0.40, 13),  # one poll: 13 preemptions at once
        _point(25, 22, 5, 0.98, 13),  # between two bursts: still the storm
        _point(30, 22, 1, 0.97, 15),
        _point(35, 18, 0, 0.80, 15),
        _point(40, 0, 0, 0.0, 15),
    ]
    acts = [
        (a.name, a.start_t, a.end_t, a.polls, a.preemptions, a.peak_waiting)
        for a in name_acts(timeline, 0.95)
    ]
    assert acts == [
        ("filling", 0, 5, 2, 0, 0),
        ("saturated with a queue", 10, 15, 2, 0, 4),
        ("preemption storm", 20, 30, 3, 15, 5),
        ("draining", 35, 40, 2, 0, 0),
    ]
    summary = pressure_summary(timeline, 0.95)
    assert summary["max_preemption_jump"] == 13
    assert summary["max_preemption_jump_at"] == 20
    assert summary["preemptions_total"] == 15
    assert (summary["first_full_at"], summary["first_waiting_at"]) == (10, 10)
    assert summary["first_preemption_at"] == 20
    assert summary["peak_waiting"] == 5


def test_acts_without_preemptions_and_without_pressure() -> None:
    queued = [_point(0, 8, 0, 0.5, 0), _point(1, 8, 2, 0.99, 0), _point(2, 3, 0, 0.4, 0)]
    assert [a.name for a in name_acts(queued, 0.95)] == [
        "filling",
        "saturated with a queue",
        "draining",
    ]
    roomy = [_point(0, 4, 0, 0.2, 0), _point(1, 2, 0, 0.1, 0)]
    assert [(a.name, a.polls) for a in name_acts(roomy, 0.95)] == [("pool never full", 2)]


def test_spec_speedup_is_baseline_tpot_over_each_run() -> None:
    on = _stats(0.004, forward_passes=43.0, drafts=43.0)
    off = _stats(0.0136, forward_passes=255.0)
    runs, speedup = spec_runs(
        [("rp 1.0", {"repetition_penalty": 1.0}, False, on), ("defaults", {}, True, off)]
    )
    assert speedup == pytest.approx(3.4)
    assert [r.speedup for r in runs] == [pytest.approx(3.4), None]


# --- the outputs ------------------------------------------------------------------------


def synthetic_results() -> LabResults:
    quant_variants = (
        _variant("BF16", 14.19, 0.0230, True, kv=487424),
        _variant("AWQ", 5.19, 0.0095, True, kv=1_150_000),
        _variant("GPTQ-Int4", 5.19, 0.0096, False, kv=1_150_000),
        VariantResult("FP8", "org/FP8", False, error="server exited with code 1:\nCUDA error"),
    )
    fit, _ = fit_tpot(quant_variants)
    timeline = (
        _point(0, 32, 0, 0.3, 0),
        _point(5, 32, 0, 0.9, 0),
        _point(10, 28, 4, 1.0, 0),
        _point(15, 24, 6, 1.0, 13),
        _point(20, 30, 0, 0.7, 14),
        _point(25, 0, 0, 0, 14),
    )
    pressure = KvPressureResult(
        startup=_startup(5.19, 57344),
        requests=32,
        completed=32,
        failed=0,
        flood_seconds=25.0,
        timeline=timeline,
        **pressure_summary(timeline, 0.95),  # type: ignore[arg-type]
    )
    runs, speedup = spec_runs(
        [
            (
                "repetition_penalty 1.0",
                {"repetition_penalty": 1.0},
                False,
                _stats(
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
            (
                "model defaults",
                {},
                True,
                _stats(
                    0.0136,
                    generated_tokens=256.0,
                    forward_passes=255.0,
                    drafts=0.0,
                    draft_coverage=0.0,
                ),
            ),
        ]
    )
    spec = SpecDecodeResult(_startup(5.19, 1_150_000), tuple(runs), speedup, 1.9, 2.0, 0.2)
    results = LabResults("seed-l40s", "kubernetes", 1_764_400_000.0, version="0.1.0")
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


def _no_nan(name: str) -> None:
    raise AssertionError(f"results.json must not contain {name}")


def test_results_json_has_the_contract_keys(tmp_path: Path) -> None:
    write_outputs(synthetic_results(), tmp_path)
    data = json.loads((tmp_path / "results.json").read_text(), parse_constant=_no_nan)
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
        } <= set(v)
    assert quant["variants"][0]["weights_bytes"] == pytest.approx(14.19 * GIB)
    assert quant["variants"][3]["tpot_seconds"] is None  # failed: null, not 0
    assert quant["variants"][3]["error"].startswith("server exited with code 1")
    fit = quant["fit"]
    assert fit["slope_seconds_per_gib"] == pytest.approx((0.0230 - 0.0095) / 9.0)
    assert {"intercept_seconds", "r_squared", "predictions"} <= set(fit)
    assert [p["name"] for p in fit["predictions"]] == ["BF16", "AWQ", "GPTQ-Int4"]
    assert {"name", "predicted_tpot_seconds", "error_ratio"} <= set(fit["predictions"][2])
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
    }
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


def test_report_has_the_articles_tables_and_plots(tmp_path: Path) -> None:
    write_outputs(synthetic_results(), tmp_path)
    report = (tmp_path / "report.md").read_text()
    # Per variant: weights, KV, TTFT, TPOT and ratios against the first variant.
    assert (
        "| BF16 (fit) | `org/BF16` | 14.2 (log) | 5 | 26.1 | 487,424 | 30,464 × 16 | 30 "
        "| 23 | 1.00× | 1.00× | 1.00× |" in report
    )
    assert "| AWQ (fit) | `org/AWQ` | 5.19 (log) |" in report
    assert "| 0.37× | 2.36× | 0.41× |" in report
    assert "failed: server exited with code 1:" in report
    assert "> **FP8 failed:** server exited with code 1:" in report
    assert "TPOT = 1.5 ms/GiB × weights GiB + 1.715 ms, R² = 1." in report
    assert "| GPTQ-Int4 | 5.19 | 9.6 | 9.5 | -1.0% |" in report
    # The pool: acts, the timeline, the biggest jump.
    assert "| preemption storm | 15 | 20 | 2 | 14 | 6 | 100% |" in report
    assert "| 15 | 24 | 6 | 100% | 13 | +13 | 1,500 |" in report
    assert "the largest jump **13** in one poll" in report
    # Spec on and off, and the cold request apart.
    assert (
        '| repetition_penalty 1.0 | `{"repetition_penalty": 1.0}` | 256 | 43 | 5.93 | 43 | 213 '
        "| 213 | 100% | 100% | 0.508 | 4 | 3.40× |"
    ) in report
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


# --- end to end: the local backend with the real vLLM CPU build ------------------------------

E2E_PLAN: dict[str, Any] = {
    "name": "e2e",
    "target": {
        "local": {
            # A 4,096-token pool: 32 blocks of 128 tokens for both tiny models.
            "args": [
                "--model",
                "tiny:small",
                "--served-model-name",
                "tiny",
                "--max-model-len",
                "2048",
                "--kv-cache-memory-bytes",
                "8388608",
                "--enforce-eager",  # no torch.compile: a minute less per start
            ],
            "tiny_models": {
                "small": {},  # the shape of the captured fixtures (6.9 MB)
                "wide": {"hidden_size": 512, "num_heads": 8, "intermediate_size": 1536},
            },
        }
    },
    "phases": [
        {
            "kind": "quantization",
            "max_tokens": 64,
            "extra": {"ignore_eos": True},
            "variants": [
                {"name": "small", "model": "tiny:small"},
                {"name": "wide", "model": "tiny:wide"},
            ],
        },
        {
            # 12 × ~620 tokens need ~7,400 tokens of KV: the pool overflows, vLLM preempts.
            "kind": "kv-pressure",
            "flags": {"--gpu-memory-utilization": False},
            "concurrency": 12,
            "max_tokens": 600,
            "temperature": 0,
            "extra": {"ignore_eos": True},
            "poll": "1s",
            "timeout": "4m",
        },
        {"kind": "spec-decode", "max_tokens": 128, "extra": {"ignore_eos": True}},
    ],
}


@pytest.mark.vllm
def test_local_backend_runs_all_three_phases_on_the_real_vllm(tmp_path: Path) -> None:
    plan = copy.deepcopy(E2E_PLAN)
    plan["target"]["local"]["model_cache"] = str(tmp_path / "models")
    (tmp_path / "plan.yaml").write_text(yaml.safe_dump(plan))
    out = tmp_path / "out"
    assert lab_main(["run", str(tmp_path / "plan.yaml"), "--out", str(out)], "lab") == 0
    data = json.loads((out / "results.json").read_text(), parse_constant=_no_nan)
    quant, kv, spec = data["phases"]
    assert [p["status"] for p in data["phases"]] == ["ok", "ok", "ok"]

    small, wide = quant["variants"]
    assert small["weights_bytes"] == 6955520 and small["weights_source"] == "safetensors"
    assert wide["weights_bytes"] > 3 * small["weights_bytes"]
    for v in (small, wide):
        assert (v["kv_cache_tokens"], v["kv_cache_blocks"], v["block_size"]) == (4096, 32, 128)
        assert v["generated_tokens"] == 64 and v["forward_passes"] == 63
        # Seconds, not milliseconds: a tiny model's token takes milliseconds however busy
        # the machine is, and a 3-token prefill never a minute.
        assert 0 < v["tpot_seconds"] < 1 and 0 < v["ttft_seconds"] < 60
        assert v["vllm_version"] == "0.32.0"
    assert quant["fit"]["r_squared"] == 1.0  # two points
    assert [p["name"] for p in quant["fit"]["predictions"]] == ["small", "wide"]

    assert kv["completed"] == 12 and kv["kv_cache_tokens"] == 4096
    assert kv["preemptions_total"] > 0 and kv["max_preemption_jump"] >= 1
    assert max(p["waiting"] for p in kv["timeline"]) > 0
    assert max(p["kv_cache_usage"] for p in kv["timeline"]) >= 0.95
    assert "preemption storm" in [a["name"] for a in kv["acts"]]
    assert kv["timeline"][-1]["generated_tokens"] >= 12 * 600

    with_rp, defaults = spec["runs"]
    assert with_rp["accepted_tokens"] > 0 and with_rp["drafts"] > 0
    assert with_rp["tokens_per_forward_pass"] > 1.5
    assert with_rp["generated_tokens"] == 128
    assert with_rp["forward_passes"] < 127
    assert defaults["baseline"] and with_rp["speedup"] is not None
    assert spec["first_request_prefill_seconds"] > 0

    report = (out / "report.md").read_text()
    assert "| small (fit) | `tiny:small` | 0.00648 (safetensors) |" in report
    for name in ("quantization-tpot", "kv-pressure-timeline", "spec-decode-spec"):
        assert (out / "plots" / f"{name}.png").read_bytes().startswith(PNG)
    assert len(list((out / "logs").glob("*.log"))) == 4
