"""The lab's arithmetic and outputs.

Fast: the phases' computations over real pages and logs captured from vLLM
(tests/fixtures), and the report written from synthetic results. End to end (marked
vllm): the local backend with the real vLLM CPU build running all three phases.
"""

from __future__ import annotations

import copy
import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import yaml
from vllm_glassbox.exporter.derive import Increase
from vllm_glassbox.exporter.snapshot import read_snapshot
from vllm_glassbox.exporter.weights import Weights
from vllm_glassbox.lab.analysis import request_stats, startup_facts
from vllm_glassbox.lab.cli import main as lab_main
from vllm_glassbox.lab.experiments.kv_pressure import (
    KvPressureResult,
    TimelinePoint,
    act_names,
    missing_acts,
    name_acts,
    pressure_summary,
    timeline_point,
)
from vllm_glassbox.lab.experiments.quantization import (
    ABOVE_LINE,
    FULL_SIZE,
    ON_LINE,
    QuantizationResult,
    Variant,
    VariantResult,
    fit_tpot,
    full_size_variants,
    variant_result,
)
from vllm_glassbox.lab.experiments.spec_decode import (
    SpecDecodeResult,
    penalty_finding,
    spec_runs,
)
from vllm_glassbox.lab.findings import fit_line, spread
from vllm_glassbox.lab.measure import Completion, increase
from vllm_glassbox.lab.report import render_markdown, why_empty, write_outputs
from vllm_glassbox.lab.results import (
    LabResults,
    Peak,
    PhaseResult,
    RequestStats,
    Startup,
)
from vllm_glassbox.units import GIB

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
    # As the exporter: the CPU build's log does not state it, the server was started with
    # --kv-cache-memory-bytes 33554432 (the cache config's label), which is the pool's size.
    assert facts.kv_cache_memory_bytes == 33554432
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


def test_line_fit_is_least_squares_and_r_squared_needs_three_points() -> None:
    # Any two points lie on a line: an R² through them would always be 1.
    assert fit_line([(1.0, 3.0), (3.0, 7.0)]) == (2.0, 1.0, None)
    slope, intercept, r2 = fit_line([(0.0, 0.0), (1.0, 1.0), (2.0, 1.0)])
    assert (slope, intercept) == pytest.approx((0.5, 1 / 6))
    assert r2 == pytest.approx(0.75)
    with pytest.raises(ValueError, match="two points with different x"):
        fit_line([(1.0, 2.0), (1.0, 3.0)])


def test_spread_is_the_median_with_its_extremes() -> None:
    measured = spread([0.012, None, 0.010, 0.011, 0.020])
    assert measured is not None
    assert (measured.median, measured.low, measured.high, measured.n) == (
        pytest.approx(0.0115),
        0.010,
        0.020,
        4,
    )
    assert measured.relative == pytest.approx(0.010 / 0.0115)
    assert spread([None]) is None


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


def _request(tpot: float) -> tuple[Completion, Increase]:
    """One 128-token request whose decode steps took `tpot` each."""
    d = Increase(
        {
            "generation_tokens": 128.0,
            "ttft_count": 1.0,
            "ttft_sum": 0.03,
            "itl_count": 127.0,
            "itl_sum": 127 * tpot,
            "engine_steps": 128.0,
        },
        1.0,
    )
    return Completion(3, 128, 127 * tpot + 0.03, ""), d


def _variant(
    name: str,
    gib: float,
    tpot: float | None,
    fit: bool,
    kv: int = 100000,
    tpots: tuple[float, ...] | None = None,
    peak: float | None = None,
    **startup: Any,
) -> VariantResult:
    """A measured variant: its requests' TPOTs (three alike by default), through the lab's
    own arithmetic."""
    if tpot is None:
        return VariantResult(name, f"org/{name}", fit, _startup(gib, kv, **startup), _stats(None))
    measured = [(0, *_request(t)) for t in (tpots or (tpot, tpot, tpot))]
    return variant_result(
        Variant(name, f"org/{name}", {}, fit), _startup(gib, kv, **startup), measured, peak
    )


