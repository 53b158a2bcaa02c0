"""kv_pool: the pool running full (filling, full with requests waiting, preempting in a
storm), and how much memory, or which utilization, would hold the demand.

Each engine's pool is judged on what it went through over the scene's window, with the
conditions of the alert each finding mirrors (alerts/glassbox-alerts.yaml; the constants
below are theirs, tests/explain/test_alert_drift.py keeps them equal): the peaks of its
usage and queue (`max_over_time`), its preemptions counted (`increase`). The pool dips
inside every storm (preemptions free blocks), so a judgement of one poll would flip.
"""

from __future__ import annotations

from dataclasses import dataclass

from vllm_glassbox.core import derive
from vllm_glassbox.core import snapshot as s
from vllm_glassbox.explain.diagnoses.common import RUNBOOK, decode_steps, gpu_memory, window
from vllm_glassbox.explain.findings import (
    Figure,
    Finding,
    Severity,
    Statement,
    core,
    counted,
    joined,
    read,
    say,
    say_if,
)
from vllm_glassbox.explain.scene import EnginePool, Scene

#: VLLMPreemptionStorm: at least this many preemptions over the window, on a pool at least
#: STORM_FILL full at its peak, with more than STORM_WAITING requests waiting for room.
STORM_ALERT = "VLLMPreemptionStorm"
STORM_PREEMPTIONS = 3.0
STORM_FILL = 0.9
STORM_WAITING = 0.0
#: VLLMKVCacheSaturated: a pool at least this full while more than SATURATED_WAITING wait.
SATURATED_ALERT = "VLLMKVCacheSaturated"
SATURATED_FILL = derive.KV_POOL_FULL
SATURATED_WAITING = 0.0
#: VLLMKVCacheExhaustionForecast: both forecasts of an engine at once — full sooner than
#: FULL_SOON_SECONDS at its recent growth, and a headroom at completion below
#: HEADROOM_AT_COMPLETION_BELOW. The time to exhaustion alone is no warning: a pool that
#: rises with the traffic and drains again has one on every rise.
FORECAST_ALERT = "VLLMKVCacheExhaustionForecast"
FULL_SOON_SECONDS = derive.KV_EXHAUSTION_WARNING_SECONDS
HEADROOM_AT_COMPLETION_BELOW = 0.0
#: Shapes of vLLM's output glassbox does not read (glassbox_input_unrecognised) that leave
#: the pool's readings untrustworthy: with one flagged it says so, and advises nothing.
UNTRUSTED = ("hybrid_kv_groups", "no_cache_config_info", "several_servers_behind_the_target")

#: What the pool was found to be: the finding, its severity, title, sentence and changes.
_Judgement = tuple[str, Severity, str, Statement, list[Statement]]
#: A pool's states, the most urgent first.
#: "preempted": preemptions enough for a storm that the polls' gauges did not see full
#: with requests waiting (a fill shorter than a poll); no alert fires on it, since the
#: storm's alert reads the same gauges, but requests were recomputed: said, not silent.
_STATES = ("preemption_storm", "saturated", "preempted", "full", "filling")


@dataclass(frozen=True)
class _Pool:
    """One engine's figures the pool is judged on, and the alerts' conditions over them."""

    engine: str | None  # None: the scene has one pool's figures, not each engine's
    capacity: Figure
    fill: Figure  # the most over the window
    now: Figure | None
    preempted: Figure | None
    first: Figure | None  # unix seconds
    last: Figure | None
    waiting: Figure | None  # for room where the page says why, else every reason
    waiting_for_room: bool  # whether `waiting` is of requests waiting for room
    deferred: Figure | None
    running: Figure | None
    exhaustion: Figure | None
    at_completion: Figure | None

    @property
    def waited(self) -> bool:
        return self.waiting is not None and self.waiting.value > STORM_WAITING

    @property
    def storm(self) -> bool:
        return (
            self.preempted is not None
            and self.preempted.value >= STORM_PREEMPTIONS
            and self.fill.value >= STORM_FILL
            and self.waited
        )

    @property
    def saturated(self) -> bool:
        waited = self.waiting is not None and self.waiting.value > SATURATED_WAITING
        return self.fill.value >= SATURATED_FILL and waited

    @property
    def preempted_unseen(self) -> bool:
        return (
            self.preempted is not None
            and self.preempted.value >= STORM_PREEMPTIONS
            and not self.storm
        )

    @property
    def full(self) -> bool:
        return self.fill.value >= SATURATED_FILL

    @property
    def soon(self) -> bool:
        # 0 is a pool full now, which vLLM's own usage says better: no forecast then.
        return (
            self.exhaustion is not None
            and 0 < self.exhaustion.value < FULL_SOON_SECONDS
            and self.at_completion is not None
            and self.at_completion.value < HEADROOM_AT_COMPLETION_BELOW
        )

    @property
    def state(self) -> str | None:
        flags = (self.storm, self.saturated, self.preempted_unseen, self.full, self.soon)
        return next((name for name, on in zip(_STATES, flags, strict=True) if on), None)


