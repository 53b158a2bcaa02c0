"""The model's weight bytes (from a checkpoint directory, and which source wins).

What vLLM loads from a checkpoint, counted the way it loads it:

- **Which files**: those of `model.safetensors.index.json` when there is one (repositories
  that also ship `consolidated.safetensors` for another runtime), else `model.safetensors`,
  else the Mistral-format `consolidated*.safetensors`, else every `*.safetensors` except
  an adapter's (`adapter_model.safetensors`).
- **At which width**: vLLM casts the floating-point tensors of an unquantized checkpoint
  to the model's dtype, 16 bits by default even for an FP32 checkpoint; so those are kept
  as element counts and priced when the dtype is known. Quantized weights and their
  scales load as stored.
- **Mixture of experts**: the routed experts' tensors apart, with the share of them one
  token uses (top-k of all), for the active weights.

Without safetensors, `config.json` gives an estimate of the same shape.

Which source wins, for the exporter and the lab alike (`resolve_weights`): the weights of
the whole model as vLLM holds it (a TP×PP-sharded model once, a data-parallel copy not
twice) come from the flag, else vLLM's log (what was loaded, including a drafter and
on-the-fly quantization), else the checkpoint's safetensors, else the estimate from its
config.json. A mixture-of-experts checkpoint also gives the active weights (shared weights
plus one token's top-k experts), whatever the source of the total.
"""

from __future__ import annotations

import json
import re
import struct
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from vllm_glassbox.core import derive
from vllm_glassbox.core.layout import ParallelLayout
from vllm_glassbox.core.startup_log import StartupFacts

#: Tensors vLLM casts to the model's dtype when the checkpoint is not quantized.
_FLOAT_DTYPES = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2}
_MAX_HEADER = 100 * 1024 * 1024
#: vLLM's default width of floating-point weights: the config's 16-bit dtype, and 16 bits
#: for an FP32 checkpoint too (`--dtype auto`).
DEFAULT_FLOAT_BYTES = 2
#: Bytes per element of the dtypes vLLM's engine-config line names (`dtype=torch.X`).
TORCH_DTYPE_BYTES = {"float16": 2, "bfloat16": 2, "half": 2, "float32": 4, "float": 4, "float64": 8}
_ROUTED_EXPERT = re.compile(r"\.experts\.")  # not shared_expert(s): always active


@dataclass(frozen=True)
class TensorBytes:
    """Bytes of some tensors: the floating-point ones vLLM casts to the model's dtype as an
    element count, the rest (quantized weights, scales, integers) as stored."""

    float_elements: int = 0
    fixed_bytes: int = 0

    def at(self, float_bytes: int) -> int:
        """Bytes in memory when the floating-point tensors take `float_bytes` each."""
        return self.float_elements * float_bytes + self.fixed_bytes

    def __add__(self, other: TensorBytes) -> TensorBytes:
        return TensorBytes(
            self.float_elements + other.float_elements, self.fixed_bytes + other.fixed_bytes
        )


@dataclass(frozen=True)
class CheckpointSize:
    """What a checkpoint directory says about the weights vLLM loads from it."""

    source: str  # "safetensors" (exact, from the headers) or "config" (an estimate)
    total: TensorBytes
    routed_experts: TensorBytes = TensorBytes()  # mixture of experts: the routed experts
    experts_per_token_share: float | None = None  # top-k / routed experts (None: dense)


def safetensors_tensors(path: Path) -> dict[str, tuple[str, int]]:
    """Tensor name -> (dtype, bytes) of one .safetensors file, from its header alone."""
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
        tensors: dict[str, tuple[str, int]] = {}
        for name, info in header.items():
            if name == "__metadata__":
                continue
            start, end = info["data_offsets"]
            tensors[name] = (str(info.get("dtype", "")), int(end) - int(start))
    except (ValueError, KeyError, TypeError, AttributeError) as e:
        raise ValueError(f"{path}: not a safetensors header ({type(e).__name__}: {e})") from None
    return tensors


def safetensors_bytes(path: Path) -> int:
    """Tensor bytes of one .safetensors file, as stored."""
    return sum(size for _, size in safetensors_tensors(path).values())


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


def _indexed(directory: Path, index_name: str) -> list[Path] | None:
    index = directory / index_name
    if not index.exists():
        return None
    try:
        weight_map = json.loads(index.read_text())["weight_map"]
        files = sorted({str(f) for f in weight_map.values()})
    except (ValueError, KeyError, TypeError, AttributeError) as e:
        raise ValueError(f"{index}: not a safetensors index ({type(e).__name__}: {e})") from None
    missing = [f for f in files if not (directory / f).is_file()]
    if missing:
        raise ValueError(f"{index} names files that are not there: {', '.join(missing[:5])}")
    return [directory / f for f in files]


def checkpoint_files(directory: Path) -> list[Path]:
    """The safetensors files vLLM loads from a checkpoint directory (see the module doc)."""
    indexed = _indexed(directory, "model.safetensors.index.json")
    if indexed is not None:
        return indexed
    if (directory / "model.safetensors").is_file():
        return [directory / "model.safetensors"]
    indexed = _indexed(directory, "consolidated.safetensors.index.json")
    if indexed is not None:
        return indexed
    every = sorted(directory.glob("*.safetensors"))
    consolidated = [f for f in every if f.name.startswith("consolidated")]
    return consolidated or [f for f in every if not f.name.startswith("adapter")]