def test_a_variant_is_the_median_of_its_requests_and_noisy_when_they_differ() -> None:
    steady = _variant("BF16", 14.0, 0.023, True, tpots=(0.0231, 0.0229, 0.0230))
    assert steady.tpot_seconds == pytest.approx(0.0230)
    assert (steady.tpot.low, steady.tpot.high) == (pytest.approx(0.0229), pytest.approx(0.0231))  # type: ignore[union-attr]
    assert not steady.noisy and len(steady.samples) == 3
    assert steady.stats is not None and steady.stats.generated_tokens == 3 * 128
    # The same work 40 % slower in one request: the median holds, the variant is noisy.
    noisy = _variant("BF16", 14.0, 0.023, True, tpots=(0.023, 0.0322, 0.0231))
    assert noisy.tpot_seconds == pytest.approx(0.0231) and noisy.noisy
    # With a peak, the achieved bandwidth and its share of it come from the core.
    with_peak = _variant("BF16", 14.0, 0.023, True, peak=864e9)
    assert with_peak.bandwidth is not None
    assert with_peak.bandwidth.weight_read_bytes_per_second == pytest.approx(14.0 * GIB / 0.023)
    assert with_peak.bandwidth.utilization == pytest.approx(14.0 * GIB / 0.023 / 864e9)
    assert with_peak.bandwidth.decode_floor_seconds == pytest.approx(14.0 * GIB / 864e9)


def test_the_fit_goes_through_the_chosen_variants_and_places_the_others() -> None:
    # TPOT = 1.5 ms/GiB × GiB + 2 ms through BF16 and AWQ; GPTQ 1 % slow: on the line;
    # FP8 (quantized) much slower than its bytes predict: above it, for compute.
    variants = [
        _variant("BF16", 14.0, 0.023, True),
        _variant("AWQ", 5.0, 0.0095, True, quantization="awq"),
        _variant("GPTQ", 5.5, 0.010_25 * 1.01, False, quantization="gptq_marlin"),
        _variant("FP8", 8.0, 0.020, False, quantization="fp8"),
        VariantResult("broken", "org/broken", False, error="did not start"),
    ]
    fit, problem = fit_tpot(variants, tolerance=0.10, peak_bandwidth=864e9)
    assert problem is None and fit is not None
    assert fit.slope_seconds_per_gib == pytest.approx(0.0015)
    assert fit.intercept_seconds == pytest.approx(0.002)
    assert fit.r_squared is None  # two points
    assert fit.fitted == ("BF16", "AWQ")
    assert fit.marginal_bandwidth_bytes_per_second == pytest.approx(GIB / 0.0015)
    assert fit.exceeds_peak is False  # 716 GB/s of the L40S's 864
    by_name = {p.name: p for p in fit.predictions}
    assert set(by_name) == {"BF16", "AWQ", "GPTQ", "FP8"}
    assert by_name["GPTQ"].predicted_tpot_seconds == pytest.approx(0.010_25)
    assert by_name["GPTQ"].error_ratio == pytest.approx(1 / 1.01 - 1)
    assert by_name["GPTQ"].verdict == ON_LINE and by_name["GPTQ"].reason is None
    assert by_name["FP8"].error_ratio == pytest.approx(0.014 / 0.020 - 1)
    assert by_name["FP8"].verdict == ABOVE_LINE
    assert "dequantizing fp8 weights costs compute" in str(by_name["FP8"].reason)


