"""What the diagnoses share: their type, the runbook, the window as a figure, the decode
steps every judgement of decode needs, and the guard for inputs glassbox does not read."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from vllm_glassbox.core import derive
from vllm_glassbox.core import snapshot as s
from vllm_glassbox.explain.findings import Figure, Finding, core, counted, read, say
from vllm_glassbox.explain.scene import Reading, Scene

Diagnosis = Callable[[Scene], list[Finding]]

RUNBOOK = "https://github.com/vllm-glassbox/vllm-glassbox/blob/main/alerts/runbook.md"
#: Fewer decode steps than this say too little to judge decode or speculation on.
MIN_DECODE_STEPS = 10.0


def window(scene: Scene) -> Figure:
    """The scene's window, as a figure of its own."""
    scope = scene.scope
    return Figure(scope.window_seconds, "seconds", "read", (_WINDOWS[scope.source],))


_WINDOWS = {
    "prometheus": "the window (--since)",
    "exporter": "the exporter's window (--window)",
    "lab": "the measured requests",
}


def decode_steps(scene: Scene) -> Figure | None:
    """The decode steps of the window (vLLM's inter-token latency count)."""
    return counted(scene.decode, s.ITL_COUNT)


def flagged(scene: Scene, shapes: Sequence[str]) -> list[str]:
    """The shapes among `shapes` that glassbox flagged in this scene as unread."""
    return [b.shape for b in scene.blind if b.shape is not None and b.shape in shapes]


def untrusted(diagnosis: Diagnosis, shapes: Sequence[str]) -> Diagnosis:
    """`diagnosis`, unless glassbox flagged one of `shapes` (a shape of its inputs it does
    not read): then one finding that says which, and nothing advised."""

    def guarded(scene: Scene) -> list[Finding]:
        found = flagged(scene, shapes)
        if not found:
            return diagnosis(scene)
        return [
            Finding(
                diagnosis.__name__,
                "not_judged",
                "info",
                f"{diagnosis.__name__.replace('_', ' ').capitalize()}: not judged",
                say(
                    f"glassbox does not trust what this would be judged on ({', '.join(found)}"
                    "): nothing is advised"
                ),
                unseen=tuple(f'glassbox_input_unrecognised{{shape="{s}"}}' for s in found),
            )
        ]

    guarded.__name__ = diagnosis.__name__
    guarded.__doc__ = diagnosis.__doc__
    return guarded


def lab_reading(scene: Scene, value: float | None, what: str) -> Reading | None:
    """A number of the lab run given with --lab, as a reading with its source."""
    if value is None or scene.lab is None:
        return None
    return Reading(value, f"{scene.lab.source}: {what}")


#: What a price would add, where a finding has none (`unseen`).
NO_PRICE = (
    "the price of a GPU hour (the exporter's --gpu-hour-price, the chart's "
    "cost.gpuHourPrice), which would price it"
)


def gpu_memory(scene: Scene) -> Figure | None:
    """One GPU's memory: as given (--gpu-memory), else dcgm-exporter's framebuffer used +
    free where Prometheus has it."""
    given = read(scene.gpu_memory, "bytes")
    if given is not None:
        return given
    return core(
        derive.gpu_memory_from_framebuffer, scene.dcgm_fb_used, scene.dcgm_fb_free, unit="bytes"
    )


def cost_per_million_tokens(scene: Scene) -> Figure | None:
    """What a million generated tokens cost over the window: the engines' GPU hours."""
    return core(
        derive.cost_per_million_generated_tokens, scene.decode, scene.hourly_cost, unit="cost"
    )
