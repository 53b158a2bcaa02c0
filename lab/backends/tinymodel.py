"""Qwen2-style model folders generated on the spot: tiny ones for vLLM's CPU build, and
config-only ones of any size for vLLM's dummy loader.

Nothing can be downloaded here, so the demo and the tests make their own models: a
`config.json`, a small BPE tokenizer trained locally, and — for small BF16 models — a
real random `model.safetensors` (so vLLM takes its normal load path and glassbox reads
real safetensors headers). A folder without a checkpoint (`checkpoint: false`, and every
AWQ or GPTQ model) is served with `--load-format dummy`: vLLM fills random weights of
the real shapes and dtypes, so memory, decode time and bandwidth are real while the
outputs are not. Random weights produce repetitive text, which ngram speculation
happily accepts.
"""

from __future__ import annotations

import json
import os
import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np

VOCAB_SIZE = 1024  # of the trained tokenizer; a config may declare a larger vocabulary
PRECISIONS = ("bf16", "awq", "gptq")


@dataclass(frozen=True)
class TinyModelSpec:
    name: str
    hidden_size: int = 256
    num_layers: int = 4
    num_heads: int = 4
    num_kv_heads: int = 2
    intermediate_size: int = 704
    max_position_embeddings: int = 4096
    #: "bf16", or a 4-bit format vLLM's dummy loader fills: "awq", "gptq".
    precision: str = "bf16"
    #: A default for requests in generation_config.json (Qwen2.5's is 1.05), or none.
    repetition_penalty: float | None = None
    #: The config's vocabulary (its embeddings and LM head); the tokenizer has VOCAB_SIZE.
    vocab_size: int = VOCAB_SIZE
    #: Write random BF16 weights; None: for BF16 models only. Without: --load-format dummy.
    checkpoint: bool | None = None

    @property
    def writes_checkpoint(self) -> bool:
        return self.precision == "bf16" if self.checkpoint is None else self.checkpoint

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads

    def tensor_shapes(self) -> dict[str, tuple[int, ...]]:
        h, kv = self.hidden_size, self.num_kv_heads * self.head_dim
        shapes: dict[str, tuple[int, ...]] = {
            "model.embed_tokens.weight": (self.vocab_size, h),
            "model.norm.weight": (h,),
            "lm_head.weight": (self.vocab_size, h),
        }
        for i in range(self.num_layers):
            p = f"model.layers.{i}."
            shapes |= {
                p + "input_layernorm.weight": (h,),
                p + "post_attention_layernorm.weight": (h,),
                p + "self_attn.q_proj.weight": (h, h),
                p + "self_attn.q_proj.bias": (h,),
                p + "self_attn.k_proj.weight": (kv, h),
                p + "self_attn.k_proj.bias": (kv,),
                p + "self_attn.v_proj.weight": (kv, h),
                p + "self_attn.v_proj.bias": (kv,),
                p + "self_attn.o_proj.weight": (h, h),
                p + "mlp.gate_proj.weight": (self.intermediate_size, h),
                p + "mlp.up_proj.weight": (self.intermediate_size, h),
                p + "mlp.down_proj.weight": (h, self.intermediate_size),
            }
        return shapes

    def parameter_count(self) -> int:
        return sum(int(np.prod(shape)) for shape in self.tensor_shapes().values())


def _config(spec: TinyModelSpec) -> dict[str, object]:
    config: dict[str, object] = {
        "architectures": ["Qwen2ForCausalLM"],
        "model_type": "qwen2",
        "hidden_size": spec.hidden_size,
        "intermediate_size": spec.intermediate_size,
        "num_hidden_layers": spec.num_layers,
        "num_attention_heads": spec.num_heads,
        "num_key_value_heads": spec.num_kv_heads,
        "max_position_embeddings": spec.max_position_embeddings,
        "vocab_size": spec.vocab_size,
        "rms_norm_eps": 1e-6,
        "rope_theta": 10000.0,
        "hidden_act": "silu",
        "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
        "bos_token_id": 1,
        "eos_token_id": 2,
        "use_sliding_window": False,
    }
    if spec.precision == "awq":
        config["torch_dtype"] = "float16"
        config["quantization_config"] = {
            "quant_method": "awq",
            "bits": 4,
            "group_size": 128,
            "zero_point": True,
            "version": "gemm",
        }
    elif spec.precision == "gptq":
        config["torch_dtype"] = "float16"
        config["quantization_config"] = {
            "quant_method": "gptq",
            "bits": 4,
            "group_size": 128,
            "desc_act": False,
            "sym": True,
            # Without a checkpoint vLLM cannot read from the safetensors which modules are
            # quantized, and would serve every layer unquantized: name them.
            "modules_in_block_to_quantize": [
                ["self_attn.k_proj", "self_attn.v_proj", "self_attn.q_proj"],
                ["self_attn.o_proj"],
                ["mlp.up_proj", "mlp.gate_proj"],
                ["mlp.down_proj"],
            ],
        }
    return config


