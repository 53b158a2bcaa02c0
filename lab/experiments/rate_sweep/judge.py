"""What the rate sweep's numbers mean: whether a step kept up (and whether it can be
judged at all), whether the client's and the counters' TPOT agree, the knee and the
mechanism that ends it. (Whether the pool's forecasts saw the first preemption coming:
pool_forecasts.py, shared with the KV-pressure kind.)"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from vllm_glassbox.core import derive
from vllm_glassbox.lab.experiments.rate_sweep.result import (
    ClientView,
    Knee,
    ServerView,
    SweepStep,
)
from vllm_glassbox.lab.experiments.rate_sweep.views import MIN_JUDGED_REQUESTS
from vllm_glassbox.lab.findings import difference

#: The arrivals must span this many times the first requests' latency: a batching server
#: that keeps up reaches its steady state about one latency after the first arrival, and
#: in a shorter step every request is still in it together (they finish together at
#: the end, whatever the server's capacity).
MIN_SPAN_LATENCIES = 2.0
#: The client's TPOT and the counters' agree within this ratio.
TPOT_AGREEMENT = 0.10
#: Decode steps this much longer than at the lowest rate: the batch made them longer.
LONGER_STEPS = 1.25


def achieved_rate(client: ClientView) -> float | None:
    """Requests per second the server served while they arrived: the arrival rate over
    1 + the backlog's growth (a server that keeps up serves them as they come)."""
    if client.arrival_rate is None or client.backlog_growth is None:
        return None
    return derive.ratio(client.arrival_rate, 1.0 + max(client.backlog_growth, 0.0))


def judged(client: ClientView) -> bool:
    """Enough requests, over long enough a span, to tell keeping up from ramping up."""
    span, early = client.arrival_span_seconds, client.early_latency_seconds
    return (
        client.backlog_growth is not None
        and span is not None
        and early is not None
        and span >= MIN_SPAN_LATENCIES * early
    )


def unjudged_reason(client: ClientView) -> str | None:
    """Why a step's keeping up cannot be told, or None when it can (`judged`)."""
    if client.missing_fields:
        return (
            f"the benchmark's JSON has no {' and no '.join(client.missing_fields)} "
            "(vllm bench serve --save-detailed of this version)"
        )
    if client.backlog_growth is None:
        return f"fewer than {MIN_JUDGED_REQUESTS} requests answered"
    if not judged(client):
        return (
            f"its arrivals spanned less than {MIN_SPAN_LATENCIES:g}× the latency of its "
            "first requests"
        )
    return None


def keeps_up(client: ClientView, threshold: float) -> bool | None:
    """Served at least `threshold` of the arrival rate, every request answered; None when
    the step cannot tell (`judged`). A step too short to be judged still falls behind when
    its backlog already grew faster than keeping up allows: requests all in the batch at
    once finish together, which only lowers the growth (each later arrival waits less)."""
    achieved = achieved_rate(client)
    if achieved is None or client.arrival_rate is None:
        return None
    kept = client.failed == 0 and achieved >= threshold * client.arrival_rate
    if judged(client):
        return kept
    return False if not kept and client.failed == 0 else None


def slo_share(client: ClientView) -> float | None:
    """The share of requests within the plan's SLOs (goodput over throughput)."""
    if client.request_goodput is None or client.request_throughput is None:
        return None
    return derive.ratio(client.request_goodput, client.request_throughput)


def tpot_verdict(
    client: ClientView | None, server: ServerView | None
) -> tuple[float | None, bool | None, str | None]:
    """The client's mean TPOT against the counters': their difference, whether they agree
    (TPOT_AGREEMENT), and why not when they do not."""
    if client is None or server is None:
        return None, None, None
    d = difference(client.tpot_mean, server.tpot_seconds)
    if d is None:
        return None, None, "one side has no TPOT (no request of more than one token)"
    if abs(d) <= TPOT_AGREEMENT:
        return d, True, None
    if client.failed:
        return (
            d,
            False,
            (
                f"{client.failed} request(s) failed: the counters count their tokens, the "
                "client's mean leaves them out"
            ),
        )
    if d > 0:
        return d, False, _client_slower(server)
    return (
        d,
        False,
        (
            "the counters' TPOT is higher: tokens of the step that the client did not time "
            "(requests still running at the step's first or last poll) are in the counters"
        ),
    )


def _client_slower(server: ServerView) -> str:
    """What the step shows beside a client TPOT above the counters': the client times
    tokens as they arrive over HTTP, vLLM's inter-token histogram as the engine produces
    them; what lies between is the API server's (and the benchmark's own event loop)."""
    shown = []
    cpu = server.api_server_cpu
    if cpu is not None:
        shown.append(
            f"vLLM's API server used {cpu:.2f} CPU-seconds per second"
            + (" — one event loop busy all along: tokens wait in it" if cpu >= 0.9 else "")
        )
    else:
        shown.append("the API server's CPU is not on the page (several API servers?)")
    if server.inter_token_latency_seconds is not None:
        shown.append(f"decode steps took {server.inter_token_latency_seconds * 1000:.1f} ms")
    shown.append(f"{server.preemptions:g} preemption(s)")
    if server.peak_waiting:
        shown.append(f"up to {server.peak_waiting:g} request(s) waited")
    return (
        "the client times tokens as they arrive over HTTP, vLLM's inter-token histogram as "
        "the engine makes them; in this step " + ", ".join(shown)
    )


# --- what the numbers mean: the knee and its mechanism --------------------------------------

