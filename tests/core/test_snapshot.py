"""Version-independent reading of vLLM pages (core/snapshot.py)."""

from __future__ import annotations

import re

import pytest
from vllm_glassbox.core import snapshot as s
from vllm_glassbox.core.derive import kv_cache_blocks, kv_cache_capacity_tokens
from vllm_glassbox.core.errors import ScrapeError
from vllm_glassbox.core.snapshot import (
    ENGINE_STEPS,
    GENERATION_TOKENS,
    EngineKey,
    read_snapshot,
)

from tests.fixtures import FIXTURES, grow_engines, page

TINY = EngineKey("tiny", "0")
AWQ = "Qwen/Qwen2.5-7B-Instruct-AWQ"


def _drop(text: str, prefix: str) -> str:
    """The page without the sample lines of names starting with `prefix`."""
    return "".join(line for line in text.splitlines(True) if not line.startswith(prefix))


def test_captured_page_gives_one_engine_with_canonical_counters() -> None:
    snap = read_snapshot(page("cpu-0.32/plain-after-3x64.txt"))
    assert list(snap.engines) == [TINY]
    c = snap.engines[TINY].counters
    # Three sequential requests of 64 tokens (ignore_eos) on a 5-token prompt.
    assert c[s.GENERATION_TOKENS] == 3 * 64
    assert c[s.TTFT_COUNT] == 3
    assert c[s.ITL_COUNT] == 3 * 63
    assert c[s.REQUESTS_FINISHED] == 3
    assert c[s.PREEMPTIONS] == 0
    assert s.SPEC_DRAFTS not in c  # no speculation configured: no spec counters at all


def test_counters_are_read_not_their_created_timestamps() -> None:
    # Every counter and histogram on these pages also has a `_created` series, a unix time.
    for name in ("cpu-0.32/plain-after-3x64.txt", "v0.11.0-single/after-spec.txt"):
        text = page(name)
        assert "vllm:generation_tokens_created" in text
        counters = next(iter(read_snapshot(text).engines.values())).counters
        assert all(value < 1e6 for value in counters.values()), counters


def test_v0_11_itl_comes_from_either_name_with_the_same_observations() -> None:
    text = page("v0.11.0-single/after-spec.txt")
    both = read_snapshot(text).engines[EngineKey(AWQ, "0")].counters
    only_old = read_snapshot(_drop(text, "vllm:inter_token_latency_seconds")).engines
    old = only_old[EngineKey(AWQ, "0")].counters
    assert both[s.ITL_COUNT] == old[s.ITL_COUNT] == 43
    assert both[s.ITL_SUM] == pytest.approx(old[s.ITL_SUM]) == pytest.approx(43 * 0.0184)


def test_current_vllm_has_only_the_new_itl_name_and_it_is_read() -> None:
    text = page("cpu-0.32/plain-after-3x64.txt")
    assert "vllm:time_per_output_token_seconds" not in text
    assert read_snapshot(text).engines[TINY].counters[s.ITL_COUNT] == 189


def test_v0_11_single_server_page_without_kv_cache_size_tokens() -> None:
    snap = read_snapshot(page("v0.11.0-single/idle.txt"))
    cache = snap.cache["0"]
    assert cache.kv_cache_size_tokens is None
    assert (cache.block_size, kv_cache_blocks(cache), cache.engines) == (16, 3584, 1)
    assert kv_cache_capacity_tokens(cache) == 3584 * 16
    assert cache.gpu_memory_utilization == 0.9
    assert cache.kv_cache_memory_bytes is None  # the label is "None" when not set
    assert snap.process_start_time == 1759665505.0
    # gpu_cache_usage_perc is hidden in 0.11; kv_cache_usage_perc is there.
    assert snap.engines[EngineKey(AWQ, "0")].gauges[s.KV_USAGE] == 0.0


def test_multiprocess_page_takes_kv_usage_max_over_pid_and_has_no_process_start() -> None:
    text = page("v0.11.0-2api/after.txt")
    assert 'pid="4101"' in text and 'pid="4102"' in text
    assert "_created" not in text
    snap = read_snapshot(text)
    [key] = snap.engines
    assert key == EngineKey(AWQ, "0")  # the pid label does not make a second engine
    assert snap.engines[key].gauges[s.KV_USAGE] == 0.4375
    assert snap.engines[key].gauges[s.RUNNING] == 2
    # Three 128-token requests through two API servers, summed by vLLM's collector.
    assert snap.engines[key].counters[s.GENERATION_TOKENS] == 3 * 128
    assert snap.process_start_time is None