def _bf16_bytes(values: np.ndarray) -> bytes:
    """float32 -> bfloat16 by keeping the upper 16 bits (numpy has no bfloat16)."""
    return (values.astype(np.float32).view(np.uint32) >> 16).astype("<u2").tobytes()


def write_safetensors(path: Path, shapes: dict[str, tuple[int, ...]], seed: int = 0) -> int:
    """Write random BF16 tensors in the safetensors format; returns the file size."""
    rng = np.random.default_rng(seed)
    header: dict[str, object] = {"__metadata__": {"format": "pt"}}
    offset = 0
    for name, shape in shapes.items():
        size = int(np.prod(shape)) * 2
        header[name] = {
            "dtype": "BF16",
            "shape": list(shape),
            "data_offsets": [offset, offset + size],
        }
        offset += size
    header_bytes = json.dumps(header, separators=(",", ":")).encode()
    header_bytes += b" " * (-len(header_bytes) % 8)
    tmp = path.with_suffix(".tmp")
    with open(tmp, "wb") as f:
        f.write(struct.pack("<Q", len(header_bytes)))
        f.write(header_bytes)
        for name, shape in shapes.items():
            if name.endswith("norm.weight"):
                values = np.ones(shape, dtype=np.float32)
            else:
                values = rng.normal(0.0, 0.05, size=shape).astype(np.float32)
            f.write(_bf16_bytes(values))
    os.replace(tmp, path)
    return path.stat().st_size


def _corpus() -> list[str]:
    words = [
        "kubernetes",
        "is",
        "a",
        "system",
        "for",
        "running",
        "containers",
        "the",
        "cache",
        "pool",
        "holds",
        "blocks",
        "of",
        "tokens",
        "and",
        "the",
        "engine",
        "decodes",
        "one",
        "step",
        "at",
        "a",
        "time",
        "while",
        "requests",
        "wait",
    ]
    lines = [" ".join(str(i + j) for j in range(12)) for i in range(200)]
    lines += [" ".join(words[(i + j) % len(words)] for j in range(20)) for i in range(200)]
    return lines


def write_tokenizer(directory: Path) -> None:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        special_tokens=["<unk>", "<s>", "</s>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_corpus(), trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, unk_token="<unk>", bos_token="<s>", eos_token="</s>"
    )
    fast.save_pretrained(str(directory))
    # transformers 5 names its own class (TokenizersBackend), which transformers 4 (what
    # vLLM 0.11 and 0.14 run on) cannot import; both read PreTrainedTokenizerFast.
    config_path = directory / "tokenizer_config.json"
    tokenizer_config = json.loads(config_path.read_text())
    tokenizer_config["tokenizer_class"] = "PreTrainedTokenizerFast"
    config_path.write_text(json.dumps(tokenizer_config, indent=2))


def generate(spec: TinyModelSpec, root: Path) -> Path:
    """Create (or reuse) the model directory for `spec` under `root`."""
    directory = root / spec.name
    marker = directory / ".complete"
    config = _config(spec)
    generation: dict[str, object] = {"bos_token_id": 1, "eos_token_id": 2}
    if spec.repetition_penalty is not None:
        generation["repetition_penalty"] = spec.repetition_penalty
    checkpoint = directory / "model.safetensors"
    if (
        marker.exists()
        and json.loads((directory / "config.json").read_text()) == config
        and checkpoint.exists() == spec.writes_checkpoint
    ):
        (directory / "generation_config.json").write_text(json.dumps(generation))
        return directory
    directory.mkdir(parents=True, exist_ok=True)
    marker.unlink(missing_ok=True)
    (directory / "config.json").write_text(json.dumps(config, indent=2))
    (directory / "generation_config.json").write_text(json.dumps(generation))
    write_tokenizer(directory)
    if spec.writes_checkpoint:
        write_safetensors(checkpoint, spec.tensor_shapes())
    else:  # served by vLLM's dummy loader: no stale weights of an earlier spec
        checkpoint.unlink(missing_ok=True)
    marker.write_text("ok\n")
    return directory
