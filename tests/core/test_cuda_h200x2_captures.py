"""vLLM 0.24.0's CUDA build on two H200s (tests/fixtures/README.md says how it was captured):
data parallel = 2 with a dense 7B model flooded until both engines preempt, tensor parallel
= 2 with a Qwen3-30B-A3B-shaped mixture of experts, and data parallel = 2 with expert
parallelism on the same model. The glassbox exporter ran beside each server; its own pages
were saved at the same moments as vLLM's. The expected numbers are read off the raw lines
and samples by hand (quoted beside each), not from the parsers."""

from __future__ import annotations

import pytest
from prometheus_client.parser import text_string_to_metric_families
from vllm_glassbox.core import derive
from vllm_glassbox.core import snapshot as s
from vllm_glassbox.core.cold_start import read_cold_starts
from vllm_glassbox.core.layout import resolve_layout
from vllm_glassbox.core.snapshot import EngineKey, read_snapshot
from vllm_glassbox.core.startup_log import read_facts
from vllm_glassbox.core.weights import checkpoint_weights, config_size, resolve_weights

from tests.fixtures import log, page

GIB = 2**30
PAGES = "cuda-0.24.0-h200x2"
ENGINES = (EngineKey("q", "0"), EngineKey("q", "1"))
#: Qwen3-30B-A3B's published shape (scripts/gpu/capture_multigpu.py writes it as config.json).
EXPERT_BYTES = 3 * 2048 * 768 * 2  # gate, up and down projections of one expert, BF16
LAYERS, EXPERTS, TOP_K = 48, 128, 8


def _page(name: str) -> s.Snapshot:
    return read_snapshot(page(f"{PAGES}/{name}.txt"))


def _exported(name: str) -> dict[str, float]:
    """The exporter's own page, captured beside vLLM's: `name{labels}` → value."""
    samples: dict[str, float] = {}
    for family in text_string_to_metric_families(page(f"{PAGES}/{name}.exporter.txt")):
        for sample in family.samples:
            labels = ",".join(f'{k}="{v}"' for k, v in sorted(sample.labels.items()))
            samples[f"{sample.name}{{{labels}}}" if labels else sample.name] = sample.value
    return samples


# --- data parallel = 2, a dense model -------------------------------------------------------


def test_dp2_logs_one_load_of_the_whole_model_and_a_pool_per_engine() -> None:
    facts = read_facts(log("cuda-0.24.0-h200x2-dp2.log"))
    # "(Worker pid=1778) … Model loading took 14.29 GiB memory and 0.445028 seconds": the
    # other engine's worker (pid 1825) logs no such line, its progress bars cut it off.
    assert list(facts.weights_by_rank.values()) == [pytest.approx(14.29 * GIB)]
    # Each engine: "GPU KV cache size: 58,000 tokens"; the engine-config line of a dense
    # data-parallel model says data_parallel_size=1 (engines run independently).
    assert facts.kv_cache_tokens == 58_000
    assert (facts.tensor_parallel, facts.data_parallel) == (1, 1)
    # The page has two engines: the layout is DP=2 and the model counted once.
    layout = resolve_layout(facts, engines=len(_page("dp2-idle").engines))
    assert (layout.tensor, layout.pipeline, layout.data) == (1, 1, 2)
    weights = resolve_weights(None, facts, None, layout)
    assert weights is not None and weights.bytes == pytest.approx(14.29 * GIB)


def test_dp2_cold_start_ends_when_the_api_server_starts() -> None:
    [cold] = read_cold_starts(log("cuda-0.24.0-h200x2-dp2.log"))
    # The banner at 10:08:42, "Starting vLLM server on http://127.0.0.1:8100" at 10:10:50.
    assert (str(cold.started_at), str(cold.ready_at)) == ("12-01 10:08:42", "12-01 10:10:50")
    stages = derive.startup_stages(cold)
    assert stages.total == 128.0
    assert stages.weights_load == 0.445028
    # "(EngineCore_DP1 …) init engine … took 42.73 s (compilation: 26.24 s)"; DP0's line
    # is lost among the CUDA-graph progress bars that both workers write at once.
    assert stages.compile == 26.24
    assert sum(stages.by_stage().values()) == pytest.approx(128.0)


