"""vLLM's sleep mode: a sleeping engine has discarded its KV pool, so it is no capacity.

`handwritten-0.32/plain-asleep.txt` is the captured `cpu-0.32/plain-after-3x64.txt` with
`vllm:engine_sleep_state` as vLLM sets it after `POST /sleep?level=1` (the CPU build
cannot sleep; tests/fixtures/README.md). Its cache config still says 128 blocks of 128
tokens (`kv_cache_size_tokens` 16,384), its usage 0, nothing running or waiting.
"""

from __future__ import annotations

from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families
from vllm_glassbox.core import derive
from vllm_glassbox.core import snapshot as s
from vllm_glassbox.core.kv_trend import KvPool, kv_pools
from vllm_glassbox.core.snapshot import EngineKey, read_snapshot
from vllm_glassbox.exporter.service import Poller, make_registry

from tests.exporter.test_exposition_golden import Clock, PageSequence, config
from tests.fixtures import page

TINY = EngineKey("tiny", "0")
AWQ = "Qwen/Qwen2.5-7B-Instruct-AWQ"  # the v0.11.0 pages' model
AWAKE_PAGE = "cpu-0.32/plain-after-3x64.txt"
ASLEEP_PAGE = "handwritten-0.32/plain-asleep.txt"
POOL_TOKENS = 128 * 128  # the page's num_gpu_blocks × block_size = kv_cache_size_tokens


def _published(pages: list[str]) -> dict[str, float]:
    """The exporter's page after polling `pages` 10 s apart: each engine-0 series' value."""
    clock = Clock()
    poller = Poller(config(), fetcher=PageSequence([page(n) for n in pages], "0.32.0"), clock=clock)
    for _ in pages:
        poller.poll_once()
        clock.now += 10.0
    text = generate_latest(make_registry(poller)).decode()
    return {
        sample.name: sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.labels.get("engine") == "0"
    }


def test_the_awake_gauge_of_vllms_sleep_state_is_read_per_engine() -> None:
    assert read_snapshot(page(AWAKE_PAGE)).engines[TINY].gauges[s.AWAKE] == 1.0
    assert read_snapshot(page(ASLEEP_PAGE)).engines[TINY].gauges[s.AWAKE] == 0.0
    # v0.11.0 has no engine_sleep_state (0.11.1+): not known, not awake.
    old = read_snapshot(page("v0.11.0-single/idle.txt")).engines[EngineKey(AWQ, "0")]
    assert s.AWAKE not in old.gauges


def test_an_engine_is_sleeping_only_when_vllm_says_it_is_not_awake() -> None:
    assert derive.engine_sleeping(0.0) is True
    assert derive.engine_sleeping(1.0) is False
    assert derive.engine_sleeping(None) is None


def test_a_sleeping_engine_holds_0_tokens_and_has_no_free_tokens_headroom_or_forecast() -> None:
    assert derive.kv_cache_held_tokens(POOL_TOKENS, True) == 0
    assert derive.kv_cache_held_tokens(POOL_TOKENS, False) == 16384
    assert derive.kv_cache_held_tokens(POOL_TOKENS, None) == 16384  # vLLM does not say
    assert derive.kv_cache_free_tokens(0.0, 0) is None
    assert derive.kv_cache_headroom_requests(0.0, 0, 0) is None
    assert derive.kv_cache_exhaustion_seconds(derive.kv_cache_free_tokens(0.0, 0), 512, 10) is None


def test_the_pools_of_a_page_give_a_sleeping_engine_0_capacity_and_0_used_tokens() -> None:
    assert kv_pools(read_snapshot(page(ASLEEP_PAGE))) == {TINY: KvPool(0, 0.0, True)}
    assert kv_pools(read_snapshot(page(AWAKE_PAGE))) == {TINY: KvPool(16384, 0.0, False)}


def test_an_awake_idle_engine_offers_its_whole_pool_and_says_it_is_awake() -> None:
    out = _published([AWAKE_PAGE])
    assert out["glassbox_engine_sleeping"] == 0
    assert out["glassbox_kv_cache_capacity_tokens"] == 16384
    assert out["glassbox_kv_cache_free_tokens"] == 16384  # 16,384 − 0 × 16,384


def test_a_sleeping_engine_publishes_no_pool_no_free_tokens_and_no_headroom() -> None:
    # Before: capacity 16,384 and free tokens 16,384 (usage 0 of the discarded pool).
    out = _published([AWAKE_PAGE, ASLEEP_PAGE])
    assert out["glassbox_engine_sleeping"] == 1
    assert out["glassbox_kv_cache_capacity_tokens"] == 0
    assert out["glassbox_kv_cache_used_tokens"] == 0
    # The configuration stays: the pool it gets back when it wakes up.
    assert out["glassbox_kv_cache_blocks"] == 128
    assert out["glassbox_kv_cache_block_size_tokens"] == 128
    for absent in (
        "glassbox_kv_cache_free_tokens",
        "glassbox_kv_cache_headroom_requests",
        "glassbox_kv_cache_exhaustion_seconds",
    ):
        assert absent not in out


def test_an_engine_woken_up_offers_its_pool_again() -> None:
    out = _published([AWAKE_PAGE, ASLEEP_PAGE, AWAKE_PAGE])
    assert out["glassbox_engine_sleeping"] == 0
    assert out["glassbox_kv_cache_capacity_tokens"] == 16384
    assert out["glassbox_kv_cache_free_tokens"] == 16384


def test_a_page_without_the_sleep_state_publishes_no_sleep_series_and_its_pool_as_before() -> None:
    out = _published(["v0.11.0-single/idle.txt"])
    assert "glassbox_engine_sleeping" not in out
    # 3,584 blocks of 16 tokens, idle (usage 0): all of it free.
    assert out["glassbox_kv_cache_capacity_tokens"] == 3584 * 16
    assert out["glassbox_kv_cache_free_tokens"] == 3584 * 16
