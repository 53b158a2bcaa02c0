"""What glassbox saw of one model (in one namespace) or one server: the inputs of every
diagnosis, each number with where it was read.

A scene is filled by one reader — Prometheus (`from_prometheus.py`), an exporter's own
state (`from_exporter.py`) or a lab run (`from_lab.py`) — and read by the diagnoses
(`diagnoses/`), which compute nothing themselves: the derived numbers come from the
derivation core over the scene's counter increases and readings. A reading the source
does not have is None (absent), never 0: a finding says what is missing instead.

Scenes travel as JSON (the exporter's `/findings`, `glassbox explain --format json`):
`scene_to_json` and `scene_from_json` are each other's inverse.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from typing import Any

from vllm_glassbox.core.derive import Increase

JSON = dict[str, Any]


@dataclass(frozen=True)
class Reading:
    """A number as the source gave it, and where: the series or PromQL an operator can
    run again."""

    value: float
    source: str


@dataclass(frozen=True)
class Window:
    """vLLM's counters' increases over the scene's window (the engines summed), and how
    they were read."""

    increase: Increase
    source: str


@dataclass(frozen=True)
class Scope:
    """Which server or model, read from where, over which window."""

    source: str  # prometheus | exporter | lab
    where: str  # the URL or file it was read from
    namespace: str | None
    model: str | None
    engines: int  # vLLM engines (data-parallel ranks, replicas) the numbers cover
    window_seconds: float
    at: float | None = None  # unix seconds the window ends

    @property
    def name(self) -> str:
        if self.source == "lab":
            return self.model or "the lab run"
        parts = []
        if self.namespace:
            parts.append(f"namespace {self.namespace}")
        parts.append(f"model {self.model}" if self.model else "the server")
        return ", ".join(parts)


@dataclass(frozen=True)
class Blind:
    """Something glassbox could not read, and what it hides."""

    kind: str  # target_down | failed_polls | input_unrecognised | no_exporter | scrape_failed
    detail: str  # in words: the reason, the shape, the job
    count: float | None  # how many (polls, targets), where it counts
    source: str
    shape: str | None = None  # input_unrecognised: the shape (glassbox_input_unrecognised)


@dataclass(frozen=True)
class LabVariant:
    """One variant of a lab run's quantization phase, as measured."""

    name: str
    weights_bytes: float
    tpot_seconds: float | None
    kv_cache_tokens: int | None
    fitted: bool = False  # one of the points the lab's line was fitted through


@dataclass(frozen=True)
class LabBaseline:
    """What a lab run measured that a live server cannot show: other precisions, the
    fitted line, a decode step without speculation (`glassbox explain --lab`)."""

    source: str  # the results.json
    variants: tuple[LabVariant, ...] = ()
    slope_seconds_per_gib: float | None = None
    intercept_seconds: float | None = None
    plain_step_seconds: float | None = None  # a decode step without speculation
    speculative_speedup: float | None = None  # the spec-decode phase's headline


@dataclass(frozen=True)
class ObjectiveState:
    """One service-level objective as its rules recorded it for this model (docs/slo.md):
    one per objective and job (and aggregation label, such as cluster)."""

    name: str  # the `slo` label
    sli: str  # ttft, tpot, e2e or errors
    labels: Mapping[str, str] = field(default_factory=dict)  # job (cluster…): its series
    threshold: Reading | None = None  # seconds: the bucket boundary counted (`threshold`)
    target: Reading | None = None  # the share of requests that must be good
    #: The share that missed it, by the record's window: rate5m … rate3d, period.
    error_ratios: Mapping[str, Reading] = field(default_factory=dict)
    budget_remaining: Reading | None = None  # 1 untouched, 0 spent, below 0 overspent
    boundary_missing: Reading | None = None  # series of vLLM's histogram without its bucket
    firing: tuple[str, ...] = ()  # its alerts firing now (ALERTS)
    alerts_source: str | None = None  # where their state was read
    # With an SLO file given (`glassbox explain --slo`): the file, and its threshold.
    asked_in: str | None = None
    asked_threshold: Reading | None = None

    @property
    def recorded(self) -> bool:
        """Whether Prometheus has any of its records."""
        return bool(
            self.target or self.error_ratios or self.budget_remaining or self.boundary_missing
        )


@dataclass(frozen=True)
class EnginePool:
    """One engine's KV pool over the scene's window, as the alerts judge it: the peaks of its
    usage and queue (`max_over_time`), the preemptions counted (`increase`), when the first
    and the last were seen (unix seconds), and its forecasts at the window's end."""

    engine: str  # which engine: its model_name and engine labels
    peak_usage: Reading | None = None  # 0–1, the most over the window
    usage_now: Reading | None = None  # 0–1, at the window's end
    peak_running: Reading | None = None
    peak_waiting: Reading | None = None  # every reason
    peak_waiting_capacity: Reading | None = None  # waiting for KV room (vLLM 0.20+)
    peak_waiting_deferred: Reading | None = None  # deferred for another reason (0.20+)
    preemptions: Reading | None = None  # counted over the window
    first_preemption_at: Reading | None = None  # unix seconds
    last_preemption_at: Reading | None = None
    exhaustion_seconds: Reading | None = None  # until full at its recent growth
    headroom_at_completion: Reading | None = None  # requests; below 0: promised too much


