"""vLLM glassbox / Prefill, decode and adapters: does the pair work, and who waits?

The prefill/decode row answers "is disaggregation doing anything": which servers are
producers and consumers, where each server's prompt tokens came from (a consumer that
computes them itself is a pair that does not work), what the KV connector moved and how
fast, and what failed or expired. The adapters row shows which LoRA adapters run and wait
and how much of the queue the adapter budget holds back.
"""

from __future__ import annotations

from grafanalib.core import Panel
from vllm_glassbox.dashboards import panels as p
from vllm_glassbox.dashboards.common import (
    BYTES_PER_SECOND,
    ENGINE,
    ENGINE_LEGEND,
    MODEL,
    NUMBER,
    PER_SECOND,
    RATIO,
    TOKENS_PER_SECOND,
    Q,
    Row,
    stat,
    timeseries,
)
from vllm_glassbox.dashboards.common import dashboard as _dashboard
from vllm_glassbox.dashboards.exporter_help import help_of, per_engine
from vllm_glassbox.dashboards.panels import fleet_q
from vllm_glassbox.dashboards.queries import RATE, exporter, model_rule

PAIR_LEGEND = "{{model_name}} pair, 5m ({{namespace}})"
NO_PAIR = (
    " Empty while no server in range has a KV connector (--kv-transfer-config) or, for "
    "the transfer series, one whose families glassbox reads (NIXL 0.11.1+, Mooncake 0.33+)."
)
NO_LORA = " Empty while no server in range runs with --enable-lora."


# A recording rule of the pair: per namespace and model, whatever the jobs.
pair = model_rule


def _pair_line(record: str) -> str:
    return (
        f"Pair line (dashed): recording rule {record}, from 5-minute rates of vLLM's "
        "counters, the producers and consumers of a model in a namespace together."
    )


ROLES = f"sum by (role, connector) (glassbox_kv_transfer_role_info{{{MODEL}}})"
SERVERS_BY_ROLE = pair("namespace_model_name_role:glassbox_servers:count")
SOURCE_SHARE = exporter("glassbox_prompt_tokens_source_ratio")
BY_SOURCE = pair("namespace_model_name_source:vllm_prompt_tokens_by_source:rate5m")
TRANSFERRED_SHARE = pair(
    "namespace_model_name:vllm_consumer_prompt_tokens_transferred:ratio_rate5m"
)
CONSUMER_PREFILL = exporter("glassbox_kv_consumer_local_prefill_tokens_per_second")
CONSUMER_PREFILL_PAIR = pair("namespace_model_name:vllm_consumer_prompt_tokens_computed:rate5m")
BANDWIDTH = exporter("glassbox_kv_transfer_bandwidth_bytes_per_second")
BANDWIDTH_PAIR = pair("namespace_model_name:vllm_kv_transfer_bandwidth_bytes_per_second:rate5m")
THROUGHPUT = exporter("glassbox_kv_transfer_throughput_bytes_per_second")
BYTES_PAIR = pair("namespace_model_name:vllm_kv_transfer_bytes:rate5m")
LINK_UTILIZATION = exporter("glassbox_kv_transfer_link_utilization_ratio")
TRANSFER_SECONDS = exporter("glassbox_kv_transfer_seconds")
DECODE_STEPS = exporter("glassbox_kv_transfer_decode_steps")
FAILURES = exporter("glassbox_kv_transfer_failures_per_second")
FAILURES_PAIR = pair("namespace_model_name:vllm_kv_transfer_failures:rate5m")
EXPIRATIONS = exporter("glassbox_kv_transfer_expirations_per_second")
EXPIRATIONS_PAIR = pair("namespace_model_name:vllm_kv_transfer_expirations:rate5m")
FETCH_STAGES = f"sum by (model_name, stage) (vllm:num_requests_kv_fetch_by_stage{{{ENGINE}}})"
ADAPTERS = f"max by (model_name) (glassbox_lora_adapters_active{{{MODEL}}})"
ADAPTER_BUDGET = f"max by (model_name) (glassbox_lora_max_adapters{{{MODEL}}})"
WAITING_BY_REASON = f"sum by (model_name, reason) (vllm:num_requests_waiting_by_reason{{{ENGINE}}})"
DEFERRED_SHARE = exporter("glassbox_waiting_deferred_ratio")
QUEUE_TIME = (
    f"sum by (model_name) (rate(vllm:request_queue_time_seconds_sum{{{ENGINE}}}{RATE})) / "
    f"(sum by (model_name) (rate(vllm:request_queue_time_seconds_count{{{ENGINE}}}{RATE})) > 0)"
)


