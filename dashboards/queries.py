"""Every PromQL expression of the dashboards, in one place.

Three sources, each with its own scope (selectors in `common`):

- the exporter's `glassbox_*` series, per engine: already ratios of counter increases over
  the exporter's window, absent when their denominator did not grow;
- the fleet recording rules of `alerts/glassbox-rules.yaml`, `by (namespace, job,
  model_name)` over 5 m: rate first, then sum, then divide;
- vLLM's own series for the raw context: counters only ever inside `rate()`, and every
  division guarded with `(... > 0)` so an idle denominator gives no value rather than NaN.
"""

from __future__ import annotations

from vllm_glassbox.dashboards.common import (
    ENGINE,
    LAB_PHASES,
    MODEL,
    NAMESPACE_RULE,
    PLACE,
    RULE,
    TARGET,
)

RATE = "[$__rate_interval]"


def exporter(name: str) -> str:
    """A per-engine series of the exporter."""
    return f"{name}{{{ENGINE}}}"


def fact(name: str) -> str:
    """A series of the exporter about the model or the hardware (no model/engine labels)."""
    return f"{name}{{{TARGET}}}"


def rule(record: str) -> str:
    """A fleet recording rule (labels: namespace, job, model_name)."""
    return f"{record}{{{RULE}}}"


def rate(counter: str, by: str = "model_name", selector: str = ENGINE) -> str:
    return f"sum by ({by}) (rate({counter}{{{selector}}}{RATE}))"


def mean_of_histogram(histogram: str, by: str = "model_name") -> str:
    """Mean observation over the rate interval: rate(sum) / rate(count), guarded."""
    return f"{rate(histogram + '_sum', by)} / ({rate(histogram + '_count', by)} > 0)"


PER_ENGINE = "model_name, instance, engine"

# --- lab ----------------------------------------------------------------------------------

LAB_PHASE = LAB_PHASES

# --- decode -------------------------------------------------------------------------------

TPOT = exporter("glassbox_time_per_output_token_seconds")
TPOT_FLEET = rule("namespace_job_model_name:vllm_time_per_output_token_seconds:rate5m")
ITL = exporter("glassbox_inter_token_latency_seconds")
ITL_FLEET = rule("namespace_job_model_name:vllm_inter_token_latency_seconds:rate5m")
DECODE_FLOOR = fact("glassbox_decode_floor_seconds")
TOKENS_PER_FORWARD_PASS = exporter("glassbox_tokens_per_forward_pass")
TOKENS_PER_FORWARD_PASS_FLEET = rule("namespace_job_model_name:vllm_tokens_per_forward_pass:rate5m")
TOKENS_PER_ENGINE_STEP = exporter("glassbox_tokens_per_engine_step")
TOKENS_PER_ENGINE_STEP_FLEET = rule("namespace_job_model_name:vllm_tokens_per_engine_step:rate5m")
ENGINE_STEPS = exporter("glassbox_engine_steps_per_second")
ENGINE_STEPS_FLEET = rule("namespace_job_model_name:vllm_engine_steps:rate5m")
GENERATION_TOKENS_FLEET = rule("namespace_job_model_name:vllm_generation_tokens:rate5m")
TTFT_MEAN = exporter("glassbox_time_to_first_token_seconds")

# --- weights and bandwidth ----------------------------------------------------------------

WEIGHTS_BYTES = fact("glassbox_model_weights_bytes")
WEIGHTS_SOURCE = fact("glassbox_model_weights_info")
PARALLEL_LAYOUT = fact("glassbox_parallel_info")
WEIGHT_BYTES_PER_TOKEN = exporter("glassbox_weight_bytes_per_output_token")
WEIGHT_READ_BANDWIDTH = exporter("glassbox_weight_read_bandwidth_bytes_per_second")
PEAK_BANDWIDTH = fact("glassbox_gpu_memory_bandwidth_bytes_per_second")
BANDWIDTH_UTILIZATION = exporter("glassbox_memory_bandwidth_utilization_ratio")

# --- KV cache and scheduling --------------------------------------------------------------

