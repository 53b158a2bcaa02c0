"""What a lab run found, as typed values; `to_json()` gives results.json's shape.

results.json is a contract (SPEC §6): every phase has `kind`; quantization has
`variants[]` (`name, weights_bytes, kv_cache_tokens, kv_cache_blocks, block_size,
ttft_seconds, tpot_seconds`) and `fit`; kv-pressure has `kv_cache_blocks,
kv_cache_tokens, timeline[], max_preemption_jump`; spec-decode has `runs[]`, `speedup`
and `first_request_prefill_seconds`. A value that could not be measured is null, never
0 and never NaN.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from vllm_glassbox.exporter.derive import marginal_weight_read_bandwidth

GIB = 1024**3

JSON = dict[str, Any]


@dataclass(frozen=True)
class Startup:
    """Facts of one server start: from its log, its cache config and its checkpoint."""

    served_model_name: str
    startup_seconds: float  # from asking for the server to /health answering
    weights_bytes: float | None
    weights_source: str | None  # log | safetensors | config
    load_seconds: float | None  # weight loading, from the log
    kv_cache_memory_bytes: float | None
    kv_cache_tokens: int | None
    kv_cache_blocks: int | None
    block_size: int | None
    vllm_version: str | None
    log_path: str | None

    @property
    def weights_gib(self) -> float | None:
        return None if self.weights_bytes is None else self.weights_bytes / GIB


@dataclass(frozen=True)
class RequestStats:
    """Derived values of the increase around some requests (exporter/derive.py)."""

    requests: int
    prompt_tokens: int
    generated_tokens: float
    wall_seconds: float
    ttft_seconds: float | None
    tpot_seconds: float | None
    inter_token_latency_seconds: float | None
    forward_passes: float  # decode steps of the requests (Δ ITL count)
    tokens_per_forward_pass: float | None
    decode_seconds: float  # Δ ITL sum
    prefill_seconds: float | None  # mean per request
    engine_steps: float
    drafts: float
    draft_tokens: float
    accepted_tokens: float
    acceptance_ratio: float | None
    draft_coverage: float | None


@dataclass(frozen=True)
class VariantResult:
    name: str
    model: str
    fit: bool
    startup: Startup | None = None
    stats: RequestStats | None = None
    error: str | None = None

    @property
    def weights_gib(self) -> float | None:
        return self.startup.weights_gib if self.startup else None

    @property
    def tpot_seconds(self) -> float | None:
        return self.stats.tpot_seconds if self.stats else None

    def to_json(self) -> JSON:
        return {
            "name": self.name,
            "model": self.model,
            "fit": self.fit,
            "error": self.error,
            **(_startup_json(self.startup)),
            **(asdict(self.stats) if self.stats else {"ttft_seconds": None, "tpot_seconds": None}),
        }


def _startup_json(startup: Startup | None) -> JSON:
    if startup is None:
        return {
            k: None for k in ("weights_bytes", "kv_cache_tokens", "kv_cache_blocks", "block_size")
        }
    return {**asdict(startup), "weights_gib": startup.weights_gib}


@dataclass(frozen=True)
class Prediction:
    name: str
    weights_gib: float
    tpot_seconds: float  # measured
    predicted_tpot_seconds: float
    error_ratio: float  # predicted / measured − 1


@dataclass(frozen=True)
class Fit:
    """TPOT = slope · GiB + intercept, least squares through the fitted variants."""

    slope_seconds_per_gib: float
    intercept_seconds: float
    r_squared: float | None  # None when every fitted TPOT is the same
    fitted: tuple[str, ...]
    predictions: tuple[Prediction, ...]

    @property
    def marginal_bandwidth_bytes_per_second(self) -> float | None:
        """The slope read as a bandwidth: what one more byte of weights costs per step
        (`derive.marginal_weight_read_bandwidth`; not the exporter's per-GPU bandwidth
        from the mean step)."""
        return marginal_weight_read_bandwidth(self.slope_seconds_per_gib)

    def to_json(self) -> JSON:
        return {
            **asdict(self),
            "fitted": list(self.fitted),
            "marginal_bandwidth_bytes_per_second": self.marginal_bandwidth_bytes_per_second,
        }


@dataclass(frozen=True)
class QuantizationResult:
    variants: tuple[VariantResult, ...]
    fit: Fit | None
    fit_problem: str | None  # why there is no fit

    def to_json(self) -> JSON:
        return {
            "variants": [v.to_json() for v in self.variants],
            "fit": self.fit.to_json() if self.fit else None,
            "fit_problem": self.fit_problem,
        }


@dataclass(frozen=True)
class TimelinePoint:
    t: float  # seconds since the flood started
    running: float | None
    waiting: float | None
    kv_cache_usage: float | None  # 0–1
    preemptions: float  # since the flood started
    generated_tokens: float  # since the flood started


@dataclass(frozen=True)
class Act:
    name: str  # filling | saturated with a queue | preemption storm | draining
    start_t: float
    end_t: float
    polls: int
    preemptions: float
    peak_waiting: float
    peak_kv_cache_usage: float


@dataclass(frozen=True)
class KvPressureResult:
    startup: Startup | None
    requests: int
    completed: int
    failed: int
    flood_seconds: float  # from the first request sent to the last answered
    timeline: tuple[TimelinePoint, ...]
    acts: tuple[Act, ...]
    max_preemption_jump: float
    max_preemption_jump_at: float | None
    preemptions_total: float
    peak_waiting: float | None
    peak_kv_cache_usage: float | None
    first_full_at: float | None
    first_waiting_at: float | None
    first_preemption_at: float | None
    request_errors: tuple[str, ...] = ()

    def to_json(self) -> JSON:
        body = asdict(self)
        body.pop("startup")
        return {
            **_startup_json(self.startup),
            **body,
            "timeline": [asdict(p) for p in self.timeline],
            "acts": [asdict(a) for a in self.acts],
            "request_errors": list(self.request_errors),
        }


@dataclass(frozen=True)
class SpecRunResult:
    label: str
    extra: dict[str, Any]
    baseline: bool
    stats: RequestStats
    speedup: float | None  # baseline TPOT / this run's TPOT; None for the baseline

    def to_json(self) -> JSON:
        return {
            "label": self.label,
            "extra": self.extra,
            "baseline": self.baseline,
            "speedup": self.speedup,
            **asdict(self.stats),
        }


@dataclass(frozen=True)
class SpecDecodeResult:
    startup: Startup | None
    runs: tuple[SpecRunResult, ...]
    speedup: float | None  # of the first run that is not the baseline
    first_request_prefill_seconds: float | None  # the cold request right after startup
    first_request_ttft_seconds: float | None
    warm_prefill_seconds: float | None  # mean prefill of the measured requests

    def to_json(self) -> JSON:
        return {
            **_startup_json(self.startup),
            "runs": [r.to_json() for r in self.runs],
            "speedup": self.speedup,
            "first_request_prefill_seconds": self.first_request_prefill_seconds,
            "first_request_ttft_seconds": self.first_request_ttft_seconds,
            "warm_prefill_seconds": self.warm_prefill_seconds,
        }


PhaseBody = QuantizationResult | KvPressureResult | SpecDecodeResult


@dataclass(frozen=True)
class PhaseResult:
    name: str
    kind: str
    status: str  # ok | failed | interrupted
    started_at: float  # unix seconds
    ended_at: float
    body: PhaseBody | None = None
    error: str | None = None

    def to_json(self) -> JSON:
        return {
            "name": self.name,
            "kind": self.kind,
            "status": self.status,
            "error": self.error,
            "started_at": self.started_at,
            "ended_at": self.ended_at,
            "duration_seconds": self.ended_at - self.started_at,
            **(self.body.to_json() if self.body else {}),
        }


@dataclass(frozen=True)
class ExporterSeries:
    """The exporter's own derived series at the end of one segment (the demo)."""

    segment: str
    values: dict[str, float]


@dataclass
class LabResults:
    plan: str
    backend: str
    started_at: float
    ended_at: float | None = None
    status: str = "running"  # running | ok | failed | interrupted
    phases: list[PhaseResult] = field(default_factory=list)
    exporter: list[ExporterSeries] = field(default_factory=list)
    images: dict[str, str] = field(default_factory=dict)  # title -> path in the output dir
    notes: list[str] = field(default_factory=list)
    version: str = ""

    def to_json(self) -> JSON:
        return {
            "plan": self.plan,
            "backend": self.backend,
            "glassbox_version": self.version,
            "status": self.status,
            "started_at": self.started_at,
            "ended_at": self.ended_at,
            "phases": [p.to_json() for p in self.phases],
            "exporter": [asdict(e) for e in self.exporter],
            "images": self.images,
            "notes": self.notes,
        }
