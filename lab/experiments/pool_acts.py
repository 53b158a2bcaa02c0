"""What the KV-pressure and rate-sweep kinds share about the pool's acts: a poll's point of
the pool, the acts a timeline of them is cut into — the pool fills, requests queue at a
full pool, vLLM preempts — and the rule that names each poll's act."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from vllm_glassbox.core.derive import counter_increase


@dataclass(frozen=True)
class TimelinePoint:
    t: float  # seconds since the flood started, when the poll's page arrived
    running: float | None
    waiting: float | None
    kv_cache_usage: float | None  # 0–1
    preemptions: float  # since the flood started
    generated_tokens: float  # since the flood started
    latency_seconds: float | None = None  # how long vLLM took to answer the poll
    delay_seconds: float | None = None  # how late after its tick the poll was sent
    # The pool's forecasts at this poll (pool_forecasts.py): the derivation core's over
    # the lab's polls, and the exporter's beside when there is one.
    headroom_requests: float | None = None
    headroom_at_completion: float | None = None
    exhaustion_seconds: float | None = None
    exporter_headroom_requests: float | None = None
    exporter_headroom_at_completion: float | None = None
    exporter_exhaustion_seconds: float | None = None


FILLING = "filling"
QUEUE_BEFORE_FULL = "queue before the pool is full"
SATURATED = "saturated with a queue"
FULL_NOBODY_WAITING = "full, nobody waiting"
STORM = "preemption storm"
DRAINING = "draining"
NEVER_FULL = "pool never full"


#: Each act's condition, as the report states it.
ACT_CONDITIONS = {
    FILLING: "nobody waits; the pool grows (it may reach full)",
    QUEUE_BEFORE_FULL: "requests wait although the pool has not been full yet (an "
    "admission backlog, not the pool)",
    SATURATED: "requests wait, and the pool is full or has been (their KV does not fit)",
    FULL_NOBODY_WAITING: "the queue emptied while the pool stays full, before any preemption",
    STORM: "from the first poll that counted preemptions to the last",
    DRAINING: "no more preemptions or queue: the running requests finish",
    NEVER_FULL: "the pool never filled and nobody waited",
}


#: The article's three acts, in order.
THREE_ACTS = (FILLING, SATURATED, STORM)


def preemption_jumps(timeline: Sequence[TimelinePoint]) -> list[float]:
    """Preemptions seen by each poll (the first poll: since the flood started)."""
    previous = 0.0
    jumps = []
    for p in timeline:
        jumps.append(counter_increase(previous, p.preemptions))
        previous = p.preemptions
    return jumps


def act_names(timeline: Sequence[TimelinePoint], saturation: float) -> list[str]:
    """The act of each poll, named only where its condition holds (ACT_CONDITIONS).

    vLLM counts a preemption when the preempted request runs again, so requests queue at
    a full pool before the count moves: the storm follows the queue.
    """
    jumps = preemption_jumps(timeline)
    waiting = [(p.waiting or 0) > 0 for p in timeline]
    full = [(p.kv_cache_usage or 0.0) >= saturation for p in timeline]
    preempted = [i for i, j in enumerate(jumps) if j > 0]
    if not preempted and not any(waiting) and not any(full):
        return [NEVER_FULL] * len(timeline)
    storm = (preempted[0], preempted[-1]) if preempted else None
    names = []
    ever_full = False
    for i in range(len(timeline)):
        ever_full = ever_full or full[i]
        if storm and storm[0] <= i <= storm[1]:
            names.append(STORM)
        elif storm and i > storm[1]:
            names.append(DRAINING)
        elif waiting[i]:
            names.append(SATURATED if ever_full else QUEUE_BEFORE_FULL)
        elif any(waiting[:i]):
            queue_again = any(waiting[i + 1 :]) or storm is not None
            names.append(
                DRAINING if not queue_again else FULL_NOBODY_WAITING if ever_full else FILLING
            )
        else:
            names.append(FILLING)
    return names
