"""Disaggregated serving and adapters: where prompt tokens came from, KV transfers between
a producer (prefill) and a consumer (decode), and the waits adapters cause.

Every number from counter increases (`Increase`) or gauges, under the core's rules: a
ratio whose denominator did not grow is absent; a series whose families the page does not
show is absent, never 0; a transfer faster than the link it crossed is a misread input,
absent. The what-ifs `glassbox explain` states (what a decode server would save if its
transfers worked, the bandwidth its traffic needs) are computed here too.
"""

from __future__ import annotations

import math

from vllm_glassbox.core import disagg_page as kv
from vllm_glassbox.core import snapshot as s
from vllm_glassbox.core.derive.arithmetic import physically_possible, ratio
from vllm_glassbox.core.derive.increases import Increase

# --- where prompt tokens came from ------------------------------------------------------


def prompt_tokens_by_source(d: Increase) -> float:
    """Prompt tokens counted by source (vLLM 0.16+); unknown (NaN) without the family:
    vLLM counts each request's prompt tokens once, as computed, from its cache or
    transferred, and (0.20+) the sources sum to `prompt_tokens_total`."""
    names = [kv.PROMPT_FROM + source for source in kv.SOURCES]
    if not any(d.has(name) for name in names):
        return math.nan
    return sum(d[name] for name in names)


def prompt_token_source_shares(d: Increase) -> dict[str, float]:
    """Each source's share of the prompt tokens: Δ tokens of the source / Δ tokens of all
    sources; empty when no prompt token was counted."""
    total = prompt_tokens_by_source(d)
    out: dict[str, float] = {}
    for source in kv.SOURCES:
        share = ratio(d[kv.PROMPT_FROM + source], total)
        if share is not None:
            out[source] = share
    return out


def prompt_token_share(d: Increase, source: str) -> float | None:
    """One source's share (`prompt_token_source_shares`)."""
    return prompt_token_source_shares(d).get(source)


def prompt_tokens_computed_share(d: Increase) -> float | None:
    """The share of prompt tokens this server computed itself (local_compute)."""
    return prompt_token_share(d, "local_compute")


def prompt_tokens_transferred_share(d: Increase) -> float | None:
    """The share of prompt tokens that arrived by KV transfer (external_kv_transfer)."""
    return prompt_token_share(d, "external_kv_transfer")


def locally_prefilled_tokens_per_second(d: Increase) -> float | None:
    """Prompt tokens this server computed itself per second: Δ local_compute / window. On
    a KV consumer these are the prefills its producers were to do."""
    name = kv.PROMPT_FROM + "local_compute"
    return ratio(d[name], d.seconds) if d.has(name) else None


# --- KV transfers -----------------------------------------------------------------------


def kv_transfer_bandwidth(d: Increase) -> float | None:
    """Bytes per second while transferring: Δ bytes transferred / Δ seconds of transfers
    (the connector's own timing of each transfer that succeeded)."""
    return ratio(d[kv.KV_TRANSFER_BYTES], d[kv.KV_TRANSFER_SECONDS])


def kv_transfer_link_utilization(d: Increase, link_peak: float | None) -> float | None:
    """The transfers' bandwidth over the link's peak (bytes/s, given by flag); absent above
    1: no transfer crosses a link faster than its peak (a peak given too low, or bytes
    counted twice)."""
    achieved = kv_transfer_bandwidth(d)
    if achieved is None or link_peak is None:
        return None
    return physically_possible(ratio(achieved, link_peak), at_most=1.0)


def kv_transfer_bytes_per_second(d: Increase) -> float | None:
    """Bytes the transfers moved per second of the window: Δ bytes / window."""
    return ratio(d[kv.KV_TRANSFER_BYTES], d.seconds) if d.has(kv.KV_TRANSFER_BYTES) else None


def kv_transfer_seconds(d: Increase) -> float | None:
    """Mean seconds of one transfer: Δ seconds of transfers / Δ transfers."""
    return ratio(d[kv.KV_TRANSFER_SECONDS], d[kv.KV_TRANSFERS])


def kv_transfer_failures_per_second(d: Increase) -> float | None:
    """Failed transfers per second (NIXL's count includes failed handshakes and
    notifications; Mooncake's, failed sends and receives): Δ failures / window."""
    name = kv.KV_TRANSFER_FAILURES
    return ratio(d[name], d.seconds) if d.has(name) else None