def test_dp2_pages_carry_both_engines_each_with_its_own_pool() -> None:
    idle = _page("dp2-idle")
    assert sorted(idle.engines) == sorted(ENGINES)
    for engine in ENGINES:
        # cache_config_info{engine=…, block_size="16", kv_cache_size_tokens="58000"}
        assert derive.kv_cache_capacity_tokens(idle.cache_for(engine)) == 58_000


def test_dp2_short_requests_split_across_the_engines_one_token_per_pass() -> None:
    increases = derive.snapshot_increases(_page("dp2-idle"), _page("dp2-after-4x128"), 10.0)
    for engine in ENGINES:
        d = increases[engine]
        # Each engine: 256 generated tokens, 2 first tokens, 254 decode steps, 130 engine
        # steps (two requests of 128 side by side).
        assert (d[s.GENERATION_TOKENS], d[s.TTFT_COUNT], d[s.ITL_COUNT]) == (256, 2, 254)
        assert derive.tokens_per_forward_pass(d) == 1.0
        assert derive.tokens_per_engine_step(d) == pytest.approx(256 / 130)
    # inter_token_latency_seconds_sum: 1.1820326130000183 on engine 0, 1.3294427589999884 on 1.
    tpot = derive.time_per_output_token(increases[ENGINES[0]])
    assert tpot == pytest.approx(1.1820326130000183 / 254)
    both = derive.engines_together(increases.values())
    assert derive.time_per_output_token(both) == pytest.approx(
        (1.1820326130000183 + 1.3294427589999884) / 508
    )


def test_dp2_flood_fills_both_pools_then_each_engine_preempts() -> None:
    filling, first = _page("dp2-flood-005"), _page("dp2-flood-006")
    # Poll 5: running 33 and 31, nobody waiting, usage 0.8397 and 0.8019.
    assert [filling.engines[e].gauges[s.WAITING] for e in ENGINES] == [0.0, 0.0]
    # Poll 6 (2 s later): waiting 2 and 1, num_preemptions_total 2 and 1.
    d = derive.snapshot_increases(filling, first, 2.0)
    assert [d[e][s.PREEMPTIONS] for e in ENGINES] == [2.0, 1.0]
    assert [derive.preemptions_per_second(d[e]) for e in ENGINES] == [1.0, 0.5]
    for engine in ENGINES:
        gauges = first.engines[engine].gauges
        used = derive.kv_cache_used_tokens(gauges[s.KV_USAGE], 58_000)
        assert derive.kv_cache_headroom_requests(used, 58_000, gauges[s.RUNNING]) == 0.0
    # After the flood: 19 and 17 preemptions in all, the pools empty again.
    after = _page("dp2-after-flood")
    total = derive.snapshot_increases(_page("dp2-idle"), after, 60.0)
    assert [total[e][s.PREEMPTIONS] for e in ENGINES] == [19.0, 17.0]
    assert [after.engines[e].gauges[s.RUNNING] for e in ENGINES] == [0.0, 0.0]


def test_the_exporter_beside_dp2_counted_the_model_once_and_served_both_engines() -> None:
    mine = _exported("dp2-after-flood")
    assert mine["glassbox_model_weights_bytes"] == pytest.approx(14.29 * GIB)
    assert mine['glassbox_parallel_info{data_parallel="2",pipeline_parallel="1",'
                'tensor_parallel="1"}'] == 1.0  # fmt: skip
    for engine in ("0", "1"):
        key = f'glassbox_kv_cache_capacity_tokens{{engine="{engine}",model_name="q"}}'
        assert mine[key] == 58_000
    # During the storm its window (30 s) saw both engines preempt.
    storm = _exported("dp2-flood-013")
    rates = [storm[f'glassbox_preemptions_per_second{{engine="{e}",model_name="q"}}'] for e in "01"]
    assert all(rate > 0 for rate in rates)
    assert mine["glassbox_target_restarts_total"] == 0.0


# --- a mixture of experts: tensor parallel = 2 ----------------------------------------------


def _moe_config() -> dict[str, object]:
    return {
        "architectures": ["Qwen3MoeForCausalLM"],
        "model_type": "qwen3_moe",
        "head_dim": 128,
        "hidden_size": 2048,
        "intermediate_size": 6144,
        "moe_intermediate_size": 768,
        "num_attention_heads": 32,
        "num_experts": EXPERTS,
        "num_experts_per_tok": TOP_K,
        "num_hidden_layers": LAYERS,
        "num_key_value_heads": 4,
        "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
        "vocab_size": 151936,
        "decoder_sparse_step": 1,
        "mlp_only_layers": [],
    }


