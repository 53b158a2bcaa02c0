"""vLLM's `/metrics` names per release, for checking every query we ship.

Transcribed from the project's vLLM metrics reference (every minor release 0.10.2–0.33.0
read from the published wheels/sdists; §2 inventory, §4 version matrix and additions).
Only the families a glassbox rule or dashboard could reasonably use are listed;
connector-specific families are left out on purpose (offloading, HF3FS, ...), so a query
naming one of them fails the name check until someone adds it here with its version range;
the transfer families of NIXL and Mooncake, which disaggregated serving reads, are here.

"Shown" means exposed by default: hidden metrics (behind
`--show-hidden-metrics-for-version`) do not count, since an operator cannot rely on them.
"""

from __future__ import annotations

from dataclasses import dataclass

Version = tuple[int, int, int]

OLDEST_SUPPORTED: Version = (0, 10, 2)
NEWEST_SUPPORTED: Version = (0, 33, 0)


def version(text: str) -> Version:
    major, minor, patch = (int(part) for part in text.split("."))
    return (major, minor, patch)


@dataclass(frozen=True)
class VllmMetric:
    """One family as exposed (counters carry `_total`, as prometheus_client adds it)."""

    name: str
    kind: str  # counter | gauge | histogram
    first: Version = OLDEST_SUPPORTED  # first release that shows it
    last: Version | None = None  # last release that shows it; None: still shown in the newest
    only_when: str = ""  # the server flag or setup without which it is absent

    @property
    def sample_names(self) -> tuple[str, ...]:
        if self.kind == "histogram":
            return tuple(self.name + suffix for suffix in ("_bucket", "_sum", "_count"))
        return (self.name,)

    def shown_in(self, v: Version) -> bool:
        return self.first <= v and (self.last is None or v <= self.last)

    @property
    def in_every_supported_version(self) -> bool:
        return self.first <= OLDEST_SUPPORTED and self.last is None


def _m(
    name: str, kind: str, first: str = "0.10.2", last: str | None = None, only_when: str = ""
) -> VllmMetric:
    return VllmMetric(name, kind, version(first), version(last) if last else None, only_when)


SPEC = "--speculative-config"
KV_METRICS = "--kv-cache-metrics"
MFU = "--enable-mfu-metrics"
NIXL = "--kv-transfer-config with NixlConnector"
MOONCAKE = "--kv-transfer-config with MooncakeConnector"
KV_CONSUMER = "--kv-transfer-config with kv_role kv_consumer or kv_both"

