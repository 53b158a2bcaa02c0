"""What a lab run found, as typed values; `to_json()` gives results.json's shape.

results.json is a contract (SPEC §6): every phase has `kind`; quantization has
`variants[]` (`name, weights_bytes, kv_cache_tokens, kv_cache_blocks, block_size,
ttft_seconds, tpot_seconds` — the median of the measured requests, with
`tpot_seconds_min`/`_max` beside it) and `fit`; kv-pressure has `kv_cache_blocks,
kv_cache_tokens, timeline[], max_preemption_jump`; spec-decode has `runs[]`, `speedup`
and `first_request_prefill_seconds`. A value that could not be measured is null, never
0 and never NaN.

Every judgement in here (a median, a fit, a verdict on the line, an act) is computed by
`lab/findings.py` and only stored here, so the report and results.json say the same.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from vllm_glassbox.exporter import derive

GIB = 1024**3

JSON = dict[str, Any]

#: Cold-start stages (the exporter's: they stack up to vLLM's own start-to-ready time).
STARTUP_STAGES = derive.STARTUP_STAGES


@dataclass(frozen=True)
class Spread:
    """The middle and the extremes of repeated measurements of one thing."""

    median: float
    low: float
    high: float
    n: int

    @property
    def relative(self) -> float | None:
        """(high − low) / median: how far apart the repetitions were."""
        return (self.high - self.low) / self.median if self.median > 0 else None


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
    quantization: str | None = None  # what vLLM says it quantizes with (awq, fp8…)
    load_format: str | None = None  # "dummy": random weights of the real shapes
    #: This model's weights at 16 bits, from its config (when readable): what a quantized
    #: variant would weigh if vLLM did not quantize it.
    unquantized_bytes: float | None = None
    #: Seconds of each STARTUP_STAGES stage the log told; absent when it did not.
    stages: Mapping[str, float] = field(default_factory=dict)
    #: The model's repetition_penalty default (generation_config.json), when readable.
    default_repetition_penalty: float | None = None
    #: vLLM's tensor-parallel size (the exporter's layout rule): per-GPU bandwidth and floor.
    tensor_parallel: int = 1

    @property
    def weights_gib(self) -> float | None:
        return None if self.weights_bytes is None else self.weights_bytes / GIB

    def to_json(self) -> JSON:
        body = asdict(self)
        body["stages"] = {stage: self.stages.get(stage) for stage in STARTUP_STAGES}
        return {**body, "weights_gib": self.weights_gib}


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
class Sample:
    """One measured request: what its own increase says."""

    round: int
    ttft_seconds: float | None
    tpot_seconds: float | None
    decode_seconds: float
    generated_tokens: float
    wall_seconds: float


@dataclass(frozen=True)
class Bandwidth:
    """A variant's decode step against the hardware: weights / step time, vs the peak."""

    weight_read_bytes_per_second: float | None
    utilization: float | None  # of the peak
    decode_floor_seconds: float | None  # weights / peak


@dataclass(frozen=True)
class VariantResult:
    name: str
    model: str
    fit: bool
    startup: Startup | None = None
    stats: RequestStats | None = None  # over every measured request (their increases summed)
    error: str | None = None
    samples: tuple[Sample, ...] = ()
    tpot: Spread | None = None  # over the samples
    ttft: Spread | None = None
    noisy: bool = False  # the TPOT spread is large: the machine was busy with other work
    bandwidth: Bandwidth | None = None

    @property
    def weights_gib(self) -> float | None:
        return self.startup.weights_gib if self.startup else None

    @property
    def tpot_seconds(self) -> float | None:
        return self.tpot.median if self.tpot else None

    def to_json(self) -> JSON:
        stats = asdict(self.stats) if self.stats else {}
        return {
            "name": self.name,
            "model": self.model,
            "fit": self.fit,
            "error": self.error,
            **(_startup_json(self.startup)),
            **stats,
            # The medians over the requests (SPEC §6), the extremes beside them.
            "ttft_seconds": self.ttft.median if self.ttft else None,
            "tpot_seconds": self.tpot_seconds,
            "tpot_seconds_min": self.tpot.low if self.tpot else None,
            "tpot_seconds_max": self.tpot.high if self.tpot else None,
            "tpot_spread_ratio": self.tpot.relative if self.tpot else None,
            "noisy": self.noisy,
            "samples": [asdict(s) for s in self.samples],
            "weight_read_bandwidth_bytes_per_second": (
                self.bandwidth.weight_read_bytes_per_second if self.bandwidth else None
            ),
            "memory_bandwidth_utilization_ratio": (
                self.bandwidth.utilization if self.bandwidth else None
            ),
            "decode_floor_seconds": self.bandwidth.decode_floor_seconds if self.bandwidth else None,
        }


