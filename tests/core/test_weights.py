"""Weight bytes from checkpoints and configs, and the GPU bandwidth table (core/weights.py)."""

from __future__ import annotations

import json
import os
import struct
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import save_file
from vllm_glassbox.core.gpus import GPU_MEMORY_BANDWIDTH, gpu_bandwidth
from vllm_glassbox.core.weights import (
    TensorBytes,
    checkpoint_directory,
    checkpoint_files,
    checkpoint_weights,
    config_size,
    estimate_from_config,
    read_checkpoint,
    safetensors_bytes,
    weights_from_config,
    weights_from_safetensors,
)
from vllm_glassbox.lab.backends.tinymodel import TinyModelSpec, _config, write_safetensors

# --- exact bytes from safetensors headers --------------------------------------------------


def test_header_bytes_equal_the_tiny_models_tensor_bytes(tmp_path: Path) -> None:
    spec = TinyModelSpec("tiny")
    size = write_safetensors(tmp_path / "model.safetensors", spec.tensor_shapes())
    got = safetensors_bytes(tmp_path / "model.safetensors")
    assert got == spec.parameter_count() * 2  # BF16
    (header_len,) = struct.unpack("<Q", (tmp_path / "model.safetensors").read_bytes()[:8])
    assert got == size - 8 - header_len  # everything after the header is tensor data


def test_header_bytes_match_the_safetensors_library(tmp_path: Path) -> None:
    tensors: dict[str, np.ndarray] = {
        "a": np.zeros((3, 5), dtype=np.float32),
        "b": np.zeros((7,), dtype=np.int8),
        "c": np.zeros((2, 2, 2), dtype=np.float16),
    }
    save_file(tensors, str(tmp_path / "x.safetensors"), metadata={"format": "np"})
    assert safetensors_bytes(tmp_path / "x.safetensors") == sum(t.nbytes for t in tensors.values())


def test_sharded_checkpoint_sums_its_shards(tmp_path: Path) -> None:
    save_file(
        {"a": np.zeros((100,), np.float16)}, str(tmp_path / "model-00001-of-00002.safetensors")
    )
    save_file(
        {"b": np.zeros((50,), np.float16)}, str(tmp_path / "model-00002-of-00002.safetensors")
    )
    (tmp_path / "config.json").write_text("{}")
    assert weights_from_safetensors(tmp_path) == 200 + 100  # no index: every shard


