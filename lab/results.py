"""What a lab run found, as typed values; `to_json()` gives results.json's shape.

results.json is a contract (SPEC §6): every phase has `kind`; quantization has
`variants[]` (`name, weights_bytes, kv_cache_tokens, kv_cache_blocks, block_size,
ttft_seconds, tpot_seconds` — the median of the measured requests, with
`tpot_seconds_min`/`_max` beside it) and `fit`; kv-pressure has `kv_cache_blocks,
kv_cache_tokens, timeline[], max_preemption_jump`; spec-decode has `runs[]`, `speedup`
and `first_request_prefill_seconds`; rate-sweep has `steps[]`, `knee` and `forecast`
(docs/lab.md lists every key). Around the phases: the lab's numbers of each segment
(`segments[]`), the exporter's page at its end (`exporter[]`) and the two compared
(`compared[]`). A value that could not be measured is null, never 0 and never NaN.

Here are the values every kind shares (a server start, the numbers of some requests, a
spread) and the run around the phases; each kind's own result is in its module
(`lab/experiments/`). Every judgement (a median, a fit, a verdict on the line, an act) is
computed by `lab/findings.py` or the kind's module and only stored in the results, so
the report and results.json say the same.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any, Protocol

from vllm_glassbox.core import derive
from vllm_glassbox.core.units import GIB
from vllm_glassbox.core.weights import Weights

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
    load_seconds: float | None  # weight loading: the log's weights_load stage
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
    #: A mixture-of-experts model's weights one token reads (the exporter's
    #: glassbox_model_active_weights_bytes); None for a dense model.
    active_weights_bytes: float | None = None

    @property
    def weights_gib(self) -> float | None:
        return None if self.weights_bytes is None else self.weights_bytes / GIB

    @property
    def weights(self) -> Weights | None:
        """The weights as the exporter resolved them, active bytes included."""
        if self.weights_bytes is None:
            return None
        return Weights(self.weights_bytes, self.weights_source or "", self.active_weights_bytes)

    def to_json(self) -> JSON:
        body = asdict(self)
        body["stages"] = {stage: self.stages.get(stage) for stage in STARTUP_STAGES}
        if self.active_weights_bytes is None:  # as on the exporter's page: for MoE models only
            del body["active_weights_bytes"]
        return {**body, "weights_gib": self.weights_gib}


@dataclass(frozen=True)
class RequestStats:
    """Derived values of the increase around some requests (core/derive/)."""

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


def startup_json(startup: Startup | None) -> JSON:
    if startup is None:
        return {
            k: None for k in ("weights_bytes", "kv_cache_tokens", "kv_cache_blocks", "block_size")
        }
    return startup.to_json()


class PhaseBody(Protocol):
    """What a phase's kind found (its module's result)."""

    def to_json(self) -> JSON: ...


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
class ComparedRow:
    """One series of one segment (and engine): both values, and what they say together."""

    name: str  # the exporter's series
    exporter: float | None
    lab: float | None
    difference: float | None  # exporter / lab − 1
    agree: bool | None  # None: not both known, or the exporter's page was stale


@dataclass(frozen=True)
class SegmentComparison:
    """The exporter against the lab over one segment, on one engine of its server."""

    segment: str
    engine: str | None  # the engine's label where the server had several; else None
    polled_since_end: bool  # the exporter's page was of a poll begun after the segment
    rows: tuple[ComparedRow, ...]

    @property
    def label(self) -> str:
        return self.segment if self.engine is None else f"{self.segment} (engine {self.engine})"

    @property
    def stale(self) -> bool:
        return not self.polled_since_end

    def to_json(self) -> JSON:
        return {
            "segment": self.segment,
            "engine": self.engine,
            "polled_since_end": self.polled_since_end,
            "rows": [asdict(row) for row in self.rows],
        }


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
    #: The exporter against the lab, built when each segment ended (`lab/compared.py`).
    compared: list[SegmentComparison] = field(default_factory=list)
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
            "compared": [c.to_json() for c in self.compared],
            "images": self.images,
            "empty_panels": self.empty_panels,
            "notes": self.notes,
        }