def kv_transfer_failure_ratio(d: Increase) -> float | None:
    """The share of transfers that failed: Δ failures / (Δ failures + Δ transfers that
    succeeded), as VLLMKVTransferFailures counts it."""
    failures = d[kv.KV_TRANSFER_FAILURES]
    return (
        ratio(failures, failures + d[kv.KV_TRANSFERS]) if d.has(kv.KV_TRANSFER_FAILURES) else None
    )


def kv_transfer_expirations_per_second(d: Increase) -> float | None:
    """Requests per second whose KV expired on the producer before a consumer fetched it
    (its lease ran out): Δ expired / window."""
    name = kv.KV_TRANSFER_EXPIRED
    return ratio(d[name], d.seconds) if d.has(name) else None


def kv_transfer_decode_steps(d: Increase) -> float | None:
    """How many of this server's decode steps one transfer lasts: mean transfer seconds /
    mean decode step (Δ ITL sum / Δ ITL count). A request's first decode step waits for
    its KV; above a few steps the link, not the decode, sets the pace."""
    transfer, step = kv_transfer_seconds(d), ratio(d[s.ITL_SUM], d[s.ITL_COUNT])
    if transfer is None or step is None:
        return None
    return ratio(transfer, step)


def kv_transfer_bytes_per_token(d: Increase) -> float | None:
    """Bytes transferred per prompt token received: Δ bytes / Δ external_kv_transfer
    tokens (connectors move whole blocks, so a little more than the pool's bytes per
    token)."""
    return ratio(d[kv.KV_TRANSFER_BYTES], d[kv.PROMPT_FROM + "external_kv_transfer"])


# --- what would change it ---------------------------------------------------------------


def prefill_seconds_on_local_tokens(d: Increase) -> float | None:
    """Seconds of request prefill per second of the window spent on prompt tokens this
    server computed itself: Δ prefill seconds × the locally computed share / window.
    What a consumer would hand to its producers if its transfers worked (its remaining
    prefill: the tokens after the last whole block, and waiting for the KV). Absent over a
    window with a failed transfer: vLLM 0.32 adds a prefill time no request had for the
    request whose KV load failed (3,048.5 s for one, on the CPU build's NIXL pair)."""
    share = prompt_token_share(d, "local_compute")
    if share is None or not d.has(s.PREFILL_SUM) or d[kv.KV_TRANSFER_FAILURES] > 0:
        return None
    return ratio(d[s.PREFILL_SUM] * share, d.seconds)


def kv_transfer_bandwidth_needed(
    tokens_per_second: float | None, bytes_per_token: float | None
) -> float | None:
    """Bytes per second a consumer's links must carry to receive `tokens_per_second`
    prompt tokens of KV at `bytes_per_token`."""
    if tokens_per_second is None or bytes_per_token is None:
        return None
    return tokens_per_second * bytes_per_token


# --- adapters ---------------------------------------------------------------------------


def deferred_share_of_waiting(deferred: float | None, waiting: float | None) -> float | None:
    """The share of waiting requests vLLM deferred (the adapter budget, a KV transfer, a
    blocked request) rather than left for capacity: deferred / waiting."""
    if deferred is None or waiting is None:
        return None
    return ratio(deferred, waiting)


def mean_queue_seconds(d: Increase) -> float | None:
    """Mean seconds requests that were scheduled waited first: Δ queue sum / Δ count."""
    return ratio(d[s.QUEUE_SUM], d[s.QUEUE_COUNT])


def queue_seconds_deferred(d: Increase, deferred_share: float | None) -> float | None:
    """The part of the mean queue time the deferred waits account for, taking the waits
    to share the queue time as the waiting requests do: mean queue seconds × the deferred
    share."""
    mean = mean_queue_seconds(d)
    if mean is None or deferred_share is None:
        return None
    return mean * deferred_share


def adapters_over_budget(active: float | None, max_loras: float | None) -> float | None:
    """Adapters in flight beyond what one batch may hold (`--max-loras`): their requests
    wait, deferred, until a slot frees; 0 within the budget."""
    if active is None or max_loras is None:
        return None
    return max(active - max_loras, 0.0)
