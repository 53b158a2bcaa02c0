"""kv_pool: the pool running full (filling, full with requests waiting, preempting in a
storm), and how much memory, or which utilization, would hold the demand."""

from __future__ import annotations

from dataclasses import dataclass

from vllm_glassbox.core import derive
from vllm_glassbox.core import snapshot as s
from vllm_glassbox.explain.diagnoses.common import RUNBOOK, decode_steps, window
from vllm_glassbox.explain.findings import (
    Figure,
    Finding,
    Severity,
    Statement,
    core,
    counted,
    read,
    say,
)
from vllm_glassbox.explain.scene import Scene

#: VLLMPreemptionStorm: at least this many preemptions, on a pool at least STORM_FILL full,
#: with requests waiting for room.
STORM_PREEMPTIONS = 3.0
STORM_FILL = 0.9
#: VLLMKVCacheSaturated: a pool at least this full while requests wait for it.
SATURATED_FILL = derive.KV_POOL_FULL
#: VLLMKVCacheExhaustionForecast: a pool forecast to be full sooner than this is worth a
#: word before it happens.
FULL_SOON_SECONDS = derive.KV_EXHAUSTION_WARNING_SECONDS
#: Shapes of vLLM's output glassbox does not read (glassbox_input_unrecognised) that leave
#: the pool's readings untrustworthy: with one flagged it says so, and advises nothing.
UNTRUSTED = ("hybrid_kv_groups", "no_cache_config_info", "several_servers_behind_the_target")

#: What the pool was found to be: the finding, its severity, title, sentence and changes.
_Judgement = tuple[str, Severity, str, Statement, list[Statement]]


@dataclass(frozen=True)
class _Pool:
    """The figures the pool is judged on, and the alerts' conditions over them."""

    capacity: Figure
    fill: Figure
    preempted: Figure | None
    waiting: Figure | None
    deferred: Figure | None
    running: Figure | None
    mean: Figure | None
    exhaustion: Figure | None

    @property
    def waited(self) -> bool:
        return self.waiting is not None and self.waiting.value > 0

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
        return self.fill.value >= SATURATED_FILL and self.waited

    @property
    def full(self) -> bool:
        return self.fill.value >= SATURATED_FILL

    @property
    def soon(self) -> bool:
        # 0 is a pool full now, which vLLM's own usage says better: no forecast then.
        return self.exhaustion is not None and 0 < self.exhaustion.value < FULL_SOON_SECONDS


def kv_pool(scene: Scene) -> list[Finding]:
    """The pool running full: filling, full with requests waiting, preempting in a storm;
    and how much memory (or which utilization) would hold the demand."""
    capacity = read(scene.kv_capacity, "tokens")
    fill = read(scene.kv_usage_peak, "ratio")
    if capacity is None or fill is None:
        return _unknown(scene, capacity)
    pool = _figures(scene, capacity, fill)
    if not (pool.storm or pool.saturated or pool.full or pool.soon):
        return []
    unseen = _unseen(scene, pool)
    assumes = ["the engines are alike: one engine's pool, the fullest engine's fill"]
    finding, severity, title, what, change = _judged(scene, pool, assumes)
    if pool.deferred is not None and pool.deferred.value > 0:
        change.append(
            say(
                "up to {deferred} requests were deferred for another reason than KV room "
                "(a LoRA budget, a KV transfer): more pool does not admit them",
                deferred=pool.deferred,
            )
        )
    if pool.waited:  # a pool nobody waited for needs no more room
        change.extend(_more_pool(scene, pool.mean, pool.running, pool.waiting, unseen))
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
            f"{RUNBOOK}#vllmpreemptionstorm" if pool.storm else f"{RUNBOOK}#vllmkvcachesaturated",
        )
    ]


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


def _figures(scene: Scene, capacity: Figure, fill: Figure) -> _Pool:
    """The pool's figures: read, or the derivation core's mean request size."""
    waiting_reading = scene.waiting_capacity_peak or scene.waiting_peak
    return _Pool(
        capacity=capacity,
        fill=fill,
        preempted=counted(scene.decode, s.PREEMPTIONS),
        waiting=read(waiting_reading, "count"),
        deferred=read(scene.waiting_deferred_peak, "count"),
        running=read(scene.running_peak, "count"),
        mean=core(
            derive.kv_cache_mean_request_tokens,
            scene.kv_used_mean,
            scene.running_mean,
            unit="tokens",
        ),
        exhaustion=read(scene.kv_exhaustion, "seconds"),
    )