def test_directory_without_safetensors_has_no_exact_weights(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text("{}")
    assert weights_from_safetensors(tmp_path) is None


# --- Hugging Face cache layout -------------------------------------------------------------


def _hf_cache(root: Path, snapshots: dict[str, int]) -> Path:
    """models--org--name/snapshots/<hash>/ with config.json and a safetensors of N halves."""
    repo = root / "models--Qwen--Qwen2.5-7B-Instruct"
    for i, (commit, floats) in enumerate(snapshots.items()):
        snap = repo / "snapshots" / commit
        snap.mkdir(parents=True)
        (snap / "config.json").write_text("{}")
        save_file({"w": np.zeros((floats,), np.float16)}, str(snap / "model.safetensors"))
        os.utime(snap, (1_700_000_000 + i, 1_700_000_000 + i))
    return repo


def test_hf_cache_dir_resolves_to_the_snapshot_refs_main_names(tmp_path: Path) -> None:
    repo = _hf_cache(tmp_path, {"a1b2c3": 10, "d4e5f6": 20})  # d4e5f6 is the newer one
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("a1b2c3\n")
    assert checkpoint_directory(repo) == repo / "snapshots" / "a1b2c3"
    assert weights_from_safetensors(repo) == 20


def test_hf_cache_dir_without_refs_takes_the_newest_snapshot(tmp_path: Path) -> None:
    repo = _hf_cache(tmp_path, {"a1b2c3": 10, "d4e5f6": 20})
    assert checkpoint_directory(repo) == repo / "snapshots" / "d4e5f6"
    assert weights_from_safetensors(repo) == 40


def test_plain_directory_is_itself(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text("{}")
    assert checkpoint_directory(tmp_path) == tmp_path


# --- estimates from config.json -------------------------------------------------------------

# Qwen/Qwen2.5-7B-Instruct's config.json (the model of the article).
QWEN_7B: dict[str, object] = {
    "architectures": ["Qwen2ForCausalLM"],
    "hidden_size": 3584,
    "intermediate_size": 18944,
    "num_hidden_layers": 28,
    "num_attention_heads": 28,
    "num_key_value_heads": 4,
    "vocab_size": 152064,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
}
H, INTER, LAYERS, VOCAB, KV = 3584, 18944, 28, 152064, 4 * 128
# (in, out) of q, k, v, o, gate, up, down
LINEARS = [(H, H), (H, KV), (H, KV), (H, H), (H, INTER), (H, INTER), (INTER, H)]
BIASES = H + KV + KV  # q, k, v
NORMS = LAYERS * 2 * H + H
EMBED = VOCAB * H  # embed_tokens, and lm_head again (not tied)


def _true_bytes(linear_bytes: int, per_layer_extra: int = 0) -> int:
    """Tensor bytes of a checkpoint whose linear layers take `linear_bytes` per layer;
    biases, norms, embeddings and lm_head are 16-bit in all four checkpoints."""
    return LAYERS * (linear_bytes + per_layer_extra + 2 * BIASES) + 2 * NORMS + 2 * 2 * EMBED


def _awq_linear(i: int, o: int, g: int = 128) -> int:
    # qweight int32 (in, out/8), qzeros int32 (in/g, out/8), scales fp16 (in/g, out)
    return i * o // 2 + (i // g) * (o // 8) * 4 + (i // g) * o * 2


def _gptq_linear(i: int, o: int, g: int = 128) -> int:
    # qweight int32 (in/8, out), qzeros int32 (in/g, out/8), scales fp16, g_idx int32 (in)
    return i * o // 2 + (i // g) * (o // 8) * 4 + (i // g) * o * 2 + 4 * i


def _fp8_linear(i: int, o: int) -> int:
    # weight float8_e4m3 (out, in), weight_scale bf16 (out, 1) per output channel
    return i * o + 2 * o


TOLERANCE = 0.01  # estimates must be within 1 % of the checkpoint's tensor bytes

AWQ = {"quant_method": "awq", "bits": 4, "group_size": 128, "zero_point": True, "version": "gemm"}
GPTQ = {"quant_method": "gptq", "bits": 4, "group_size": 128, "desc_act": False, "sym": True}
FP8 = {
    "quant_method": "compressed-tensors",
    "format": "float-quantized",
    "ignore": ["lm_head"],
    "config_groups": {
        "group_0": {
            "targets": ["Linear"],
            "weights": {"num_bits": 8, "type": "float", "strategy": "channel", "group_size": None},
            "input_activations": {"num_bits": 8, "type": "float", "dynamic": True},
        }
    },
}


@pytest.mark.parametrize(
    ("quantization", "true_bytes"),
    [
        (None, _true_bytes(2 * sum(i * o for i, o in LINEARS))),
        (AWQ, _true_bytes(sum(_awq_linear(i, o) for i, o in LINEARS))),
        (GPTQ, _true_bytes(sum(_gptq_linear(i, o) for i, o in LINEARS))),
        (FP8, _true_bytes(sum(_fp8_linear(i, o) for i, o in LINEARS))),
    ],
    ids=["bf16", "awq", "gptq", "fp8"],
)
def test_config_estimate_is_within_tolerance_of_the_checkpoint_bytes(
    quantization: dict[str, object] | None, true_bytes: int
) -> None:
    config = dict(QWEN_7B)
    if quantization is not None:
        config["quantization_config"] = quantization
    estimate = estimate_from_config(config)
    assert abs(estimate - true_bytes) / true_bytes < TOLERANCE, (estimate, true_bytes)


def test_bf16_checkpoint_of_the_article_model_is_15_2_gb() -> None:
    # 7,615,616,512 parameters (the model card's "7.61B") at 2 bytes each.
    assert _true_bytes(2 * sum(i * o for i, o in LINEARS)) == 7_615_616_512 * 2
    assert estimate_from_config(QWEN_7B) == pytest.approx(15.23e9, rel=0.001)


def test_quantization_makes_the_weights_smaller_in_the_expected_order() -> None:
    sizes = {
        name: estimate_from_config({**QWEN_7B, "quantization_config": q} if q else QWEN_7B)
        for name, q in (("bf16", None), ("fp8", FP8), ("awq", AWQ), ("gptq", GPTQ))
    }
    assert sizes["bf16"] > sizes["fp8"] > max(sizes["awq"], sizes["gptq"])


def test_gptq_per_channel_and_compressed_tensors_w4a16() -> None:
    per_channel = estimate_from_config(
        {**QWEN_7B, "quantization_config": {**GPTQ, "group_size": -1}}
    )
    w4a16 = {
        "quant_method": "compressed-tensors",
        "config_groups": {
            "g": {"weights": {"num_bits": 4, "strategy": "group", "group_size": 128}}
        },
    }
    grouped = estimate_from_config({**QWEN_7B, "quantization_config": w4a16})
    linear = LAYERS * sum(i * o for i, o in LINEARS)
    fixed = 2 * (LAYERS * 2 * H + H + 2 * EMBED)
    assert per_channel == int(linear * 4 / 8 + fixed)
    assert grouped == int(linear * (4 + 16 / 128) / 8 + fixed)


def test_tiny_model_estimate_is_within_tolerance_of_its_safetensors(tmp_path: Path) -> None:
    spec = TinyModelSpec("tiny")
    (tmp_path / "config.json").write_text(json.dumps(_config(spec)))
    write_safetensors(tmp_path / "model.safetensors", spec.tensor_shapes())
    exact = weights_from_safetensors(tmp_path)
    assert exact is not None
    assert abs(weights_from_config(tmp_path) - exact) / exact < TOLERANCE


def test_multimodal_config_uses_its_text_config() -> None:
    wrapped = {"architectures": ["X"], "text_config": QWEN_7B, "quantization_config": AWQ}
    assert estimate_from_config(wrapped) == estimate_from_config(
        {**QWEN_7B, "quantization_config": AWQ}
    )


def test_mixture_of_experts_counts_every_expert_and_its_router() -> None:
    dense = estimate_from_config(QWEN_7B)
    moe = estimate_from_config({**QWEN_7B, "num_local_experts": 8})
    mlp_bytes = LAYERS * 3 * H * INTER * 2
    router_bytes = LAYERS * H * 8 * 2
    assert moe - dense == 7 * mlp_bytes + router_bytes


# --- bad inputs --------------------------------------------------------------------------


def test_config_without_the_essential_sizes_is_refused() -> None:
    with pytest.raises(ValueError, match="hidden_size, num_hidden_layers or vocab_size"):
        estimate_from_config({"architectures": ["X"], "hidden_size": 64})


def test_directory_without_config_or_snapshots_is_refused_by_name(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=f"{tmp_path}: no config.json"):
        checkpoint_directory(tmp_path)


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b"\x01\x02", "too short"),
        (struct.pack("<Q", 10**12) + b"{}", "not plausible"),
        (struct.pack("<Q", 100) + b'{"a": ', "cut short"),
        (struct.pack("<Q", 8) + b"not json", "not a safetensors header"),
        (struct.pack("<Q", 14) + b'{"w": {"x":1}}', "not a safetensors header"),
    ],
    ids=["too-short", "absurd-header", "truncated-header", "not-json", "no-offsets"],
)
def test_broken_safetensors_files_are_refused_by_name(
    tmp_path: Path, content: bytes, message: str
) -> None:
    path = tmp_path / "model.safetensors"
    path.write_bytes(content)
    with pytest.raises(ValueError, match=message) as info:
        safetensors_bytes(path)
    assert str(path) in str(info.value)


