"""The diagnoses: what an engineer who knows vLLM concludes from one scene, in words.

Each diagnosis is a small function, `Scene -> list[Finding]`, listed in `DIAGNOSES`;
`explain()` runs them all and orders what they found (glassbox's own blind spots first,
then by severity). Another diagnosis is one more function and one more line in
`DIAGNOSES`, with what it reads added to the scene by each reader. A finding may name
the findings that usually explain it (`Finding.see`: an SLO burning names the pool, decode
and speculation findings); `explain()` keeps those the scene has.

The rules every diagnosis keeps:

- every number is a figure (`findings.py`): read as the source gave it, or computed by
  the derivation core (`core(derive.FUNCTION, …)`). No arithmetic here:
  `tests/explain/test_no_arithmetic.py` reads this module and fails on any;
- a reading that is absent is never advised on: the finding says what is missing;
- the thresholds are the alerts' (alerts/glassbox-alerts.yaml), so that a finding and an
  alert agree on what is a storm, a saturated pool, a bypassed or a useless speculation.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace

from vllm_glassbox.core import derive
from vllm_glassbox.core import slo as objectives
from vllm_glassbox.core import snapshot as s
from vllm_glassbox.explain.findings import (
    Explained,
    Figure,
    Finding,
    Severity,
    Statement,
    core,
    counted,
    joined,
    ordered,
    read,
    say,
    say_if,
)
from vllm_glassbox.explain.scene import Blind, LabVariant, ObjectiveState, Reading, Scene

Diagnosis = Callable[[Scene], list[Finding]]

#: VLLMPreemptionStorm: at least this many preemptions, on a pool at least STORM_FILL full,
#: with requests waiting for room.
STORM_PREEMPTIONS = 3.0
STORM_FILL = 0.9
#: VLLMKVCacheSaturated: a pool at least this full while requests wait for it.
SATURATED_FILL = derive.KV_POOL_FULL
#: VLLMKVCacheExhaustionForecast: a pool forecast to be full sooner than this is worth a
#: word before it happens.
FULL_SOON_SECONDS = derive.KV_EXHAUSTION_WARNING_SECONDS
#: VLLMSpecDecodeBypassed: under this share of decode steps drafted.
BYPASSED_COVERAGE = 0.1
#: VLLMSpecDecodeAcceptanceLow: under this share of draft tokens accepted.
LOW_ACCEPTANCE = 0.3
#: Under this many tokens a forward pass, speculation cannot pay for its drafting and
#: verifying (at most a tenth faster, before they cost anything).
CANNOT_PAY_PER_PASS = 1.1
#: VLLMDecodeBandwidthLow: decode reads the weights under this share of the peak.
LOW_BANDWIDTH = 0.4
#: From this share of the peak up, weight reads are most of a decode step.
WEIGHT_BOUND = 0.6
#: Fewer decode steps than this say too little to judge decode or speculation on.
MIN_DECODE_STEPS = 10.0
#: A stage with at least this share of a start dominates it.
DOMINANT_STAGE = 0.5

#: Shapes of vLLM's output glassbox does not read (glassbox_input_unrecognised) that leave
#: a diagnosis' inputs untrustworthy: with one flagged it says so, and advises nothing.
UNTRUSTED = {
    "speculation": ("v0_spec_counters", "several_servers_behind_the_target"),
    "decode": (
        "weights_of_another_model",
        "experts_across_engines",
        "unplaced_engine",
        "several_servers_behind_the_target",
    ),
    "kv_pool": ("hybrid_kv_groups", "no_cache_config_info", "several_servers_behind_the_target"),
}
#: Tokens per engine step are no count of a batch on a V0 page (docs/exporter.md).
UNTRUSTED_BATCH = "v0_engine_steps"

RUNBOOK = "https://github.com/vllm-glassbox/vllm-glassbox/blob/main/alerts/runbook.md"
STAGE_WORDS = {
    "weights_load": "loading the weights",
    "compile": "torch.compile",
    "cuda_graphs": "capturing CUDA graphs",
    "engine_init": "the engine's initialisation",
}


def window(scene: Scene) -> Figure:
    """The scene's window, as a figure of its own."""
    scope = scene.scope
    return Figure(scope.window_seconds, "seconds", "read", (_WINDOWS[scope.source],))


_WINDOWS = {
    "prometheus": "the window (--since)",
    "exporter": "the exporter's window (--window)",
    "lab": "the measured requests",
}


def _flagged(scene: Scene, shapes: Sequence[str]) -> list[str]:
    return [b.shape for b in scene.blind if b.shape is not None and b.shape in shapes]