def test_moe_tp2_one_rank_logs_half_the_model_and_glassbox_scales_it() -> None:
    facts = read_facts(log("cuda-0.24.0-h200x2-moe-tp2.log"))
    # Only Worker_TP0 logs "Model loading took 28.46 GiB memory"; tensor_parallel_size=2.
    assert list(facts.weights_by_rank.values()) == [pytest.approx(28.46 * GIB)]
    assert facts.tensor_parallel == 2
    layout = resolve_layout(facts, engines=1)
    checkpoint = checkpoint_weights(config_size(_moe_config()), facts)
    weights = resolve_weights(None, facts, checkpoint, layout)
    assert weights is not None and weights.bytes == pytest.approx(2 * 28.46 * GIB)
    # One token reads the shared weights and 8 of 128 experts in each of 48 layers.
    routed = LAYERS * EXPERTS * EXPERT_BYTES
    active = LAYERS * TOP_K * EXPERT_BYTES
    assert weights.active_bytes == pytest.approx(weights.bytes - routed + active, rel=0.01)
    # Each rank holds half the 4 KV heads: 48 layers × 2 (K, V) × 2 heads × 128 × 2 bytes
    # = 49,152 bytes per token; 8 GiB → 174,762, in whole 16-token blocks 174,752.
    assert facts.kv_cache_tokens == 174_752 == (8 * GIB // 49_152) // 16 * 16


def test_the_exporter_beside_moe_tp2_published_whole_and_active_weights() -> None:
    mine = _exported("moe-tp2-after-4x128")
    assert mine["glassbox_model_weights_bytes"] == pytest.approx(2 * 28.46 * GIB)
    assert mine["glassbox_model_active_weights_bytes"] == pytest.approx(6.71e9, rel=0.01)
    assert mine['glassbox_parallel_info{data_parallel="1",pipeline_parallel="1",'
                'tensor_parallel="2"}'] == 1.0  # fmt: skip
    # Decode floor: active bytes / (TP × 4.8 TB/s) = 6.71e9 / 9.6e12 ≈ 0.70 ms.
    assert mine["glassbox_decode_floor_seconds"] == pytest.approx(6.71e9 / 9.6e12, rel=0.01)


# --- a mixture of experts: data parallel = 2 with expert parallelism ------------------------


def test_moe_dp2_ep_each_rank_holds_half_the_experts() -> None:
    text = log("cuda-0.24.0-h200x2-moe-dp2-ep.log")
    # "[EP Rank 0/2] Expert parallelism is enabled. … Local/global number of experts: 64/128"
    assert "Local/global number of experts: 64/128" in text
    facts = read_facts(text)
    # "(Worker_DP0_EP0 pid=3308) … Model loading took 29.88 GiB memory": the shared weights
    # and 64 experts per layer; the other rank logs no such line.
    assert list(facts.weights_by_rank.values()) == [pytest.approx(29.88 * GIB)]
    # Each engine: "GPU KV cache size: 87,376 tokens" (all 4 KV heads on each rank).
    assert facts.kv_cache_tokens == 87_376
    # Worked by hand: the rank's 29.88 GiB less its 64 × 48 experts is the shared part,
    # 2.88 GiB; the whole model is that plus all 128 × 48 experts.
    shared = 29.88 * GIB - LAYERS * 64 * EXPERT_BYTES
    assert shared / GIB == pytest.approx(2.88, abs=0.01)
    assert (shared + LAYERS * EXPERTS * EXPERT_BYTES) / GIB == pytest.approx(56.88, abs=0.01)


def test_moe_dp2_ep_whole_model_is_not_one_ranks_share_but_every_expert_once() -> None:
    facts = read_facts(log("cuda-0.24.0-h200x2-moe-dp2-ep.log"))
    layout = resolve_layout(facts, engines=len(_page("moe-dp2-ep-idle").engines))
    assert layout.data == 2
    # No engine holds the model: the logged 29.88 GiB is flagged, never published as it.
    assert "experts_across_engines" in facts.unrecognised()
    assert resolve_weights(None, facts, None, layout) is None
    # With the model's folder (the exporter's --model-dir), the config gives the whole model.
    checkpoint = checkpoint_weights(config_size(_moe_config()), facts)
    weights = resolve_weights(None, facts, checkpoint, layout)
    assert weights is not None and weights.source == "config"
    assert weights.bytes / GIB == pytest.approx(56.88, abs=0.05)