KV_CAPACITY_TOKENS = exporter("glassbox_kv_cache_capacity_tokens")
KV_USED_TOKENS = exporter("glassbox_kv_cache_used_tokens")
KV_FREE_TOKENS = exporter("glassbox_kv_cache_free_tokens")
KV_CAPACITY_TOKENS_FLEET = rule("namespace_job_model_name:glassbox_kv_cache_capacity_tokens:sum")
KV_USED_TOKENS_FLEET = rule("namespace_job_model_name:glassbox_kv_cache_used_tokens:sum")
KV_BLOCKS = exporter("glassbox_kv_cache_blocks")
KV_BLOCK_SIZE = exporter("glassbox_kv_cache_block_size_tokens")
KV_USAGE = f"max by ({PER_ENGINE}) (vllm:kv_cache_usage_perc{{{ENGINE}}})"
KV_USAGE_FLEET = rule("namespace_job_model_name:vllm_kv_cache_usage:max")
# Every configuration seen over the range, also of servers no longer up (an instant
# query at the range's end would miss a server stopped before it).
CACHE_CONFIG = f'last_over_time(vllm:cache_config_info{{{TARGET}, engine=~"$engine"}}[$__range])'

RUNNING = f"sum by ({PER_ENGINE}) (vllm:num_requests_running{{{ENGINE}}})"
WAITING = f"sum by ({PER_ENGINE}) (vllm:num_requests_waiting{{{ENGINE}}})"
RUNNING_FLEET = rule("namespace_job_model_name:vllm_num_requests_running:sum")
WAITING_FLEET = rule("namespace_job_model_name:vllm_num_requests_waiting:sum")
# vLLM v0.20+ only: why requests wait (capacity, deferred).
WAITING_BY_REASON = f"sum by (model_name, reason) (vllm:num_requests_waiting_by_reason{{{ENGINE}}})"
PREEMPTIONS = exporter("glassbox_preemptions_per_second")
PREEMPTIONS_FLEET = rule("namespace_job_model_name:vllm_num_preemptions:rate5m")

# --- KV headroom (autoscaling) ------------------------------------------------------------

KV_HEADROOM = exporter("glassbox_kv_cache_headroom_requests")
KV_HEADROOM_FLEET = rule("namespace_job_model_name:glassbox_kv_cache_headroom_requests:sum")
KV_FREE_TOKENS_FLEET = rule("namespace_job_model_name:glassbox_kv_cache_free_tokens:sum")
KV_EXHAUSTION = exporter("glassbox_kv_cache_exhaustion_seconds")
KV_HEADROOM_AT_COMPLETION = exporter("glassbox_kv_cache_headroom_requests_at_completion")
REQUEST_SIZE_AT_COMPLETION = exporter("glassbox_request_size_at_completion_tokens")
KV_EXHAUSTION_FLEET = rule("namespace_job_model_name:glassbox_kv_cache_exhaustion_seconds:min")
# Summed per namespace and model over vLLM's and the exporter's jobs: no job selector.
KV_REPLICAS_NEEDED = (
    f"namespace_model_name:glassbox_kv_cache_replicas_needed:ratio{{{NAMESPACE_RULE}}}"
)

# --- cost and the GPU beside vLLM (docs/cost.md): per namespace and model, any job -------


def model_rule(record: str) -> str:
    """A record per namespace and model (vLLM's, the exporters' and others' series)."""
    return f"{record}{{{NAMESPACE_RULE}}}"


COST_PER_MILLION_GENERATED = model_rule(
    "namespace_model_name:vllm_cost_per_million_generated_tokens:rate5m"
)
COST_PER_MILLION_PROMPT = model_rule(
    "namespace_model_name:vllm_cost_per_million_prompt_tokens:rate5m"
)
COST_PER_MILLION_GENERATED_ENGINE = exporter("glassbox_cost_per_million_generated_tokens")
COST_PER_MILLION_PROMPT_ENGINE = exporter("glassbox_cost_per_million_prompt_tokens")
GPU_HOURLY_COST = model_rule("namespace_model_name:gpu_hourly_cost:sum")
COST_UNUSED_POOL_HOURLY = model_rule("namespace_model_name:vllm_cost_unused_pool:hourly_avg1h")
COST_IDLE_RATIO = model_rule("namespace_model_name:vllm_cost_idle:ratio_avg1h")
COST_UNUSED_POOL_RATIO = model_rule("namespace_model_name:vllm_cost_unused_pool:ratio_avg1h")
DCGM_DRAM_ACTIVE = model_rule("namespace_model_name:dcgm_dram_active:avg")
DCGM_SM_ACTIVE = model_rule("namespace_model_name:dcgm_sm_active:avg")
DCGM_BEYOND_WEIGHT_READS = model_rule(
    "namespace_model_name:dcgm_dram_active_beyond_weight_reads:avg"
)
WEIGHT_READS_BY_MODEL = (
    "avg by (namespace, model_name) "
    f"(glassbox_memory_bandwidth_utilization_ratio{{{NAMESPACE_RULE}}})"
)
_POD = PLACE + ', pod=~"$pod"'
DCGM_FB_BYTES = f"namespace_pod:dcgm_fb_bytes:sum{{{_POD}}}"
DCGM_FB_USED_BYTES = f"namespace_pod:dcgm_fb_used_bytes:sum{{{_POD}}}"
DCGM_POWER = f"namespace_pod:dcgm_power_usage_watts:sum{{{_POD}}}"

