"""Scenes written by hand for the diagnoses' tests, from the project's own measurements:
the tiny CPU model's pools (2,048 KV bytes a token, 128-token blocks), the captured
speculative requests (tests/fixtures/README.md) and the H200's BF16 run
(docs/results/h200/run-1)."""

from __future__ import annotations

from dataclasses import replace

from vllm_glassbox.explain.scene import Reading, Scene, Scope, Window
from vllm_glassbox.exporter import snapshot as s
from vllm_glassbox.exporter.derive import Increase

MIB = 1024**2


def scope(window: float = 60.0, engines: int = 1) -> Scope:
    return Scope("prometheus", "http://prometheus.invalid", "team-a", "tiny", engines, window)


def r(value: float, source: str = "by hand") -> Reading:
    return Reading(value, source)


def window(**counters: float) -> Window:
    names = {
        "generated": s.GENERATION_TOKENS,
        "first": s.TTFT_COUNT,
        "steps": s.ITL_COUNT,
        "step_seconds": s.ITL_SUM,
        "engine_steps": s.ENGINE_STEPS,
        "preemptions": s.PREEMPTIONS,
        "drafts": s.SPEC_DRAFTS,
        "draft_tokens": s.SPEC_DRAFT_TOKENS,
        "accepted": s.SPEC_ACCEPTED,
    }
    return Window(Increase({names[k]: v for k, v in counters.items()}, 60.0), "increase(<counter>)")


def storm() -> Scene:
    """The stack's flood, in round numbers: a 4,096-token pool (8 MiB, fixed by
    --kv-cache-memory-bytes) full, 58 preemptions, up to 11 running and 5 waiting, 10
    running and 3,500 tokens used on average (350 tokens a request)."""
    return Scene(
        scope(),
        decode=window(
            generated=9600,
            first=16,
            steps=9000,
            step_seconds=180.0,
            engine_steps=1200,
            preemptions=58,
        ),
        kv_capacity=r(4096),
        kv_block_size=r(128),
        kv_memory=r(8 * MIB),
        kv_memory_fixed=True,
        kv_usage_peak=r(1.0),
        kv_used_mean=r(3500),
        running_mean=r(10),
        running_peak=r(11),
        waiting_peak=r(5),
    )


def bypassed(version: str = "0.11.0") -> Scene:
    """The article's run on vLLM 0.11 under the model's default repetition penalty:
    256 tokens, 255 decode steps, no draft."""
    return Scene(
        scope(),
        decode=window(
            generated=256,
            first=1,
            steps=255,
            step_seconds=3.57,
            engine_steps=256,
            drafts=0,
            draft_tokens=0,
            accepted=0,
        ),
        spec_configured=True,
        vllm_version=version,
    )


def speculating() -> Scene:
    """Two speculative requests on the CPU build (spec-after-2x256 less idle): 512 tokens,
    2 first tokens, 104 decode steps (0.6 s), 96 drafts of 446 tokens, 414 accepted."""
    return Scene(
        scope(),
        decode=window(
            generated=512,
            first=2,
            steps=104,
            step_seconds=0.6,
            engine_steps=106,
            drafts=96,
            draft_tokens=446,
            accepted=414,
        ),
        spec_configured=True,
    )


def bf16() -> Scene:
    """The H200's BF16 variant: 14.29 GiB read in 381 decode steps of 4.7132 ms."""
    return Scene(
        scope(),
        decode=window(
            generated=384, first=3, steps=381, step_seconds=1.7957383069999935, engine_steps=384
        ),
        weights=r(15343770664.96),
        peak_bandwidth=r(4.8e12),
    )


def idle() -> Scene:
    return Scene(
        scope(600.0),
        decode=window(generated=0, first=0, steps=0, step_seconds=0.0, preemptions=0),
        kv_capacity=r(4096),
        kv_usage_peak=r(0.0),
        waiting_peak=r(0),
    )


def with_startup(scene: Scene, **stages: float) -> Scene:
    return replace(scene, startup={k: r(v) for k, v in stages.items()})