def _startup_json(startup: Startup | None) -> JSON:
    if startup is None:
        return {
            k: None for k in ("weights_bytes", "kv_cache_tokens", "kv_cache_blocks", "block_size")
        }
    return startup.to_json()


# Where a measured variant sits against the fitted line.
FITTED = "fitted"
ON_LINE = "on the line"
ABOVE_LINE = "above the line"  # slower than its bytes predict
BELOW_LINE = "below the line"  # faster than its bytes predict
FULL_SIZE = "loaded at full size"  # meant to be quantized, loaded as large as unquantized


@dataclass(frozen=True)
class Prediction:
    name: str
    weights_gib: float
    tpot_seconds: float  # measured (median)
    predicted_tpot_seconds: float
    error_ratio: float  # predicted / measured − 1
    verdict: str = FITTED  # FITTED, ON_LINE, ABOVE_LINE, BELOW_LINE or FULL_SIZE
    reason: str | None = None  # why it is off the line, in words


@dataclass(frozen=True)
class Fit:
    """TPOT = slope · GiB + intercept, least squares through the fitted variants."""

    slope_seconds_per_gib: float
    intercept_seconds: float
    r_squared: float | None  # None through two points (always 1) or equal TPOTs
    fitted: tuple[str, ...]
    predictions: tuple[Prediction, ...]
    tolerance: float = 0.10  # |error ratio| within which a variant is on the line
    #: The slope read as a bandwidth (`derive.marginal_weight_read_bandwidth`): what one
    #: more byte of weights costs per step — not the exporter's per-GPU bandwidth from the
    #: mean step, and not a bandwidth at all when much of a step is not weight reads
    #: (see exceeds_peak).
    marginal_bandwidth_bytes_per_second: float | None = None
    peak_bandwidth_bytes_per_second: float | None = None
    #: The slope implies more than the hardware can read: not a bandwidth.
    exceeds_peak: bool | None = None
    excluded: tuple[str, ...] = ()  # marked `fit` but not usable (loaded at full size)
    #: The intercept's share of the largest fitted variant's TPOT: how much of a decode
    #: step is not weight reads.
    intercept_share: float | None = None

    def to_json(self) -> JSON:
        return {
            **asdict(self),
            "fitted": list(self.fitted),
            "excluded": list(self.excluded),
            "points": len(self.fitted),
        }


@dataclass(frozen=True)
class QuantizationResult:
    variants: tuple[VariantResult, ...]
    fit: Fit | None
    fit_problem: str | None  # why there is no fit
    #: Variants meant to be quantized but loaded as large as an unquantized one: name ->
    #: the unquantized variant they match.
    full_size: Mapping[str, str] = field(default_factory=dict)
    rounds: int = 1

    def to_json(self) -> JSON:
        return {
            "variants": [
                {**v.to_json(), "full_size_of": self.full_size.get(v.name)} for v in self.variants
            ],
            "fit": self.fit.to_json() if self.fit else None,
            "fit_problem": self.fit_problem,
            "rounds": self.rounds,
        }


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


@dataclass(frozen=True)
class MissedPoll:
    """A poll that failed or timed out: recorded, never silently skipped."""

    t: float
    error: str


@dataclass(frozen=True)
class Act:
    name: str  # see findings.ACT_CONDITIONS
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
    poll_seconds: float | None = None  # the period the timeline was polled at
    missed_polls: tuple[MissedPoll, ...] = ()
    late_polls: int = 0  # polls that took longer than one period
    max_gap_seconds: float | None = None  # largest time between two polls' pages
    max_gap_ended_at: float | None = None  # t of the page that ended it
    missing_acts: tuple[str, ...] = ()  # of the article's three, which did not happen

    def to_json(self) -> JSON:
        body = asdict(self)
        body.pop("startup")
        return {
            **_startup_json(self.startup),
            **body,
            "timeline": [asdict(p) for p in self.timeline],
            "acts": [asdict(a) for a in self.acts],
            "request_errors": list(self.request_errors),
            "missed_polls": [asdict(m) for m in self.missed_polls],
            "missing_acts": list(self.missing_acts),
        }


