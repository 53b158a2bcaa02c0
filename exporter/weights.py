"""Model weight bytes from a checkpoint directory, and peak memory bandwidth of GPUs.

Order of trust (the exporter's `glassbox_model_weights_info{source}`): the flag, then
vLLM's log (what was actually loaded), then the safetensors headers (exact tensor bytes
on disk), then an estimate from `config.json`.
"""

from __future__ import annotations

import json
import re
import struct
from pathlib import Path

_DTYPE_BYTES = {
    "F64": 8,
    "I64": 8,
    "U64": 8,
    "F32": 4,
    "I32": 4,
    "U32": 4,
    "F16": 2,
    "BF16": 2,
    "I16": 2,
    "U16": 2,
    "F8_E4M3": 1,
    "F8_E5M2": 1,
    "I8": 1,
    "U8": 1,
    "BOOL": 1,
}
_MAX_HEADER = 100 * 1024 * 1024


def safetensors_bytes(path: Path) -> int:
    """Tensor bytes of one .safetensors file, from its header alone."""
    with open(path, "rb") as f:
        raw = f.read(8)
        if len(raw) != 8:
            raise ValueError(f"{path}: not a safetensors file (too short)")
        (length,) = struct.unpack("<Q", raw)
        if length > _MAX_HEADER:
            raise ValueError(f"{path}: header of {length} bytes is not plausible")
        raw_header = f.read(length)
    if len(raw_header) != length:
        raise ValueError(f"{path}: header cut short ({len(raw_header)} of {length} bytes)")
    try:
        header = json.loads(raw_header)
        total = 0
        for name, info in header.items():
            if name == "__metadata__":
                continue
            start, end = info["data_offsets"]
            total += int(end) - int(start)
    except (ValueError, KeyError, TypeError, AttributeError) as e:
        raise ValueError(f"{path}: not a safetensors header ({type(e).__name__}: {e})") from None
    return total


def checkpoint_directory(path: Path) -> Path:
    """A plain checkpoint directory, or the current snapshot of a Hugging Face cache dir."""
    if (path / "config.json").exists():
        return path
    snapshots = path / "snapshots"
    if snapshots.is_dir():
        ref = path / "refs" / "main"
        if ref.exists() and (snapshots / ref.read_text().strip()).is_dir():
            return snapshots / ref.read_text().strip()
        candidates = sorted(snapshots.iterdir(), key=lambda p: p.stat().st_mtime)
        if candidates:
            return candidates[-1]
    raise ValueError(f"{path}: no config.json and no Hugging Face snapshots/ inside")


def weights_from_safetensors(directory: Path) -> int | None:
    files = sorted(checkpoint_directory(directory).glob("*.safetensors"))
    return sum(safetensors_bytes(f) for f in files) if files else None


def _bits_per_weight(config: dict[str, object]) -> float:
    quant = config.get("quantization_config")
    if isinstance(quant, dict):
        method = str(quant.get("quant_method", "")).lower()
        if method == "compressed-tensors":
            return _compressed_tensors_bits(quant)
        if "fp8" in method or method == "modelopt":
            return 8.0
        bits = quant.get("bits") or quant.get("w_bit")
        if isinstance(bits, int | float):
            group = quant.get("group_size") or quant.get("q_group_size") or 128
            if not isinstance(group, int | float) or group <= 0:
                return float(bits)  # group_size -1: one scale per output channel, noise
            # Each group also stores a 16-bit scale and a packed zero point.
            return float(bits) + (16.0 + float(bits)) / float(group)
    dtype = str(config.get("torch_dtype", config.get("dtype", "bfloat16")))
    return {"float32": 32.0, "float16": 16.0, "bfloat16": 16.0, "float8": 8.0}.get(dtype, 16.0)


def _compressed_tensors_bits(quant: dict[str, object]) -> float:
    """Bits per weight of a compressed-tensors scheme (FP8 says 8; W4A16 says 4 + scales)."""
    groups = quant.get("config_groups")
    for group in groups.values() if isinstance(groups, dict) else ():
        weights = group.get("weights") if isinstance(group, dict) else None
        if isinstance(weights, dict) and isinstance(weights.get("num_bits"), int):
            bits = float(weights["num_bits"])
            size = weights.get("group_size")
            # Grouped schemes store a 16-bit scale per group; per-channel scales are noise.
            return bits + 16.0 / size if isinstance(size, int) and size > 0 else bits
    return 8.0


