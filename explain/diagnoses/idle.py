"""idle: nothing decoded over the window, said plainly, so that nothing is judged on it."""

from __future__ import annotations

from vllm_glassbox.core import snapshot as s
from vllm_glassbox.explain.diagnoses.common import decode_steps, window
from vllm_glassbox.explain.findings import Finding, counted, read, say, say_if
from vllm_glassbox.explain.scene import Scene


def idle(scene: Scene) -> list[Finding]:
    """Nothing decoded over the window: nothing to judge, said plainly."""
    if scene.decode is None:
        return []
    if not scene.decode.increase.counters:
        return [
            Finding(
                "idle",
                "no_increase",
                "info",
                "Nothing to judge yet",
                say(
                    "none of vLLM's counters has an increase over the last {window}: the window "
                    "holds fewer than two scrapes of them (a longer --since, or a server that "
                    "just started); nothing is judged",
                    window=window(scene),
                ),
                unseen=("every windowed number: increase() needs two samples in the window",),
            )
        ]
    steps = decode_steps(scene)
    tokens = counted(scene.decode, s.GENERATION_TOKENS, "tokens")
    if steps is None or tokens is None or steps.value > 0 or tokens.value > 0:
        return []
    usage = read(scene.kv_usage_peak, "ratio")
    waiting = read(scene.waiting_peak, "count")
    what = say_if(
        "nothing ran in the last {window}: {tokens} tokens generated, no request waiting (the "
        "longest queue: {waiting}), the KV pool at most {usage} full. Nothing to judge; "
        "nothing wrong",
        window=window(scene),
        tokens=tokens,
        waiting=waiting,
        usage=usage,
    ) or say(
        "nothing ran in the last {window}: {tokens} tokens generated. Nothing to judge; "
        "nothing wrong",
        window=window(scene),
        tokens=tokens,
    )
    return [Finding("idle", "idle", "ok", "Idle", what)]