# --- GPU table ---------------------------------------------------------------------------


def test_the_article_gpu_and_common_aliases() -> None:
    assert gpu_bandwidth("L40S") == 864e9
    assert gpu_bandwidth("l40s") == gpu_bandwidth("L40S")
    assert gpu_bandwidth("H100") == GPU_MEMORY_BANDWIDTH["H100-SXM"]
    assert gpu_bandwidth("A100") == GPU_MEMORY_BANDWIDTH["A100-40GB"]
    assert gpu_bandwidth("a100_80gb") == gpu_bandwidth("A100 80GB") == 2039e9
    assert gpu_bandwidth("A100-80G") == 2039e9


@pytest.mark.parametrize(
    ("smi_name", "table_name"),
    [
        ("NVIDIA L40S", "L40S"),
        ("NVIDIA A100-SXM4-80GB", "A100-80GB"),
        ("NVIDIA A100-SXM4-40GB", "A100-40GB"),
        ("NVIDIA H100 80GB HBM3", "H100-SXM"),
        ("NVIDIA H100 PCIe", "H100-PCIE"),
        ("NVIDIA GeForce RTX 4090", "RTX4090"),
        ("NVIDIA RTX 6000 Ada Generation", "RTX6000ADA"),
        ("Tesla T4", "T4"),
        ("AMD Instinct MI300X", "MI300X"),
    ],
)
def test_gpu_names_as_nvidia_smi_prints_them(smi_name: str, table_name: str) -> None:
    assert gpu_bandwidth(smi_name) == GPU_MEMORY_BANDWIDTH[table_name]


def test_every_table_entry_is_a_plausible_bandwidth_and_reachable_by_name() -> None:
    for name, bandwidth in GPU_MEMORY_BANDWIDTH.items():
        assert 1e11 < bandwidth < 2e13, name
        assert gpu_bandwidth(name) == bandwidth