def test_a_slope_that_implies_more_than_the_peak_is_not_a_bandwidth(tmp_path: Path) -> None:
    # An H200-like run: BF16 4.73 ms at 14.29 GiB, AWQ 3.0 ms at 5.2 GiB. The slope would
    # be 5.6 TB/s of weight reads, more than the H200's 4.8: most of a step is not reads.
    variants = [
        _variant("BF16", 14.29, 0.00473, True, peak=4.8e12),
        _variant("AWQ", 5.2, 0.0030, True, peak=4.8e12, quantization="awq_marlin"),
    ]
    fit, _ = fit_tpot(variants, peak_bandwidth=4.8e12)
    assert fit is not None and fit.exceeds_peak is True
    assert fit.marginal_bandwidth_bytes_per_second == pytest.approx(GIB * 9.09 / 0.00173)
    # Most of a decode step is the intercept: 2.01 ms of BF16's 4.73.
    assert fit.intercept_share == pytest.approx((0.0030 - 5.2 * 0.00173 / 9.09) / 0.00473)
    results = _results_with(QuantizationResult(tuple(variants), fit, None))
    write_outputs(results, tmp_path)
    report = (tmp_path / "report.md").read_text()
    assert (
        "the slope would mean weights read at 5.64 TB/s, more than the peak 4.8 TB/s: "
        "**not a bandwidth** — much of a decode step here is not weight reads (the "
        "intercept is 43% of the largest variant's TPOT)" in report
    )
    assert "(two points: no R²)" in report
    # Each variant's own achieved bandwidth stays in its row: 3.24 TB/s is 68 % of peak.
    assert "| 3.24 TB/s | 68% |" in report
    data = json.loads((tmp_path / "results.json").read_text())
    assert data["phases"][0]["fit"]["exceeds_peak"] is True
    assert data["phases"][0]["fit"]["r_squared"] is None


def test_a_quantized_variant_loaded_at_full_size_is_flagged_not_predicted(tmp_path: Path) -> None:
    # vLLM served a GPTQ folder in BF16: same weights and KV pool as BF16. Its "prediction"
    # would be perfect, and mean nothing.
    variants = [
        _variant("BF16", 14.29, 0.00473, True, kv=2_085_488),
        _variant("AWQ", 5.2, 0.0030, True, kv=2_200_000, quantization="awq_marlin"),
        _variant("GPTQ-Int4", 14.29, 0.00474, False, kv=2_085_488, quantization="gptq_marlin"),
    ]
    fit, _ = fit_tpot(variants)
    assert fit is not None
    gptq = next(p for p in fit.predictions if p.name == "GPTQ-Int4")
    assert gptq.verdict == FULL_SIZE and abs(gptq.error_ratio) < 0.01
    assert "as large as BF16's: vLLM did not quantize it (gptq_marlin)" in str(gptq.reason)
    # With its config readable, a variant is held to its own shape at 16 bits: an AWQ model
    # as large as a smaller BF16 model is not "full size".
    other = [
        _variant("medium", 0.13, 0.018, True),
        _variant(
            "large-awq", 0.124, 0.065, False, quantization="awq", unquantized_bytes=0.46 * GIB
        ),
    ]
    assert full_size_variants(other) == {}
    served_plain = [
        _variant("GPTQ", 14.29, 0.0047, False, quantization="gptq", unquantized_bytes=14.2 * GIB)
    ]
    assert full_size_variants(served_plain) == {"GPTQ": "its 16-bit size"}
    # Marked `fit`, it is left out of the line.
    fit_too, _ = fit_tpot([*variants[:2], replace(variants[2], fit=True)])
    assert fit_too is not None and fit_too.fitted == ("BF16", "AWQ")
    assert fit_too.excluded == ("GPTQ-Int4",)

    results = _results_with(
        QuantizationResult(tuple(variants), fit, None, full_size_variants(variants))
    )
    write_outputs(results, tmp_path)
    report = (tmp_path / "report.md").read_text()
    assert "Loaded at full size: GPTQ-Int4: its weights (14.3 GiB) are as large as BF16's" in report
    assert "loaded at full size (like BF16)" in report
    assert "On the line" not in report
    data = json.loads((tmp_path / "results.json").read_text())
    assert [v["full_size_of"] for v in data["phases"][0]["variants"]] == [None, None, "BF16"]


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
    return TimelinePoint(t, running, waiting, usage, preempted, t * 100, 0.01)


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
    assert summary.missing_acts == ()
    assert summary.max_preemption_jump == 13
    assert summary.max_preemption_jump_at == 20
    assert summary.preemptions_total == 15
    assert (summary.first_full_at, summary.first_waiting_at) == (10, 10)
    assert summary.first_preemption_at == 20
    assert summary.peak_waiting == 5
    assert summary.max_gap_seconds == 5