# --- cold start (from vLLM's log, one series per start) ----------------------------------

# Every start seen over the dashboard's range, for a bar per start.
STARTUP_STAGES = (
    "max by (model_name, start, stage) "
    f"(last_over_time(glassbox_startup_stage_seconds{{{MODEL}}}[$__range]))"
)
STARTUP_SECONDS = f"glassbox_startup_seconds{{{MODEL}}}"
STARTUP_PREVIOUS_MAX = (
    f"namespace_model_name:glassbox_startup_seconds_previous:max7d{{{NAMESPACE_RULE}}}"
)
MODEL_LOAD_RATE = f"glassbox_model_load_bytes_per_second{{{MODEL}}}"
FIRST_REQUEST_PREFILL = exporter("glassbox_first_request_prefill_seconds")
WARM_REQUEST_PREFILL = exporter("glassbox_warm_request_prefill_seconds")


def alert_state(alertname: str) -> str:
    """0 inactive, 1 pending, 2 firing (the worst instance), from Prometheus' ALERTS."""
    alerts = f'ALERTS{{alertname="{alertname}", {RULE}'
    return (
        f'max(2 * {alerts}, alertstate="firing"}}) '
        f'or max({alerts}, alertstate="pending"}}) or vector(0)'
    )


PREEMPTION_STORM = alert_state("VLLMPreemptionStorm")
STARTUP_SLOW = alert_state("VLLMStartupSlow")

# --- speculative decoding -----------------------------------------------------------------

ACCEPTANCE = exporter("glassbox_spec_decode_acceptance_ratio")
ACCEPTANCE_FLEET = rule("namespace_job_model_name:vllm_spec_decode_acceptance_ratio:rate5m")
ACCEPTANCE_LENGTH = exporter("glassbox_spec_decode_mean_acceptance_length")
ACCEPTANCE_LENGTH_FLEET = rule(
    "namespace_job_model_name:vllm_spec_decode_mean_acceptance_length:rate5m"
)
ACCEPTANCE_BY_POSITION = exporter("glassbox_spec_decode_position_acceptance_ratio")
ACCEPTANCE_BY_POSITION_FLEET = rule(
    "namespace_job_model_name_position:vllm_spec_decode_acceptance_ratio:rate5m"
)
DRAFT_COVERAGE = exporter("glassbox_spec_decode_draft_coverage_ratio")
DRAFT_COVERAGE_FLEET = rule("namespace_job_model_name:vllm_spec_decode_draft_coverage_ratio:rate5m")
DRAFTS_RATE = rate("vllm:spec_decode_num_drafts_total")
DRAFT_TOKENS_RATE = rate("vllm:spec_decode_num_draft_tokens_total")
ACCEPTED_TOKENS_RATE = rate("vllm:spec_decode_num_accepted_tokens_total")

# --- raw context (vLLM's own series) ------------------------------------------------------

RAW_PREEMPTIONS = rate("vllm:num_preemptions_total")
PROMPT_TOKENS_RATE = rate("vllm:prompt_tokens_total")
GENERATION_TOKENS_RATE = rate("vllm:generation_tokens_total")
REQUESTS_RATE = rate("vllm:request_success_total")
# From the recording rule (buckets per namespace and model, not per engine): at fleet size
# the raw buckets are the dashboards' heaviest read (docs/fleet.md).
TTFT_BUCKETS = rule("namespace_job_model_name_le:vllm_time_to_first_token_seconds_bucket:rate5m")
TTFT_P50 = f"histogram_quantile(0.5, sum by (le, model_name) ({TTFT_BUCKETS}))"
TTFT_P95 = f"histogram_quantile(0.95, sum by (le, model_name) ({TTFT_BUCKETS}))"
TTFT_RAW_MEAN = mean_of_histogram("vllm:time_to_first_token_seconds")

