"""decode: whether weight reads bound a decode step (the achieved bandwidth against the
peak), and what another precision would do to the step and to the pool."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from vllm_glassbox.core import derive
from vllm_glassbox.explain.diagnoses.common import (
    MIN_DECODE_STEPS,
    NO_PRICE,
    RUNBOOK,
    cost_per_million_tokens,
    decode_steps,
    flagged,
    lab_reading,
)
from vllm_glassbox.explain.findings import (
    Figure,
    Finding,
    Severity,
    Statement,
    core,
    joined,
    read,
    say,
    say_if,
)
from vllm_glassbox.explain.scene import LabVariant, Reading, Scene

#: VLLMDecodeBandwidthLow: decode reads the weights under this share of the peak.
LOW_BANDWIDTH = 0.4
#: From this share of the peak up, weight reads are most of a decode step.
WEIGHT_BOUND = 0.6
#: Shapes of vLLM's output glassbox does not read (glassbox_input_unrecognised) that leave
#: the weights or the layout untrustworthy: with one flagged it says so, and advises nothing.
UNTRUSTED = (
    "weights_of_another_model",
    "experts_across_engines",
    "unplaced_engine",
    "several_servers_behind_the_target",
)
#: Tokens per engine step are no count of a batch on a V0 page (docs/exporter.md).
UNTRUSTED_BATCH = "v0_engine_steps"

#: What decode was found to be: the finding, its severity, title and sentence.
_Judgement = tuple[str, Severity, str, Statement]


@dataclass(frozen=True)
class _Reads:
    """A decode step and its weight reads: the figures decode is judged on."""

    step: Figure
    tpot: Figure
    weights: Figure
    bandwidth: Figure
    share: Figure | None
    peak: Figure | None
    floor: Figure | None
    batch: Figure | None


def decode(scene: Scene) -> list[Finding]:
    """Whether weight reads bound a decode step (the achieved bandwidth against the peak),
    and what another precision would do to the step and to the pool."""
    steps = decode_steps(scene)
    if steps is None or steps.value < MIN_DECODE_STEPS:
        return []
    step = core(derive.inter_token_latency, scene.decode, unit="seconds")
    tpot = core(derive.time_per_output_token, scene.decode, unit="seconds")
    if step is None or tpot is None:
        return []
    weights = read(scene.weights, "bytes")
    if weights is None:
        return _weights_unknown(step, tpot)
    bandwidth = core(
        derive.weight_read_bandwidth_per_gpu,
        scene.decode,
        scene.weights,
        scene.tensor_parallel,
        unit="bytes_per_second",
    )
    if bandwidth is None:
        return []
    assumes = ["a decode step reads every weight once (one copy per GPU share, TP × PP)"]
    if scene.mixture_of_experts:
        assumes.append("mixture of experts: one token's active weights; a batch reads more")
    unseen: list[str] = []
    reads = _reads(scene, step, tpot, weights, bandwidth)
    finding, severity, title, what = _judged(reads, assumes, unseen)
    what = joined(what, _dram(scene, reads, unseen))
    change = _other_precisions(scene, bandwidth, step, unseen)
    return [
        Finding(
            "decode",
            finding,
            severity,
            title,
            what,
            tuple(change),
            tuple(assumes),
            tuple(unseen),
            f"{RUNBOOK}#vllmdecodebandwidthlow" if finding == "not_weight_bound" else None,
        )
    ]


def _weights_unknown(step: Figure, tpot: Figure) -> list[Finding]:
    """A decode step whose weight bytes are unknown: its time, and what would tell more."""
    return [
        Finding(
            "decode",
            "weights_unknown",
            "info",
            "Decode: weight reads unknown",
            say(
                "a decode step takes {step} ({tpot} a token), but the model's weight bytes "
                "are unknown: how much of a step is reading them cannot be said",
                step=step,
                tpot=tpot,
            ),
            unseen=(
                "glassbox_model_weights_bytes (give the exporter --model-dir, "
                "--weights-bytes or --vllm-log)",
            ),
        )
    ]


def _reads(scene: Scene, step: Figure, tpot: Figure, weights: Figure, bandwidth: Figure) -> _Reads:
    """The share of the peak the weight reads reach and the step's floor at the peak (the
    derivation core's), and the tokens of an engine step where they count a batch."""
    batch = None
    if not flagged(scene, (UNTRUSTED_BATCH,)):
        batch = core(derive.tokens_per_engine_step, scene.decode, unit="factor")
    return _Reads(
        step=step,
        tpot=tpot,
        weights=weights,
        bandwidth=bandwidth,
        share=core(
            derive.memory_bandwidth_utilization,
            scene.decode,
            scene.weights,
            scene.peak_bandwidth,
            scene.tensor_parallel,
            unit="ratio",
        ),
        peak=read(scene.peak_bandwidth, "bytes_per_second"),
        floor=core(
            derive.decode_floor_seconds,
            scene.weights,
            scene.peak_bandwidth,
            scene.tensor_parallel,
            unit="seconds",
        ),
        batch=batch,
    )