_POOL_READINGS = tuple(f.name for f in fields(EnginePool) if f.type == "Reading | None")


@dataclass(frozen=True)
class Scene:
    scope: Scope
    #: Counter increases over the window, the engines summed; None: no counters read.
    decode: Window | None = None
    # The model and the hardware.
    weights: Reading | None = None  # bytes one decode step reads (active weights if MoE)
    mixture_of_experts: bool = False
    peak_bandwidth: Reading | None = None  # bytes/s, one GPU
    tensor_parallel: int = 1
    pipeline_parallel: int = 1
    gpu_memory: Reading | None = None  # bytes, one GPU, given by hand (--gpu-memory)
    # The GPU's own counters (dcgm-exporter), where the source has them: one GPU of the
    # model's pods, its framebuffer used and free (MiB); DRAM activity (0–1) over the
    # window, the mean of the model's GPUs.
    dcgm_fb_used: Reading | None = None
    dcgm_fb_free: Reading | None = None
    dcgm_dram_active: Reading | None = None
    # What the model's engines' GPUs cost an hour, engines summed (glassbox_engine_hourly_cost,
    # from --gpu-hour-price); None without a price.
    hourly_cost: Reading | None = None
    vllm_version: str | None = None
    # The KV pool: one engine's (engines are started alike).
    kv_capacity: Reading | None = None  # tokens
    kv_block_size: Reading | None = None  # tokens
    kv_memory: Reading | None = None  # bytes of one GPU
    kv_memory_fixed: bool = False  # sized by --kv-cache-memory-bytes, not the utilization
    gpu_memory_utilization: Reading | None = None
    kv_usage_peak: Reading | None = None  # the fullest engine, 0–1
    kv_used_mean: Reading | None = None  # tokens, engines summed, over the window
    running_mean: Reading | None = None  # requests, engines summed, over the window
    running_peak: Reading | None = None  # one engine's most
    waiting_peak: Reading | None = None  # one engine's longest queue, every reason
    waiting_capacity_peak: Reading | None = None  # waiting for KV room (vLLM 0.20+)
    waiting_deferred_peak: Reading | None = None  # deferred for another reason (0.20+)
    kv_exhaustion: Reading | None = None  # seconds until the first engine's pool is full
    #: Each engine's pool over the window (none: the source gives only the figures above).
    pools: tuple[EnginePool, ...] = ()
    # Speculative decoding: configured when vLLM shows its counters.
    spec_configured: bool = False
    # Disaggregated serving: the server's KV role (producer, consumer, both, none, unknown;
    # None: not read), its connector and where they were read; the link's peak (bytes/s).
    kv_role: str | None = None
    kv_connector: str | None = None
    kv_role_source: str | None = None
    kv_link_bandwidth: Reading | None = None
    # Adapters (--enable-lora): how many have requests in flight, and the budget.
    adapters_active: Reading | None = None
    adapter_budget: Reading | None = None
    # The latest start of vLLM, by stage (derive.STARTUP_STAGES) and "total", seconds.
    startup: Mapping[str, Reading] = field(default_factory=dict)
    # Service-level objectives of this model (their rules' records, docs/slo.md).
    objectives: tuple[ObjectiveState, ...] = ()
    # What glassbox could not read.
    blind: tuple[Blind, ...] = ()
    lab: LabBaseline | None = None

    @property
    def shards(self) -> int:
        """GPUs one copy of the model is split over (TP × PP)."""
        return self.tensor_parallel * self.pipeline_parallel


# --- JSON ---------------------------------------------------------------------------------


def _finite(value: float) -> float | None:
    return value if math.isfinite(value) else None


def _reading_json(r: Reading | None) -> JSON | None:
    return None if r is None else {"value": r.value, "source": r.source}


def _reading(data: Any) -> Reading | None:
    if data is None:
        return None
    return Reading(float(data["value"]), str(data["source"]))


_READINGS = tuple(f.name for f in fields(Scene) if f.type == "Reading | None")


