"""The catalogue's families of disaggregated serving and adapters (`series.ALL` shows them
after the pool's and the first requests').

A server's KV role, where its prompt tokens came from, the KV transfers a connector
reports, and the adapters a LoRA server runs: each family's HELP gives its formula and
the vLLM releases whose page has its inputs. The windowed ones carry the derivation
core's function that computes them (`TransferSeries`); a series whose families the page
does not show is absent.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from vllm_glassbox.core import derive
from vllm_glassbox.core.derive import Increase
from vllm_glassbox.core.families import ENGINE, Family, gauge


@dataclass(frozen=True, kw_only=True)
class TransferSeries(Family):
    """A per-engine value over the window, from the increase and the link's peak."""

    compute: Callable[[Increase, float | None], float | None]


def _windowed(
    name: str, help: str, compute: Callable[[Increase, float | None], float | None]
) -> TransferSeries:
    return TransferSeries(name, "gauge", help, ENGINE, windowed=True, compute=compute)


NIXL_MOONCAKE = "NIXL 0.11.1+, Mooncake 0.33+"

ROLE_INFO = gauge(
    "glassbox_kv_transfer_role_info",
    "1 for this server's KV role: producer (prefills for others), consumer (receives "
    "KV: vLLM 0.32+ shows vllm:num_requests_kv_fetch_by_stage only there), both, none, "
    "or unknown (a connector's families, its side not said); connector: the log's "
    "kv_connector or the page's families (nixl, mooncake); source: log (the "
    "--kv-transfer-config of the non-default args line) or page.",
    ("model_name", "role", "connector", "source"),
)
LINK_BANDWIDTH = gauge(
    "glassbox_kv_link_bandwidth_bytes_per_second",
    "Peak bandwidth of the link a KV consumer receives KV on, as given by --kv-link-bandwidth.",
)
SOURCE_SHARE = Family(
    "glassbox_prompt_tokens_source_ratio",
    "gauge",
    "Share of prompt tokens by where they came from (source: local_compute, "
    "local_cache_hit, external_kv_transfer): Δ vllm:prompt_tokens_by_source_total of the "
    "source / Δ of all sources (vLLM 0.16+).",
    (*ENGINE, "source"),
    windowed=True,
)
CONSUMER_PREFILL = _windowed(
    "glassbox_kv_consumer_local_prefill_tokens_per_second",
    "On a KV consumer: prompt tokens it computed itself per second, the prefill its "
    "producers were to do: Δ prompt_tokens_by_source_total{source=local_compute} / window "
    "(vLLM 0.16+).",
    lambda d, peak: derive.locally_prefilled_tokens_per_second(d),
)
TRANSFERS: tuple[TransferSeries, ...] = (
    _windowed(
        "glassbox_kv_transfer_bandwidth_bytes_per_second",
        "KV transfer bandwidth while transferring: Δ bytes transferred / Δ seconds of "
        f"transfers (the connector's histograms' sums; {NIXL_MOONCAKE}).",
        lambda d, peak: derive.kv_transfer_bandwidth(d),
    ),
    _windowed(
        "glassbox_kv_transfer_link_utilization_ratio",
        "KV transfer bandwidth / the link's peak (--kv-link-bandwidth); absent above 1 (no "
        f"transfer crosses a link faster than its peak: a misread input; {NIXL_MOONCAKE}).",
        lambda d, peak: derive.kv_transfer_link_utilization(d, peak),
    ),
    _windowed(
        "glassbox_kv_transfer_throughput_bytes_per_second",
        f"KV bytes transferred per second of the window: Δ bytes / window ({NIXL_MOONCAKE}).",
        lambda d, peak: derive.kv_transfer_bytes_per_second(d),
    ),
    _windowed(
        "glassbox_kv_transfer_seconds",
        f"Mean seconds of one KV transfer: Δ seconds of transfers / Δ transfers ({NIXL_MOONCAKE}).",
        lambda d, peak: derive.kv_transfer_seconds(d),
    ),
    _windowed(
        "glassbox_kv_transfer_decode_steps",
        "Decode steps of this server one KV transfer lasts: mean transfer seconds / "
        "(Δ ITL sum / Δ ITL count); a request's first decode step waits for its KV "
        f"({NIXL_MOONCAKE}).",
        lambda d, peak: derive.kv_transfer_decode_steps(d),
    ),
    _windowed(
        "glassbox_kv_transfer_failures_per_second",
        "Failed KV transfers per second: Δ vllm:nixl_num_failed_transfers_total (failed "
        "handshakes and notifications included), or Δ Mooncake's failed transfers and "
        f"receives, / window ({NIXL_MOONCAKE}).",
        lambda d, peak: derive.kv_transfer_failures_per_second(d),
    ),
    _windowed(
        "glassbox_kv_transfer_expirations_per_second",
        "Requests per second whose KV expired on the producer before a consumer fetched it "
        "(its lease ran out): Δ vllm:nixl_num_kv_expired_reqs_total (NIXL 0.15+) or Δ "
        "vllm:mooncake_num_kv_expired_reqs_total (0.33+) / window.",
        lambda d, peak: derive.kv_transfer_expirations_per_second(d),
    ),
)
ADAPTERS = gauge(
    "glassbox_lora_adapters_active",
    "Adapters with requests in flight, as vLLM's latest vllm:lora_requests_info names "
    "them (--enable-lora): its running and waiting labels together (vLLM 0.32 lists every "
    "adapter in flight in both, so glassbox does not tell them apart).",
    ("model_name",),
)
ADAPTER_BUDGET = gauge(
    "glassbox_lora_max_adapters",
    "Adapters one batch may hold (--max-loras; vllm:lora_requests_info's max_lora).",
    ("model_name",),
)
DEFERRED_SHARE = gauge(
    "glassbox_waiting_deferred_ratio",
    "Share of waiting requests vLLM deferred (the adapter budget, a KV transfer, a "
    "blocked request) rather than left for capacity: num_requests_waiting_by_reason"
    "{reason=deferred} / the sum of reasons, at the latest poll (vLLM 0.20+); absent "
    "while none waits.",
    ENGINE,
)

ALL: tuple[Family, ...] = (
    ROLE_INFO,
    LINK_BANDWIDTH,
    SOURCE_SHARE,
    CONSUMER_PREFILL,
    *TRANSFERS,
    ADAPTERS,
    ADAPTER_BUDGET,
    DEFERRED_SHARE,
)