def untrusted(diagnosis: Diagnosis) -> Diagnosis:
    """`diagnosis`, unless glassbox flagged a shape of its inputs it does not read: then
    one finding that says which, and nothing advised."""
    shapes = UNTRUSTED[diagnosis.__name__]

    def guarded(scene: Scene) -> list[Finding]:
        flagged = _flagged(scene, shapes)
        if not flagged:
            return diagnosis(scene)
        return [
            Finding(
                diagnosis.__name__,
                "not_judged",
                "info",
                f"{diagnosis.__name__.replace('_', ' ').capitalize()}: not judged",
                say(
                    f"glassbox does not trust what this would be judged on ({', '.join(flagged)}"
                    "): nothing is advised"
                ),
                unseen=tuple(f'glassbox_input_unrecognised{{shape="{s}"}}' for s in flagged),
            )
        ]

    guarded.__name__ = diagnosis.__name__
    guarded.__doc__ = diagnosis.__doc__
    return guarded


def _lab_reading(scene: Scene, value: float | None, what: str) -> Reading | None:
    if value is None or scene.lab is None:
        return None
    return Reading(value, f"{scene.lab.source}: {what}")


# --- glassbox itself ----------------------------------------------------------------------


#: Each blind spot: its severity, title, and its sentence with a count and without one
#: ({detail}: what shows it, in words; the count is a figure).
_BLIND_WORDS: dict[str, tuple[Severity, str, str, str]] = {
    "target_down": (
        "critical",
        "glassbox cannot read vLLM",
        "{count} exporters of this model cannot read their vLLM now ({detail}): every "
        "series they derive is absent",
        "the exporter's latest poll of vLLM failed ({detail}): every series it derives is absent",
    ),
    "scrape_failed": (
        "critical",
        "Prometheus cannot scrape part of this namespace",
        "Prometheus' latest scrape of {count} targets of {detail} failed (up == 0): their "
        "series are missing from everything below",
        "Prometheus' latest scrapes of {detail} failed (up == 0): their series are missing "
        "from everything below",
    ),
    "no_exporter": (
        "warning",
        "No glassbox exporter beside this model",
        "{detail}: the weights, the KV pool in tokens, bandwidth and cold starts are unknown",
        "{detail}: the weights, the KV pool in tokens, bandwidth and cold starts are unknown",
    ),
    "failed_polls": (
        "warning",
        "Some polls of vLLM failed",
        "{count} polls of vLLM failed in the window ({detail}): the windowed series span "
        "them, the gauges of those moments are lost",
        "polls of vLLM failed in the window ({detail}): the windowed series span them, the "
        "gauges of those moments are lost",
    ),
    "input_unrecognised": (
        "warning",
        "glassbox does not read part of vLLM's output",
        "{detail}: the series it would feed are absent, not guessed",
        "{detail}: the series it would feed are absent, not guessed",
    ),
}


def glassbox(scene: Scene) -> list[Finding]:
    """What glassbox could not read: a failed poll, failed scrapes, a shape of vLLM's log
    or page it does not know. These come before everything else."""
    out = []
    for blind in scene.blind:
        severity, title, counted_, uncounted = _BLIND_WORDS[blind.kind]
        # The detail is words (reasons, shapes, jobs): braces in it are no fields.
        detail = blind.detail.replace("{", "{{").replace("}", "}}")
        if blind.count is not None and "{count}" in counted_:
            count = Figure(blind.count, "count", "read", (blind.source,))
            what = say(counted_.replace("{detail}", detail), count=count)
        else:
            what = say(uncounted.replace("{detail}", detail))
        out.append(
            Finding(
                "glassbox", blind.kind, severity, title, what, unseen=(f"shown by {blind.source}",)
            )
        )
    return out


# --- idle ---------------------------------------------------------------------------------


def _decode_steps(scene: Scene) -> Figure | None:
    return counted(scene.decode, s.ITL_COUNT)


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
    steps = _decode_steps(scene)
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


# --- the KV pool --------------------------------------------------------------------------