@dataclass(frozen=True)
class SpecRunResult:
    label: str
    extra: dict[str, Any]
    baseline: bool
    stats: RequestStats
    speedup: float | None  # baseline TPOT / this run's TPOT; None for the baseline
    speculation: bool = True  # the server speculated (--speculative-config)
    tpot: Spread | None = None  # over its requests
    finding: str | None = None  # speculated, bypassed, or off, in words

    @property
    def tpot_seconds(self) -> float | None:
        return self.tpot.median if self.tpot else self.stats.tpot_seconds

    def to_json(self) -> JSON:
        return {
            "label": self.label,
            "extra": self.extra,
            "baseline": self.baseline,
            "speculation": self.speculation,
            "speedup": self.speedup,
            "finding": self.finding,
            **asdict(self.stats),
            "tpot_seconds": self.tpot_seconds,
            "tpot_seconds_min": self.tpot.low if self.tpot else None,
            "tpot_seconds_max": self.tpot.high if self.tpot else None,
        }


@dataclass(frozen=True)
class SpecDecodeResult:
    startup: Startup | None  # the server with speculation
    runs: tuple[SpecRunResult, ...]
    speedup: float | None  # of the first run that is not the baseline
    first_request_prefill_seconds: float | None  # the cold request right after startup
    first_request_ttft_seconds: float | None
    warm_prefill_seconds: float | None  # mean prefill of the measured requests
    startup_without_speculation: Startup | None = None
    baseline_problem: str | None = None  # why the baseline is refused (it drafted)
    penalty_finding: str | None = None  # how the running vLLM treats a repetition penalty

    def to_json(self) -> JSON:
        return {
            **_startup_json(self.startup),
            "runs": [r.to_json() for r in self.runs],
            "speedup": self.speedup,
            "baseline_problem": self.baseline_problem,
            "penalty_finding": self.penalty_finding,
            "first_request_prefill_seconds": self.first_request_prefill_seconds,
            "first_request_ttft_seconds": self.first_request_ttft_seconds,
            "warm_prefill_seconds": self.warm_prefill_seconds,
            "startup_without_speculation": (
                self.startup_without_speculation.to_json()
                if self.startup_without_speculation
                else None
            ),
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
    """The exporter's own derived series at the end of one segment."""

    segment: str
    values: dict[str, float]


@dataclass(frozen=True)
class SegmentNumbers:
    """The lab's own derived values over one whole segment (from the first snapshot after
    the server was ready to the last), the same span the exporter beside it covered."""

    segment: str
    values: dict[str, float | None]
    startup: Startup | None = None


@dataclass(frozen=True)
class Peak:
    """The hardware's peak memory bandwidth the run compared against."""

    bytes_per_second: float
    source: str  # where it comes from, in words
    samples: tuple[float, ...] = ()  # a measured peak: every repetition, bytes/s

    def to_json(self) -> JSON:
        return {**asdict(self), "samples": list(self.samples)}


@dataclass
class LabResults:
    plan: str
    backend: str
    started_at: float
    ended_at: float | None = None
    status: str = "running"  # running | ok | failed | interrupted
    phases: list[PhaseResult] = field(default_factory=list)
    exporter: list[ExporterSeries] = field(default_factory=list)
    segments: list[SegmentNumbers] = field(default_factory=list)
    images: dict[str, str] = field(default_factory=dict)  # title -> path in the output dir
    notes: list[str] = field(default_factory=list)
    version: str = ""
    description: str = ""  # the plan's
    peak: Peak | None = None
    #: Dashboard panels without data on this run: "dashboard / panel" -> why.
    empty_panels: dict[str, str] = field(default_factory=dict)

    def to_json(self) -> JSON:
        return {
            "plan": self.plan,
            "backend": self.backend,
            "glassbox_version": self.version,
            "description": self.description,
            "status": self.status,
            "started_at": self.started_at,
            "ended_at": self.ended_at,
            "peak_bandwidth": self.peak.to_json() if self.peak else None,
            "phases": [p.to_json() for p in self.phases],
            "exporter": [asdict(e) for e in self.exporter],
            "segments": [{"segment": s.segment, "values": s.values} for s in self.segments],
            "images": self.images,
            "empty_panels": self.empty_panels,
            "notes": self.notes,
        }