def kv_pool(scene: Scene) -> list[Finding]:
    """The pool running full: filling, full with requests waiting, preempting in a storm;
    and how much memory (or which utilization) would hold the demand. Judged engine by
    engine; the most urgent engine's is told."""
    capacity = read(scene.kv_capacity, "tokens")
    pools = [p for p in (_figures(scene, capacity, e) for e in _engines(scene)) if p is not None]
    if capacity is None or not pools:
        return _unknown(scene, capacity)
    judged = [p for p in pools if p.state is not None]
    if not judged:
        return []
    pool = min(judged, key=lambda p: _STATES.index(p.state or ""))
    unseen = _unseen(scene, pool)
    assumes = (
        ["judged engine by engine, as the alerts are"]
        if scene.pools
        else ["the engines are alike: one engine's pool, the fullest engine's fill"]
    )
    finding, severity, title, what, change = _judged(scene, pool, assumes)
    if pool.deferred is not None and pool.deferred.value > 0:
        change.append(
            say(
                "up to {deferred} requests were deferred for another reason than KV room "
                "(a LoRA budget, a KV transfer): more pool does not admit them",
                deferred=pool.deferred,
            )
        )
    if pool.waited and finding != "filling":  # a pool nobody waited for needs no more room
        change.extend(_more_pool(scene, pool.running, pool.waiting, unseen))
    return [
        Finding(
            "kv_pool",
            finding,
            severity,
            title,
            what,
            tuple(change),
            tuple(assumes),
            tuple(unseen),
            f"{RUNBOOK}#{_RUNBOOK_SECTIONS[finding]}",
        )
    ]


_RUNBOOK_SECTIONS = {
    "preemption_storm": "vllmpreemptionstorm",
    "saturated": "vllmkvcachesaturated",
    "preempted": "vllmpreemptionstorm",
    "full": "vllmkvcachesaturated",
    "filling": "vllmkvcacheexhaustionforecast",
}


def _engines(scene: Scene) -> tuple[EnginePool, ...]:
    """Each engine's pool; a source without them (a scene written by hand, a lab run)
    gives one pool of the scene's own figures."""
    if scene.pools:
        return scene.pools
    return (
        EnginePool(
            engine="",
            peak_usage=scene.kv_usage_peak,
            peak_running=scene.running_peak,
            peak_waiting=scene.waiting_peak,
            peak_waiting_capacity=scene.waiting_capacity_peak,
            peak_waiting_deferred=scene.waiting_deferred_peak,
            exhaustion_seconds=scene.kv_exhaustion,
        ),
    )


def _unknown(scene: Scene, capacity: Figure | None) -> list[Finding]:
    """A pool whose size or fill is absent: unknown, where decode ran on it."""
    steps = decode_steps(scene)
    if capacity is not None or steps is None or steps.value <= 0:
        return []  # a pool of known size whose fill was not watched: nothing to say
    return [
        Finding(
            "kv_pool",
            "unknown",
            "info",
            "The KV pool: unknown",
            say("how full the KV pool ran cannot be said: its size or usage is absent"),
            unseen=(
                "glassbox_kv_cache_capacity_tokens (vllm:cache_config_info or vLLM's "
                "log, read by the exporter)",
            ),
        )
    ]


def _figures(scene: Scene, capacity: Figure | None, pool: EnginePool) -> _Pool | None:
    """One engine's figures, as read (None where its usage was not)."""
    fill = read(pool.peak_usage, "ratio")
    if capacity is None or fill is None:
        return None
    waiting = pool.peak_waiting_capacity or pool.peak_waiting
    preempted = read(pool.preemptions, "count")
    if not scene.pools:
        preempted = counted(scene.decode, s.PREEMPTIONS)
    return _Pool(
        engine=pool.engine if len(scene.pools) > 1 else None,
        capacity=capacity,
        fill=fill,
        now=read(pool.usage_now, "ratio"),
        preempted=preempted,
        first=read(pool.first_preemption_at, "clock"),
        last=read(pool.last_preemption_at, "clock"),
        waiting=read(waiting, "count"),
        waiting_for_room=pool.peak_waiting_capacity is not None,
        deferred=read(pool.peak_waiting_deferred, "count"),
        running=read(pool.peak_running, "count"),
        exhaustion=read(pool.exhaustion_seconds, "seconds"),
        at_completion=read(pool.headroom_at_completion, "count"),
    )