KV_POOL = "kv-pool"
CLIENT_LIMIT = "client-limit"
ADMISSION = "admission"
DECODE_STEPS = "decode-steps"
FIRST_STEP = "first-step"
FAILED = "failed-requests"
UNEXPLAINED = "unexplained"

#: Each mechanism's condition, as the report states it.
LIMITS = {
    KV_POOL: "the KV pool full, then requests queue and vLLM preempts",
    CLIENT_LIMIT: "the benchmark's --max-concurrency holds the requests back (vLLM's queue "
    "stays empty)",
    ADMISSION: "requests queue while the pool has room: the scheduler's batch limits "
    "(--max-num-seqs, --max-num-batched-tokens) or the prefill time",
    DECODE_STEPS: f"decode steps {LONGER_STEPS - 1:.0%} or more longer than at the lowest "
    "rate as the batch grows, the pool not full: the hardware's compute or bandwidth",
    FIRST_STEP: "the lowest rate already falls behind, the pool not full and nobody "
    "waiting: nothing to hold its decode steps against (start the sweep lower; on a "
    "shared machine, see the host's load)",
    FAILED: "requests failed while the others were served as they came: it kept up but "
    "for them (the benchmark's error, not the server's capacity)",
    UNEXPLAINED: "none of the mechanisms above holds",
}


def limit_of(
    step: SweepStep,
    first: SweepStep,
    saturation: float,
    max_concurrency: int | None,
    keep_up: float = 0.9,
) -> str:
    """What holds the server back at `step` (LIMITS), `first` the lowest rate's step."""
    server = step.server
    if server is None:
        return UNEXPLAINED
    client = step.client
    if client is not None and client.failed and keeps_up(replace(client, failed=0), keep_up):
        return FAILED
    queued = (server.peak_waiting or 0) > 0
    # vLLM preempts only when a running request finds no free block: a preemption proves
    # the pool ran full even where no poll landed on that moment.
    full = (server.peak_kv_cache_usage or 0.0) >= saturation or server.preemptions > 0
    if full and (queued or server.preemptions > 0):
        return KV_POOL
    if (
        max_concurrency is not None
        and client is not None
        and (client.max_concurrent_requests or 0) >= max_concurrency
        and not queued
    ):
        return CLIENT_LIMIT
    if queued and not full:
        return ADMISSION
    slower = decode_slowdown(step, first)
    if slower is not None and slower >= LONGER_STEPS:
        return DECODE_STEPS
    return FIRST_STEP if step.index == first.index else UNEXPLAINED


def step_goodput(step: SweepStep) -> tuple[float | None, float | None]:
    """Requests per second within the SLOs, and their share of the requests: by the SLO
    file when one judged the step, else the benchmark's goodput."""
    if step.slo is not None:
        return step.slo.per_second, derive.ratio(step.slo.good_requests, step.slo.requests)
    if step.client is None:
        return None, None
    return step.client.request_goodput, slo_share(step.client)


def within_slos(step: SweepStep, keep_up: float) -> bool | None:
    """Whether a step kept its requests within the SLOs: with an SLO file, every objective
    at its target (core/slo/); else the benchmark's goodput share at `keep_up`."""
    if step.slo is not None:
        return step.slo.met
    share = slo_share(step.client) if step.client else None
    return None if share is None else share >= keep_up


def find_knee(steps: Sequence[SweepStep], keep_up: float) -> Knee:
    """The highest rate kept up with before the first step that was not; and the highest
    before the first that did not keep its requests within the SLOs (`within_slos`)."""
    slo_rate = None
    for step in steps:
        if not within_slos(step, keep_up):
            break
        slo_rate = step.rate
    kept = None
    unjudged: list[float] = []
    for step in steps:
        if step.keeps_up is False:
            limit = step.limit
            return Knee(kept, step.rate, limit, LIMITS.get(limit or ""), slo_rate, tuple(unjudged))
        if step.keeps_up:
            kept, unjudged = step.rate, []
        else:
            unjudged.append(step.rate)
    return Knee(kept, None, None, None, slo_rate, tuple(unjudged))


def judge_steps(
    steps: Sequence[SweepStep],
    saturation: float,
    max_concurrency: int | None,
    keep_up: float = 0.9,
) -> list[SweepStep]:
    """Each step with its decode steps against the lowest rate's, and the mechanism that
    held it back: for those that fell behind; for those that could not be judged, only a
    mechanism they showed (no "unexplained"); none for those that kept up."""
    if not steps:
        return []
    first = steps[0]
    return [
        replace(
            step,
            decode_slowdown=decode_slowdown(step, first),
            limit=_limit(step, first, saturation, max_concurrency, keep_up),
        )
        for step in steps
    ]


def _limit(
    step: SweepStep,
    first: SweepStep,
    saturation: float,
    max_concurrency: int | None,
    keep_up: float,
) -> str | None:
    if step.keeps_up:
        return None
    limit = limit_of(step, first, saturation, max_concurrency, keep_up)
    if step.keeps_up is None and limit in (UNEXPLAINED, FIRST_STEP):
        return None  # not seen to fall behind: nothing to explain
    return limit


def decode_slowdown(step: SweepStep, first: SweepStep) -> float | None:
    """How many times as long a decode step took as at the lowest rate (the counters' ITL)."""
    base = first.server.inter_token_latency_seconds if first.server else None
    now = step.server.inter_token_latency_seconds if step.server else None
    return None if base is None or now is None else derive.ratio(now, base)
