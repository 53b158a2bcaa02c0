"""The derivation core's what-ifs (what `glassbox explain` says would change a finding)
against numbers worked out by hand.

The figures are the project's own measurements: the tiny CPU model's pools
(tests/fixtures/README.md: 2,048 KV bytes per token, 128-token blocks; 8 MiB gave 4,096
tokens, 32 MiB 16,384) and the H200 runs of docs/results/h200/ (BF16 14.29 GiB with
108.58 GiB of KV memory and 2,033,120 tokens; AWQ 5.38 GiB and 2,198,176 tokens).
"""

from __future__ import annotations

import pytest
from vllm_glassbox.core import derive

GIB = 1024**3
MIB = 1024**2


def test_the_fill_of_a_pool_is_used_over_capacity() -> None:
    assert derive.kv_cache_fill(3072.0, 4096) == 0.75
    assert derive.kv_cache_fill(0.0, 0) is None  # no pool: no fill, not 0
    assert derive.kv_cache_fill(None, 4096) is None


def test_bytes_per_token_is_the_pools_memory_over_its_tokens() -> None:
    # 8 MiB gave the tiny model 4,096 tokens: 2,048 bytes each (2 KV heads × 64 dims ×
    # 2 (K and V) × 4 layers × 2 bytes).
    assert derive.kv_cache_bytes_per_token(8 * MIB, 4096) == 2048.0
    assert derive.kv_cache_bytes_per_token(8 * MIB, 0) is None


def test_a_pool_of_more_memory_holds_whole_blocks_of_tokens() -> None:
    # 32 MiB at 2,048 bytes a token: 16,384 tokens, 128 blocks of 128 (what the plain
    # server measured with --kv-cache-memory-bytes 33554432).
    assert derive.kv_cache_tokens_for_memory(32 * MIB, 2048.0, 128) == 16384
    # 10 MiB: 5,120 tokens, exactly 40 blocks; a byte less is 5,119.9 tokens, 39 blocks.
    assert derive.kv_cache_tokens_for_memory(10 * MIB, 2048.0, 128) == 5120
    assert derive.kv_cache_tokens_for_memory(10 * MIB - 1, 2048.0, 128) == 39 * 128
    assert derive.kv_cache_tokens_for_memory(10 * MIB - 1, 2048.0) == 5119
    assert derive.kv_cache_tokens_for_memory(-1.0, 2048.0) == 0
    assert derive.kv_cache_tokens_for_memory(10 * MIB, None) is None


def test_the_memory_a_pool_of_some_tokens_needs_is_whole_blocks() -> None:
    # 5,000 tokens are 39.06 blocks of 128: 40 blocks, 5,120 tokens, 10 MiB.
    assert derive.kv_cache_memory_for_tokens(5000.0, 2048.0, 128) == 10 * MIB
    assert derive.kv_cache_memory_for_tokens(5000.0, 2048.0) == 5000 * 2048
    assert derive.kv_cache_memory_for_tokens(None, 2048.0) is None


def test_weights_saved_on_a_gpu_become_kv_memory() -> None:
    # BF16 → AWQ on one H200: 14.29 − 5.38 = 8.91 GiB more for the pool's 108.58 GiB.
    memory = derive.kv_cache_memory_with_weights(108.58 * GIB, 14.29 * GIB, 5.38 * GIB)
    assert memory == pytest.approx(117.49 * GIB)
    # Tensor-parallel over 2 GPUs: each saves half.
    tp2 = derive.kv_cache_memory_with_weights(50 * GIB, 14 * GIB, 6 * GIB, shards=2)
    assert tp2 == pytest.approx(54 * GIB)


def test_the_awq_pool_predicted_from_bf16_lands_within_a_tenth_of_a_percent() -> None:
    # 108.58 GiB (the log's rounding) for 2,033,120 tokens: 57,343.8 bytes a token (56 KiB
    # = 57,344: 28 layers × 4 KV heads × 128 dims × 2 × 2 bytes); 117.49 GiB of it is
    # 2,199,956 tokens, 137,497 blocks of 16: 2,199,952. AWQ measured 2,198,176: +0.08 %.
    per_token = derive.kv_cache_bytes_per_token(108.58 * GIB, 2033120)
    assert per_token == pytest.approx(57343.8, abs=0.1)
    predicted = derive.kv_cache_tokens_for_memory(117.49 * GIB, per_token, 16)
    assert predicted == 2199952
    assert derive.prediction_error(predicted, 2198176) == pytest.approx(0.000808, abs=1e-6)


def test_another_gpu_memory_utilization_moves_the_pool_by_that_share_of_the_gpu() -> None:
    # 0.90 → 0.95 of a 140 GiB GPU: 7 GiB more.
    assert derive.kv_cache_memory_at_utilization(100 * GIB, 0.90, 0.95, 140 * GIB) == (
        pytest.approx(107 * GIB)
    )
    assert derive.kv_cache_memory_at_utilization(100 * GIB, 0.90, 0.95, None) is None


