"""The derivation core's cost (core/derive/cost.py) and the GPU's own counters beside
glassbox's (core/derive/telemetry.py), against costs worked out by hand.

The engine of these tests: one H200 hour at 3.6, tensor-parallel 2, so 7.2 an hour.
Over a 60 s window it costs 7.2 × 60 / 3600 = 0.12. With 48,000 tokens generated that is
0.12 / 48,000 = 0.0000025 a token, 2.5 per million; with 240,000 prompt tokens, 0.5.
"""

from __future__ import annotations

import pytest
from vllm_glassbox.core import derive
from vllm_glassbox.core import snapshot as s
from vllm_glassbox.core.derive import Increase

ENGINE0 = Increase({s.GENERATION_TOKENS: 48_000.0, s.PROMPT_TOKENS: 240_000.0}, 60.0)
ENGINE1 = Increase({s.GENERATION_TOKENS: 12_000.0, s.PROMPT_TOKENS: 60_000.0}, 60.0)


def test_an_engine_costs_its_gpus_hours() -> None:
    assert derive.engine_hourly_cost(3.6, 2, 1) == pytest.approx(7.2)
    assert derive.engine_hourly_cost(3.6, 2, 2) == pytest.approx(14.4)
    assert derive.engine_hourly_cost(None, 2) is None
    assert derive.cost_over(7.2, 60.0) == pytest.approx(0.12)


def test_cost_per_million_tokens_by_hand() -> None:
    assert derive.cost_per_million_generated_tokens(ENGINE0, 7.2) == pytest.approx(2.5)
    assert derive.cost_per_million_prompt_tokens(ENGINE0, 7.2) == pytest.approx(0.5)
    # Engine 1 made a quarter of the tokens in the same GPU hours: four times the cost.
    assert derive.cost_per_million_generated_tokens(ENGINE1, 7.2) == pytest.approx(10.0)


def test_a_model_sums_its_engines_costs_and_tokens_never_averages_ratios() -> None:
    # 0.12 + 0.12 = 0.24 over 60,000 tokens: 4.0 per million (the mean of 2.5 and 10.0,
    # 6.25, would be wrong).
    both = derive.engines_together([ENGINE0, ENGINE1])
    assert derive.cost_per_million_generated_tokens(both, 7.2 + 7.2) == pytest.approx(4.0)
    assert derive.cost_per_million_prompt_tokens(both, 14.4) == pytest.approx(0.8)


def test_no_price_or_no_tokens_is_no_cost() -> None:
    assert derive.cost_per_million_generated_tokens(ENGINE0, None) is None
    idle = Increase({s.GENERATION_TOKENS: 0.0}, 60.0)
    assert derive.cost_per_million_generated_tokens(idle, 7.2) is None  # absent, not inf
    unseen = Increase({}, 60.0)
    assert derive.cost_per_million_prompt_tokens(unseen, 7.2) is None
    assert derive.cost_per_million_tokens(7.2, 0.0, 10.0) is None
    # A price of 0 (hardware already paid) is a cost of 0, not an absent one.
    assert derive.cost_per_million_generated_tokens(ENGINE0, 0.0) == 0.0


def test_idle_time_is_the_share_of_readings_with_no_request_running() -> None:
    # Ten readings, five with none running.
    assert derive.idle_ratio([0, 0, 3, 5, 0, 2, 0, 0, 1, 4]) == 0.5
    assert derive.idle_ratio([1, 2]) == 0.0
    assert derive.idle_ratio([]) is None


def test_an_empty_pool_is_the_mean_of_one_minus_usage() -> None:
    # (1 + 0.8 + 0.5 + 0.5) / 4 = 0.7: a pool 30 % full on average.
    assert derive.unused_pool_ratio([0.0, 0.2, 0.5, 0.5]) == pytest.approx(0.7)
    assert derive.unused_pool_ratio([1.0, 1.2]) == 0.0  # a usage above 1 is a full pool
    assert derive.unused_pool_ratio([]) is None
    # 70 % of 7.2 an hour buys room no request uses: 5.04 an hour.
    assert derive.cost_of_share(7.2, 0.7) == pytest.approx(5.04)
    assert derive.cost_of_share(None, 0.7) is None


def test_a_shorter_decode_step_costs_less_per_token_at_this_load() -> None:
    # 2.5 per million at a 20 ms step; at 8 ms the same GPU hours make 2.5 times the
    # tokens: 1.0 per million.
    assert derive.cost_per_million_tokens_at_step(2.5, 0.020, 0.008) == pytest.approx(1.0)
    assert derive.cost_per_million_tokens_at_step(2.5, 0.0, 0.008) is None
    assert derive.cost_per_million_tokens_at_step(None, 0.020, 0.008) is None


def test_dcgm_framebuffer_used_and_free_is_the_gpus_memory() -> None:
    # An H200 as DCGM shows it: 130,000 MiB used and 13,771 MiB free, 143,771 MiB:
    # 143,771 × 1,048,576 = 150,754,820,096 bytes.
    assert derive.gpu_memory_from_framebuffer(130_000, 13_771) == 150_754_820_096
    assert derive.gpu_memory_from_framebuffer(None, 13_771) is None
    assert derive.gpu_memory_from_framebuffer(0, 0) is None


def test_dram_activity_beside_the_weight_reads() -> None:
    agree = derive.bandwidth_check(0.62, 0.55)
    assert agree is not None and agree.verdict == "agree"
    assert agree.gap == pytest.approx(0.07)
    more = derive.bandwidth_check(0.80, 0.55)
    assert more is not None and more.verdict == "unmodelled_reads"  # KV reads, say
    less = derive.bandwidth_check(0.30, 0.55)
    assert less is not None and less.verdict == "weights_overcounted"
    assert derive.bandwidth_check(None, 0.55) is None
    assert derive.percent_as_ratio(62.0) == pytest.approx(0.62)
    assert derive.mean_of([10.0, 20.0, 60.0]) == 30.0
    assert derive.mean_of([]) is None