METRICS: tuple[VllmMetric, ...] = (
    # scheduler and KV cache (§2.2)
    _m("vllm:num_requests_running", "gauge"),
    _m("vllm:num_requests_waiting", "gauge"),
    _m("vllm:kv_cache_usage_perc", "gauge"),
    _m("vllm:gpu_cache_usage_perc", "gauge", last="0.10.2"),  # hidden 0.11, gone 0.12
    _m("vllm:prefix_cache_queries_total", "counter"),
    _m("vllm:prefix_cache_hits_total", "counter"),
    _m("vllm:gpu_prefix_cache_queries_total", "counter", last="0.10.2"),
    _m("vllm:gpu_prefix_cache_hits_total", "counter", last="0.10.2"),
    # tokens and requests (§2.3)
    _m("vllm:num_preemptions_total", "counter"),
    _m("vllm:prompt_tokens_total", "counter"),
    _m("vllm:generation_tokens_total", "counter"),
    _m("vllm:request_success_total", "counter"),
    # histograms (§2.4)
    _m("vllm:iteration_tokens_total", "histogram"),
    _m("vllm:request_prompt_tokens", "histogram"),
    _m("vllm:request_generation_tokens", "histogram"),
    _m("vllm:request_max_num_generation_tokens", "histogram"),
    _m("vllm:request_params_n", "histogram"),
    _m("vllm:request_params_max_tokens", "histogram"),
    _m("vllm:time_to_first_token_seconds", "histogram"),
    # Same observations as inter_token_latency_seconds; hidden 0.12–0.14, removed 0.15.
    _m("vllm:time_per_output_token_seconds", "histogram", last="0.11.2"),
    _m("vllm:inter_token_latency_seconds", "histogram"),
    _m("vllm:request_time_per_output_token_seconds", "histogram", first="0.11.0"),
    _m("vllm:e2e_request_latency_seconds", "histogram"),
    _m("vllm:request_queue_time_seconds", "histogram"),
    _m("vllm:request_prefill_time_seconds", "histogram"),
    _m("vllm:request_decode_time_seconds", "histogram"),
    _m("vllm:request_inference_time_seconds", "histogram"),
    # speculative decoding (§2.5)
    _m("vllm:spec_decode_num_drafts_total", "counter", only_when=SPEC),
    _m("vllm:spec_decode_num_draft_tokens_total", "counter", only_when=SPEC),
    _m("vllm:spec_decode_num_accepted_tokens_total", "counter", only_when=SPEC),
    _m("vllm:spec_decode_num_accepted_tokens_per_pos_total", "counter", only_when=SPEC),
    # info gauges (§2.6)
    _m("vllm:cache_config_info", "gauge"),
    _m("vllm:lora_requests_info", "gauge", only_when="--enable-lora"),
    # added after 0.11.0 (§4.2)
    _m("vllm:engine_sleep_state", "gauge", first="0.11.1"),
    _m(
        "vllm:corrupted_requests_total",
        "counter",
        first="0.11.1",
        only_when="VLLM_COMPUTE_NANS_IN_LOGITS=1",
    ),
    _m("vllm:external_prefix_cache_queries_total", "counter", first="0.11.1"),
    _m("vllm:external_prefix_cache_hits_total", "counter", first="0.11.1"),
    _m("vllm:mm_cache_queries_total", "counter", first="0.11.1"),
    _m("vllm:mm_cache_hits_total", "counter", first="0.11.1"),
    _m("vllm:kv_block_lifetime_seconds", "histogram", first="0.12.0", only_when=KV_METRICS),
    _m(
        "vllm:kv_block_idle_before_evict_seconds", "histogram", first="0.12.0", only_when=KV_METRICS
    ),
    _m("vllm:kv_block_reuse_gap_seconds", "histogram", first="0.12.0", only_when=KV_METRICS),
    _m("vllm:request_prefill_kv_computed_tokens", "histogram", first="0.13.0"),
    _m("vllm:prompt_tokens_by_source_total", "counter", first="0.16.0"),
    _m("vllm:prompt_tokens_cached_total", "counter", first="0.16.0"),
    _m("vllm:estimated_flops_per_gpu_total", "counter", first="0.17.0", only_when=MFU),
    _m("vllm:estimated_read_bytes_per_gpu_total", "counter", first="0.17.0", only_when=MFU),
    _m("vllm:estimated_write_bytes_per_gpu_total", "counter", first="0.17.0", only_when=MFU),
    _m("vllm:num_requests_waiting_by_reason", "gauge", first="0.20.0"),
    _m("vllm:request_num_preemptions", "histogram", first="0.30.0"),
    _m("vllm:admission_rejections_total", "counter", first="0.32.0"),
    _m("vllm:prompt_tokens_cached_by_source_total", "counter", first="0.32.0"),
    # disaggregated serving: a KV consumer's fetch stages, the connectors' transfers
    # (vllm/distributed/kv_transfer/kv_connector/v1/nixl/stats.py, mooncake/stats.py)
    _m("vllm:num_requests_kv_fetch_by_stage", "gauge", first="0.32.0", only_when=KV_CONSUMER),
    _m("vllm:nixl_xfer_time_seconds", "histogram", first="0.11.1", only_when=NIXL),
    _m("vllm:nixl_bytes_transferred", "histogram", first="0.11.1", only_when=NIXL),
    _m("vllm:nixl_num_failed_transfers_total", "counter", first="0.11.1", only_when=NIXL),
    _m("vllm:nixl_num_kv_expired_reqs_total", "counter", first="0.15.0", only_when=NIXL),
    _m("vllm:mooncake_xfer_time_seconds", "histogram", first="0.33.0", only_when=MOONCAKE),
    _m("vllm:mooncake_bytes_transferred", "histogram", first="0.33.0", only_when=MOONCAKE),
    _m("vllm:mooncake_num_failed_transfers_total", "counter", first="0.33.0", only_when=MOONCAKE),
    _m("vllm:mooncake_num_failed_recvs_total", "counter", first="0.33.0", only_when=MOONCAKE),
    _m("vllm:mooncake_num_kv_expired_reqs_total", "counter", first="0.33.0", only_when=MOONCAKE),
)

BY_SAMPLE_NAME: dict[str, VllmMetric] = {s: m for m in METRICS for s in m.sample_names}

#: Sample names shown by every supported release (given the flag in `only_when`).
IN_EVERY_SUPPORTED_VERSION: frozenset[str] = frozenset(
    s for m in METRICS if m.in_every_supported_version for s in m.sample_names
)

#: Sample names shown by at least one supported release.
IN_SOME_SUPPORTED_VERSION: frozenset[str] = frozenset(BY_SAMPLE_NAME)


def sample_names_shown_in(v: Version) -> frozenset[str]:
    return frozenset(s for m in METRICS if m.shown_in(v) for s in m.sample_names)


#: Non-`vllm:` series of a vLLM target. `process_*` are absent in multiprocess mode
#: (`--api-server-count > 1`, the default under data parallelism from 0.15).
PROCESS_SAMPLE_NAMES: frozenset[str] = frozenset(
    {"process_start_time_seconds", "process_cpu_seconds_total", "process_resident_memory_bytes"}
)

#: The API server's HTTP metrics (prometheus_fastapi_instrumentator, every version; they
#: exclude /metrics, /health and other housekeeping handlers).
HTTP_SAMPLE_NAMES: frozenset[str] = frozenset(
    {
        "http_requests_total",
        *(f"http_request_duration_seconds{s}" for s in ("_bucket", "_sum", "_count")),
    }
)
