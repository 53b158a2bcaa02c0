"""What the quantization phase found: each variant's requests, startup and bandwidth, the
fitted line and where each variant sits against it, and the result's JSON (results.json:
`variants[]`, `fit`)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field

from vllm_glassbox.lab.results import JSON, RequestStats, Spread, Startup, startup_json


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
            **(startup_json(self.startup)),
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
