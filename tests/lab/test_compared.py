"""The exporter against the lab (lab/compared.py), built when a segment ends: engine by
engine on a data-parallel server (real captures of vLLM 0.32's CPU build with two engines
and the exporter beside it, tests/fixtures/matrix/0.32.0), no verdict on a page the
exporter had not refreshed since the segment ended, and how the report words both."""

from __future__ import annotations

import pytest
from prometheus_client.parser import text_string_to_metric_families
from vllm_glassbox.core.derive import snapshot_increases
from vllm_glassbox.core.own_page import ExporterPage
from vllm_glassbox.core.snapshot import EngineKey, read_snapshot
from vllm_glassbox.lab.analysis import segment_values, startup_facts
from vllm_glassbox.lab.compared import SLOW_POLLS, compare_segment, kept
from vllm_glassbox.lab.report import render_markdown
from vllm_glassbox.lab.results import ExporterSeries, LabResults

from tests.fixtures import FIXTURES

MATRIX = FIXTURES / "matrix" / "0.32.0"
TPOT = "glassbox_time_per_output_token_seconds"
KV = "glassbox_kv_cache_capacity_tokens"


def raw(name: str) -> dict[tuple[str, str], float]:
    """A vLLM page's samples by (sample name, engine), read by prometheus_client."""
    text = (MATRIX / name).read_text()
    return {
        (s.name, s.labels.get("engine", "")): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def hand_tpot(engine: str) -> float:
    """Δ ITL sum / (Δ generated tokens − Δ first tokens) of one engine, by hand."""
    idle, after = raw("dp2-idle.txt"), raw("dp2-after-2x64.txt")

    def grew(sample: str) -> float:
        return after[(sample, engine)] - idle.get((sample, engine), 0.0)

    decode = grew("vllm:generation_tokens_total") - grew("vllm:time_to_first_token_seconds_count")
    return grew("vllm:inter_token_latency_seconds_sum") / decode


def dp2_segment(fresh: bool = True) -> tuple[LabResults, ExporterPage]:
    idle = read_snapshot((MATRIX / "dp2-idle.txt").read_text())
    after = read_snapshot((MATRIX / "dp2-after-2x64.txt").read_text())
    startup = startup_facts((MATRIX / "dp2-startup.log").read_text(), idle, "tiny", 320.9)
    page = ExporterPage.parse((MATRIX / "exporter-dp2-after-2x64.txt").read_text())
    lab = {
        k: segment_values(d, startup, None) for k, d in snapshot_increases(idle, after, 0).items()
    }
    results = LabResults("p", "local", 0.0, 1.0, "ok")
    results.exporter.append(ExporterSeries("dp2", page.totals([TPOT, KV])))
    results.compared += compare_segment("dp2", page, lab, fresh)
    return results, page


def test_a_data_parallel_server_is_compared_engine_by_engine() -> None:
    results, page = dp2_segment()
    engine0, engine1 = results.compared
    assert (engine0.label, engine1.label) == ("dp2 (engine 0)", "dp2 (engine 1)")
    for c, engine in ((engine0, "0"), (engine1, "1")):
        rows = {r.name: r for r in c.rows}
        assert rows[TPOT].exporter == pytest.approx(hand_tpot(engine), rel=1e-12)
        assert rows[TPOT].lab == pytest.approx(hand_tpot(engine), rel=1e-12)
        assert rows[KV].exporter == rows[KV].lab == 16384  # each engine's own pool
        assert all(r.agree is not False for r in c.rows)
    # The two engines decoded at different speeds; summed over engines (what the exporter's
    # totals give) they make no TPOT of either.
    assert hand_tpot("0") != pytest.approx(hand_tpot("1"), rel=0.1)
    assert page.totals([TPOT])[TPOT] == pytest.approx(hand_tpot("0") + hand_tpot("1"))
    report = render_markdown(results)
    assert f"| dp2 (engine 1) | TPOT ms | {hand_tpot('1') * 1000:.4g} |" in report
    assert "The exporter and the lab agree on every series both have." in report


def test_a_single_engine_segment_keeps_the_segments_name() -> None:
    page = ExporterPage({TPOT: [({"model_name": "m", "engine": "0"}, 0.0102)]})
    (c,) = compare_segment("quant › BF16", page, {EngineKey("m", "0"): {TPOT: 0.0100}}, True)
    assert (c.label, c.engine) == ("quant › BF16", None)
    (tpot,) = c.rows  # series neither side has are left out
    assert tpot.difference == pytest.approx(0.02) and tpot.agree is False  # 2 % > 1 %


def test_a_page_not_polled_since_the_segment_ended_is_stale_never_agreed() -> None:
    results, _ = dp2_segment(fresh=False)
    assert all(c.stale and all(r.agree is None for r in c.rows) for c in results.compared)
    stored = results.to_json()["compared"][0]
    assert stored["polled_since_end"] is False
    assert {r["agree"] for r in stored["rows"]} == {None}
    report = render_markdown(results)
    assert "| dp2 (engine 0) | TPOT ms |" in report and "| stale |" in report
    assert "| yes |" not in report
    assert "**Stale**: the exporter had not polled vLLM since the workload of dp2 (engine 0)" in (
        report
    )
    assert "agree on every series both have on a fresh page." in report


def test_a_disagreement_is_named_in_the_report() -> None:
    page = ExporterPage({TPOT: [({"model_name": "m", "engine": "0"}, 0.0102)]})
    results = LabResults("p", "local", 0.0, 1.0, "ok")
    results.exporter.append(ExporterSeries("quant › BF16", page.totals([TPOT])))
    results.compared += compare_segment(
        "quant › BF16", page, {EngineKey("m", "0"): {TPOT: 0.0100}}, True
    )
    report = render_markdown(results)
    assert "| quant › BF16 | TPOT ms | 10.2 | 10 | +2.0% | **no** |" in report
    assert "**They disagree** on: quant › BF16 TPOT ms." in report


def test_the_lab_keeps_the_exporters_late_polls_apart_from_its_failed_ones() -> None:
    # An H200 sweep's exporter: 14 polls counted in glassbox_scrape_errors_total, which
    # counts the polls answered after the interval (read, reason slow) beside the failures.
    page = ExporterPage.parse(
        "# TYPE glassbox_scrape_errors_total counter\n"
        'glassbox_scrape_errors_total{reason="slow"} 11\n'
        'glassbox_scrape_errors_total{reason="timeout"} 2\n'
        'glassbox_scrape_errors_total{reason="connect"} 1\n'
        "# TYPE glassbox_target_up gauge\nglassbox_target_up 1\n"
    )
    assert (page.polls("failed"), page.polls("slow")) == (3, 11)
    seen = kept(page)
    assert seen["glassbox_scrape_errors_total"] == 3 and seen[SLOW_POLLS] == 11
    assert kept(ExporterPage({})) == {}
