"""cold_start: a start dominated by one stage (loading the weights, torch.compile, CUDA
graphs, the engine's initialisation), and what shortens it."""

from __future__ import annotations

from vllm_glassbox.core import derive
from vllm_glassbox.explain.findings import Finding, core, read, say
from vllm_glassbox.explain.scene import Scene

#: A stage with at least this share of a start dominates it.
DOMINANT_STAGE = 0.5
STAGE_WORDS = {
    "weights_load": "loading the weights",
    "compile": "torch.compile",
    "cuda_graphs": "capturing CUDA graphs",
    "engine_init": "the engine's initialisation",
}

_STAGE_CHANGE = {
    "compile": (
        "keep vLLM's compile cache (VLLM_CACHE_ROOT, ~/.cache/vllm) on a volume that "
        "outlives the pod: a start with the same flags then loads the compiled graphs "
        "(on the H200, 4–6 s instead of ~20 s: docs/results/h200)"
    ),
    "weights_load": (
        "faster storage for the weights (a local NVMe, a warmed page cache), or "
        "--load-format runai_streamer / fastsafetensors"
    ),
    "cuda_graphs": (
        "capture fewer graph sizes (--cuda-graph-sizes, --max-num-seqs), or "
        "--enforce-eager at the price of slower decode"
    ),
    "engine_init": (
        "the engine's initialisation is memory profiling, KV allocation and warm-up: a "
        "smaller --max-num-batched-tokens shortens the profiling and the warm-up"
    ),
}


def cold_start(scene: Scene) -> list[Finding]:
    """A start dominated by one stage (not 'other': processes starting, the API server)."""
    total = read(scene.startup.get("total"), "seconds")
    stages = {
        name: figure
        for name, reading in scene.startup.items()
        if name in STAGE_WORDS and (figure := read(reading, "seconds")) is not None
    }
    if total is None or not stages:
        return []
    name = max(stages, key=lambda n: stages[n].value)
    stage = stages[name]
    share = core(derive.share_of, stage, total, unit="ratio")
    if share is None or share.value < DOMINANT_STAGE:
        return []
    without = core(derive.startup_without_stage, total, stage, unit="seconds")
    change = [say(_STAGE_CHANGE[name])]
    if without is not None:
        change.append(say("without it the start takes {without}", without=without))
    return [
        Finding(
            "cold_start",
            name,
            "info",
            f"Cold starts are mostly {STAGE_WORDS[name]}",
            say(
                f"the latest start took {{total}}, {{share}} of it {STAGE_WORDS[name]}: {{stage}}",
                total=total,
                share=share,
                stage=stage,
            ),
            tuple(change),
            ("the latest start of the slowest server stands for the others",),
        )
    ]