def test_unknown_gpu_is_refused_with_the_known_names() -> None:
    with pytest.raises(ValueError) as info:
        gpu_bandwidth("RTX 9090")
    message = str(info.value)
    assert "'RTX 9090'" in message and "L40S" in message and "--gpu-memory-bandwidth" in message


# --- the files vLLM loads, at the dtype it loads them ---------------------------------------


def _shards(directory: Path, tensors: dict[str, np.ndarray], index: bool = True) -> None:
    """A sharded checkpoint: one tensor per shard, and its index."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "config.json").write_text(json.dumps({"torch_dtype": "bfloat16"}))
    names = {
        name: f"model-{i + 1:05d}-of-{len(tensors):05d}.safetensors"
        for i, name in enumerate(tensors)
    }
    for name, array in tensors.items():
        save_file({name: array}, str(directory / names[name]))
    if index:
        weight_map = {"metadata": {"total_size": 0}, "weight_map": names}
        (directory / "model.safetensors.index.json").write_text(json.dumps(weight_map))


TWO_SHARDS = {"a": np.zeros((1000,), np.float16), "b": np.zeros((1000,), np.float16)}


def test_a_consolidated_file_beside_the_indexed_shards_is_not_counted(tmp_path: Path) -> None:
    # Mistral-style repositories ship both; vLLM loads the index's files only.
    _shards(tmp_path, TWO_SHARDS)
    save_file(TWO_SHARDS, str(tmp_path / "consolidated.safetensors"))
    assert [f.name for f in checkpoint_files(tmp_path)] == [
        "model-00001-of-00002.safetensors",
        "model-00002-of-00002.safetensors",
    ]
    assert weights_from_safetensors(tmp_path) == 4000  # every file summed: 8000


def test_an_adapter_beside_the_model_is_not_counted(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text("{}")
    save_file({"w": np.zeros((1000,), np.float16)}, str(tmp_path / "model.safetensors"))
    save_file({"lora_A": np.zeros((100,), np.float16)}, str(tmp_path / "adapter_model.safetensors"))
    assert weights_from_safetensors(tmp_path) == 2000  # with the adapter: 2200


def test_a_mistral_format_checkpoint_alone_is_its_consolidated_file(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text("{}")
    save_file(TWO_SHARDS, str(tmp_path / "consolidated.safetensors"))
    save_file({"lora_A": np.zeros((10,), np.float16)}, str(tmp_path / "adapter_model.safetensors"))
    assert [f.name for f in checkpoint_files(tmp_path)] == ["consolidated.safetensors"]


def test_an_index_naming_a_missing_file_is_refused_by_name(tmp_path: Path) -> None:
    _shards(tmp_path, TWO_SHARDS)
    (tmp_path / "model-00002-of-00002.safetensors").unlink()
    with pytest.raises(ValueError, match=r"model-00002-of-00002\.safetensors"):
        read_checkpoint(tmp_path)


def test_an_fp32_checkpoint_counts_at_the_16_bits_vllm_loads_it_at(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps({"torch_dtype": "float32"}))
    save_file(
        {"w": np.zeros((1000,), np.float32), "ids": np.zeros((10,), np.int64)},
        str(tmp_path / "model.safetensors"),
    )
    size = read_checkpoint(tmp_path)
    assert size.total == TensorBytes(float_elements=1000, fixed_bytes=80)
    assert weights_from_safetensors(tmp_path) == 2000 + 80  # as stored: 4080
    assert size.total.at(4) == 4080  # vLLM started with --dtype float32


def test_a_quantized_checkpoint_counts_as_stored_scales_included(tmp_path: Path) -> None:
    config = {"torch_dtype": "bfloat16", "quantization_config": FP8}
    (tmp_path / "config.json").write_text(json.dumps(config))
    save_file(
        {
            "w": np.zeros((1000,), np.int8),  # float8 weights, stored as bytes
            "w_scale": np.zeros((10,), np.float32),  # scales stay float32 in vLLM
            "embed": np.zeros((100,), np.float16),
        },
        str(tmp_path / "model.safetensors"),
    )
    assert weights_from_safetensors(tmp_path) == 1000 + 40 + 200


# --- mixture of experts ----------------------------------------------------------------------

# Qwen/Qwen3-30B-A3B's config.json (the shapes that matter).
QWEN3_30B_A3B: dict[str, object] = {
    "architectures": ["Qwen3MoeForCausalLM"],
    "hidden_size": 2048,
    "intermediate_size": 6144,
    "moe_intermediate_size": 768,
    "num_experts": 128,
    "num_experts_per_tok": 8,
    "decoder_sparse_step": 1,
    "mlp_only_layers": [],
    "num_hidden_layers": 48,
    "num_attention_heads": 32,
    "num_key_value_heads": 4,
    "head_dim": 128,
    "vocab_size": 151936,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
}
# mistralai/Mixtral-8x7B-v0.1's config.json.
MIXTRAL_8X7B: dict[str, object] = {
    "architectures": ["MixtralForCausalLM"],
    "hidden_size": 4096,
    "intermediate_size": 14336,
    "num_local_experts": 8,
    "num_experts_per_tok": 2,
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "vocab_size": 32000,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
}


@pytest.mark.parametrize(
    ("config", "total_params", "active_params"),
    [(QWEN3_30B_A3B, 30.5e9, 3.3e9), (MIXTRAL_8X7B, 46.7e9, 12.9e9)],
    ids=["qwen3-30b-a3b", "mixtral-8x7b"],
)
def test_moe_config_estimate_has_the_model_cards_total_and_active_parameters(
    config: dict[str, object], total_params: float, active_params: float
) -> None:
    size = config_size(config)
    weights = checkpoint_weights(size)
    assert weights.bytes == pytest.approx(2 * total_params, rel=0.02)  # was 467 GB for 30B-A3B
    assert weights.active_bytes == pytest.approx(2 * active_params, rel=0.03)
    assert size.experts_per_token_share == config["num_experts_per_tok"] / (  # type: ignore[operator]
        config.get("num_experts") or config["num_local_experts"]
    )


def test_moe_layers_follow_the_dense_layer_settings() -> None:
    every = config_size(QWEN3_30B_A3B)
    # DeepSeek-style: the first layer is dense (its MLP at intermediate_size).
    first_dense = config_size({**QWEN3_30B_A3B, "first_k_dense_replace": 1})
    per_layer_routed = every.routed_experts.float_elements // 48
    assert first_dense.routed_experts.float_elements == 47 * per_layer_routed
    # Qwen's mlp_only_layers and decoder_sparse_step: every second layer routed.
    assert config_size({**QWEN3_30B_A3B, "decoder_sparse_step": 2}).routed_experts == (
        TensorBytes(float_elements=24 * per_layer_routed)
    )
    assert config_size({**QWEN3_30B_A3B, "mlp_only_layers": [0, 1]}).routed_experts == (
        TensorBytes(float_elements=46 * per_layer_routed)
    )


def test_shared_experts_are_always_active() -> None:
    shared = {**QWEN3_30B_A3B, "shared_expert_intermediate_size": 4096}
    plain, with_shared = (
        checkpoint_weights(config_size(QWEN3_30B_A3B)),
        checkpoint_weights(config_size(shared)),
    )
    extra = 48 * 3 * 2048 * 4096 * 2
    assert with_shared.bytes - plain.bytes == extra
    assert with_shared.active_bytes is not None and plain.active_bytes is not None
    assert with_shared.active_bytes - plain.active_bytes == pytest.approx(extra)


def test_moe_safetensors_give_exact_routed_expert_bytes(tmp_path: Path) -> None:
    config = {**QWEN3_30B_A3B, "num_experts": 4, "num_experts_per_tok": 1}
    (tmp_path / "config.json").write_text(json.dumps(config))
    tensors = {
        f"model.layers.0.mlp.experts.{e}.{p}.weight": np.zeros((100,), np.float16)
        for e in range(4)
        for p in ("gate_proj", "up_proj", "down_proj")
    }
    tensors["model.layers.0.mlp.shared_expert.up_proj.weight"] = np.zeros((100,), np.float16)
    tensors["model.layers.0.mlp.gate.weight"] = np.zeros((8,), np.float16)
    tensors["model.embed_tokens.weight"] = np.zeros((400,), np.float16)
    save_file(tensors, str(tmp_path / "model.safetensors"))
    size = read_checkpoint(tmp_path)
    assert size.source == "safetensors"
    assert size.routed_experts == TensorBytes(float_elements=1200)
    weights = checkpoint_weights(size)
    assert weights.bytes == 2 * (1200 + 100 + 8 + 400)
    assert weights.active_bytes == 2 * (300 + 100 + 8 + 400)  # one expert of four


def test_a_dense_checkpoint_has_no_active_weights(tmp_path: Path) -> None:
    spec = TinyModelSpec("tiny")
    (tmp_path / "config.json").write_text(json.dumps(_config(spec)))
    write_safetensors(tmp_path / "model.safetensors", spec.tensor_shapes())
    weights = checkpoint_weights(read_checkpoint(tmp_path))
    assert weights.active_bytes is None
    assert weights.read_per_step == weights.bytes == spec.parameter_count() * 2