# --- the exporter itself ------------------------------------------------------------------

TARGET_UP = f"min by (job, instance) (glassbox_target_up{{{TARGET}}})"
# What glassbox explain finds, one series per finding of each exporter's latest poll.
FINDINGS = f"glassbox_finding_info{{{MODEL}}}"
SCRAPE_DURATION = fact("glassbox_scrape_duration_seconds")
SCRAPE_ERRORS = f"sum by (reason) (rate(glassbox_scrape_errors_total{{{TARGET}}}{RATE}))"
RESTARTS_IN_RANGE = f"sum(increase(glassbox_target_restarts_total{{{TARGET}}}[$__range]))"

# --- the fleet: per model and namespace, and the servers that stand out -----------------

PER_SERVER = "cluster, namespace, instance, model_name"
PER_NAMESPACE = "cluster, namespace, model_name"
SHOWN_SERVERS = 20  # a table of the worst servers, not of a thousand pods
# VLLMDecodeBandwidthLow's threshold (alerts/glassbox-alerts.yaml; a test keeps them equal).
BANDWIDTH_LOW = 0.4

SERVER_BANDWIDTH = f"min by ({PER_SERVER}) ({BANDWIDTH_UTILIZATION})"
SERVER_PREEMPTIONS = f"sum by ({PER_SERVER}) ({PREEMPTIONS})"
SERVER_HEADROOM = f"sum by ({PER_SERVER}) ({KV_HEADROOM})"
OFF_BANDWIDTH_SERVERS = f"bottomk({SHOWN_SERVERS}, {SERVER_BANDWIDTH} < {BANDWIDTH_LOW})"
PREEMPTING_SERVERS = f"topk({SHOWN_SERVERS}, {SERVER_PREEMPTIONS} > 0)"
OUT_OF_HEADROOM_SERVERS = f"bottomk({SHOWN_SERVERS}, {SERVER_HEADROOM} < 1)"
OFF_BANDWIDTH_COUNT = f"count by ({PER_NAMESPACE}) ({SERVER_BANDWIDTH} < {BANDWIDTH_LOW})"
PREEMPTING_COUNT = f"count by ({PER_NAMESPACE}) ({SERVER_PREEMPTIONS} > 0)"
OUT_OF_HEADROOM_COUNT = f"count by ({PER_NAMESPACE}) ({SERVER_HEADROOM} < 1)"
SERVERS = (
    f"count by ({PER_NAMESPACE}) (group by ({PER_SERVER}) (vllm:num_requests_running{{{ENGINE}}}))"
)
# Across namespaces: sums of the per-namespace records, never of raw series.
GENERATION_TOKENS_BY_MODEL = f"sum by (model_name) ({GENERATION_TOKENS_FLEET})"
PREEMPTIONS_BY_MODEL = f"sum by (model_name) ({PREEMPTIONS_FLEET})"
WAITING_BY_MODEL = f"sum by (model_name) ({WAITING_FLEET})"
# alerts/glassbox-alerts.yaml's alerts (a test keeps the list whole).
GLASSBOX_ALERTS = (
    "VLLMPreemptionStorm",
    "VLLMKVCacheSaturated",
    "VLLMKVCacheExhaustionForecast",
    "VLLMRequestQueueGrowing",
    "VLLMSpecDecodeAcceptanceLow",
    "VLLMSpecDecodeBypassed",
    "VLLMDecodeBandwidthLow",
    "VLLMTargetRestarted",
    "VLLMStartupSlow",
    "VLLMDisaggregationInactive",
    "VLLMKVTransferFailures",
    "VLLMKVTransferExpired",
    "VLLMKVTransferSlow",
    "GlassboxTargetDown",
    "GlassboxExporterAbsent",
    "GlassboxInputUnrecognised",
)
FIRING_ALERTS = (
    "count by (cluster, namespace, alertname) "
    f'(ALERTS{{alertname=~"{"|".join(GLASSBOX_ALERTS)}", alertstate="firing", {PLACE}}})'
)