def test_an_act_is_named_only_where_its_condition_holds() -> None:
    # The pool is full at 10 s but nobody waits until 15 s; the queue empties at 20 s and
    # comes back: a poll without a queue is never "saturated with a queue".
    timeline = [
        _point(0, 12, 0, 0.3, 0),
        _point(10, 12, 0, 1.0, 0),
        _point(15, 10, 2, 1.0, 0),
        _point(20, 10, 0, 0.99, 0),
        _point(25, 8, 4, 0.9, 0),
        _point(30, 6, 2, 0.95, 4),
        _point(35, 2, 0, 0.3, 4),
    ]
    names = act_names(timeline, 0.95)
    assert names == [
        "filling",
        "filling",  # full, but nobody waits yet
        "saturated with a queue",
        "full, nobody waiting",
        "saturated with a queue",  # usage below 95 %, but the pool has been full
        "preemption storm",
        "draining",
    ]
    for point, name in zip(timeline, names, strict=True):
        if name == "saturated with a queue":
            assert point.waiting
        if name == "filling":
            assert not point.waiting


def test_a_queue_before_the_pool_is_full_is_no_first_act() -> None:
    # Requests wait from the first poll (an admission backlog), then the pool fills.
    timeline = [
        _point(0, 2, 10, 0.1, 0),
        _point(2, 12, 0, 0.6, 0),
        _point(4, 9, 3, 1.0, 0),
        _point(6, 4, 1, 0.9, 3),
        _point(8, 0, 0, 0.0, 3),
    ]
    acts = name_acts(timeline, 0.95)
    assert [a.name for a in acts] == [
        "queue before the pool is full",
        "filling",
        "saturated with a queue",
        "preemption storm",
        "draining",
    ]
    assert missing_acts(acts) == ["filling"]


def test_acts_without_preemptions_and_without_pressure() -> None:
    queued = [_point(0, 8, 0, 0.5, 0), _point(1, 8, 2, 0.99, 0), _point(2, 3, 0, 0.4, 0)]
    assert [a.name for a in name_acts(queued, 0.95)] == [
        "filling",
        "saturated with a queue",
        "draining",
    ]
    assert missing_acts(name_acts(queued, 0.95)) == ["preemption storm"]
    roomy = [_point(0, 4, 0, 0.2, 0), _point(1, 2, 0, 0.1, 0)]
    assert [(a.name, a.polls) for a in name_acts(roomy, 0.95)] == [("pool never full", 2)]


def test_a_hole_in_the_timeline_is_called_out_with_its_cause(tmp_path: Path) -> None:
    # Polled every 2 s; the page at 11 s closes a 7 s gap: its poll was sent 2.4 s after
    # its tick and vLLM took 4.6 s to answer it.
    timeline = [
        _point(0, 0, 0, 0.0, 0),
        _point(2, 12, 0, 0.4, 0),
        _point(4, 12, 0, 0.8, 0),
        replace(_point(11, 8, 4, 1.0, 0), latency_seconds=4.6, delay_seconds=2.4),
        _point(13, 0, 0, 0.0, 0),
    ]
    flood = KvPressureResult(
        startup=_startup(0.05, 4096),
        requests=12,
        completed=12,
        failed=0,
        flood_seconds=13.0,
        timeline=tuple(timeline),
        poll_seconds=2.0,
        late_polls=1,
        pressure=pressure_summary(timeline, 0.95),
    )
    assert (flood.pressure.max_gap_seconds, flood.pressure.max_gap_ended_at) == (7, 11)
    write_outputs(_results_with(flood), tmp_path)
    report = (tmp_path / "report.md").read_text()
    assert (
        "the largest gap between two pages 7 s — **a hole in the timeline** (more than two "
        "periods): its closing poll was sent 2.4 s after its tick (this machine's CPU was "
        "taken) and vLLM took 4.6 s to answer it." in report
    )