def test_the_utilization_that_gives_a_pool_is_its_memory_as_a_share_of_the_gpu() -> None:
    # 100 GiB at 0.90 of a 140 GiB GPU; 107 GiB needs 7 / 140 = 0.05 more: 0.95.
    assert derive.gpu_memory_utilization_for(107 * GIB, 100 * GIB, 0.90, 140 * GIB) == (
        pytest.approx(0.95)
    )
    # 240 GiB would need more than the whole GPU: absent.
    assert derive.gpu_memory_utilization_for(240 * GIB, 100 * GIB, 0.90, 140 * GIB) is None


def test_weights_at_other_bits_scale_every_weight_alike() -> None:
    # 14.29 GiB of BF16 at 4 bits: 3.5725 GiB; at 8: 7.145 GiB.
    assert derive.weights_at_bits(14.29 * GIB, 4) == pytest.approx(3.5725 * GIB)
    assert derive.weights_at_bits(14.29 * GIB, 8) == pytest.approx(7.145 * GIB)
    assert derive.weights_at_bits(None, 4) is None


def test_requests_that_fit_are_whole_requests() -> None:
    assert derive.requests_that_fit(4096.0, 1000.0) == 4.0
    assert derive.requests_that_fit(4096.0, 1024.0) == 4.0
    assert derive.requests_that_fit(4096.0, 4097.0) == 0.0
    assert derive.requests_that_fit(4096.0, 0.0) is None


def test_tokens_demanded_and_recomputed_are_requests_at_the_mean_size() -> None:
    # 11 running and 5 waiting requests of 620 tokens: 9,920 tokens (the stack's flood of
    # 16 on a 4,096-token pool).
    assert derive.kv_cache_tokens_demanded(620.0, 11.0, 5.0) == 9920.0
    assert derive.kv_cache_tokens_demanded(620.0, 11.0, None) is None
    # 58 preemptions of requests of 300 tokens: 17,400 tokens prefilled again.
    assert derive.tokens_recomputed_by_preemptions(58.0, 300.0) == 17400.0
    assert derive.tokens_recomputed_by_preemptions(58.0, None) is None


def test_awq_at_bf16s_bandwidth_predicts_a_step_of_its_weights_over_that_bandwidth() -> None:
    # BF16 on the H200 read its 14.29 GiB at 3.2555 TB/s; AWQ's 5.38 GiB at that rate:
    # 5.38 × 1,073,741,824 / 3.2555e12 = 1.7745 ms. AWQ measured 3.7152 ms: −52.2 %.
    step = derive.decode_step_at_bandwidth(5.38 * GIB, 3.2555e12)
    assert step == pytest.approx(1.7745e-3, rel=1e-4)
    assert derive.prediction_error(step, 3.7152e-3) == pytest.approx(-0.5224, abs=1e-4)
    assert derive.decode_step_at_bandwidth(5.38 * GIB, 3.2555e12, 2) == pytest.approx(
        0.88723e-3, rel=1e-4
    )


def test_the_labs_line_predicts_with_its_intercept() -> None:
    # The H200 run 1 line: 0.11207 ms/GiB × 5.29 GiB + 3.11227 ms = 3.70512 ms (GPTQ).
    step = derive.decode_step_on_line(5.29 * GIB, 0.00011207029967211255, 0.00311226600036257)
    assert step == pytest.approx(0.0037051178856280457, rel=1e-12)


def test_a_tokens_time_is_its_steps_over_the_tokens_each_makes() -> None:
    assert derive.time_per_token_of_step(0.005, 5.0) == pytest.approx(0.001)
    assert derive.time_per_token_of_step(0.005, None) is None
    assert derive.prediction_error(1.1, 1.0) == pytest.approx(0.1)
    assert derive.prediction_error(1.0, 0.0) is None


def test_speculations_speed_up_break_even_and_coverage_needed() -> None:
    # H200 run 1, AWQ: with ngram a step took 5.3784 ms and made 5.4255 tokens (0.9913 ms
    # a token); without, a step (one token) took 3.7152 ms: 3.748× faster.
    assert derive.spec_speedup(5.3784e-3, 5.4255, 3.7152e-3) == pytest.approx(3.7478, abs=1e-4)
    # A speculative step costs 1.4477 plain ones: it must make 1.4477 tokens to break even.
    needed = derive.spec_break_even_tokens_per_pass(5.3784e-3, 3.7152e-3)
    assert needed == pytest.approx(1.44767, abs=1e-5)
    # Drafting steps made 1 + 624 / 129 = 5.8372 tokens: 0.44767 / 4.8372 = 9.25 % of the
    # steps must draft.
    coverage = derive.spec_coverage_needed(needed, 1 + 624 / 129)
    assert coverage == pytest.approx(0.092548, abs=1e-6)
    # No acceptance, no coverage is enough; a cheaper step than plain needs none.
    assert derive.spec_coverage_needed(1.2, 1.0) is None
    assert derive.spec_coverage_needed(0.9, 3.0) == 0.0


def test_a_stages_share_and_the_start_without_it() -> None:
    # BF16's first start on the H200: torch.compile 20.13 s of 82 s.
    assert derive.share_of(20.13, 82.0) == pytest.approx(0.24549, abs=1e-5)
    assert derive.startup_without_stage(82.0, 20.13) == pytest.approx(61.87)
    assert derive.share_of(1.0, 0.0) is None