def servers_by_role() -> Panel:
    return stat(
        "Servers by KV role",
        f"{help_of('glassbox_kv_transfer_role_info')} Counted per role and connector; "
        "a pair is producers and consumers of one model." + NO_PAIR,
        [Q(ROLES, "{{role}} {{connector}}")],
        NUMBER,
    )


def transferred_share_stat() -> Panel:
    return stat(
        "Consumers' prompt tokens transferred",
        "Share of the consumers' prompt tokens that arrived by KV transfer, 5 m: near 1 "
        "while the pair works; near 0, with prompt tokens flowing, is "
        "VLLMDisaggregationInactive. " + _pair_line(TRANSFERRED_SHARE.split("{")[0]) + NO_PAIR,
        [Q(TRANSFERRED_SHARE, "{{model_name}} ({{namespace}})")],
        RATIO,
    )


def prompt_token_sources() -> Panel:
    return timeseries(
        "Prompt tokens by source",
        per_engine("glassbox_prompt_tokens_source_ratio")
        + " A producer computes its prompts (local_compute 1); a consumer receives them "
        "(external_kv_transfer near 1).\n\n" + _pair_line(BY_SOURCE.split("{")[0]) + NO_PAIR,
        [
            Q(SOURCE_SHARE, "{{source}} " + ENGINE_LEGEND),
        ],
        RATIO,
    )


def prompt_tokens_rate() -> Panel:
    return timeseries(
        "Prompt tokens per second by source, the pair",
        _pair_line(BY_SOURCE.split("{")[0])
        + " Beside it, per engine: "
        + help_of("glassbox_kv_consumer_local_prefill_tokens_per_second")
        + NO_PAIR,
        [
            fleet_q(BY_SOURCE, "{{source}} " + PAIR_LEGEND),
            fleet_q(CONSUMER_PREFILL_PAIR, "computed on consumers " + PAIR_LEGEND),
            Q(CONSUMER_PREFILL, "computed on consumer " + ENGINE_LEGEND),
        ],
        TOKENS_PER_SECOND,
    )


def transfer_bandwidth() -> Panel:
    return timeseries(
        "KV transfer bandwidth",
        per_engine("glassbox_kv_transfer_bandwidth_bytes_per_second")
        + " Beside it the bytes moved per second of the window: "
        + help_of("glassbox_kv_transfer_throughput_bytes_per_second")
        + "\n\n"
        + _pair_line(BANDWIDTH_PAIR.split("{")[0])
        + NO_PAIR,
        [
            Q(BANDWIDTH, "while transferring " + ENGINE_LEGEND),
            Q(THROUGHPUT, "moved " + ENGINE_LEGEND),
            fleet_q(BANDWIDTH_PAIR, "while transferring " + PAIR_LEGEND),
            fleet_q(BYTES_PAIR, "moved " + PAIR_LEGEND),
        ],
        BYTES_PER_SECOND,
    )


def link_utilization() -> Panel:
    return timeseries(
        "KV link utilization",
        per_engine("glassbox_kv_transfer_link_utilization_ratio")
        + " Empty unless the exporter is given the link's peak (--kv-link-bandwidth)."
        + NO_PAIR,
        [Q(LINK_UTILIZATION, ENGINE_LEGEND)],
        RATIO,
    )


def transfer_decode_steps() -> Panel:
    return timeseries(
        "Decode steps one transfer lasts",
        per_engine("glassbox_kv_transfer_decode_steps")
        + " Above 10 for 15 minutes is VLLMKVTransferSlow. Beside it: "
        + help_of("glassbox_kv_transfer_seconds")
        + NO_PAIR,
        [
            Q(DECODE_STEPS, "steps " + ENGINE_LEGEND),
            Q(TRANSFER_SECONDS, "seconds " + ENGINE_LEGEND),
        ],
        NUMBER,
    )


