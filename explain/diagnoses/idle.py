"""idle: nothing decoded over the window, said plainly, so that nothing is judged on it;
and, with a price, what the room no request used costs (a pool that runs mostly empty)."""

from __future__ import annotations

from vllm_glassbox.core import derive
from vllm_glassbox.core import snapshot as s
from vllm_glassbox.explain.diagnoses.common import decode_steps, window
from vllm_glassbox.explain.findings import Finding, core, counted, read, say, say_if
from vllm_glassbox.explain.scene import Scene

#: From this share of the pool unused on the window's mean up, its cost is told.
ROOM_UNUSED = 0.5


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
        return _room_unused(scene)
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


def _room_unused(scene: Scene) -> list[Finding]:
    """A pool that ran mostly empty over the window, with a price: the share of the GPU
    hours (and their cost an hour) that bought room no request used. Without a price,
    nothing is said (the pool's own findings judge it full or not)."""
    fill = core(
        derive.pool_fill_of_engines,
        scene.kv_used_mean,
        scene.kv_capacity,
        scene.scope.engines,
        unit="ratio",
    )
    unused = core(derive.unused_share, fill, unit="ratio")
    hourly = read(scene.hourly_cost, "cost")
    cost = core(derive.cost_of_share, hourly, unused, unit="cost")
    if fill is None or unused is None or cost is None or unused.value < ROOM_UNUSED:
        return []
    what = say(
        "the pool runs {fill} full: {unused} of the GPU's hours buy room no request uses, "
        "{cost} an hour of the {hourly} the engines cost",
        fill=fill,
        unused=unused,
        cost=cost,
        hourly=hourly,
    )
    return [
        Finding(
            "idle",
            "room_unused",
            "info",
            "Room no request uses",
            what,
            (
                say(
                    "fewer or smaller engines (or a lower --gpu-memory-utilization) at this "
                    "load; or more load on these"
                ),
            ),
            (
                "the mean fill of the window's readings (engines alike): 1 − usage, idle "
                "time counting whole",
            ),
        )
    ]