def kv_pool(scene: Scene) -> list[Finding]:
    """The pool running full: filling, full with requests waiting, preempting in a storm;
    and how much memory (or which utilization) would hold the demand."""
    capacity = read(scene.kv_capacity, "tokens")
    fill = read(scene.kv_usage_peak, "ratio")
    steps = _decode_steps(scene)
    if capacity is None or fill is None:
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
    preempted = counted(scene.decode, s.PREEMPTIONS)
    waiting_reading = scene.waiting_capacity_peak or scene.waiting_peak
    waiting = read(waiting_reading, "count")
    deferred = read(scene.waiting_deferred_peak, "count")
    running = read(scene.running_peak, "count")
    mean = core(
        derive.kv_cache_mean_request_tokens, scene.kv_used_mean, scene.running_mean, unit="tokens"
    )
    exhaustion = read(scene.kv_exhaustion, "seconds")
    waited = waiting is not None and waiting.value > 0
    storm = (
        preempted is not None
        and preempted.value >= STORM_PREEMPTIONS
        and fill.value >= STORM_FILL
        and waited
    )
    saturated = fill.value >= SATURATED_FILL and waited
    full = fill.value >= SATURATED_FILL
    # 0 is a pool full now, which vLLM's own usage says better: no forecast then.
    soon = exhaustion is not None and 0 < exhaustion.value < FULL_SOON_SECONDS
    if not (storm or saturated or full or soon):
        return []

    unseen = []
    if scene.waiting_capacity_peak is None:
        unseen.append(
            "why requests waited: vLLM 0.20+ splits the queue into waiting for KV room "
            "and deferred (num_requests_waiting_by_reason); here every waiting request is "
            "taken as waiting for room"
        )
    if preempted is None:
        unseen.append("preemptions (vllm:num_preemptions_total absent)")
    assumes = ["the engines are alike: one engine's pool, the fullest engine's fill"]

    severity: Severity
    if storm and preempted is not None and waiting is not None:
        recomputed = core(derive.tokens_recomputed_by_preemptions, preempted, mean, unit="tokens")
        finding, severity, title = (
            "preemption_storm",
            "critical",
            "The KV pool is full: vLLM preempts",
        )
        what = say(
            "the KV pool ({capacity} tokens an engine) ran {fill} full, and vLLM preempted "
            "requests {preempted} times in {window} while up to {waiting} waited for room",
            capacity=capacity,
            fill=fill,
            preempted=preempted,
            window=window(scene),
            waiting=waiting,
        )
        change = []
        if recomputed is not None and mean is not None:
            change.append(
                say(
                    "each preemption drops a request's KV cache and prefills it again: at the "
                    "mean request size of {mean} tokens, about {recomputed} tokens were "
                    "computed twice",
                    mean=mean,
                    recomputed=recomputed,
                )
            )
            assumes.append("preempted requests had the mean size of the running ones")
    elif saturated and waiting is not None:
        severity = "warning"
        finding, title = "saturated", "The KV pool is full: requests wait"
        what = say(
            "the KV pool ({capacity} tokens an engine) ran {fill} full with up to {waiting} "
            "requests waiting for room in {window}",
            capacity=capacity,
            fill=fill,
            waiting=waiting,
            window=window(scene),
        )
        change = []
    elif full:
        severity = "info"
        finding, title = "full", "The KV pool runs full, nobody waits"
        what = say(
            "the KV pool ({capacity} tokens an engine) ran {fill} full in {window}, and no "
            "request waited for room: it keeps up, with nothing to spare",
            capacity=capacity,
            fill=fill,
            window=window(scene),
        )
        change = []
    else:
        assert exhaustion is not None
        severity = "warning"
        finding, title = "filling", "The KV pool fills"
        what = Statement(
            "at the growth of the last window the KV pool ({capacity} tokens an engine, "
            "{fill} full at most) is full in {exhaustion}",
            {"capacity": capacity, "fill": fill, "exhaustion": exhaustion},
        )
        change = []
    if deferred is not None and deferred.value > 0:
        change.append(
            say(
                "up to {deferred} requests were deferred for another reason than KV room "
                "(a LoRA budget, a KV transfer): more pool does not admit them",
                deferred=deferred,
            )
        )
    if waited:  # a pool nobody waited for needs no more room
        change.extend(_more_pool(scene, mean, running, waiting, unseen))
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
            f"{RUNBOOK}#vllmpreemptionstorm" if storm else f"{RUNBOOK}#vllmkvcachesaturated",
        )
    ]


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
    if scene.kv_memory_fixed:
        return [
            holds,
            say(
                "--kv-cache-memory-bytes {memory} gives it (now {now}, {per_token} a token)",
                memory=memory,
                now=now,
                per_token=per_token,
            ),
        ]
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
        return [
            holds,
            say(
                "--gpu-memory-utilization {utilization} gives it {memory} of KV memory a GPU "
                "(now {current}: {now})",
                utilization=utilization,
                memory=memory,
                current=current,
                now=now,
            ),
        ]
    unseen.append(
        "the GPU's memory (no series has it; `glassbox explain --gpu-memory`), so no "
        "--gpu-memory-utilization for that pool"
    )
    return [
        holds,
        say(
            "it takes {memory} of KV memory a GPU (now {now}): more utilization, quantized "
            "weights (the decode finding) or more replicas",
            memory=memory,
            now=now,
        ),
    ]


# --- speculative decoding -----------------------------------------------------------------


def _skips_penalized(version: str | None) -> bool:
    """vLLM up to 0.11 skips speculation for requests with penalties, min_p or logprobs."""
    try:
        major, minor = (int(p) for p in (version or "").split(".")[:2])
    except ValueError:
        return False
    return (major, minor) <= (0, 11)


