"""What the speculative-decoding phase found: each run's requests, speed-up and finding,
the cold first request, and the result's JSON (results.json: `runs[]`, `speedup`,
`first_request_prefill_seconds`)."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from vllm_glassbox.lab.results import JSON, RequestStats, Spread, Startup, startup_json


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
            **startup_json(self.startup),
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