def scene_to_json(scene: Scene) -> JSON:
    body: JSON = {"scope": vars(scene.scope).copy()}
    if scene.decode is not None:
        body["decode"] = {
            # NaN (a counter some poll did not see) is null in JSON: unknown.
            "counters": {k: _finite(v) for k, v in sorted(scene.decode.increase.counters.items())},
            "seconds": scene.decode.increase.seconds,
            "source": scene.decode.source,
        }
    for name in _READINGS:
        reading = _reading_json(getattr(scene, name))
        if reading is not None:
            body[name] = reading
    body |= {
        "mixture_of_experts": scene.mixture_of_experts,
        "tensor_parallel": scene.tensor_parallel,
        "pipeline_parallel": scene.pipeline_parallel,
        "vllm_version": scene.vllm_version,
        "kv_memory_fixed": scene.kv_memory_fixed,
        "spec_configured": scene.spec_configured,
        "kv_role": scene.kv_role,
        "kv_connector": scene.kv_connector,
        "kv_role_source": scene.kv_role_source,
        "startup": {stage: _reading_json(r) for stage, r in scene.startup.items()},
        "blind": [vars(b).copy() for b in scene.blind],
    }
    if scene.pools:
        body["pools"] = [_pool_json(p) for p in scene.pools]
    if scene.objectives:
        body["objectives"] = [_objective_json(o) for o in scene.objectives]
    if scene.lab is not None:
        lab = vars(scene.lab).copy()
        lab["variants"] = [vars(v).copy() for v in scene.lab.variants]
        body["lab"] = lab
    return body


def _pool_json(pool: EnginePool) -> JSON:
    body: JSON = {"engine": pool.engine}
    for name in _POOL_READINGS:
        reading = _reading_json(getattr(pool, name))
        if reading is not None:
            body[name] = reading
    return body


def pool_from_json(data: Mapping[str, Any]) -> EnginePool:
    """One engine's pool as `/findings` and scenes carry it (`pools`)."""
    readings = {name: _reading(data.get(name)) for name in _POOL_READINGS}
    return EnginePool(engine=str(data["engine"]), **readings)


def _objective_json(o: ObjectiveState) -> JSON:
    return {
        "name": o.name,
        "sli": o.sli,
        "labels": dict(o.labels),
        "threshold": _reading_json(o.threshold),
        "target": _reading_json(o.target),
        "error_ratios": {w: _reading_json(r) for w, r in o.error_ratios.items()},
        "budget_remaining": _reading_json(o.budget_remaining),
        "boundary_missing": _reading_json(o.boundary_missing),
        "firing": list(o.firing),
        "alerts_source": o.alerts_source,
        "asked_in": o.asked_in,
        "asked_threshold": _reading_json(o.asked_threshold),
    }


def _objective(data: Mapping[str, Any]) -> ObjectiveState:
    ratios = {w: r for w, raw in dict(data.get("error_ratios", {})).items() if (r := _reading(raw))}
    return ObjectiveState(
        name=str(data["name"]),
        sli=str(data["sli"]),
        labels={str(k): str(v) for k, v in dict(data.get("labels", {})).items()},
        threshold=_reading(data.get("threshold")),
        target=_reading(data.get("target")),
        error_ratios=ratios,
        budget_remaining=_reading(data.get("budget_remaining")),
        boundary_missing=_reading(data.get("boundary_missing")),
        firing=tuple(str(a) for a in data.get("firing", [])),
        alerts_source=data.get("alerts_source"),
        asked_in=data.get("asked_in"),
        asked_threshold=_reading(data.get("asked_threshold")),
    )


def scene_from_json(data: Mapping[str, Any]) -> Scene:
    """The scene `scene_to_json` wrote; KeyError, TypeError or ValueError when it is not."""
    scope = Scope(**data["scope"])
    decode = None
    if "decode" in data:
        d = data["decode"]
        counters = {k: math.nan if v is None else float(v) for k, v in d["counters"].items()}
        decode = Window(Increase(counters, float(d["seconds"])), str(d["source"]))
    lab = None
    if data.get("lab") is not None:
        raw = dict(data["lab"])
        variants = tuple(LabVariant(**v) for v in raw.pop("variants", []))
        lab = LabBaseline(variants=variants, **raw)
    scene = Scene(
        scope=scope,
        decode=decode,
        mixture_of_experts=bool(data.get("mixture_of_experts", False)),
        tensor_parallel=int(data.get("tensor_parallel", 1)),
        pipeline_parallel=int(data.get("pipeline_parallel", 1)),
        vllm_version=data.get("vllm_version"),
        kv_memory_fixed=bool(data.get("kv_memory_fixed", False)),
        spec_configured=bool(data.get("spec_configured", False)),
        kv_role=data.get("kv_role"),
        kv_connector=data.get("kv_connector"),
        kv_role_source=data.get("kv_role_source"),
        startup={
            stage: r
            for stage, raw in dict(data.get("startup", {})).items()
            if (r := _reading(raw)) is not None
        },
        pools=tuple(pool_from_json(p) for p in data.get("pools", [])),
        objectives=tuple(_objective(o) for o in data.get("objectives", [])),
        blind=tuple(Blind(**b) for b in data.get("blind", [])),
        lab=lab,
    )
    readings: dict[str, Any] = {name: _reading(data.get(name)) for name in _READINGS}
    return replace(scene, **readings)