def speculation(scene: Scene) -> list[Finding]:
    """Speculation configured but bypassed, accepting too little to pay for itself, or
    paying: tokens per forward pass, and the speed-up where a plain step is known."""
    steps = _decode_steps(scene)
    if not scene.spec_configured or steps is None or steps.value < MIN_DECODE_STEPS:
        return []
    coverage = core(derive.spec_draft_coverage, scene.decode, unit="ratio")
    acceptance = core(derive.spec_acceptance_ratio, scene.decode, unit="ratio")
    length = core(derive.spec_mean_acceptance_length, scene.decode, unit="factor")
    per_pass = core(derive.tokens_per_forward_pass, scene.decode, unit="factor")
    step = core(derive.inter_token_latency, scene.decode, unit="seconds")
    tpot = core(derive.time_per_output_token, scene.decode, unit="seconds")
    drafts = counted(scene.decode, s.SPEC_DRAFTS)
    if coverage is None or per_pass is None:
        return []
    plain = _lab_reading(
        scene,
        scene.lab.plain_step_seconds if scene.lab else None,
        "spec-decode's run without speculation, its decode step",
    )
    speedup = core(derive.spec_speedup, step, per_pass, plain, unit="times")
    runbook = f"{RUNBOOK}#vllmspecdecodebypassed"
    if coverage.value < BYPASSED_COVERAGE:
        why = (
            f"vLLM {scene.vllm_version} skips speculation for every request with a "
            "repetition, frequency or presence penalty, min_p or logprobs — and a model's "
            "generation_config.json can set a penalty by default (Qwen2.5: "
            "repetition_penalty 1.05), which applies to every request that sets none"
            if _skips_penalized(scene.vllm_version)
            else "the proposer found nothing to draft (ngram: no match of the latest tokens "
            "in the context), or this vLLM skips speculation for the requests' sampling "
            "parameters"
        )
        change = [
            say(
                'send "repetition_penalty": 1.0 (no min_p, no logprobs) where the output '
                "allows it, or start vLLM with --generation-config vllm to drop the model's "
                "defaults"
            )
        ]
        lab_speedup = read(
            _lab_reading(
                scene,
                scene.lab.speculative_speedup if scene.lab else None,
                "spec-decode speedup",
            ),
            "times",
        )
        if lab_speedup is not None:
            change.append(
                say(
                    "the lab measured decode {speedup} faster with drafts on its prompt",
                    speedup=lab_speedup,
                )
            )
        return [
            Finding(
                "speculation",
                "bypassed",
                "warning",
                "Speculation is configured but bypassed",
                say(
                    "speculation is configured, but only {coverage} of {steps} decode steps "
                    "drafted in {window}: {per_pass} tokens per forward pass",
                    coverage=coverage,
                    steps=steps,
                    window=window(scene),
                    per_pass=per_pass,
                ),
                tuple(change),
                (f"why: {why}",),
                (
                    "the requests' sampling parameters (no series shows them): the cause is "
                    "inferred from the version and the counters",
                ),
                runbook,
            )
        ]
    if acceptance is not None and acceptance.value < LOW_ACCEPTANCE:
        change = []
        needed = core(derive.spec_break_even_tokens_per_pass, step, plain, unit="factor")
        if needed is not None:
            change.append(
                say(
                    "a step with speculation costs {needed} plain steps: it pays from {needed} "
                    "tokens per forward pass",
                    needed=needed,
                )
            )
        change.append(
            say(
                "draft fewer tokens (num_speculative_tokens), or a proposer that predicts "
                "this traffic better (a draft model, EAGLE); sampled requests (a temperature "
                "above zero) reject more drafts: speculation off for them"
            )
        )
        cannot_pay = per_pass.value < CANNOT_PAY_PER_PASS or (
            needed is not None and per_pass.value < needed.value
        )
        return [
            Finding(
                "speculation",
                "not_paying" if cannot_pay else "low_acceptance",
                "warning",
                "Speculation cannot pay for itself"
                if cannot_pay
                else "Speculation accepts few of its drafts",
                say(
                    "{coverage} of decode steps drafted, but only {acceptance} of draft tokens "
                    "were accepted: {per_pass} tokens per forward pass, so decoding is at most "
                    "{per_pass} times as fast as without speculation, before what drafting "
                    "and verifying cost",
                    coverage=coverage,
                    acceptance=acceptance,
                    per_pass=per_pass,
                ),
                tuple(change),
                (
                    "the speed-up is at most the tokens per forward pass: a step with "
                    "speculation costs at least a plain one",
                ),
                ()
                if plain is not None
                else ("a decode step without speculation (--lab gives one)",),
                f"{RUNBOOK}#vllmspecdecodeacceptancelow",
            )
        ]
    if speedup is not None:
        what = say(
            "speculation pays: {per_pass} tokens per forward pass ({acceptance} of draft "
            "tokens accepted, on {coverage} of decode steps), a token every {tpot}: "
            "{speedup} as fast as a plain step",
            per_pass=per_pass,
            acceptance=acceptance,
            coverage=coverage,
            tpot=tpot,
            speedup=speedup,
        )
        unseen: tuple[str, ...] = ()
    else:
        what = say(
            "speculation works: {per_pass} tokens per forward pass ({acceptance} of draft "
            "tokens accepted, on {coverage} of decode steps, {drafts} drafts), a token every "
            "{tpot}",
            per_pass=per_pass,
            acceptance=acceptance,
            coverage=coverage,
            drafts=drafts,
            tpot=tpot,
        )
        unseen = (
            "the speed-up: it needs a decode step without speculation (--lab with a "
            "spec-decode phase); at most the tokens per forward pass",
        )
    change = []
    needed = core(derive.spec_break_even_tokens_per_pass, step, plain, unit="factor")
    cover = core(derive.spec_coverage_needed, needed, length, unit="ratio")
    if needed is not None and cover is not None:
        change.append(
            say(
                "it pays while at least {cover} of decode steps draft at this acceptance "
                "({needed} tokens per forward pass break even)",
                cover=cover,
                needed=needed,
            )
        )
    return [
        Finding(
            "speculation",
            "working",
            "ok",
            "Speculation works",
            what,
            tuple(change),
            unseen=unseen,
        )
    ]


