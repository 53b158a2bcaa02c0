"""vLLM 0.24.0's CUDA build on one H200, captured while the lab ran its gpu-7b plan
(tests/fixtures/README.md says how): what the log parser, the page parser and the
derivation core make of the real logs and pages. The expected numbers are read off the raw
lines and samples by hand (quoted beside each), not from the parsers."""

from __future__ import annotations

import pytest
from vllm_glassbox.core import derive
from vllm_glassbox.core import snapshot as s
from vllm_glassbox.core.cold_start import read_cold_starts
from vllm_glassbox.core.snapshot import EngineKey, read_snapshot
from vllm_glassbox.core.startup_log import read_facts

from tests.fixtures import log, page

GIB = 2**30
ENGINE = EngineKey("qwen", "0")
PAGES = "cuda-0.24.0-h200"


def _page(name: str) -> s.Snapshot:
    return read_snapshot(page(f"{PAGES}/{name}"))


def _increase(before: str, after: str, seconds: float) -> derive.Increase:
    return derive.snapshot_increases(_page(before), _page(after), seconds)[ENGINE]


# --- the logs: one start per variant ------------------------------------------------------


@pytest.mark.parametrize(
    ("variant", "weights_gib", "kv_tokens", "dtype"),
    [
        # "Model loading took 14.29 GiB memory", "GPU KV cache size: 2,033,120 tokens"
        ("bf16", 14.29, 2_033_120, "bfloat16"),
        ("awq", 5.38, 2_198_176, "float16"),  # quantization=auto_awq
        ("gptq", 5.29, 2_199_712, "float16"),  # quantization=auto_gptq
        ("fp8", 8.2, 2_148_000, "bfloat16"),  # quantization=fp8: weights in FP8, dtype BF16
        ("kv-pressure", 5.38, 58_000, "float16"),  # --kv-cache-memory-bytes 3325952000
        ("spec", 5.38, 2_155_648, "float16"),  # ngram: the pool gives way to the proposer
    ],
)
def test_each_h200_start_logs_its_weights_pool_and_dtype_once(
    variant: str, weights_gib: float, kv_tokens: int, dtype: str
) -> None:
    facts = read_facts(log(f"cuda-0.24.0-h200-{variant}.log"))
    assert facts.vllm_version == "0.24.0"
    assert (facts.tensor_parallel, facts.pipeline_parallel, facts.data_parallel) == (1, 1, 1)
    # One GPU, one engine core: one "Model loading took" line, the whole model.
    [(process, weights)] = facts.weights_by_rank.items()
    assert process.startswith("EngineCore:")
    assert weights == pytest.approx(weights_gib * GIB)
    assert facts.kv_cache_tokens == kv_tokens
    assert facts.model_dtype == dtype
    assert facts.max_model_len == 8192


def test_quantization_shrinks_the_weights_and_the_freed_memory_goes_to_the_kv_pool() -> None:
    tokens = {
        v: read_facts(log(f"cuda-0.24.0-h200-{v}.log")).kv_cache_tokens
        for v in ("bf16", "awq", "fp8")
    }
    # 14.29 − 5.38 GiB of weights freed: 165,056 more tokens of 57,344 bytes (28 layers ×
    # 2 × 4 KV heads × 128 dims × 2 bytes), 8.8 GiB; the rest went to activations.
    assert tokens["awq"] - tokens["bf16"] == 165_056
    assert (tokens["awq"] - tokens["bf16"]) * 57_344 / GIB == pytest.approx(8.81, abs=0.01)
    assert tokens["bf16"] < tokens["fp8"] < tokens["awq"]


def test_a_cuda_start_by_stage_adds_up_to_vllms_own_start_to_ready() -> None:
    [cold] = read_cold_starts(log("cuda-0.24.0-h200-bf16.log"))
    assert cold.model_name == "qwen"
    # The banner at 07:32:46, "Starting vLLM server on" at 07:34:08.
    assert (str(cold.started_at), str(cold.ready_at)) == ("11-30 07:32:46", "11-30 07:34:08")
    stages = derive.startup_stages(cold)
    assert stages.total == 82.0
    assert stages.weights_load == 0.833533  # "Model loading took 14.29 GiB … 0.833533 seconds"
    assert stages.compile == 20.13  # "(compilation: 20.13 s)"
    assert stages.cuda_graphs == 5.0  # "Graph capturing finished in 5 secs"
    assert stages.engine_init == pytest.approx(37.45 - 20.13 - 5)  # "init engine … 37.45 s"
    assert sum(stages.by_stage().values()) == pytest.approx(82.0)


