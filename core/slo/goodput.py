"""The lab's goodput: the objectives of an SLO file judged request by request, as a client
saw each, with the same boundaries the rules count.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from vllm_glassbox.core import derive
from vllm_glassbox.core.slo.file import ERRORS, Objective, SloFile


@dataclass(frozen=True)
class RequestOutcome:
    """One request as a client saw it."""

    failed: bool
    ttft_seconds: float | None
    e2e_seconds: float | None
    output_tokens: int

    @property
    def tpot_seconds(self) -> float | None:
        """vLLM's time per output token of a request: decode time / (tokens - 1)."""
        return derive.request_time_per_output_token(
            self.e2e_seconds, self.ttft_seconds, self.output_tokens
        )

    def latency(self, sli: str) -> float | None:
        return {"ttft": self.ttft_seconds, "tpot": self.tpot_seconds, "e2e": self.e2e_seconds}[sli]


@dataclass(frozen=True)
class Attainment:
    """One objective over a set of requests: how many it counted, how many were good."""

    objective: str
    sli: str
    target: float
    threshold_seconds: float | None  # the boundary counted (latency)
    counted: int
    good: int
    share: float | None  # good / counted
    burn_rate: float | None  # the bad share over the budget
    met: bool | None  # share ≥ target; None when nothing was counted


@dataclass(frozen=True)
class Goodput:
    """Requests within every objective: how many, and per second."""

    attainments: tuple[Attainment, ...]
    requests: int
    good_requests: int
    per_second: float | None
    met: bool | None  # every objective met (None: one counted nothing)


def judge(slo: SloFile, objective: Objective, outcome: RequestOutcome) -> bool | None:
    """Whether the request is good for the objective; None when the objective does not
    count it (a failed request has no latency: the latency histograms count only requests
    that were answered, as vLLM's do)."""
    if objective.sli == ERRORS:
        return not outcome.failed
    boundary = slo.boundary(objective)
    latency = outcome.latency(objective.sli)
    if outcome.failed or boundary is None or latency is None:
        return None
    return latency <= boundary.seconds  # Prometheus' le: at most the boundary


def goodput(
    slo: SloFile, outcomes: Sequence[RequestOutcome], seconds: float, model: str
) -> Goodput:
    """The objectives of `slo` that apply to `model` over the requests of a run of
    `seconds`: each one's attainment and burn rate, and the requests good for all."""
    objectives = [o for o in slo.objectives if o.applies_to(model)]
    verdicts = [[judge(slo, o, r) for o in objectives] for r in outcomes]
    attainments = []
    for i, o in enumerate(objectives):
        counted = [v[i] for v in verdicts if v[i] is not None]
        good = sum(1 for v in counted if v)
        share = derive.ratio(good, len(counted))
        bad = None if share is None else 1 - share
        boundary = slo.boundary(o)
        attainments.append(
            Attainment(
                objective=o.name,
                sli=o.sli,
                target=o.target,
                threshold_seconds=boundary.seconds if boundary else None,
                counted=len(counted),
                good=good,
                share=share,
                burn_rate=derive.burn_rate(bad, o.target),
                met=None if share is None else share >= o.target,
            )
        )
    good_requests = sum(1 for v in verdicts if all(x is True for x in v))
    met = [a.met for a in attainments]
    return Goodput(
        attainments=tuple(attainments),
        requests=len(outcomes),
        good_requests=good_requests,
        per_second=derive.ratio(good_requests, seconds),
        met=None if not met or None in met else all(met),
    )