def _spec(label: str, extra: dict[str, Any], base: bool, spec: bool, st: RequestStats) -> Any:
    return (label, extra, base, spec, st, spread([st.tpot_seconds]))


def test_spec_speedup_is_the_baseline_without_speculation_over_each_run() -> None:
    on = _stats(0.004, forward_passes=43.0, drafts=43.0, draft_coverage=1.0)
    off = _stats(0.0136, forward_passes=255.0)
    runs, speedup, problem = spec_runs(
        [
            _spec("rp 1.0", {"repetition_penalty": 1.0}, False, True, on),
            _spec("no speculation", {"repetition_penalty": 1.0}, True, False, off),
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
    with_rp = _stats(0.004, forward_passes=46.0, drafts=44.0, draft_coverage=44 / 46)
    defaults = _stats(0.0056, forward_passes=46.0, drafts=44.0, draft_coverage=44 / 46)
    runs, speedup, problem = spec_runs(
        [
            _spec("repetition_penalty 1.0", {"repetition_penalty": 1.0}, False, True, with_rp),
            _spec("model defaults", {}, True, True, defaults),
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
    skipped = _stats(0.0136, forward_passes=255.0, draft_coverage=0.0)
    runs, _, _ = spec_runs(
        [
            _spec("repetition_penalty 1.0", {"repetition_penalty": 1.0}, False, True, with_rp),
            _spec("model defaults", {}, True, True, skipped),
        ]
    )
    assert penalty_finding(runs, 1.05, "0.11.0") == (
        "vLLM 0.11.0 skips speculation under a repetition penalty, as v0.11 did: run "
        "'model defaults' (the model's default 1.05) drafted nothing in 255 decode steps"
    )


def test_a_panel_without_data_gives_the_reason_its_description_states() -> None:
    assert (
        why_empty("Achieved bandwidth. Present only when the exporter is given --gpu. More.")
        == "Present only when the exporter is given --gpu."
    )
    assert why_empty("No reason here.") == "(its description does not say why)"


def test_the_copy_benchmark_reports_the_median_of_its_repetitions() -> None:
    from vllm_glassbox.lab.membench import copy_bandwidths

    ticks = iter([0.0, 0.01, 1.0, 1.02, 2.0, 2.04])
    rates = copy_bandwidths(8 * 1024**2, 3, clock=lambda: next(ticks))
    moved = 2 * 8 * 1024**2  # read and written
    assert rates == pytest.approx([moved / 0.01, moved / 0.02, moved / 0.04])
    measured = spread(rates)
    assert measured is not None and measured.median == pytest.approx(moved / 0.02)


# --- the outputs ------------------------------------------------------------------------


def _results_with(*bodies: Any) -> LabResults:
    results = LabResults("gpu", "local", 1_764_400_000.0, version="0.1.0")
    results.phases = [
        PhaseResult(f"p{i}", "quantization", "ok", 1_764_400_000.0, 1_764_400_100.0, body)
        for i, body in enumerate(bodies)
    ]
    results.status, results.ended_at = "ok", 1_764_400_100.0
    return results


def synthetic_results() -> LabResults:
    l40s = 864e9
    quant_variants = (
        _variant("BF16", 14.19, 0.0230, True, 487424, (0.0228, 0.0230, 0.0233), l40s),
        _variant("AWQ", 5.19, 0.0095, True, 1_150_000, peak=l40s, quantization="awq"),
        _variant("GPTQ-Int4", 5.19, 0.0096, False, 1_150_000, peak=l40s, quantization="gptq"),
        VariantResult("FP8", "org/FP8", False, error="server exited with code 1:\nCUDA error"),
    )
    fit, _ = fit_tpot(quant_variants, peak_bandwidth=l40s)
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
        poll_seconds=5.0,
        pressure=pressure_summary(timeline, 0.95),
    )
    runs, speedup, problem = spec_runs(
        [
            _spec(
                "repetition_penalty 1.0",
                {"repetition_penalty": 1.0},
                False,
                True,
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
            _spec(
                "no speculation",
                {"repetition_penalty": 1.0},
                True,
                False,
                _stats(0.0136, generated_tokens=256.0, forward_passes=255.0),
            ),
        ]
    )
    spec = SpecDecodeResult(
        _startup(5.19, 1_150_000),
        tuple(runs),
        speedup,
        1.9,
        2.0,
        0.2,
        startup_without_speculation=_startup(5.19, 1_160_000),
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
        assert v["generated_tokens"] == 3 * 64 and v["forward_passes"] == 3 * 63
        # Seconds, not milliseconds: a tiny model's token takes milliseconds however busy
        # the machine is, and a 3-token prefill never a minute.
        assert 0 < v["tpot_seconds"] < 1 and 0 < v["ttft_seconds"] < 60
        assert v["vllm_version"] == "0.32.0"
    assert quant["fit"]["r_squared"] is None  # two points: no R²
    assert [p["name"] for p in quant["fit"]["predictions"]] == ["small", "wide"]
    for v in (small, wide):  # a warm-up, then three requests measured apart
        assert len(v["samples"]) == 3
        assert v["tpot_seconds_min"] <= v["tpot_seconds"] <= v["tpot_seconds_max"]

    assert kv["completed"] == 12 and kv["kv_cache_tokens"] == 4096
    assert kv["preemptions_total"] > 0 and kv["max_preemption_jump"] >= 1
    assert max(p["waiting"] for p in kv["timeline"]) > 0
    # The preemptions prove the pool ran out; the polls only sample the gauge (requests
    # grow in lockstep, several are preempted in one step and free their blocks), so each
    # sample is a fraction and a poll that saw a queue saw blocks held.
    usage = [p["kv_cache_usage"] for p in kv["timeline"]]
    assert all(0 <= u <= 1 for u in usage)
    assert all(p["kv_cache_usage"] > 0 for p in kv["timeline"] if p["waiting"] > 0)
    assert "preemption storm" in [a["name"] for a in kv["acts"]]
    assert kv["timeline"][-1]["generated_tokens"] >= 12 * 600

    with_rp, defaults, off = spec["runs"]
    assert with_rp["accepted_tokens"] > 0 and with_rp["drafts"] > 0
    assert with_rp["tokens_per_forward_pass"] > 1.5
    assert with_rp["generated_tokens"] == 3 * 128
    assert with_rp["forward_passes"] < 3 * 127
    assert defaults["drafts"] > 0  # same request: these tiny models set no penalty
    assert spec["penalty_finding"] is None
    assert off["baseline"] and not off["speculation"] and off["drafts"] == 0
    assert off["forward_passes"] == 3 * 127 and spec["baseline_problem"] is None
    assert with_rp["speedup"] is not None and spec["speedup"] == with_rp["speedup"]
    assert spec["first_request_prefill_seconds"] > 0

    report = (out / "report.md").read_text()
    assert "| small (fit) | `tiny:small` | 0.00648 (safetensors) |" in report
    for name in ("quantization-tpot", "kv-pressure-timeline", "spec-decode-spec"):
        assert (out / "plots" / f"{name}.png").read_bytes().startswith(PNG)
    assert len(list((out / "logs").glob("*.log"))) == 5  # spec on and off: two servers