def estimate_from_config(config: dict[str, object]) -> int:
    """Weight bytes of a decoder-only transformer, from its config.json.

    Linear layers are quantized at the config's bit width; embeddings, norms and the
    LM head stay at 16 bits (as AWQ/GPTQ checkpoints keep them).
    """
    text = config.get("text_config")
    if isinstance(text, dict):
        config = {**text, "quantization_config": config.get("quantization_config")}

    def num(key: str, default: int = 0) -> int:
        value = config.get(key, default)
        return int(value) if isinstance(value, int | float) else default

    h = num("hidden_size")
    layers = num("num_hidden_layers")
    vocab = num("vocab_size")
    heads = num("num_attention_heads", 1) or 1
    kv_heads = num("num_key_value_heads", heads) or heads
    head_dim = num("head_dim", h // heads)
    inter = num("intermediate_size", 4 * h)
    experts = max(num("num_local_experts", num("num_experts", 1)), 1)
    if not (h and layers and vocab):
        raise ValueError("config.json lacks hidden_size, num_hidden_layers or vocab_size")
    attention = h * heads * head_dim * 2 + h * kv_heads * head_dim * 2
    mlp = 3 * h * inter * experts
    linear = layers * (attention + mlp)
    embeddings = vocab * h * (1 if config.get("tie_word_embeddings") else 2)
    norms = layers * 2 * h + h
    return int(linear * _bits_per_weight(config) / 8 + (embeddings + norms) * 2)


def weights_from_config(directory: Path) -> int:
    config = json.loads((checkpoint_directory(directory) / "config.json").read_text())
    return estimate_from_config(config)


#: Peak memory bandwidth, bytes/s, from vendor datasheets.
GPU_MEMORY_BANDWIDTH: dict[str, float] = {
    "T4": 320e9,
    "L4": 300e9,
    "A10": 600e9,
    "A10G": 600e9,
    "L40": 864e9,
    "L40S": 864e9,
    "RTX4090": 1008e9,
    "RTX6000ADA": 960e9,
    "A6000": 768e9,
    "V100": 900e9,
    "A100-40GB": 1555e9,
    "A100-80GB": 2039e9,
    "A100-80GB-PCIE": 1935e9,
    "H100-PCIE": 2.0e12,
    "H100-SXM": 3.35e12,
    "H100-NVL": 3.9e12,
    "H200": 4.8e12,
    "GH200": 4.0e12,
    "B200": 8.0e12,
    "MI250X": 3.2e12,
    "MI300X": 5.3e12,
    "MI325X": 6.0e12,
}


# Other spellings, including what nvidia-smi / rocm-smi print, by their normalized form.
_GPU_ALIASES = {
    "A100": "A100-40GB",
    "A10080G": "A100-80GB",
    "A100SXM440GB": "A100-40GB",
    "A100SXM480GB": "A100-80GB",
    "A100PCIE40GB": "A100-40GB",
    "A100PCIE80GB": "A100-80GB",
    "H100": "H100-SXM",
    "H10080GBHBM3": "H100-SXM",
    "H100SXM580GB": "H100-SXM",
    "RTX6000ADAGENERATION": "RTX6000ADA",
    "RTXA6000": "A6000",
    "TESLAT4": "T4",
    "TESLAV100SXM216GB": "V100",
    "TESLAV100SXM232GB": "V100",
}


def _normalize(name: str) -> str:
    """Upper case, vendor prefix and punctuation gone: "NVIDIA A100 80GB" -> "A10080GB"."""
    key = re.sub(r"[^A-Z0-9]", "", name.upper())
    for prefix in ("NVIDIA", "AMD", "INSTINCT", "GEFORCE"):
        key = key.removeprefix(prefix)
    return key


def gpu_bandwidth(name: str) -> float:
    table = {_normalize(k): k for k in GPU_MEMORY_BANDWIDTH}
    key = _normalize(name)
    key = table.get(key) or _GPU_ALIASES.get(key, "")
    if key not in GPU_MEMORY_BANDWIDTH:
        known = ", ".join(sorted(GPU_MEMORY_BANDWIDTH))
        raise ValueError(f"unknown GPU {name!r}; known: {known} (or give --gpu-memory-bandwidth)")
    return GPU_MEMORY_BANDWIDTH[key]
