"""Inputs glassbox does not read are shown, never turned into numbers: the exporter's
page carries glassbox_input_unrecognised{source, shape}, its log says so once, and the
series the input would feed are absent."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
from prometheus_client import generate_latest
from vllm_glassbox.exporter.service import Poller, make_registry

from tests.exporter.test_exposition_golden import Clock, PageSequence, config
from tests.fixtures import FIXTURES, page

CORPUS = FIXTURES / "corpus"


def exporter_page(pages: list[str], log_text: str | None, tmp_path: Path) -> str:
    """The exporter's page after polling `pages` 10 s apart beside a vLLM log."""
    overrides = {}
    if log_text is not None:
        (tmp_path / "vllm.log").write_text(log_text)
        overrides["vllm_log"] = str(tmp_path / "vllm.log")
    clock = Clock()
    poller = Poller(config(**overrides), fetcher=PageSequence(pages, "0.9.2"), clock=clock)
    for _ in pages:
        poller.poll_once()
        clock.now += 10.0
    return generate_latest(make_registry(poller)).decode()


def flag(source: str, shape: str) -> str:
    return f'glassbox_input_unrecognised{{shape="{shape}",source="{source}"}} 1.0'


def test_an_unknown_process_prefix_is_flagged_logged_once_and_feeds_nothing(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    idle = page("cpu-0.32/plain-idle.txt")
    log_text = (CORPUS / "handwritten-unknown-prefix.log").read_text()
    with caplog.at_level(logging.WARNING, logger="glassbox.exporter"):
        out = exporter_page([idle, idle, idle], log_text, tmp_path)
    assert flag("log", "unknown_process_prefix") in out
    # Two ranks behind a prefix of no known shape: no weights, no stage summed over them.
    assert "glassbox_model_weights_bytes " not in out
    assert "glassbox_startup_stage_seconds{" not in out
    warnings = [r.getMessage() for r in caplog.records if "shape=" in r.getMessage()]
    assert len(warnings) == 1  # three polls, one line
    assert "source=log shape=unknown_process_prefix" in warnings[0]
    assert "(launcher job=42)" in warnings[0]


def test_a_known_log_is_not_flagged(tmp_path: Path) -> None:
    idle = page("cpu-0.32/plain-idle.txt")
    log_text = (CORPUS / "handwritten-v0.9-tp8-vllmworker-rank.log").read_text()
    out = exporter_page([idle, idle], log_text, tmp_path)
    assert "glassbox_input_unrecognised{" not in out
    assert 'glassbox_startup_stage_seconds{model_name="llama-70b"' in out
    assert 'stage="cuda_graphs",start="06-20 10:00:00"} 26.0' in out  # not 201 s: the slowest rank


def test_a_v0_page_is_flagged_and_nothing_is_derived_from_its_engine_steps(
    tmp_path: Path,
) -> None:
    before = (CORPUS / "handwritten-v0.10-v0-page.txt").read_text()
    after = before.replace(" 1000.0", " 1100.0").replace(" 1351.0", " 1486.0")
    out = exporter_page([before, after], None, tmp_path)
    assert flag("page", "v0_engine_steps") in out
    # 100 tokens over 135 iteration observations would read 0.74 tokens per engine step.
    assert "glassbox_tokens_per_engine_step{" not in out
    assert "glassbox_engine_steps_per_second{" not in out
    assert 'glassbox_kv_cache_used_tokens{engine="0",model_name="qwen"} 22764.0' in out


def test_a_hybrid_pool_without_vllms_own_count_has_no_capacity_and_says_so(
    tmp_path: Path,
) -> None:
    hybrid = (CORPUS / "handwritten-v0.11.1-hybrid-page.txt").read_text()
    out = exporter_page([hybrid, hybrid], None, tmp_path)
    assert flag("page", "hybrid_kv_groups") in out
    assert "glassbox_kv_cache_capacity_tokens{" not in out  # 1000 × 1600 would overstate it
    assert "glassbox_kv_cache_used_tokens{" not in out


def test_a_hybrid_pool_takes_the_size_its_log_states(tmp_path: Path) -> None:
    hybrid = (CORPUS / "handwritten-v0.11.1-hybrid-page.txt").read_text()
    log_text = (
        "(EngineCore_DP0 pid=7) INFO 01-01 00:00:00 [kv_cache_utils.py:1087] "
        "GPU KV cache size: 800,000 tokens\n"
    )
    out = exporter_page([hybrid, hybrid], log_text, tmp_path)
    assert 'shape="hybrid_kv_groups"' not in out
    assert 'glassbox_kv_cache_capacity_tokens{engine="0",model_name="qwen3-next"} 800000.0' in out
    assert 'glassbox_kv_cache_used_tokens{engine="0",model_name="qwen3-next"} 400000.0' in out