def _unseen(scene: Scene, pool: _Pool) -> list[str]:
    """What the judgement of the pool could not read: what the source lacks."""
    unseen = []
    if not pool.waiting_for_room and pool.waited:
        unseen.append(
            "why requests waited: vLLM 0.20+ splits the queue into waiting for KV room "
            "and deferred (num_requests_waiting_by_reason), which this source lacks; here "
            "every waiting request is taken as waiting for room"
        )
    if pool.preempted is None:
        unseen.append("preemptions (vllm:num_preemptions_total absent)")
    return unseen


def _on(pool: _Pool) -> Statement:
    """Which engine, where the scene has several: its labels as text, never a figure."""
    if pool.engine is None:
        return Statement("")
    name = pool.engine.replace("{", "{{").replace("}", "}}")
    return Statement(f"engine {name}: ")


def _fill(scene: Scene, pool: _Pool) -> Statement:
    """'{fill} full at most in {window} ({now} now)': the window's peak, and now."""
    return joined(
        say("{fill} full at most in {window}", fill=pool.fill, window=window(scene)),
        say_if(" ({now} now)", now=pool.now),
    )


def _judged(scene: Scene, pool: _Pool, assumes: list[str]) -> _Judgement:
    """The most urgent of the pool's states: a storm, saturated, full, or filling."""
    on = _on(pool)
    if pool.state == "preemption_storm":
        return _storm(scene, pool, assumes)
    if pool.state == "preempted":
        return _preempted_between_polls(scene, pool, assumes)
    pooled = joined(
        on, say("the KV pool ({capacity} tokens an engine) ran ", capacity=pool.capacity)
    )
    if pool.state == "saturated":
        what = joined(
            pooled,
            _fill(scene, pool),
            say(", with up to {waiting} requests waiting for room", waiting=pool.waiting),
        )
        return "saturated", "warning", "The KV pool is full: requests wait", what, []
    if pool.state == "full":
        what = joined(
            pooled,
            _fill(scene, pool),
            say(", and no request waited for room: it keeps up, with nothing to spare"),
        )
        return "full", "info", "The KV pool runs full, nobody waits", what, []
    what = joined(
        on,
        say(
            "at its growth over the last window the KV pool ({capacity} tokens an engine",
            capacity=pool.capacity,
        ),
        say_if(", {now} full now", now=pool.now),
        say(
            ") is full in {exhaustion}, and its running requests, once at the size "
            "requests finish at, outgrow it (headroom at completion: {at_completion} "
            "requests)",
            exhaustion=pool.exhaustion,
            at_completion=pool.at_completion,
        ),
    )
    return "filling", "warning", "The KV pool fills", what, []


def _when(scene: Scene, pool: _Pool) -> Statement | None:
    """', between {first} and {last}, the last {ago} ago, none since': where the source
    has the preemptions' times."""
    ago = core(derive.seconds_since, pool.last, scene.scope.at, unit="seconds")
    if pool.first is None or pool.last is None or ago is None:
        return None
    span = (
        say(", at {last}", last=pool.last)
        if pool.first.value == pool.last.value
        else say(", between {first} and {last}", first=pool.first, last=pool.last)
    )
    ended = (
        say(", the last at the latest poll (still preempting)")
        if ago.value <= 0
        else say(", the last {ago} ago, none since", ago=ago)
    )
    return joined(span, ended)


def _preempted(scene: Scene, pool: _Pool) -> Statement:
    """'over the {window} window vLLM preempted requests {preempted} times, between …'"""
    return joined(
        _on(pool),
        say(
            "over the {window} window vLLM preempted requests {preempted} times",
            preempted=pool.preempted,
            window=window(scene),
        ),
        _when(scene, pool),
    )


def _recomputed(scene: Scene, pool: _Pool, assumes: list[str]) -> list[Statement]:
    """The prompt tokens the preemptions made vLLM compute again, at the mean size."""
    mean = _mean(scene)
    recomputed = core(derive.tokens_recomputed_by_preemptions, pool.preempted, mean, unit="tokens")
    if recomputed is None or mean is None:
        return []
    assumes.append("preempted requests had the mean size of the running ones")
    return [
        say(
            "each preemption drops a request's KV cache and prefills it again: at the "
            "mean request size of {mean} tokens, about {recomputed} tokens were "
            "computed twice",
            mean=mean,
            recomputed=recomputed,
        )
    ]


