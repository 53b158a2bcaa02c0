"""What glassbox knows of the model vLLM serves: its parallel layout and its weights.

Each is resolved by one ranking, shared by the exporter and the lab:

- **Layout**: tensor- and pipeline-parallel sizes from the flags, else from vLLM's
  engine-config log line, else 1; data-parallel from the number of engines on vLLM's
  page, else that line, else 1.
- **Weights** (of the whole model as vLLM holds it: a TP×PP-sharded model once, a
  data-parallel copy not twice): the flag, else vLLM's log (what was loaded, including
  a drafter and on-the-fly quantization), else the checkpoint's safetensors, else an
  estimate from its config.json. A mixture-of-experts checkpoint also gives the active
  weights (shared weights plus one token's top-k experts), whatever the source of the
  total.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from . import derive
from .startup_log import StartupFacts
from .weights import DEFAULT_FLOAT_BYTES, TORCH_DTYPE_BYTES, CheckpointSize, read_checkpoint


@dataclass(frozen=True)
class ParallelLayout:
    tensor: int = 1
    pipeline: int = 1
    data: int = 1

    @property
    def shards(self) -> int:
        """Parts one copy of the model is split into (one per GPU of an engine)."""
        return self.tensor * self.pipeline


def resolve_layout(
    facts: StartupFacts | None,
    tensor_flag: int | None = None,
    pipeline_flag: int | None = None,
    engines: int | None = None,
) -> ParallelLayout:
    logged = facts or StartupFacts()
    return ParallelLayout(
        tensor=tensor_flag or logged.tensor_parallel or 1,
        pipeline=pipeline_flag or logged.pipeline_parallel or 1,
        # The page's engines first: for a dense model vLLM runs data-parallel engines
        # independently, and each one's engine-config line says data_parallel_size=1.
        data=engines or logged.data_parallel or 1,
    )


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
    elif facts is not None:
        logged = derive.weights_from_log(facts.weights_by_engine(), layout.shards)
        if logged is not None:
            total, source = logged, "log"
    if total is None:
        return checkpoint
    active = None
    if checkpoint is not None and checkpoint.active_bytes is not None:
        active = derive.active_weights_of(total, checkpoint.bytes, checkpoint.active_bytes)
    return Weights(total, source, active)
