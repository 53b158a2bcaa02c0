"""The quantization experiment (lab/experiments/quantization/): a variant's TPOT from its
requests, the line through the chosen variants and the verdict on the others, and what the
report says of a slope that is no bandwidth and of a variant loaded at full size.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
from vllm_glassbox.core.units import GIB
from vllm_glassbox.lab.experiments.quantization import (
    ABOVE_LINE,
    FULL_SIZE,
    ON_LINE,
    QuantizationResult,
    VariantResult,
    fit_tpot,
    full_size_variants,
)
from vllm_glassbox.lab.report import write_outputs

from tests.lab_results import results_with, variant


def test_a_variant_is_the_median_of_its_requests_and_noisy_when_they_differ() -> None:
    steady = variant("BF16", 14.0, 0.023, True, tpots=(0.0231, 0.0229, 0.0230))
    assert steady.tpot_seconds == pytest.approx(0.0230)
    assert (steady.tpot.low, steady.tpot.high) == (pytest.approx(0.0229), pytest.approx(0.0231))  # type: ignore[union-attr]
    assert not steady.noisy and len(steady.samples) == 3
    assert steady.stats is not None and steady.stats.generated_tokens == 3 * 128
    # The same work 40 % slower in one request: the median holds, the variant is noisy.
    noisy = variant("BF16", 14.0, 0.023, True, tpots=(0.023, 0.0322, 0.0231))
    assert noisy.tpot_seconds == pytest.approx(0.0231) and noisy.noisy
    # With a peak, the achieved bandwidth and its share of it come from the core.
    with_peak = variant("BF16", 14.0, 0.023, True, peak=864e9)
    assert with_peak.bandwidth is not None
    assert with_peak.bandwidth.weight_read_bytes_per_second == pytest.approx(14.0 * GIB / 0.023)
    assert with_peak.bandwidth.utilization == pytest.approx(14.0 * GIB / 0.023 / 864e9)
    assert with_peak.bandwidth.decode_floor_seconds == pytest.approx(14.0 * GIB / 864e9)


def test_the_fit_goes_through_the_chosen_variants_and_places_the_others() -> None:
    # TPOT = 1.5 ms/GiB × GiB + 2 ms through BF16 and AWQ; GPTQ 1 % slow: on the line;
    # FP8 (quantized) much slower than its bytes predict: above it, for compute.
    variants = [
        variant("BF16", 14.0, 0.023, True),
        variant("AWQ", 5.0, 0.0095, True, quantization="awq"),
        variant("GPTQ", 5.5, 0.010_25 * 1.01, False, quantization="gptq_marlin"),
        variant("FP8", 8.0, 0.020, False, quantization="fp8"),
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
        variant("BF16", 14.29, 0.00473, True, peak=4.8e12),
        variant("AWQ", 5.2, 0.0030, True, peak=4.8e12, quantization="awq_marlin"),
    ]
    fit, _ = fit_tpot(variants, peak_bandwidth=4.8e12)
    assert fit is not None and fit.exceeds_peak is True
    assert fit.marginal_bandwidth_bytes_per_second == pytest.approx(GIB * 9.09 / 0.00173)
    # Most of a decode step is the intercept: 2.01 ms of BF16's 4.73.
    assert fit.intercept_share == pytest.approx((0.0030 - 5.2 * 0.00173 / 9.09) / 0.00473)
    results = results_with(QuantizationResult(tuple(variants), fit, None))
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
        variant("BF16", 14.29, 0.00473, True, kv=2_085_488),
        variant("AWQ", 5.2, 0.0030, True, kv=2_200_000, quantization="awq_marlin"),
        variant("GPTQ-Int4", 14.29, 0.00474, False, kv=2_085_488, quantization="gptq_marlin"),
    ]
    fit, _ = fit_tpot(variants)
    assert fit is not None
    gptq = next(p for p in fit.predictions if p.name == "GPTQ-Int4")
    assert gptq.verdict == FULL_SIZE and abs(gptq.error_ratio) < 0.01
    assert "as large as BF16's: vLLM did not quantize it (gptq_marlin)" in str(gptq.reason)
    # With its config readable, a variant is held to its own shape at 16 bits: an AWQ model
    # as large as a smaller BF16 model is not "full size".
    other = [
        variant("medium", 0.13, 0.018, True),
        variant("large-awq", 0.124, 0.065, False, quantization="awq", unquantized_bytes=0.46 * GIB),
    ]
    assert full_size_variants(other) == {}
    served_plain = [
        variant("GPTQ", 14.29, 0.0047, False, quantization="gptq", unquantized_bytes=14.2 * GIB)
    ]
    assert full_size_variants(served_plain) == {"GPTQ": "its 16-bit size"}
    # Marked `fit`, it is left out of the line.
    fit_too, _ = fit_tpot([*variants[:2], replace(variants[2], fit=True)])
    assert fit_too is not None and fit_too.fitted == ("BF16", "AWQ")
    assert fit_too.excluded == ("GPTQ-Int4",)

    results = results_with(
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
    fit, problem = fit_tpot([variant("a", 1.0, 0.01, True), variant("b", 2.0, None, True)])
    assert fit is None
    assert problem == (
        "no fit: a line needs at least two points with different x "
        "(fitted variants measured: ['a'])"
    )
