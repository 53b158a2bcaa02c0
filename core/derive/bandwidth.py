"""Weights and memory bandwidth: the weight bytes one decode step reads, how fast a GPU
reads them against its peak, the floor that sets on a step; and what another
precision would weigh and take.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from vllm_glassbox.core import snapshot as s
from vllm_glassbox.core.derive.arithmetic import physically_possible, ratio
from vllm_glassbox.core.derive.increases import Increase
from vllm_glassbox.core.derive.rates import inter_token_latency
from vllm_glassbox.core.units import GIB


@dataclass(frozen=True)
class Context:
    """What a derived value may need besides counter increases."""

    #: Weight bytes one decode step reads: the whole model, or for a mixture-of-experts
    #: model its active weights (shared weights plus one token's top-k experts).
    weights_bytes: float | None = None
    peak_bandwidth: float | None = None  # of one GPU
    tensor_parallel: int = 1
    #: What one engine's GPUs cost an hour (`cost.engine_hourly_cost`); None: no price.
    engine_hourly_cost: float | None = None


def weights_from_log(by_engine: Mapping[str, Sequence[float]], shards: int) -> float | None:
    """Whole-model weight bytes from the "Model loading took" lines of one startup.

    `by_engine`: for each data-parallel engine, the bytes each of its processes logged.
    Every engine holds a full copy, split into `shards` (TP × PP) parts. vLLM ≤ 0.11.0
    logs every part, later versions only the first rank of a node: a copy is the parts
    logged, scaled up to all its parts (taken as equal) when fewer were logged. The
    engines' copies are the same model, counted once.
    """
    copies = [
        sum(parts) * max(shards, len(parts)) / len(parts) for parts in by_engine.values() if parts
    ]
    return max(copies) if copies else None


def active_weights(total_bytes: float, routed_expert_bytes: float, share: float) -> float:
    """A mixture-of-experts model's weights that one token reads: all but the routed
    experts it does not use (`share` = top-k / routed experts)."""
    return total_bytes - routed_expert_bytes * (1.0 - share)


def active_weights_of(
    weights_bytes: float, checkpoint_bytes: float, checkpoint_active_bytes: float
) -> float:
    """The checkpoint's proportion of active weights, carried over to weights known from
    another source (the flag, the log)."""
    if checkpoint_bytes <= 0:
        return weights_bytes
    return weights_bytes * checkpoint_active_bytes / checkpoint_bytes


def weight_bytes_per_output_token(d: Increase, weights_bytes: float | None) -> float | None:
    """Weight bytes read per generated token: each engine step reads every weight once."""
    steps_per_token = None
    if d.has(s.ENGINE_STEPS):  # the inverse of tokens per engine step, under its rule
        steps_per_token = ratio(d[s.ENGINE_STEPS], d[s.GENERATION_TOKENS])
    r = physically_possible(steps_per_token, at_most=1.0)
    return None if r is None or weights_bytes is None else weights_bytes * r


def weight_read_bandwidth_per_gpu(
    d: Increase, weights_bytes: float | None, tensor_parallel: int = 1
) -> float | None:
    """Bytes/s one GPU reads weights at, from the mean decode step. In each step every GPU
    of a pipeline stage reads its 1/TP share while the stages run one after another, so one
    GPU reads weights / (TP × PP) in step / PP: PP cancels out."""
    step = inter_token_latency(d)
    if step is None or weights_bytes is None:
        return None
    return ratio(weights_bytes, tensor_parallel * step)


def memory_bandwidth_utilization(
    d: Increase,
    weights_bytes: float | None,
    peak_bandwidth: float | None,
    tensor_parallel: int = 1,
) -> float | None:
    """One GPU's achieved weight-read bandwidth over one GPU's peak."""
    achieved = weight_read_bandwidth_per_gpu(d, weights_bytes, tensor_parallel)
    if achieved is None or peak_bandwidth is None:
        return None
    return physically_possible(ratio(achieved, peak_bandwidth), at_most=1.0)


def decode_floor_seconds(
    weights_bytes: float | None, peak_bandwidth: float | None, tensor_parallel: int = 1
) -> float | None:
    """Physical lower bound of one decode step: each GPU reads its 1/TP share of the
    weights at its peak bandwidth (the pipeline stages' shares add up to the same time)."""
    if weights_bytes is None or peak_bandwidth is None:
        return None
    return ratio(weights_bytes, tensor_parallel * peak_bandwidth)


def marginal_weight_read_bandwidth(slope_seconds_per_gib: float) -> float | None:
    """The lab's fit of TPOT against weight GiB, read as a bandwidth: the bytes/s at which
    one more byte of the whole model costs decode time (fixed per-step costs sit in the
    intercept). A different estimator from `weight_read_bandwidth_per_gpu`, which divides
    all of one GPU's weights by the whole mean step."""
    return GIB / slope_seconds_per_gib if slope_seconds_per_gib > 0 else None


def weights_at_bits(
    weights_bytes: float | None, bits: float, from_bits: float = 16.0
) -> float | None:
    """The weights stored at `bits` a parameter instead of `from_bits`: every weight
    scaled alike (a quantized checkpoint keeps its embeddings and norms wider, so it
    weighs somewhat more: Qwen2.5-7B's AWQ is 37.6 % of its BF16, not 25 %)."""
    if weights_bytes is None or from_bits <= 0:
        return None
    return weights_bytes * bits / from_bits


def decode_step_at_bandwidth(
    weights_bytes: float | None, bandwidth_per_gpu: float | None, tensor_parallel: int = 1
) -> float | None:
    """Seconds of one decode step that reads `weights_bytes` at `bandwidth_per_gpu` (each
    GPU its 1/TP share): the step another precision would take at the bandwidth this one
    achieved, if decode is bound by weight reads (with the peak: `decode_floor_seconds`)."""
    return decode_floor_seconds(weights_bytes, bandwidth_per_gpu, tensor_parallel)


def decode_step_on_line(
    weights_bytes: float | None,
    slope_seconds_per_gib: float | None,
    intercept_seconds: float | None,
) -> float | None:
    """The lab's fitted line TPOT = a·GiB + b at `weights_bytes`: the fixed per-step cost
    (b) included, which a bandwidth alone leaves out."""
    if weights_bytes is None or slope_seconds_per_gib is None or intercept_seconds is None:
        return None
    return slope_seconds_per_gib * weights_bytes / GIB + intercept_seconds