def _preempted_between_polls(scene: Scene, pool: _Pool, assumes: list[str]) -> _Judgement:
    """Preemptions enough for a storm that the gauges did not see: the pool ran full
    between two polls (vLLM preempts only when a step finds no free block)."""
    seen = joined(
        say(
            "; the polls saw its KV pool ({capacity} tokens an engine) {fill} full at most",
            capacity=pool.capacity,
            fill=pool.fill,
        ),
        say_if(" ({now} now)", now=pool.now),
        say(" with up to {waiting} requests waiting for room", waiting=pool.waiting)
        if pool.waited and pool.waiting is not None
        else say(" and no request waiting for room"),
        say(
            ": vLLM preempts only on a full pool, so it ran full between two polls, too "
            "briefly for them to see (and for VLLMPreemptionStorm, which reads the same "
            "gauges, to fire)"
        ),
    )
    what = joined(_preempted(scene, pool), seen)
    change = _recomputed(scene, pool, assumes)
    change.append(say("polls closer together (the exporter's --interval) see such a fill"))
    return "preempted", "warning", "vLLM preempted between polls", what, change


def _storm(scene: Scene, pool: _Pool, assumes: list[str]) -> _Judgement:
    """vLLM preempting on a full pool while requests wait: when, and what it recomputed."""
    assert pool.preempted is not None and pool.waiting is not None
    what = joined(
        _preempted(scene, pool),
        say(
            "; its KV pool ({capacity} tokens an engine) ran {fill} full at most",
            capacity=pool.capacity,
            fill=pool.fill,
        ),
        say_if(" ({now} now)", now=pool.now),
        say(", while up to {waiting} requests waited for room", waiting=pool.waiting),
    )
    change = _recomputed(scene, pool, assumes)
    return "preemption_storm", "critical", "The KV pool is full: vLLM preempts", what, change


def _mean(scene: Scene) -> Figure | None:
    """The mean request size in the pool (used tokens over running requests)."""
    return core(
        derive.kv_cache_mean_request_tokens, scene.kv_used_mean, scene.running_mean, unit="tokens"
    )


def _more_pool(
    scene: Scene, running: Figure | None, waiting: Figure | None, unseen: list[str]
) -> list[Statement]:
    """The pool that would have held every running and waiting request at the mean size:
    its memory, as --kv-cache-memory-bytes or as --gpu-memory-utilization."""
    mean = _mean(scene)
    per_token = core(
        derive.kv_cache_bytes_per_token, scene.kv_memory, scene.kv_capacity, unit="bytes"
    )
    demanded = core(derive.kv_cache_tokens_demanded, mean, running, waiting, unit="tokens")
    memory = core(
        derive.kv_cache_memory_for_tokens, demanded, per_token, scene.kv_block_size, unit="bytes"
    )
    now = read(scene.kv_memory, "bytes")
    capacity = read(scene.kv_capacity, "tokens")
    if capacity is not None and demanded is not None and demanded.value <= capacity.value:
        return []  # the mean size says they fit: they waited for something else
    if memory is None or now is None or demanded is None:
        if now is None:
            unseen.append(
                "the pool's memory (glassbox_kv_cache_memory_bytes: vLLM's log or "
                "--kv-cache-memory-bytes), so no memory that would hold the demand"
            )
        elif mean is None:
            unseen.append("the mean request size (used tokens, running requests)")
        return []
    assert running is not None and waiting is not None and mean is not None
    holds = say(
        "a pool of {demanded} tokens an engine would hold the {running} running and "
        "{waiting} waiting requests at the mean size of {mean} tokens",
        demanded=demanded,
        running=running,
        waiting=waiting,
        mean=mean,
    )
    return [holds, _memory_setting(scene, memory, now, per_token, unseen)]


def _memory_setting(
    scene: Scene, memory: Figure, now: Figure, per_token: Figure | None, unseen: list[str]
) -> Statement:
    """The setting that gives the pool `memory`: --kv-cache-memory-bytes for a pool of fixed
    memory, else --gpu-memory-utilization where the GPU's memory is known."""
    if scene.kv_memory_fixed:
        return say(
            "--kv-cache-memory-bytes {memory} gives it (now {now}, {per_token} a token)",
            memory=memory,
            now=now,
            per_token=per_token,
        )
    utilization = core(
        derive.gpu_memory_utilization_for,
        memory,
        scene.kv_memory,
        scene.gpu_memory_utilization,
        gpu_memory(scene),
        unit="ratio",
    )
    current = read(scene.gpu_memory_utilization, "ratio")
    if utilization is not None and current is not None:
        return say(
            "--gpu-memory-utilization {utilization} gives it {memory} of KV memory a GPU "
            "(now {current}: {now})",
            utilization=utilization,
            memory=memory,
            current=current,
            now=now,
        )
    unseen.append(
        "the GPU's memory (dcgm-exporter's DCGM_FI_DEV_FB_USED + FB_FREE, or "
        "`glassbox explain --gpu-memory`), so no --gpu-memory-utilization for that pool"
    )
    return say(
        "it takes {memory} of KV memory a GPU (now {now}): more utilization, quantized "
        "weights (the decode finding) or more replicas",
        memory=memory,
        now=now,
    )