def _judged(r: _Reads, assumes: list[str], unseen: list[str]) -> _Judgement:
    """Bound by weight reads, not bound by them, or (without the peak) the bandwidth alone."""
    if r.share is None or r.peak is None or r.floor is None:
        unseen.append(
            "the GPU's peak bandwidth (glassbox_gpu_memory_bandwidth_bytes_per_second: the "
            "exporter's --gpu or --gpu-memory-bandwidth)"
            if r.peak is None
            else "a share of the peak: the achieved bandwidth is above it (a misread layout)"
        )
        what = say(
            "a decode step takes {step} ({tpot} a token) and reads the weights ({weights}) "
            "at {bandwidth} a GPU",
            step=r.step,
            tpot=r.tpot,
            weights=r.weights,
            bandwidth=r.bandwidth,
        )
        return "bandwidth_only", "info", "Decode: the bandwidth it reaches", what
    assumes.append("the peak is the datasheet's (or the one given): a GPU reaches less")
    if r.share.value >= WEIGHT_BOUND:
        what = say(
            "decode reads the weights at {bandwidth}, {share} of the GPU's {peak}: it is "
            "bound by weight reads (a step {step}; the weights ({weights}) alone take "
            "{floor} at the peak)",
            bandwidth=r.bandwidth,
            share=r.share,
            peak=r.peak,
            step=r.step,
            weights=r.weights,
            floor=r.floor,
        )
        return "weight_bound", "info", "Decode is bound by weight reads", what
    severity: Severity = "warning" if r.share.value < LOW_BANDWIDTH else "info"
    what = joined(
        say(
            "decode reads the weights at only {share} of the GPU's {peak} ({bandwidth}): "
            "a step takes {step}, reading the weights ({weights}) would take {floor} at "
            "the peak; the rest is per-step work (kernel launches, sampling, scheduling, "
            "attention)",
            share=r.share,
            peak=r.peak,
            bandwidth=r.bandwidth,
            step=r.step,
            weights=r.weights,
            floor=r.floor,
        ),
        say_if(", at {batch} tokens per engine step", batch=r.batch),
    )
    return "not_weight_bound", severity, "Decode is not bound by weight reads", what


def _dram(scene: Scene, r: _Reads, unseen: list[str]) -> Statement | None:
    """dcgm-exporter's DRAM activity beside the weight reads' share of the peak: agreeing
    within the core's tolerance, or busier (a reader the counters' model misses), or less
    busy (the weights or the layout misread)."""
    if r.share is None:
        return None
    dram = read(scene.dcgm_dram_active, "ratio")
    if dram is None:
        unseen.append(
            "the GPU's own DRAM activity (dcgm-exporter's DCGM_FI_PROF_DRAM_ACTIVE), to set "
            "beside the weight reads' share of the peak"
        )
        return None
    check = derive.bandwidth_check(dram.value, r.share.value)
    gap = core(derive.dram_active_beyond_weight_reads, dram, r.share, unit="ratio")
    if check is None or gap is None:
        return None
    if check.verdict == "agree":
        template = (
            "; the GPU's DRAM was busy {dram} of the time (DCGM), agreeing with the weight "
            "reads' {share}"
        )
    elif check.verdict == "unmodelled_reads":
        template = (
            "; the GPU's DRAM was busy {dram} of the time (DCGM), {gap} above the weight "
            "reads' {share}: the counters' model misses a reader (KV cache reads share that "
            "bandwidth, and grow with the tokens held)"
        )
    else:
        template = (
            "; the GPU's DRAM was busy only {dram} of the time (DCGM), under the weight "
            "reads' {share} ({gap}): the weights or the layout are misread"
        )
    figures = {"dram": dram, "share": r.share}
    return say(template, **figures, **({} if check.verdict == "agree" else {"gap": gap}))


def _priced(scene: Scene, step: Figure, predicted: Figure | None) -> Statement | None:
    """What a million tokens would cost at the predicted time a token (against the
    inter-token latency now), at this load."""
    cost = core(
        derive.cost_per_million_tokens_at_step,
        cost_per_million_tokens(scene),
        step,
        predicted,
        unit="cost",
    )
    return say_if(": {cost} per million tokens at this load", cost=cost)