# --- decode -------------------------------------------------------------------------------


def decode(scene: Scene) -> list[Finding]:
    """Whether weight reads bound a decode step (the achieved bandwidth against the peak),
    and what another precision would do to the step and to the pool."""
    steps = _decode_steps(scene)
    if steps is None or steps.value < MIN_DECODE_STEPS:
        return []
    step = core(derive.inter_token_latency, scene.decode, unit="seconds")
    tpot = core(derive.time_per_output_token, scene.decode, unit="seconds")
    batch = None
    if not _flagged(scene, (UNTRUSTED_BATCH,)):
        batch = core(derive.tokens_per_engine_step, scene.decode, unit="factor")
    if step is None or tpot is None:
        return []
    weights = read(scene.weights, "bytes")
    if weights is None:
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
    bandwidth = core(
        derive.weight_read_bandwidth_per_gpu,
        scene.decode,
        scene.weights,
        scene.tensor_parallel,
        unit="bytes_per_second",
    )
    share = core(
        derive.memory_bandwidth_utilization,
        scene.decode,
        scene.weights,
        scene.peak_bandwidth,
        scene.tensor_parallel,
        unit="ratio",
    )
    floor = core(
        derive.decode_floor_seconds,
        scene.weights,
        scene.peak_bandwidth,
        scene.tensor_parallel,
        unit="seconds",
    )
    peak = read(scene.peak_bandwidth, "bytes_per_second")
    assumes = ["a decode step reads every weight once (one copy per GPU share, TP × PP)"]
    if scene.mixture_of_experts:
        assumes.append("mixture of experts: one token's active weights; a batch reads more")
    unseen: list[str] = []
    if bandwidth is None:
        return []
    if share is None or peak is None or floor is None:
        unseen.append(
            "the GPU's peak bandwidth (glassbox_gpu_memory_bandwidth_bytes_per_second: the "
            "exporter's --gpu or --gpu-memory-bandwidth)"
            if peak is None
            else "a share of the peak: the achieved bandwidth is above it (a misread layout)"
        )
        severity: Severity = "info"
        finding, title = "bandwidth_only", "Decode: the bandwidth it reaches"
        what = say(
            "a decode step takes {step} ({tpot} a token) and reads the weights ({weights}) "
            "at {bandwidth} a GPU",
            step=step,
            tpot=tpot,
            weights=weights,
            bandwidth=bandwidth,
        )
    elif share.value >= WEIGHT_BOUND:
        severity = "info"
        finding, title = "weight_bound", "Decode is bound by weight reads"
        assumes.append("the peak is the datasheet's (or the one given): a GPU reaches less")
        what = say(
            "decode reads the weights at {bandwidth}, {share} of the GPU's {peak}: it is "
            "bound by weight reads (a step {step}; the weights ({weights}) alone take "
            "{floor} at the peak)",
            bandwidth=bandwidth,
            share=share,
            peak=peak,
            step=step,
            weights=weights,
            floor=floor,
        )
    else:
        finding, title = "not_weight_bound", "Decode is not bound by weight reads"
        severity = "warning" if share.value < LOW_BANDWIDTH else "info"
        assumes.append("the peak is the datasheet's (or the one given): a GPU reaches less")
        what = joined(
            say(
                "decode reads the weights at only {share} of the GPU's {peak} ({bandwidth}): "
                "a step takes {step}, reading the weights ({weights}) would take {floor} at "
                "the peak; the rest is per-step work (kernel launches, sampling, scheduling, "
                "attention)",
                share=share,
                peak=peak,
                bandwidth=bandwidth,
                step=step,
                weights=weights,
                floor=floor,
            ),
            say_if(", at {batch} tokens per engine step", batch=batch),
        )
    change = _other_precisions(scene, bandwidth, unseen)
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