def _unseen(scene: Scene, pool: _Pool) -> list[str]:
    """What the judgement of the pool could not read."""
    unseen = []
    if scene.waiting_capacity_peak is None:
        unseen.append(
            "why requests waited: vLLM 0.20+ splits the queue into waiting for KV room "
            "and deferred (num_requests_waiting_by_reason); here every waiting request is "
            "taken as waiting for room"
        )
    if pool.preempted is None:
        unseen.append("preemptions (vllm:num_preemptions_total absent)")
    return unseen


def _judged(scene: Scene, pool: _Pool, assumes: list[str]) -> _Judgement:
    """The most urgent of the pool's states: a storm, saturated, full, or filling."""
    if pool.storm and pool.preempted is not None and pool.waiting is not None:
        return _storm(scene, pool, pool.preempted, pool.waiting, assumes)
    if pool.saturated and pool.waiting is not None:
        what = say(
            "the KV pool ({capacity} tokens an engine) ran {fill} full with up to {waiting} "
            "requests waiting for room in {window}",
            capacity=pool.capacity,
            fill=pool.fill,
            waiting=pool.waiting,
            window=window(scene),
        )
        return "saturated", "warning", "The KV pool is full: requests wait", what, []
    if pool.full:
        what = say(
            "the KV pool ({capacity} tokens an engine) ran {fill} full in {window}, and no "
            "request waited for room: it keeps up, with nothing to spare",
            capacity=pool.capacity,
            fill=pool.fill,
            window=window(scene),
        )
        return "full", "info", "The KV pool runs full, nobody waits", what, []
    assert pool.exhaustion is not None
    what = Statement(
        "at the growth of the last window the KV pool ({capacity} tokens an engine, "
        "{fill} full at most) is full in {exhaustion}",
        {"capacity": pool.capacity, "fill": pool.fill, "exhaustion": pool.exhaustion},
    )
    return "filling", "warning", "The KV pool fills", what, []


def _storm(
    scene: Scene, pool: _Pool, preempted: Figure, waiting: Figure, assumes: list[str]
) -> _Judgement:
    """vLLM preempting on a full pool while requests wait: what it recomputed."""
    recomputed = core(derive.tokens_recomputed_by_preemptions, preempted, pool.mean, unit="tokens")
    what = say(
        "the KV pool ({capacity} tokens an engine) ran {fill} full, and vLLM preempted "
        "requests {preempted} times in {window} while up to {waiting} waited for room",
        capacity=pool.capacity,
        fill=pool.fill,
        preempted=preempted,
        window=window(scene),
        waiting=waiting,
    )
    change = []
    if recomputed is not None and pool.mean is not None:
        change.append(
            say(
                "each preemption drops a request's KV cache and prefills it again: at the "
                "mean request size of {mean} tokens, about {recomputed} tokens were "
                "computed twice",
                mean=pool.mean,
                recomputed=recomputed,
            )
        )
        assumes.append("preempted requests had the mean size of the running ones")
    return "preemption_storm", "critical", "The KV pool is full: vLLM preempts", what, change


def _more_pool(
    scene: Scene,
    mean: Figure | None,
    running: Figure | None,
    waiting: Figure | None,
    unseen: list[str],
) -> list[Statement]:
    """The pool that would have held every running and waiting request at the mean size:
    its memory, as --kv-cache-memory-bytes or as --gpu-memory-utilization."""
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
        scene.gpu_memory,
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
        "the GPU's memory (no series has it; `glassbox explain --gpu-memory`), so no "
        "--gpu-memory-utilization for that pool"
    )
    return say(
        "it takes {memory} of KV memory a GPU (now {now}): more utilization, quantized "
        "weights (the decode finding) or more replicas",
        memory=memory,
        now=now,
    )