def test_fp8_compiles_longest_of_the_four_precisions() -> None:
    compile_seconds = {
        v: derive.startup_stages(read_cold_starts(log(f"cuda-0.24.0-h200-{v}.log"))[0]).compile
        for v in ("bf16", "awq", "gptq", "fp8")
    }
    assert compile_seconds == {"bf16": 20.13, "awq": 22.81, "gptq": 18.3, "fp8": 33.35}


# --- the pages: the flood and speculation ---------------------------------------------------


def test_the_h200_pool_is_the_pages_own_token_count() -> None:
    cache = _page("bf16-idle.txt").cache_for(ENGINE)
    # cache_config_info: num_gpu_blocks="127070", block_size="16", kv_cache_size_tokens.
    assert cache is not None and cache.block_size == 16
    assert derive.kv_cache_blocks(cache) == 127_070
    assert derive.kv_cache_capacity_tokens(cache) == 2_033_120 == 127_070 * 16


def test_a_full_pool_on_the_h200_preempts_and_leaves_no_headroom() -> None:
    full = _page("flood-preempting.txt").engines[ENGINE].gauges
    # running 28, waiting 4, kv_cache_usage_perc 0.9826158940397351 of 58,000 tokens.
    assert (full[s.RUNNING], full[s.WAITING]) == (28.0, 4.0)
    capacity = derive.kv_cache_capacity_tokens(_page("flood-preempting.txt").cache_for(ENGINE))
    assert capacity == 58_000
    used = derive.kv_cache_used_tokens(full[s.KV_USAGE], capacity)
    assert used == pytest.approx(56_991.7, abs=0.1)
    assert derive.kv_cache_headroom_requests(used, capacity, full[s.RUNNING]) == 0.0
    # 3.004 s from the last filling page: 4 preemptions (num_preemptions_total 0 → 4).
    d = _increase("flood-filling.txt", "flood-preempting.txt", 3.004)
    assert d[s.PREEMPTIONS] == 4.0
    assert derive.preemptions_per_second(d) == pytest.approx(4 / 3.004)


def test_the_flood_filling_the_pool_forecasts_its_exhaustion() -> None:
    # 3.004 s apart: usage 0.8306 (32 running) → 0.9826 (28 running, 4 preempted).
    before = _page("flood-filling.txt").engines[ENGINE].gauges[s.KV_USAGE]
    after = _page("flood-preempting.txt").engines[ENGINE].gauges[s.KV_USAGE]
    assert before == pytest.approx(0.8305739514348786)
    assert after == pytest.approx(0.9826158940397351)
    free = derive.kv_cache_free_tokens(after * 58_000, 58_000)
    seconds = derive.kv_cache_exhaustion_seconds(free, (after - before) * 58_000, 3.004)
    assert seconds == pytest.approx((1 - after) / ((after - before) / 3.004))


def test_the_whole_flood_counts_every_preemption_and_token() -> None:
    d = _increase("flood-filling.txt", "flood-after.txt", 27.005)
    assert d[s.PREEMPTIONS] == 18.0  # num_preemptions_total 0 → 18
    # Each of the 32 requests decodes 4,095 tokens after its first; nobody speculates.
    assert derive.tokens_per_forward_pass(d) == 1.0
    assert derive.spec_draft_coverage(d) is None


def test_ngram_speculation_on_random_weights_accepts_every_draft() -> None:
    # From the cold request in flight (5 tokens out) to 7 requests of 256 tokens done:
    # generation 5 → 1,792, first tokens 1 → 7, decode steps (ITL count) 4 → 329,
    # drafts 0 → 301, draft tokens and accepted tokens both 0 → 1,456.
    d = _increase("spec-cold.txt", "spec-after.txt", 3.0)
    assert derive.tokens_per_forward_pass(d) == pytest.approx((1787 - 6) / 325)
    assert derive.spec_acceptance_ratio(d) == 1.0
    assert derive.spec_mean_acceptance_length(d) == pytest.approx(1 + 1456 / 301)
    assert derive.spec_draft_coverage(d) == pytest.approx(301 / 325)