def _other_precisions(scene: Scene, bandwidth: Figure, unseen: list[str]) -> list[Statement]:
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
                pool,
            )
        )
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
    measured = read(_lab_reading(scene, v.tpot_seconds, f"{v.name} tpot_seconds"), "seconds")
    error = core(derive.prediction_error, predicted, measured, unit="error")
    on_line = core(
        derive.decode_step_on_line,
        weights,
        _lab_reading(scene, scene.lab.slope_seconds_per_gib, "fit slope_seconds_per_gib"),
        _lab_reading(scene, scene.lab.intercept_seconds, "fit intercept_seconds"),
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
        _lab_reading(
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


# --- cold starts --------------------------------------------------------------------------


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


# --- service-level objectives -------------------------------------------------------------

#: Each burn alert (glassbox/slo_rules.yaml, most urgent first: `slo.BURN_ALERTS`) as a
#: finding: its name, severity and title. A fast burn is critical, as its page; a slow
#: burn and a ticket's are warnings: the budget goes, not within hours.
BURNS: dict[str, tuple[str, Severity, str]] = {
    "VLLMSLOFastBurn": ("fast_burn", "critical", "its error budget burns fast"),
    "VLLMSLOSlowBurn": ("slow_burn", "warning", "its error budget burns"),
    "VLLMSLOTicketBurn": ("ticket_burn", "warning", "its error budget runs out early"),
}
BOUNDARY_MISSING = "VLLMSLOBoundaryMissing"
#: The records' windows (their names' suffixes) in words.
WINDOW_WORDS = {
    "rate5m": "the last five minutes",
    "rate30m": "the last thirty minutes",
    "rate1h": "the last hour",
    "rate2h": "the last two hours",
    "rate6h": "the last six hours",
    "rate1d": "the last day",
    "rate3d": "the last three days",
}
#: The window a kept objective is told by: the first one recorded.
KEPT_WINDOWS = ("rate1h", "rate5m", "rate6h", "rate30m", "rate1d", "rate2h", "rate3d")
#: What a request must do to meet a latency objective ({threshold}: the boundary counted).
SLI_WORDS = {
    "ttft": "a first token within {threshold}",
    "tpot": "a time per output token within {threshold}",
    "e2e": "a whole answer within {threshold}",
}
_QUEUE = ("kv_pool/preemption_storm", "kv_pool/saturated")
_DECODE = (
    "decode/not_weight_bound",
    "decode/weight_bound",
    "speculation/bypassed",
    "speculation/not_paying",
    "speculation/low_acceptance",
)
#: The findings that usually explain a burn of each SLI (alerts/runbook.md, "What usually
#: explains a breach"): requests waiting for KV room delay first tokens; preemptions and a
#: slow decode step stretch the time per token; both lengthen a request end to end.
BEHIND = {
    "ttft": _QUEUE,
    "tpot": ("kv_pool/preemption_storm", *_DECODE),
    "e2e": (*_QUEUE, *_DECODE),
    "errors": (),
}
_ERRORS_UNSEEN = (
    "why requests failed: aborts and errors by finished_reason, refusals at admission "
    "(vllm:admission_rejections_total) and vLLM's log; no mechanism glassbox derives "
    "explains them"
)


def _objective_title(o: ObjectiveState, state: str) -> str:
    where = ", ".join(f"{k} {v}" for k, v in o.labels.items())
    return f"SLO {o.name}{f' ({where})' if where else ''}: {state}"


def _met(o: ObjectiveState, missed: Figure, window: str) -> Statement:
    """Over `window`, the share of requests that missed the objective, in its words."""
    threshold = read(o.threshold, "seconds")
    asked = read(o.asked_threshold, "seconds")
    if o.sli not in SLI_WORDS or threshold is None:
        return say(
            f"over {WINDOW_WORDS[window]} {{missed}} of requests were aborted, failed or refused",
            missed=missed,
        )
    met = say(
        f"over {WINDOW_WORDS[window]} {{missed}} of requests missed {SLI_WORDS[o.sli]}",
        missed=missed,
        threshold=threshold,
    )
    if asked is not None and asked.value > threshold.value:
        return joined(
            met, say(" (the bucket boundary counted, below the objective's {asked})", asked=asked)
        )
    return met


def _none_missed(o: ObjectiveState, window: str) -> Statement:
    """Over `window`, no request missed the objective."""
    threshold = read(o.threshold, "seconds")
    if o.sli not in SLI_WORDS or threshold is None:
        return say(f"over {WINDOW_WORDS[window]} no request was aborted, failed or refused")
    return say(
        f"over {WINDOW_WORDS[window]} every request got {SLI_WORDS[o.sli]}", threshold=threshold
    )


def _budget(o: ObjectiveState, target: Figure) -> Statement | None:
    """The period's error budget: what is left, or how many times over it is spent."""
    left = read(o.budget_remaining, "ratio")
    if left is None:
        return None
    if left.value >= 0:
        return say("; {left} of the error budget is left", left=left)
    spent = core(derive.burn_rate, o.error_ratios.get("period"), target, unit="times")
    return say_if(
        "; over the objective's window it has spent {spent} its error budget", spent=spent
    ) or say("; the error budget is overspent ({left} left)", left=left)


def _confidence(o: ObjectiveState, budget: Statement | None) -> tuple[list[str], list[str]]:
    assumes = [
        "each error ratio is its record at the window's end, over the record's own window "
        "(not --since), summed over the model's engines and replicas of the job"
    ]
    unseen = []
    threshold, asked = o.threshold, o.asked_threshold
    if o.sli in SLI_WORDS and threshold is not None:
        if asked is None:
            unseen.append(
                "whether the objective's own threshold is above the boundary counted (the "
                "rules count the nearest bucket boundary below it): --slo with its SLO file "
                "says"
            )
        elif asked.value > threshold.value:
            assumes.append(
                "requests between the bucket boundary counted and the objective's threshold "
                "count as missed: the burn is overstated, never understated"
            )
        elif asked.value < threshold.value:
            unseen.append(
                "the objective as the SLO file says it: its records count a boundary above "
                "the file's threshold (rules rendered from another file)"
            )
    if budget is None:
        unseen.append(
            "the error budget left (…_error_budget_remaining:ratio absent: its group runs "
            "every five minutes, and needs a request counted in the objective's window)"
        )
    if o.sli == "errors":
        unseen.append(_ERRORS_UNSEEN)
    return assumes, unseen


def _unrecorded(o: ObjectiveState) -> Finding | None:
    """An objective of the SLO file given that Prometheus has no record of."""
    if o.asked_in is None:
        return None
    return Finding(
        "slo",
        "no_records",
        "info",
        _objective_title(o, "no records"),
        say(
            "Prometheus has no record of this objective of the SLO file for this model: its "
            "rules are not loaded here, or were rendered from another file"
        ),
        unseen=(
            f'namespace_job_model_name_slo:glassbox_slo_target:ratio{{slo="{o.name}"}} '
            f"(glassbox rules --slo {o.asked_in} renders them)",
        ),
    )


def _unreadable(o: ObjectiveState, missing: Figure) -> Finding:
    """vLLM has no bucket at the objective's boundary: nothing can be judged of it."""
    what = say_if(
        "this model's vLLM histogram has no bucket at {threshold}, the boundary this "
        "objective counts, in {missing} of its series: its attainment, error budget and burn "
        "rates are absent, and nothing is judged",
        missing=missing,
        threshold=read(o.threshold, "seconds"),
    ) or say(
        "this model's vLLM histogram has no bucket at the boundary this objective counts in "
        "{missing} of its series: its attainment, error budget and burn rates are absent, and "
        "nothing is judged",
        missing=missing,
    )
    shown = BOUNDARY_MISSING in o.firing and o.alerts_source is not None
    return Finding(
        "slo",
        "boundary_missing",
        "warning",
        _objective_title(o, "cannot be read"),
        what,
        unseen=(
            "whether requests meet it: vLLM runs with other buckets than the SLO file says "
            "(docs/slo.md)",
        ),
        runbook=f"{RUNBOOK}#{BOUNDARY_MISSING.lower()}",
        also_read=(f"{o.alerts_source}: {BOUNDARY_MISSING}",) if shown else (),
    )


def _kept(
    o: ObjectiveState, window: str, burn: Figure, target: Figure, budget: Statement | None
) -> Statement:
    """Under every burn alert's factor: the share missed over `window`, its burn, the budget."""
    missed = read(o.error_ratios[window], "ratio")
    if missed is None or missed.value == 0:
        return joined(
            _none_missed(o, window), say(", against a target of {target}", target=target), budget
        )
    return joined(
        _met(o, missed, window),
        say(
            ", against a target of {target}: the error budget burns {burn} as fast as the "
            "objective allows, under every burn alert's factor",
            target=target,
            burn=burn,
        ),
        budget,
    )


def _burning(
    o: ObjectiveState,
    alert: str,
    clause: objectives.BurnClause,
    burns: Mapping[str, Figure | None],
    target: Figure,
    budget: Statement | None,
    holding: Sequence[str],
) -> Statement:
    """The alert's condition: the share missed over its long window, the burn over both
    windows above its factor, the burn alerts Prometheus shows firing, the budget."""
    long, short = clause.windows
    missed = read(o.error_ratios[long], "ratio")
    assert missed is not None  # its burn rate holds
    factor = read(Reading(clause.factor, f"{alert} (glassbox/slo_rules.yaml)"), "times")
    firing = [a for a in holding if a in o.firing]
    return joined(
        _met(o, missed, long),
        say(
            ", against a target of {target}: the error budget burns {burn_long} as fast as the "
            f"objective allows, and {{burn_short}} over {WINDOW_WORDS[short]}, above {alert}'s "
            "{factor}",
            target=target,
            burn_long=burns[long],
            burn_short=burns[short],
            factor=factor,
        ),
        say(f" ({', '.join(firing)} firing)") if firing else None,
        budget,
    )


def _objective(o: ObjectiveState) -> Finding | None:
    if not o.recorded:
        return _unrecorded(o)
    missing = read(o.boundary_missing, "count")
    if missing is not None and missing.value > 0:
        return _unreadable(o, missing)
    target = read(o.target, "ratio")
    burns = {
        window: core(derive.burn_rate, reading, o.target, unit="times")
        for window, reading in o.error_ratios.items()
    }
    window = next((w for w in KEPT_WINDOWS if burns.get(w) is not None), None)
    if target is None or window is None:
        return None  # no request counted in three days: nothing to judge, nothing said
    holding = [
        (alert, clause)
        for alert, clauses in objectives.BURN_ALERTS.items()
        for clause in clauses
        if all((b := burns.get(w)) is not None and b.value > clause.factor for w in clause.windows)
    ]
    budget = _budget(o, target)
    assumes, unseen = _confidence(o, budget)
    if not holding:
        burn = burns[window]
        assert burn is not None
        what = _kept(o, window, burn, target, budget)
        return Finding(
            "slo",
            "kept",
            "ok",
            _objective_title(o, "kept"),
            what,
            assumes=tuple(assumes),
            unseen=tuple(unseen),
        )
    alert, clause = holding[0]
    alerts = list(dict.fromkeys(a for a, _ in holding))
    finding, severity, state = BURNS[alert]
    if alert not in o.firing and o.alerts_source is not None:
        unseen.append(
            f"{alert} firing: Prometheus shows it not firing for this objective (its rules "
            "evaluated elsewhere, or at another moment)"
        )
    firing = [a for a in alerts if a in o.firing]
    return Finding(
        "slo",
        finding,
        severity,
        _objective_title(o, state),
        _burning(o, alert, clause, burns, target, budget, alerts),
        assumes=tuple(assumes),
        unseen=tuple(unseen),
        runbook=f"{RUNBOOK}#{alert.lower()}",
        see=BEHIND.get(o.sli, ()),
        also_read=(f"{o.alerts_source}: {', '.join(firing)}",) if firing else (),
    )


def slo(scene: Scene) -> list[Finding]:
    """Each service-level objective of the model, from its rules' records: burning (the
    most urgent burn alert whose condition holds, with its windows' burn rates and the
    budget left), kept, or unreadable (vLLM lacks its bucket); with an SLO file, its
    objectives Prometheus has no record of. One that counted no request says nothing.
    What usually explains a burn is named, not judged again: the pool's, decode's and
    speculation's findings of the same scene (`explain` keeps those that are there)."""
    return [f for o in scene.objectives if (f := _objective(o)) is not None]


#: Every diagnosis, in the order their findings show within one severity: an objective
#: missed first, then the mechanisms that usually explain it.
DIAGNOSES: tuple[Diagnosis, ...] = (
    glassbox,
    idle,
    slo,
    untrusted(kv_pool),
    untrusted(speculation),
    untrusted(decode),
    cold_start,
)


def explain(scene: Scene, diagnoses: Sequence[Diagnosis] = DIAGNOSES) -> Explained:
    """Every diagnosis of one scene, most severe first."""
    found: list[Finding] = []
    for diagnosis in diagnoses:
        found.extend(diagnosis(scene))
    return Explained(scene.scope, ordered(linked(found)))


def linked(found: Sequence[Finding]) -> list[Finding]:
    """Each finding's `see` kept to the findings that are there (and not `ok`); one that
    names some, none of which is there, says so."""
    there = {f.key for f in found if f.severity != "ok"}
    out = []
    for f in found:
        if f.see:
            see = tuple(k for k in f.see if k in there)
            nothing = (
                "what is behind it: none of the findings that usually explain it (the KV pool, "
                "decode, speculation) is here; the runbook's section lists where else to look"
            )
            f = replace(f, see=see, unseen=f.unseen if see else (*f.unseen, nothing))
        out.append(f)
    return out


__all__ = ["DIAGNOSES", "Blind", "explain"]
