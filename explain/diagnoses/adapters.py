"""adapters: LoRA adapters sharing a server — more in flight than one batch may hold, their
requests deferred, and what the adapter budget costs in queue time."""

from __future__ import annotations

from vllm_glassbox.core import derive
from vllm_glassbox.explain.findings import Figure, Finding, core, read, say, say_if
from vllm_glassbox.explain.scene import Scene


def adapters(scene: Scene) -> list[Finding]:
    """Adapters in flight against the budget (--max-loras), the waits vLLM deferred, and
    the queue time those waits account for."""
    budget = read(scene.adapter_budget, "count")
    active = read(scene.adapters_active, "count")
    if budget is None or active is None:
        return []
    deferred = read(scene.waiting_deferred_peak, "count")
    if deferred is None or deferred.value == 0:
        return [_within_budget(active, budget)]
    share = core(
        derive.deferred_share_of_waiting,
        scene.waiting_deferred_peak,
        scene.waiting_peak,
        unit="ratio",
    )
    queue = core(derive.mean_queue_seconds, scene.decode, unit="seconds")
    costs = core(derive.queue_seconds_deferred, scene.decode, share, unit="seconds")
    over = core(
        derive.adapters_over_budget, scene.adapters_active, scene.adapter_budget, unit="count"
    )
    change = [
        part
        for part in (
            say_if(
                "the deferred waits account for about {costs} of the mean queue time of "
                "{queue} (their {share} share of the waits)",
                costs=costs,
                queue=queue,
                share=share,
            ),
            say(
                "raise --max-loras (each slot holds one adapter's weights at --max-lora-rank "
                "on every GPU), or route each adapter's requests to fewer servers so that a "
                "server's adapters fit its budget"
            ),
        )
        if part is not None
    ]
    if over is not None and over.value > 0:
        what = say(
            "{deferred} requests waited deferred while {active} adapters had requests in "
            "flight with a budget of {budget} a batch: {over} beyond it wait for a slot",
            deferred=deferred,
            active=active,
            budget=budget,
            over=over,
        )
    else:
        what = say(
            "{deferred} requests waited deferred while {active} adapters had requests in "
            "flight with a budget of {budget} a batch",
            deferred=deferred,
            active=active,
            budget=budget,
        )
    return [
        Finding(
            "adapters",
            "budget_bound",
            "info",
            "The adapter budget holds requests back",
            what,
            tuple(change),
            (
                "deferred waits count requests held back by the adapter budget, a KV "
                "transfer or a blocked request alike (vLLM 0.20+)",
                "the waits share the queue time as the waiting requests do",
            ),
        )
    ]


def _within_budget(active: Figure, budget: Figure) -> Finding:
    return Finding(
        "adapters",
        "within_budget",
        "ok",
        "Adapters fit their budget",
        say(
            "{active} adapters had requests in flight, within a budget of {budget} a "
            "batch (--max-loras); no request waited deferred",
            active=active,
            budget=budget,
        ),
    )