def _other_precisions(
    scene: Scene, bandwidth: Figure, step: Figure, unseen: list[str]
) -> list[Statement]:
    """The step and the pool at other weights: the lab's variants when a lab run is
    given (and what the lab measured of each, with the error); else 8 and 4 bits of a
    16-bit model."""
    per_pass = core(derive.tokens_per_forward_pass, scene.decode, unit="factor")
    variants: Sequence[LabVariant] = scene.lab.variants if scene.lab else ()
    if variants and per_pass is not None and per_pass.value > 1.0:
        unseen.append(
            "the lab's precisions beside this server: it speculates, and the lab measured "
            "them without"
        )
        return []
    out: list[Statement] = []
    for v in variants:
        if scene.weights is not None and v.weights_bytes == scene.weights.value:
            continue  # this server's own precision
        out.extend(_lab_variant(scene, v, bandwidth, per_pass))
    if variants:
        return out
    for bits in (8, 4):
        weights = core(derive.weights_at_bits, scene.weights, bits, unit="bytes")
        predicted_step = core(
            derive.decode_step_at_bandwidth,
            weights,
            bandwidth,
            scene.tensor_parallel,
            unit="seconds",
        )
        predicted = core(derive.time_per_token_of_step, predicted_step, per_pass, unit="seconds")
        if weights is None or predicted is None:
            continue
        tokens = _pool_at_weights(scene, weights)
        mean = core(
            derive.kv_cache_mean_request_tokens,
            scene.kv_used_mean,
            scene.running_mean,
            unit="tokens",
        )
        fit = core(derive.requests_that_fit, tokens, mean, unit="count")
        pool = say_if(
            ", and give the pool {tokens} tokens an engine ({fit} requests of the mean size)",
            tokens=tokens,
            fit=fit,
        ) or say_if(", and give the pool {tokens} tokens an engine", tokens=tokens)
        out.append(
            joined(
                say(
                    f"{bits}-bit weights ({{weights}}, if they are 16-bit now) would take at "
                    "least {predicted} a token at this bandwidth",
                    weights=weights,
                    predicted=predicted,
                ),
                _priced(scene, step, predicted),
                pool,
            )
        )
    if out and cost_per_million_tokens(scene) is None:
        unseen.append(f"the cost of a million tokens at each precision: {NO_PRICE}")
    if out:
        unseen.append(
            "the precision of the weights now (taken as 16-bit) and how much of a step is "
            "not weight reads: a smaller model's step shrinks less than its bytes "
            "(--lab with a quantization phase measures it)"
        )
    return out


def _lab_variant(
    scene: Scene, v: LabVariant, bandwidth: Figure, per_pass: Figure | None
) -> list[Statement]:
    """Another precision the lab measured: its step at this server's bandwidth (and on the
    lab's line) against the lab's TPOT, its pool against the lab's, each with its error."""
    assert scene.lab is not None
    source = scene.lab.source
    weights = read(Reading(v.weights_bytes, f"{source}: {v.name} weights_bytes"), "bytes")
    predicted_step = core(
        derive.decode_step_at_bandwidth, weights, bandwidth, scene.tensor_parallel, unit="seconds"
    )
    predicted = core(derive.time_per_token_of_step, predicted_step, per_pass, unit="seconds")
    measured = read(lab_reading(scene, v.tpot_seconds, f"{v.name} tpot_seconds"), "seconds")
    error = core(derive.prediction_error, predicted, measured, unit="error")
    on_line = core(
        derive.decode_step_on_line,
        weights,
        lab_reading(scene, scene.lab.slope_seconds_per_gib, "fit slope_seconds_per_gib"),
        lab_reading(scene, scene.lab.intercept_seconds, "fit intercept_seconds"),
        unit="seconds",
    )
    line_error = core(derive.prediction_error, on_line, measured, unit="error")
    line = (
        "the lab's line goes through it"
        if v.fitted
        else "the lab's line through its variants says {on_line} ({line_error})"
    )
    out = [
        say_if(
            f"{v.name} ({{weights}}) at this bandwidth: {{predicted}} a token; the lab measured "
            f"{{measured}} ({{error}}); {line}",
            weights=weights,
            predicted=predicted,
            measured=measured,
            error=error,
            **({} if v.fitted else {"on_line": on_line, "line_error": line_error}),
        )
        or say_if(
            f"{v.name} ({{weights}}) at this bandwidth: {{predicted}} a token; the lab measured "
            "{measured} ({error})",
            weights=weights,
            predicted=predicted,
            measured=measured,
            error=error,
        )
    ]
    tokens = _pool_at_weights(scene, weights) if weights is not None else None
    measured_tokens = read(
        lab_reading(
            scene,
            None if v.kv_cache_tokens is None else float(v.kv_cache_tokens),
            f"{v.name} kv_cache_tokens",
        ),
        "tokens",
    )
    pool_error = core(derive.prediction_error, tokens, measured_tokens, unit="error")
    out.append(
        say_if(
            f"{v.name}'s weights would leave the pool {{tokens}} tokens an engine; the lab "
            "measured {measured} ({error})",
            tokens=tokens,
            measured=measured_tokens,
            error=pool_error,
        )
    )
    return [s for s in out if s is not None]


def _pool_at_weights(scene: Scene, weights: Figure) -> Figure | None:
    """The pool an engine would have with `weights` under --gpu-memory-utilization (a
    pool of fixed memory, --kv-cache-memory-bytes, stays as it is)."""
    if scene.kv_memory_fixed:
        return None
    memory = core(
        derive.kv_cache_memory_with_weights,
        scene.kv_memory,
        scene.weights,
        weights,
        scene.shards,
        unit="bytes",
    )
    per_token = core(
        derive.kv_cache_bytes_per_token, scene.kv_memory, scene.kv_capacity, unit="bytes"
    )
    return core(
        derive.kv_cache_tokens_for_memory, memory, per_token, scene.kv_block_size, unit="tokens"
    )