def failures() -> Panel:
    return timeseries(
        "KV transfer failures and expirations",
        per_engine("glassbox_kv_transfer_failures_per_second")
        + " "
        + help_of("glassbox_kv_transfer_expirations_per_second")
        + "\n\n"
        + _pair_line(FAILURES_PAIR.split("{")[0])
        + NO_PAIR,
        [
            Q(FAILURES, "failed " + ENGINE_LEGEND),
            Q(EXPIRATIONS, "expired " + ENGINE_LEGEND),
            fleet_q(FAILURES_PAIR, "failed " + PAIR_LEGEND),
            fleet_q(EXPIRATIONS_PAIR, "expired " + PAIR_LEGEND),
        ],
        PER_SECOND,
    )


def fetch_stages() -> Panel:
    return timeseries(
        "Consumers' requests waiting on KV, by stage",
        "vllm:num_requests_kv_fetch_by_stage (vLLM 0.32+, only on a KV consumer), summed "
        "over engines: waiting_to_start (a fetch not started), in_progress, "
        "completed_waiting (KV here, the request not running yet)." + NO_PAIR,
        [Q(FETCH_STAGES, "{{stage}} {{model_name}}")],
        NUMBER,
    )


def adapters() -> Panel:
    return timeseries(
        "LoRA adapters in flight",
        help_of("glassbox_lora_adapters_active")
        + " Dashed: "
        + help_of("glassbox_lora_max_adapters")
        + NO_LORA,
        [Q(ADAPTERS, "in flight {{model_name}}"), fleet_q(ADAPTER_BUDGET, "budget {{model_name}}")],
        NUMBER,
    )


def waiting_by_reason() -> Panel:
    return timeseries(
        "Waiting requests by reason",
        "vllm:num_requests_waiting_by_reason (vLLM 0.20+), summed over engines: capacity "
        "(no KV room) and deferred (the adapter budget, a KV transfer, a blocked request). "
        "Beside it, per engine: " + help_of("glassbox_waiting_deferred_ratio"),
        [
            Q(WAITING_BY_REASON, "{{reason}} {{model_name}}"),
            Q(DEFERRED_SHARE, "deferred share " + ENGINE_LEGEND),
        ],
        NUMBER,
    )


def queue_time() -> Panel:
    return timeseries(
        "Mean queue time",
        "Mean seconds the requests scheduled in the interval waited first: rate of "
        "vllm:request_queue_time_seconds sum over its count. Deferred waits (the adapter "
        "budget) land here; on a KV consumer so does the wait for the KV. A request whose KV "
        "load failed is observed with a queue time below 0 (vLLM 0.32: −3,043 s on the "
        "captured pair), which rate() reads as a counter reset: the line jumps after one. "
        "Empty while no vLLM in range scheduled a request in the 5 minutes before (a ratio "
        "of rates), or on a page without vllm:request_queue_time_seconds.",
        [Q(QUEUE_TIME, "{{model_name}}")],
        "s",
    )


dashboard = _dashboard(
    uid="glassbox-disaggregation",
    title="vLLM glassbox / Prefill, decode and adapters",
    description="Disaggregated serving (servers by KV role, prompt tokens by source, KV "
    "transfer bandwidth, failures and expirations, the consumers' fetch stages) and LoRA "
    "adapters (in flight against the adapter budget, deferred waits, queue time).",
    rows=[
        Row("Lab phases", [(p.lab_phase(), 24)], height=4),
        Row(
            "Prefill and decode: at a glance",
            [(servers_by_role(), 12), (transferred_share_stat(), 12)],
            height=4,
        ),
        Row(
            "Prefill and decode: where prompt tokens come from",
            [(prompt_token_sources(), 12), (prompt_tokens_rate(), 12)],
        ),
        Row(
            "Prefill and decode: the KV link",
            [(transfer_bandwidth(), 8), (link_utilization(), 8), (transfer_decode_steps(), 8)],
        ),
        Row(
            "Prefill and decode: what fails and waits",
            [(failures(), 12), (fetch_stages(), 12)],
        ),
        Row("Adapters", [(adapters(), 8), (waiting_by_reason(), 8), (queue_time(), 8)]),
    ],
)