def test_counters_with_a_pid_label_are_summed_over_processes() -> None:
    text = (
        'vllm:generation_tokens_total{engine="0",model_name="m",pid="1"} 10\n'
        'vllm:generation_tokens_total{engine="0",model_name="m",pid="2"} 32\n'
        'vllm:kv_cache_usage_perc{engine="0",model_name="m",pid="1"} 0.25\n'
        'vllm:kv_cache_usage_perc{engine="0",model_name="m",pid="2"} 0.5\n'
    )
    sample = read_snapshot(text).engines[EngineKey("m", "0")]
    assert sample.counters[s.GENERATION_TOKENS] == 42
    assert sample.gauges[s.KV_USAGE] == 0.5


def test_data_parallel_page_divides_the_summed_blocks_among_engines() -> None:
    snap = read_snapshot(page("v0.11.0-dp2/after.txt"))
    assert list(snap.engines) == [EngineKey(AWQ, "0"), EngineKey(AWQ, "1")]
    for engine in ("0", "1"):
        cache = snap.cache[engine]
        assert cache.num_gpu_blocks_total == 7168  # vLLM labels every engine with the sum
        assert kv_cache_blocks(cache) == 3584
        assert kv_cache_capacity_tokens(cache) == 3584 * 16
    # Engine 0 served two requests, engine 1 three (256 tokens each).
    assert snap.engines[EngineKey(AWQ, "0")].counters[s.GENERATION_TOKENS] == 2 * 256
    assert snap.engines[EngineKey(AWQ, "1")].counters[s.GENERATION_TOKENS] == 3 * 256


def test_grown_page_has_per_engine_capacity_from_kv_cache_size_tokens() -> None:
    one = read_snapshot(page("cpu-0.32/flood-after.txt"))
    grown = read_snapshot(grow_engines(page("cpu-0.32/flood-after.txt"), 8))
    assert [k.engine for k in grown.engines] == [str(i) for i in range(8)]
    for key, sample in grown.engines.items():
        assert sample == one.engines[TINY], key
        cache = grown.cache_for(key)
        assert cache is not None
        assert cache.num_gpu_blocks_total == 8 * 32
        assert (kv_cache_blocks(cache), kv_cache_capacity_tokens(cache)) == (32, 4096)


def test_capacity_prefers_kv_cache_size_tokens_over_blocks_times_block_size() -> None:
    text = page("cpu-0.32/spec-idle.txt")
    cache = read_snapshot(text).cache["0"]
    assert (kv_cache_blocks(cache), cache.block_size, cache.kv_cache_size_tokens) == (32, 128, 4096)
    # A hybrid model's pool holds fewer tokens than blocks × block_size: the label wins.
    hybrid = read_snapshot(
        text.replace('kv_cache_size_tokens="4096"', 'kv_cache_size_tokens="3072"')
    )
    assert kv_cache_capacity_tokens(hybrid.cache["0"]) == 3072
    # Before v0.24 there is no such label: blocks × block_size.
    older = read_snapshot(re.sub(r'kv_cache_size_tokens="\d+",', "", text))
    assert older.cache["0"].kv_cache_size_tokens is None
    assert kv_cache_capacity_tokens(older.cache["0"]) == 32 * 128


def test_captured_cache_config_and_process_start() -> None:
    snap = read_snapshot(page("cpu-0.32/plain-idle.txt"))
    cache = snap.cache["0"]
    assert (kv_cache_blocks(cache), cache.block_size, kv_cache_capacity_tokens(cache)) == (
        128,
        128,
        16384,
    )
    assert cache.kv_cache_memory_bytes == 33554432
    assert snap.process_start_time is not None and snap.process_start_time > 1.7e9


