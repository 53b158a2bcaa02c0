"""What the lab reads off real pages and logs captured from vLLM (tests/fixtures): a
request's stats, the increases between two pages across a restart (lab/vllm/client.py), and a
server's startup facts (lab/analysis.py).
"""

from __future__ import annotations

import pytest
from vllm_glassbox.core.snapshot import read_snapshot
from vllm_glassbox.core.units import GIB
from vllm_glassbox.core.weights import Weights
from vllm_glassbox.lab.analysis import request_stats, startup_facts
from vllm_glassbox.lab.vllm.client import Completion, increase

from tests.fixtures import log, page


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