def _read_config(directory: Path) -> dict[str, object]:
    path = directory / "config.json"
    if not path.exists():
        return {}
    config = json.loads(path.read_text())
    if not isinstance(config, dict):
        raise ValueError(f"{path}: not a JSON object")
    return config


def _quantized(config: dict[str, object]) -> bool:
    return isinstance(config.get("quantization_config") or config.get("compression_config"), dict)


def _size_of_tensors(
    tensors: Iterable[tuple[str, str, int]], quantized: bool
) -> tuple[TensorBytes, TensorBytes]:
    """(all, routed experts) of (name, dtype, bytes) tensors."""
    total, routed = TensorBytes(), TensorBytes()
    for name, dtype, size in tensors:
        width = _FLOAT_DTYPES.get(dtype)
        one = (
            TensorBytes(float_elements=size // width)
            if width and not quantized
            else TensorBytes(fixed_bytes=size)
        )
        total += one
        if _ROUTED_EXPERT.search(name):
            routed += one
    return total, routed


def read_checkpoint(path: Path) -> CheckpointSize:
    """The weights vLLM loads from a checkpoint (or Hugging Face cache) directory: exact
    from the safetensors headers, else estimated from config.json."""
    directory = checkpoint_directory(path)
    config = _read_config(directory)
    files = checkpoint_files(directory)
    if not files:
        return config_size(config)
    tensors = [
        (name, dtype, size) for f in files for name, (dtype, size) in safetensors_tensors(f).items()
    ]
    total, routed = _size_of_tensors(tensors, _quantized(config))
    share = _experts_per_token_share(_text_config(config))
    return CheckpointSize("safetensors", total, routed if share else TensorBytes(), share)


def weights_from_safetensors(directory: Path) -> int | None:
    """Bytes of the safetensors vLLM loads, at its default dtype; None without any."""
    if not checkpoint_files(checkpoint_directory(directory)):
        return None
    return read_checkpoint(directory).total.at(DEFAULT_FLOAT_BYTES)


# --- estimates from config.json ---------------------------------------------------------


def _bits_per_weight(config: dict[str, object]) -> float | None:
    """Bits of a quantized linear weight (with its scales); None when not quantized."""
    quant = config.get("quantization_config")
    if not isinstance(quant, dict):
        return None
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
    return None


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


def _text_config(config: dict[str, object]) -> dict[str, object]:
    """A multimodal config's language model, with the top-level quantization."""
    text = config.get("text_config")
    if isinstance(text, dict):
        return {**text, "quantization_config": config.get("quantization_config")}
    return config


def _int(config: dict[str, object], *keys: str) -> int:
    """The first of `keys` that is a number in the config, else 0."""
    for key in keys:
        value = config.get(key)
        if isinstance(value, int | float) and not isinstance(value, bool):
            return int(value)
    return 0


def _routed_experts(config: dict[str, object]) -> int:
    return _int(config, "num_local_experts", "num_experts", "n_routed_experts")


def _experts_per_token_share(config: dict[str, object]) -> float | None:
    """Top-k / routed experts of a mixture-of-experts config; None for a dense model."""
    experts = _routed_experts(config)
    top_k = _int(config, "num_experts_per_tok", "experts_per_token", "moe_topk", "moe_top_k")
    return top_k / experts if experts > 1 and 0 < top_k <= experts else None


def _moe_layers(config: dict[str, object], layers: int) -> int:
    """How many layers route to experts (the others have a dense MLP): Qwen's
    `mlp_only_layers` and `decoder_sparse_step`, DeepSeek's `first_k_dense_replace` and
    `moe_layer_freq`, Llama 4's `interleave_moe_layer_step`."""
    only_mlp = config.get("mlp_only_layers")
    dense = set(only_mlp) if isinstance(only_mlp, list) else set()
    first = _int(config, "first_k_dense_replace")
    step = _int(config, "decoder_sparse_step", "moe_layer_freq", "interleave_moe_layer_step") or 1
    return sum(1 for i in range(layers) if i not in dense and i >= first and (i + 1) % step == 0)


def config_size(config: dict[str, object]) -> CheckpointSize:
    """Weights of a decoder-only transformer (dense or mixture of experts), from its
    config.json. Linear layers are quantized at the config's bit width; embeddings, norms
    and routers stay floating-point (as AWQ/GPTQ checkpoints keep them)."""
    config = _text_config(config)
    h = _int(config, "hidden_size")
    layers = _int(config, "num_hidden_layers")
    vocab = _int(config, "vocab_size")
    heads = _int(config, "num_attention_heads") or 1
    kv_heads = _int(config, "num_key_value_heads") or heads
    head_dim = _int(config, "head_dim") or (h // heads)
    inter = _int(config, "intermediate_size") or 4 * h
    if not (h and layers and vocab):
        raise ValueError("config.json lacks hidden_size, num_hidden_layers or vocab_size")
    experts = _routed_experts(config)
    moe_layers = _moe_layers(config, layers) if experts > 1 else 0
    expert_inter = _int(config, "moe_intermediate_size") or inter
    shared_inter = _int(config, "shared_expert_intermediate_size") or (
        _int(config, "n_shared_experts") * expert_inter
    )
    dense_inter = _int(config, "intermediate_size_mlp") or inter  # Llama 4's dense layers

    attention = layers * (h * heads * head_dim * 2 + h * kv_heads * head_dim * 2)
    dense_mlp = (layers - moe_layers) * 3 * h * dense_inter
    shared = moe_layers * 3 * h * shared_inter
    routed = moe_layers * 3 * h * expert_inter * experts
    routers = moe_layers * h * experts
    embeddings = vocab * h * (1 if config.get("tie_word_embeddings") else 2)
    norms = layers * 2 * h + h

    bits = _bits_per_weight(config)

    def linear(params: int) -> TensorBytes:
        if bits is None:
            return TensorBytes(float_elements=params)
        return TensorBytes(fixed_bytes=int(params * bits / 8))

    floats = TensorBytes(float_elements=embeddings + norms + routers)
    total = linear(attention + dense_mlp + shared) + linear(routed) + floats
    share = _experts_per_token_share(config) if moe_layers else None
    return CheckpointSize("config", total, linear(routed) if share else TensorBytes(), share)


def estimate_from_config(config: dict[str, object]) -> int:
    """Estimated weight bytes at vLLM's default dtype."""
    return config_size(config).total.at(DEFAULT_FLOAT_BYTES)


def weights_from_config(directory: Path) -> int:
    return estimate_from_config(_read_config(checkpoint_directory(directory)))


# --- which source wins ---------------------------------------------------------------


@dataclass(frozen=True)
class Weights:
    bytes: float  # the whole model
    source: str  # flag | log | safetensors | config
    active_bytes: float | None = None  # mixture of experts only: what one token reads

    @property
    def read_per_step(self) -> float:
        """The bytes the per-token series price a decode step at."""
        return self.bytes if self.active_bytes is None else self.active_bytes


def float_bytes(facts: StartupFacts | None) -> int:
    """Width vLLM loads an unquantized checkpoint's floating-point weights at: the dtype
    its engine-config line names, else its default (16 bits)."""
    dtype = facts.model_dtype if facts else None
    return TORCH_DTYPE_BYTES.get(dtype or "", DEFAULT_FLOAT_BYTES)


def checkpoint_weights(size: CheckpointSize, facts: StartupFacts | None = None) -> Weights:
    """A checkpoint's weights at the width vLLM loads them."""
    width = float_bytes(facts)
    total = float(size.total.at(width))
    active = None
    if size.experts_per_token_share is not None:
        routed = float(size.routed_experts.at(width))
        active = derive.active_weights(total, routed, size.experts_per_token_share)
    return Weights(total, size.source, active)


def read_checkpoint_weights(model_dir: str) -> Weights:
    """Weights of a checkpoint directory at vLLM's default dtype (raises OSError or
    ValueError naming what is wrong)."""
    return checkpoint_weights(read_checkpoint(Path(model_dir)))


def resolve_weights(
    flag_bytes: float | None,
    facts: StartupFacts | None,
    checkpoint: Weights | None,
    layout: ParallelLayout,
) -> Weights | None:
    """The whole model's weights from the first source that has them (the module doc)."""
    total: float | None = None
    source = ""
    if flag_bytes is not None:
        total, source = flag_bytes, "flag"
    elif facts is not None and facts.weights_readable:
        # A log whose weights lines cannot be placed in their engines gives no total.
        logged = derive.weights_from_log(facts.weights_by_engine(), layout.shards)
        if logged is not None:
            total, source = logged, "log"
    if total is None:
        return checkpoint
    active = None
    if checkpoint is not None and checkpoint.active_bytes is not None:
        active = derive.active_weights_of(total, checkpoint.bytes, checkpoint.active_bytes)
    return Weights(total, source, active)


# --- whose weights ---------------------------------------------------------------------


@dataclass(frozen=True)
class Model:
    """Which model some weights are of, or an engine serves, as far as glassbox can tell:
    the name vLLM serves it as (the page's `model_name` label) and the checkpoint the
    start loaded (`model='…'` of the log's engine-config line). None: not known."""

    served: str | None = None
    checkpoint: str | None = None

    def __str__(self) -> str:
        served = self.served if self.served is not None else "?"
        return f"model_name={served}" + (
            f" checkpoint={self.checkpoint}" if self.checkpoint else ""
        )


def told_apart(owner: Model, serving: Model) -> str | None:
    """What shows that weights of `owner` are not those of the model `serving`: "page"
    (another model_name label), "log" (a start of another checkpoint); None when nothing
    known tells them apart."""
    if owner.served is not None and serving.served is not None and owner.served != serving.served:
        return "page"
    if (
        owner.checkpoint is not None
        and serving.checkpoint is not None
        and owner.checkpoint != serving.checkpoint
    ):
        return "log"
    return None