def test_spec_page_has_the_five_draft_positions_in_order() -> None:
    counters = read_snapshot(page("cpu-0.32/spec-after-1x256.txt")).engines[TINY].counters
    assert s.spec_positions(counters) == ["0", "1", "2", "3", "4"]
    assert s.spec_positions([s.SPEC_ACCEPTED_AT + p for p in ("10", "2", "1", "0")]) == [
        "0",
        "1",
        "2",
        "10",
    ]


def test_v0_pages_without_engine_label_count_as_engine_0_and_old_kv_gauge_is_read() -> None:
    text = (
        'vllm:generation_tokens_total{model_name="opt"} 12\n'
        'vllm:gpu_cache_usage_perc{model_name="opt"} 0.75\n'
    )
    sample = read_snapshot(text).engines[EngineKey("opt", "0")]
    assert sample.counters[s.GENERATION_TOKENS] == 12
    assert sample.gauges[s.KV_USAGE] == 0.75


def test_a_page_without_vllm_series_is_refused_as_no_vllm_metrics() -> None:
    # What vLLM serves with --disable-log-stats: only process_* and http_* remain.
    text = "".join(
        line
        for line in page("cpu-0.32/plain-after-3x64.txt").splitlines(True)
        if "vllm:" not in line
    )
    assert "process_start_time_seconds" in text
    with pytest.raises(ScrapeError) as info:
        read_snapshot(text)
    assert info.value.reason == "no_vllm_metrics"
    assert "--disable-log-stats" in str(info.value)


def test_a_malformed_page_is_refused_before_any_reading() -> None:
    with pytest.raises(ScrapeError) as info:
        read_snapshot(page("cpu-0.32/plain-idle.txt")[:-1])
    assert info.value.reason == "parse"


CORPUS = FIXTURES / "corpus"


def test_a_v0_page_keeps_no_engine_step_count_and_says_why() -> None:
    snap = read_snapshot((CORPUS / "handwritten-v0.10-v0-page.txt").read_text())
    [sample] = snap.engines.values()
    assert ENGINE_STEPS not in sample.counters
    assert sample.counters[GENERATION_TOKENS] == 1000.0
    assert set(snap.unrecognised) == {"v0_engine_steps"}


def test_a_v1_page_keeps_its_engine_steps_and_flags_nothing() -> None:
    snap = read_snapshot(page("cpu-0.32/plain-after-3x64.txt"))
    assert all(ENGINE_STEPS in e.counters for e in snap.engines.values())
    assert snap.unrecognised == {}


def test_only_a_number_in_a_mamba_label_makes_the_pool_hybrid() -> None:
    hybrid = read_snapshot((CORPUS / "handwritten-v0.11.1-hybrid-page.txt").read_text())
    assert [c.hybrid for c in hybrid.cache.values()] == [True]
    # The real 0.24 build labels every model mamba_block_size="False".
    real = read_snapshot(page("cuda-0.24.0-h200/bf16-idle.txt"))
    assert 'mamba_block_size="False"' in page("cuda-0.24.0-h200/bf16-idle.txt")
    assert [c.hybrid for c in real.cache.values()] == [False]


def test_a_speculating_v0_page_keeps_none_of_its_running_total_spec_counters() -> None:
    text = (CORPUS / "handwritten-v0.10-v0-page.txt").read_text() + (
        "# HELP vllm:spec_decode_num_draft_tokens_total Number of draft tokens.\n"
        "# TYPE vllm:spec_decode_num_draft_tokens_total counter\n"
        'vllm:spec_decode_num_draft_tokens_total{model_name="qwen"} 5050.0\n'
        "# HELP vllm:spec_decode_num_accepted_tokens_total Number of accepted tokens.\n"
        "# TYPE vllm:spec_decode_num_accepted_tokens_total counter\n"
        'vllm:spec_decode_num_accepted_tokens_total{model_name="qwen"} 2525.0\n'
    )
    snap = read_snapshot(text)
    [sample] = snap.engines.values()
    assert not any(name.startswith("spec_") for name in sample.counters)
    assert set(snap.unrecognised) == {"v0_engine_steps", "v0_spec_counters"}
    v1 = read_snapshot(page("cpu-0.32/spec-after-2x256.txt"))  # V1 keeps them
    assert all(s.SPEC_DRAFTS in e.counters for e in v1.engines.values())
