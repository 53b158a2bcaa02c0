"""Every panel, as a function that builds a fresh one (a layout moves what it is given).

Descriptions say what a series means and how it is computed; for the exporter's series
they quote its HELP text (see `exporter_help`) instead of restating the formula.
"""

from __future__ import annotations

from grafanalib.core import Panel
from vllm_glassbox.dashboards import queries as q
from vllm_glassbox.dashboards.common import (
    BYTES,
    BYTES_PER_SECOND,
    ENGINE_LEGEND,
    FLEET_LEGEND,
    NUMBER,
    PER_SECOND,
    RATIO,
    SECONDS,
    STATE_MAPPINGS,
    TOKENS,
    TOKENS_PER_SECOND,
    UP_MAPPINGS,
    Q,
    stacked_bars,
    stat,
    table,
    timeseries,
)
from vllm_glassbox.dashboards.exporter_help import fleet, help_of, per_engine

# Judgements, shared by the panels that draw them.
KV_NEARLY_FULL = 0.95  # vLLM preempts once it cannot grow a running request's blocks
_KV_THRESHOLDS = [("green", None), ("orange", KV_NEARLY_FULL)]
_ANY_PREEMPTION = [("green", None), ("orange", 1e-9)]


# Prometheus' rate() divides by the whole 5 m window; a series younger than that reads low.
_YOUNG = " The 5-minute fleet rate reads low while vLLM has run for less than 5 minutes."

# When a panel can have no data, its description says so in a sentence of its own starting
# "Empty" or "Present only": the lab's report quotes it for every empty panel of a run.
_NO_WEIGHTS = (
    ' Empty when the exporter knows no weights (no --weights-bytes, no "Model loading '
    "took\" line in vLLM's log, no readable checkpoint)."
)
_NO_PEAK = " Present only when the exporter is given the peak (--gpu or --gpu-memory-bandwidth)."
_NO_START_LINES = (
    " Empty without vLLM's log (--vllm-log), or while the log shows no whole start (its "
    "first line and the line that says the server is up: docs/exporter.md lists them)."
)
_NO_DECODE = " Empty while no vLLM in range decoded in the 5 minutes before (a ratio of rates)."
_NO_SPECULATION = (
    " Empty while no vLLM in range speculates (no --speculative-config) or before it drafts."
)


def fleet_q(expr: str, legend: str = FLEET_LEGEND) -> Q:
    """A query of a fleet recording rule: drawn dashed beside the per-engine lines."""
    return Q(expr, legend, dashed=True)


def _pair(name: str, record: str) -> str:
    return f"{per_engine(name)}\n\n{fleet(record)}"


# --- lab ----------------------------------------------------------------------------------


def lab_phase() -> Panel:
    return timeseries(
        "Lab phase",
        "1 while a phase of `glassbox lab` runs, one band per phase "
        "(glassbox_lab_phase_info{phase, kind, variant}, served by the lab while it runs). "
        "Empty when no lab ran in the time range.",
        [Q(q.LAB_PHASE, "{{kind}}: {{phase}} {{variant}}")],
        NUMBER,
        band=True,
    )


# --- decode -------------------------------------------------------------------------------


def tpot() -> Panel:
    return timeseries(
        "Time per output token (TPOT)",
        "Seconds per generated decode token, counting every token a speculative step "
        "emits (vLLM's ITL histogram has one sample per step, not per token).\n\n"
        + _pair(
            "glassbox_time_per_output_token_seconds",
            "namespace_job_model_name:vllm_time_per_output_token_seconds:rate5m",
        ),
        [Q(q.TPOT, ENGINE_LEGEND), fleet_q(q.TPOT_FLEET, FLEET_LEGEND)],
        SECONDS,
    )


def decode_step() -> Panel:
    return timeseries(
        "Decode step (ITL) vs the decode floor",
        "How long one decode step of one sequence takes, against the floor set by memory "
        "bandwidth: in each step every GPU reads its share of the weights once.\n\n"
        + _pair(
            "glassbox_inter_token_latency_seconds",
            "namespace_job_model_name:vllm_inter_token_latency_seconds:rate5m",
        )
        + f"\n\nFloor: {help_of('glassbox_decode_floor_seconds')} "
        "The floor is present only when the exporter knows the peak bandwidth (--gpu or "
        "--gpu-memory-bandwidth).",
        [
            Q(q.ITL, ENGINE_LEGEND),
            fleet_q(q.ITL_FLEET, FLEET_LEGEND),
            Q(q.DECODE_FLOOR, "decode floor ({{instance}})"),
        ],
        SECONDS,
    )


def tokens_per_forward_pass() -> Panel:
    return timeseries(
        "Tokens per forward pass",
        "Above 1 only when speculative decoding lands accepted drafts.\n\n"
        + _pair(
            "glassbox_tokens_per_forward_pass",
            "namespace_job_model_name:vllm_tokens_per_forward_pass:rate5m",
        ),
        [
            Q(q.TOKENS_PER_FORWARD_PASS, ENGINE_LEGEND),
            fleet_q(q.TOKENS_PER_FORWARD_PASS_FLEET, FLEET_LEGEND),
        ],
        NUMBER,
    )


def tokens_per_engine_step() -> Panel:
    return timeseries(
        "Tokens per engine step",
        "What one engine step yields across the whole batch: grows with batching and "
        "with speculation.\n\n"
        + _pair(
            "glassbox_tokens_per_engine_step",
            "namespace_job_model_name:vllm_tokens_per_engine_step:rate5m",
        ),
        [
            Q(q.TOKENS_PER_ENGINE_STEP, ENGINE_LEGEND),
            fleet_q(q.TOKENS_PER_ENGINE_STEP_FLEET, FLEET_LEGEND),
        ],
        NUMBER,
    )


def engine_steps() -> Panel:
    return timeseries(
        "Engine steps per second",
        _pair(
            "glassbox_engine_steps_per_second", "namespace_job_model_name:vllm_engine_steps:rate5m"
        )
        + _YOUNG,
        [Q(q.ENGINE_STEPS, ENGINE_LEGEND), fleet_q(q.ENGINE_STEPS_FLEET, FLEET_LEGEND)],
        PER_SECOND,
    )


def generation_throughput_fleet() -> Panel:
    return timeseries(
        "Generated tokens per second",
        "Fleet: recording rule namespace_job_model_name:vllm_generation_tokens:rate5m, "
        "rate of vllm:generation_tokens_total over 5 minutes, summed over engines." + _YOUNG,
        [fleet_q(q.GENERATION_TOKENS_FLEET, FLEET_LEGEND)],
        TOKENS_PER_SECOND,
    )


# --- weights and bandwidth ----------------------------------------------------------------


def weight_bytes_per_token() -> Panel:
    return timeseries(
        "Weight bytes read per output token",
        "How well batching and speculation amortize the weight reads: each engine step "
        "reads every weight once, whatever the batch.\n\n"
        + per_engine("glassbox_weight_bytes_per_output_token")
        + _NO_WEIGHTS,
        [Q(q.WEIGHT_BYTES_PER_TOKEN, ENGINE_LEGEND)],
        BYTES,
    )


def weight_read_bandwidth() -> Panel:
    return timeseries(
        "Achieved weight-read bandwidth of one GPU vs its peak",
        per_engine("glassbox_weight_read_bandwidth_bytes_per_second")
        + _NO_WEIGHTS
        + f"\n\nPeak: {help_of('glassbox_gpu_memory_bandwidth_bytes_per_second')}"
        + _NO_PEAK,
        [
            Q(q.WEIGHT_READ_BANDWIDTH, ENGINE_LEGEND),
            Q(q.PEAK_BANDWIDTH, "peak ({{instance}})"),
        ],
        BYTES_PER_SECOND,
    )


def bandwidth_utilization() -> Panel:
    return timeseries(
        "Memory bandwidth utilization",
        per_engine("glassbox_memory_bandwidth_utilization_ratio") + _NO_PEAK + _NO_WEIGHTS,
        [Q(q.BANDWIDTH_UTILIZATION, ENGINE_LEGEND)],
        RATIO,
    )


def weights_bytes() -> Panel:
    return stat(
        "Model weights",
        help_of("glassbox_model_weights_bytes") + _NO_WEIGHTS,
        [Q(q.WEIGHTS_BYTES, "{{instance}}")],
        BYTES,
    )


def weights_source() -> Panel:
    return stat(
        "Weights known from",
        help_of("glassbox_model_weights_info") + _NO_WEIGHTS,
        [Q(q.WEIGHTS_SOURCE, "{{source}}")],
        NUMBER,
        text_mode="name",
    )


def parallel_layout() -> Panel:
    return stat(
        "Parallel layout",
        help_of("glassbox_parallel_info"),
        [
            Q(
                q.PARALLEL_LAYOUT,
                "TP {{tensor_parallel}} × PP {{pipeline_parallel}}, DP {{data_parallel}}",
            )
        ],
        NUMBER,
        text_mode="name",
    )


def peak_bandwidth() -> Panel:
    return stat(
        "Peak memory bandwidth",
        help_of("glassbox_gpu_memory_bandwidth_bytes_per_second") + _NO_PEAK,
        [Q(q.PEAK_BANDWIDTH, "{{instance}}")],
        BYTES_PER_SECOND,
    )


def decode_floor() -> Panel:
    return stat(
        "Decode floor",
        help_of("glassbox_decode_floor_seconds") + _NO_PEAK + _NO_WEIGHTS,
        [Q(q.DECODE_FLOOR, "{{instance}}")],
        SECONDS,
    )


# --- KV cache and scheduling --------------------------------------------------------------


def kv_tokens() -> Panel:
    return timeseries(
        "KV pool: capacity, used and free tokens",
        f"Capacity: {help_of('glassbox_kv_cache_capacity_tokens')} "
        f"Used: {help_of('glassbox_kv_cache_used_tokens')} "
        f"Free: {help_of('glassbox_kv_cache_free_tokens')}",
        [
            Q(q.KV_CAPACITY_TOKENS, "capacity " + ENGINE_LEGEND),
            Q(q.KV_USED_TOKENS, "used " + ENGINE_LEGEND),
            Q(q.KV_FREE_TOKENS, "free " + ENGINE_LEGEND),
        ],
        TOKENS,
    )


def kv_tokens_fleet() -> Panel:
    return timeseries(
        "KV pool of the fleet: used, free and capacity tokens",
        "Recording rules namespace_job_model_name:glassbox_kv_cache_used_tokens:sum, "
        "namespace_job_model_name:glassbox_kv_cache_free_tokens:sum and "
        "namespace_job_model_name:glassbox_kv_cache_capacity_tokens:sum: the exporter's per-engine "
        "tokens summed over the engines of a job and model.",
        [
            fleet_q(q.KV_CAPACITY_TOKENS_FLEET, "capacity {{model_name}} ({{job}})"),
            fleet_q(q.KV_USED_TOKENS_FLEET, "used {{model_name}} ({{job}})"),
            fleet_q(q.KV_FREE_TOKENS_FLEET, "free {{model_name}} ({{job}})"),
        ],
        TOKENS,
    )


def kv_usage() -> Panel:
    return timeseries(
        "KV cache usage",
        "vllm:kv_cache_usage_perc, the share of KV blocks held by requests (a fraction, "
        "evictable prefix-cache blocks count as free); per engine, and the fleet's maximum "
        "(recording rule namespace_job_model_name:vllm_kv_cache_usage:max). Paging is invisible "
        f"until the pool is full: the line marks {KV_NEARLY_FULL:.0%}.",
        [Q(q.KV_USAGE, ENGINE_LEGEND), fleet_q(q.KV_USAGE_FLEET, "max " + FLEET_LEGEND)],
        RATIO,
        thresholds=_KV_THRESHOLDS,
    )


def kv_capacity_stat() -> Panel:
    return stat(
        "KV capacity",
        help_of("glassbox_kv_cache_capacity_tokens"),
        [Q(q.KV_CAPACITY_TOKENS, ENGINE_LEGEND)],
        TOKENS,
    )


def kv_blocks_stat() -> Panel:
    return stat(
        "KV blocks",
        help_of("glassbox_kv_cache_blocks"),
        [Q(q.KV_BLOCKS, ENGINE_LEGEND)],
        NUMBER,
    )


def kv_block_size_stat() -> Panel:
    return stat(
        "KV block size",
        help_of("glassbox_kv_cache_block_size_tokens")
        + " vLLM allocates KV memory to requests in whole blocks (cache_config_info block_size).",
        [Q(q.KV_BLOCK_SIZE, ENGINE_LEGEND)],
        TOKENS,
    )


def kv_usage_stat() -> Panel:
    return stat(
        "KV usage, fleet max",
        "Recording rule namespace_job_model_name:vllm_kv_cache_usage:max: the fullest engine's "
        "vllm:kv_cache_usage_perc.",
        [fleet_q(q.KV_USAGE_FLEET, "{{model_name}}")],
        RATIO,
        thresholds=_KV_THRESHOLDS,
    )


def cache_config() -> Panel:
    return table(
        "vLLM cache configuration",
        "Labels of vllm:cache_config_info per engine: every configuration seen over the "
        "range, one row per distinct one (a restart with other settings adds a row). "
        "num_gpu_blocks is summed over data-parallel engines by vLLM; "
        "glassbox_kv_cache_blocks divides it back. Empty when no vLLM was scraped in the "
        "range.",
        [Q(q.CACHE_CONFIG)],
        [
            "instance",
            "engine",
            "block_size",
            "num_gpu_blocks",
            "cache_dtype",
            "gpu_memory_utilization",
            "enable_prefix_caching",
        ],
    )


def running_waiting() -> Panel:
    return timeseries(
        "Requests running and waiting",
        "vllm:num_requests_running and vllm:num_requests_waiting per engine, and the "
        "fleet sums (recording rules "
        "namespace_job_model_name:vllm_num_requests_{running,waiting}:sum). "
        "From vLLM v0.20 vllm:num_requests_waiting_by_reason says why they wait "
        "(capacity: no KV room; deferred: LoRA budget, KV transfer).",
        [
            Q(q.RUNNING, "running " + ENGINE_LEGEND),
            Q(q.WAITING, "waiting " + ENGINE_LEGEND),
            fleet_q(q.RUNNING_FLEET, "running " + FLEET_LEGEND),
            fleet_q(q.WAITING_FLEET, "waiting " + FLEET_LEGEND),
            Q(q.WAITING_BY_REASON, "waiting for {{reason}} {{model_name}}"),
        ],
        NUMBER,
    )


def preemptions() -> Panel:
    return timeseries(
        "Preemptions per second",
        "A preempted request loses its KV blocks and is prefilled again later. "
        "A single one is not a storm; a run of them while requests wait is.\n\n"
        + _pair(
            "glassbox_preemptions_per_second",
            "namespace_job_model_name:vllm_num_preemptions:rate5m",
        )
        + _YOUNG,
        [Q(q.PREEMPTIONS, ENGINE_LEGEND), fleet_q(q.PREEMPTIONS_FLEET, FLEET_LEGEND)],
        PER_SECOND,
    )


def preemption_storm() -> Panel:
    return timeseries(
        "VLLMPreemptionStorm alert",
        "State of the alert from Prometheus' ALERTS series (0 inactive, 1 pending, "
        "2 firing; the worst instance). It fires when preemptions keep happening while the "
        "pool is nearly full and requests wait. See alerts/runbook.md.",
        [Q(q.PREEMPTION_STORM, "VLLMPreemptionStorm")],
        NUMBER,
        mappings=STATE_MAPPINGS,
        band=True,
    )


def preemption_storm_stat() -> Panel:
    return stat(
        "Preemption storm",
        "VLLMPreemptionStorm from Prometheus' ALERTS series: inactive, pending or firing.",
        [Q(q.PREEMPTION_STORM, "VLLMPreemptionStorm")],
        NUMBER,
        mappings=STATE_MAPPINGS,
        thresholds=[("green", None), ("orange", 1), ("red", 2)],
    )


def preemptions_stat() -> Panel:
    return stat(
        "Preemptions / s",
        "Recording rule namespace_job_model_name:vllm_num_preemptions:rate5m: "
        "rate of vllm:num_preemptions_total over 5 minutes, summed over engines.",
        [fleet_q(q.PREEMPTIONS_FLEET, "{{model_name}}")],
        PER_SECOND,
        thresholds=_ANY_PREEMPTION,
    )


def waiting_stat() -> Panel:
    return stat(
        "Waiting requests",
        "Recording rule namespace_job_model_name:vllm_num_requests_waiting:sum.",
        [fleet_q(q.WAITING_FLEET, "{{model_name}}")],
        NUMBER,
    )


# --- KV headroom (autoscaling) ------------------------------------------------------------


def kv_headroom() -> Panel:
    return timeseries(
        "Headroom: more requests that fit",
        f"Per engine: {help_of('glassbox_kv_cache_headroom_requests')} It falls to 0 before "
        "vLLM has to preempt. Fleet (dashed): recording rule "
        "namespace_job_model_name:glassbox_kv_cache_headroom_requests:sum, the engines' whole "
        "requests summed. Absent while no request runs.",
        [
            Q(q.KV_HEADROOM, ENGINE_LEGEND),
            fleet_q(q.KV_HEADROOM_FLEET, "{{model_name}} ({{namespace}}, {{job}})"),
        ],
        NUMBER,
    )


def kv_exhaustion() -> Panel:
    return timeseries(
        "Time until the KV pool is full",
        f"Per engine: {help_of('glassbox_kv_cache_exhaustion_seconds')} Fleet (dashed): "
        "recording rule namespace_job_model_name:glassbox_kv_cache_exhaustion_seconds:min, "
        "the engine "
        "that fills first. Absent unless the used tokens grew over the window.",
        [
            Q(q.KV_EXHAUSTION, ENGINE_LEGEND),
            fleet_q(q.KV_EXHAUSTION_FLEET, "{{model_name}} ({{namespace}}, {{job}})"),
        ],
        SECONDS,
    )


def kv_replicas_needed() -> Panel:
    return timeseries(
        "Replicas' worth of KV pool needed",
        "Recording rule namespace_model_name:glassbox_kv_cache_replicas_needed:ratio: the "
        "KV tokens the running requests hold plus the waiting ones at the current mean size, "
        "in pools of one replica. The autoscaling signal of docs/autoscaling.md: a target of "
        "0.8 per replica keeps a fifth of every pool free. Empty while no request runs.",
        [Q(q.KV_REPLICAS_NEEDED, "{{model_name}} {{namespace}}")],
        NUMBER,
    )


# --- cold start ---------------------------------------------------------------------------


def startup_stages() -> Panel:
    return stacked_bars(
        "Start-up by stage, per start",
        "One bar per start of vLLM in the time range (its start time in vLLM's log), "
        f"stacked by stage. {help_of('glassbox_startup_stage_seconds')} The bar's height is "
        "process start to ready." + _NO_START_LINES,
        Q(q.STARTUP_STAGES, "{{stage}}"),
        SECONDS,
        bar="start",
        stack="stage",
    )


def startup_total() -> Panel:
    return timeseries(
        "Process start to ready",
        f"{help_of('glassbox_startup_seconds')} One line per start. Dashed: recording rule "
        "namespace_model_name:glassbox_startup_seconds_previous:max7d, the longest start of "
        "the model "
        "in the 7 days before (the starts published now left out), which VLLMStartupSlow "
        "compares a new start with." + _NO_START_LINES,
        [
            Q(q.STARTUP_SECONDS, "{{model_name}} start {{start}} ({{instance}})"),
            fleet_q(q.STARTUP_PREVIOUS_MAX, "{{model_name}} longest previous"),
        ],
        SECONDS,
    )


def model_load_rate() -> Panel:
    return timeseries(
        "Weights load bandwidth",
        help_of("glassbox_model_load_bytes_per_second")
        + " The weights are the exporter's (glassbox_model_weights_info says from where)."
        + " Empty without vLLM's log (--vllm-log), or when no load time or no weights are known.",
        [Q(q.MODEL_LOAD_RATE, "{{model_name}} start {{start}} ({{instance}})")],
        BYTES_PER_SECOND,
    )


def first_request_prefill() -> Panel:
    return timeseries(
        "First request after a start vs warm prefill",
        f"First: {help_of('glassbox_first_request_prefill_seconds')} "
        f"Warm: {help_of('glassbox_warm_request_prefill_seconds')} "
        "The gap is what a cold start costs the first user. Empty until a request finishes "
        "after a start the exporter saw.",
        [
            Q(q.FIRST_REQUEST_PREFILL, "first " + ENGINE_LEGEND),
            Q(q.WARM_REQUEST_PREFILL, "warm " + ENGINE_LEGEND),
        ],
        SECONDS,
    )


def startup_slow_stat() -> Panel:
    return stat(
        "Slow start",
        "VLLMStartupSlow from Prometheus' ALERTS series: a start in the last hour took over "
        "1.5 × and over a minute longer than the model's longest start in the 7 days "
        "before. See alerts/runbook.md.",
        [Q(q.STARTUP_SLOW, "VLLMStartupSlow")],
        NUMBER,
        mappings=STATE_MAPPINGS,
        thresholds=[("green", None), ("orange", 1), ("red", 2)],
    )


# --- speculative decoding -----------------------------------------------------------------


def acceptance() -> Panel:
    return timeseries(
        "Draft acceptance ratio",
        _pair(
            "glassbox_spec_decode_acceptance_ratio",
            "namespace_job_model_name:vllm_spec_decode_acceptance_ratio:rate5m",
        )
        + _NO_SPECULATION,
        [Q(q.ACCEPTANCE, ENGINE_LEGEND), fleet_q(q.ACCEPTANCE_FLEET, FLEET_LEGEND)],
        RATIO,
    )


def acceptance_length() -> Panel:
    return timeseries(
        "Mean acceptance length",
        "Upper bound: num_speculative_tokens + 1.\n\n"
        + _pair(
            "glassbox_spec_decode_mean_acceptance_length",
            "namespace_job_model_name:vllm_spec_decode_mean_acceptance_length:rate5m",
        )
        + _NO_SPECULATION,
        [Q(q.ACCEPTANCE_LENGTH, ENGINE_LEGEND), fleet_q(q.ACCEPTANCE_LENGTH_FLEET, FLEET_LEGEND)],
        TOKENS,
    )


def acceptance_by_position() -> Panel:
    return timeseries(
        "Acceptance by draft position",
        "Position k is accepted only when positions 0..k-1 were: the curve falls with k.\n\n"
        + _pair(
            "glassbox_spec_decode_position_acceptance_ratio",
            "namespace_job_model_name_position:vllm_spec_decode_acceptance_ratio:rate5m",
        )
        + _NO_SPECULATION,
        [
            Q(q.ACCEPTANCE_BY_POSITION, "position {{position}} " + ENGINE_LEGEND),
            fleet_q(q.ACCEPTANCE_BY_POSITION_FLEET, "position {{position}} " + FLEET_LEGEND),
        ],
        RATIO,
    )


def draft_coverage() -> Panel:
    return timeseries(
        "Draft coverage",
        "Near 0 while decoding means speculation is configured but bypassed, e.g. vLLM "
        "v0.11 skips it for requests with non-default penalties, min_p or logprobs.\n\n"
        + _pair(
            "glassbox_spec_decode_draft_coverage_ratio",
            "namespace_job_model_name:vllm_spec_decode_draft_coverage_ratio:rate5m",
        )
        + _NO_SPECULATION,
        [Q(q.DRAFT_COVERAGE, ENGINE_LEGEND), fleet_q(q.DRAFT_COVERAGE_FLEET, FLEET_LEGEND)],
        RATIO,
    )


def drafts_rate() -> Panel:
    return timeseries(
        "Drafts, draft tokens and accepted tokens per second",
        "Rates of vLLM's spec-decode counters, summed over engines: "
        "vllm:spec_decode_num_drafts_total (one per request per step that drafted), "
        "vllm:spec_decode_num_draft_tokens_total and "
        "vllm:spec_decode_num_accepted_tokens_total." + _NO_SPECULATION,
        [
            Q(q.DRAFTS_RATE, "drafts {{model_name}}"),
            Q(q.DRAFT_TOKENS_RATE, "draft tokens {{model_name}}"),
            Q(q.ACCEPTED_TOKENS_RATE, "accepted tokens {{model_name}}"),
        ],
        PER_SECOND,
    )


def acceptance_stat() -> Panel:
    return stat(
        "Draft acceptance",
        fleet("namespace_job_model_name:vllm_spec_decode_acceptance_ratio:rate5m")
        + _NO_SPECULATION,
        [fleet_q(q.ACCEPTANCE_FLEET, "{{model_name}}")],
        RATIO,
    )


def acceptance_length_stat() -> Panel:
    return stat(
        "Mean acceptance length",
        fleet("namespace_job_model_name:vllm_spec_decode_mean_acceptance_length:rate5m")
        + _NO_SPECULATION,
        [fleet_q(q.ACCEPTANCE_LENGTH_FLEET, "{{model_name}}")],
        TOKENS,
    )


def draft_coverage_stat() -> Panel:
    return stat(
        "Draft coverage",
        fleet("namespace_job_model_name:vllm_spec_decode_draft_coverage_ratio:rate5m")
        + _NO_SPECULATION,
        [fleet_q(q.DRAFT_COVERAGE_FLEET, "{{model_name}}")],
        RATIO,
    )


# --- at a glance --------------------------------------------------------------------------


def tpot_stat() -> Panel:
    return stat(
        "TPOT",
        fleet("namespace_job_model_name:vllm_time_per_output_token_seconds:rate5m") + _NO_DECODE,
        [fleet_q(q.TPOT_FLEET, "{{model_name}}")],
        SECONDS,
    )


def tokens_per_forward_pass_stat() -> Panel:
    return stat(
        "Tokens per forward pass",
        fleet("namespace_job_model_name:vllm_tokens_per_forward_pass:rate5m") + _NO_DECODE,
        [fleet_q(q.TOKENS_PER_FORWARD_PASS_FLEET, "{{model_name}}")],
        NUMBER,
    )


def generation_stat() -> Panel:
    return stat(
        "Output tokens / s",
        "Recording rule namespace_job_model_name:vllm_generation_tokens:rate5m.",
        [fleet_q(q.GENERATION_TOKENS_FLEET, "{{model_name}}")],
        TOKENS_PER_SECOND,
    )


def target_up_stat() -> Panel:
    return stat(
        "Exporter sees vLLM",
        help_of("glassbox_target_up"),
        [Q(q.TARGET_UP, "{{instance}}")],
        NUMBER,
        mappings=UP_MAPPINGS,
        thresholds=[("red", None), ("green", 1)],
    )


def restarts_stat() -> Panel:
    return stat(
        "vLLM restarts in range",
        help_of("glassbox_target_restarts_total") + " Increase over the dashboard's range.",
        [Q(q.RESTARTS_IN_RANGE, "restarts")],
        NUMBER,
        thresholds=[("green", None), ("orange", 1)],
    )


# --- raw context (vLLM's own series) ------------------------------------------------------


def raw_running_waiting() -> Panel:
    return timeseries(
        "Running and waiting requests",
        "vllm:num_requests_running and vllm:num_requests_waiting, per engine.",
        [Q(q.RUNNING, "running " + ENGINE_LEGEND), Q(q.WAITING, "waiting " + ENGINE_LEGEND)],
        NUMBER,
    )


def raw_kv_usage() -> Panel:
    return timeseries(
        "KV cache usage",
        "vllm:kv_cache_usage_perc per engine: the share of KV blocks held by requests.",
        [Q(q.KV_USAGE, ENGINE_LEGEND)],
        RATIO,
        thresholds=_KV_THRESHOLDS,
    )


def raw_preemptions() -> Panel:
    return timeseries(
        "Preemptions per second",
        "rate(vllm:num_preemptions_total), summed over engines.",
        [Q(q.RAW_PREEMPTIONS, "{{model_name}}")],
        PER_SECOND,
    )


def raw_throughput() -> Panel:
    return timeseries(
        "Token throughput",
        "rate(vllm:prompt_tokens_total) (prompt tokens, counted once a request's prefill "
        "completes) and rate(vllm:generation_tokens_total), summed over engines.",
        [
            Q(q.PROMPT_TOKENS_RATE, "prompt {{model_name}}"),
            Q(q.GENERATION_TOKENS_RATE, "generated {{model_name}}"),
        ],
        TOKENS_PER_SECOND,
    )


def raw_requests() -> Panel:
    return timeseries(
        "Finished requests per second",
        "rate(vllm:request_success_total), all finish reasons, summed over engines.",
        [Q(q.REQUESTS_RATE, "{{model_name}}")],
        PER_SECOND,
    )


def raw_ttft() -> Panel:
    return timeseries(
        "Time to first token",
        "p50 and p95 per model, all selected namespaces together, from recording rule "
        "namespace_job_model_name_le:vllm_time_to_first_token_seconds_bucket:rate5m (the "
        "buckets of vllm:time_to_first_token_seconds over 5 m, not narrowed by pod or "
        "engine), and the mean (rate of _sum / rate of _count); for a short prompt it is "
        "mostly fixed overhead.\n\n" + per_engine("glassbox_time_to_first_token_seconds"),
        [
            Q(q.TTFT_P50, "p50 {{model_name}}"),
            Q(q.TTFT_P95, "p95 {{model_name}}"),
            Q(q.TTFT_RAW_MEAN, "mean {{model_name}}"),
            Q(q.TTFT_MEAN, "mean " + ENGINE_LEGEND),
        ],
        SECONDS,
    )


# --- the exporter itself ------------------------------------------------------------------


def exporter_poll_duration() -> Panel:
    return timeseries(
        "Exporter: poll duration",
        help_of("glassbox_scrape_duration_seconds"),
        [Q(q.SCRAPE_DURATION, "{{instance}}")],
        SECONDS,
    )


def exporter_errors() -> Panel:
    return timeseries(
        "Exporter: failed polls per second",
        help_of("glassbox_scrape_errors_total") + " Rate, by reason.",
        [Q(q.SCRAPE_ERRORS, "{{reason}}")],
        PER_SECOND,
    )


# --- the fleet ----------------------------------------------------------------------------

_PER_NAMESPACE_LEGEND = "{{model_name}} {{namespace}} {{cluster}}"
_SERVER_COLUMNS = ["cluster", "namespace", "model_name", "instance", "Value"]
_WORST = f"The {q.SHOWN_SERVERS} worst at the end of the range, from the exporters' series."


def fleet_servers() -> Panel:
    return timeseries(
        "vLLM servers per model and namespace",
        "vLLM targets scraped that serve each model (vllm:num_requests_running: one series "
        "per engine, grouped per server).",
        [Q(q.SERVERS, _PER_NAMESPACE_LEGEND)],
        NUMBER,
    )


def fleet_off_bandwidth_count() -> Panel:
    return timeseries(
        "Servers off the bandwidth line",
        f"Servers whose slowest engine is under {q.BANDWIDTH_LOW:.0%} (the threshold of "
        "VLLMDecodeBandwidthLow), per model and namespace. "
        f"{per_engine('glassbox_memory_bandwidth_utilization_ratio')}" + _NO_PEAK,
        [Q(q.OFF_BANDWIDTH_COUNT, _PER_NAMESPACE_LEGEND)],
        NUMBER,
    )


def fleet_preempting_count() -> Panel:
    return timeseries(
        "Servers preempting",
        "Servers with any preemption over the exporter's window (above 0 on any engine), "
        f"per model and namespace. {per_engine('glassbox_preemptions_per_second')} Empty "
        "while no server preempts.",
        [Q(q.PREEMPTING_COUNT, _PER_NAMESPACE_LEGEND)],
        NUMBER,
    )


def fleet_out_of_headroom_count() -> Panel:
    return timeseries(
        "Servers out of KV headroom",
        "Servers where not one more request fits in any engine's KV pool (summed over "
        "engines, under 1), per model and namespace. "
        f"{per_engine('glassbox_kv_cache_headroom_requests')} Absent while no request runs.",
        [Q(q.OUT_OF_HEADROOM_COUNT, _PER_NAMESPACE_LEGEND)],
        NUMBER,
    )


def fleet_off_bandwidth_servers() -> Panel:
    return table(
        "Furthest off the bandwidth line",
        f"The slowest engine of each server, under {q.BANDWIDTH_LOW:.0%}. {_WORST} "
        f"{per_engine('glassbox_memory_bandwidth_utilization_ratio')}" + _NO_PEAK,
        [Q(q.OFF_BANDWIDTH_SERVERS)],
        _SERVER_COLUMNS,
    )


def fleet_preempting_servers() -> Panel:
    return table(
        "Preempting most",
        f"Preemptions per second of each server, summed over engines, above 0. {_WORST} "
        f"{per_engine('glassbox_preemptions_per_second')} Empty while no server preempts.",
        [Q(q.PREEMPTING_SERVERS)],
        _SERVER_COLUMNS,
    )


def fleet_out_of_headroom_servers() -> Panel:
    return table(
        "Out of KV headroom",
        f"Requests that still fit, summed over engines, under 1. {_WORST} "
        f"{per_engine('glassbox_kv_cache_headroom_requests')} Empty while every server has "
        "room for one more request of its current size, or runs none.",
        [Q(q.OUT_OF_HEADROOM_SERVERS)],
        _SERVER_COLUMNS,
    )


def fleet_firing_alerts() -> Panel:
    return table(
        "Firing alerts per namespace",
        "Prometheus' ALERTS in state firing, counted per cluster, namespace and alert: the "
        "namespace is the route each one takes (alerts/runbook.md). Empty while no glassbox "
        "alert fires.",
        [Q(q.FIRING_ALERTS)],
        ["cluster", "namespace", "alertname", "Value"],
    )


def fleet_generation_by_namespace() -> Panel:
    return timeseries(
        "Generated tokens per model and namespace",
        "Recording rule namespace_job_model_name:vllm_generation_tokens:rate5m per "
        "namespace; dashed: summed over namespaces per model." + _YOUNG,
        [
            Q(q.GENERATION_TOKENS_FLEET, _PER_NAMESPACE_LEGEND),
            fleet_q(q.GENERATION_TOKENS_BY_MODEL, "{{model_name}}, all namespaces"),
        ],
        TOKENS_PER_SECOND,
    )


def fleet_tpot_by_namespace() -> Panel:
    return timeseries(
        "TPOT per model and namespace",
        "Recording rule namespace_job_model_name:vllm_time_per_output_token_seconds:rate5m "
        "per namespace (a ratio: never averaged across namespaces)." + _NO_DECODE,
        [Q(q.TPOT_FLEET, _PER_NAMESPACE_LEGEND)],
        SECONDS,
    )


def fleet_kv_usage_by_namespace() -> Panel:
    return timeseries(
        "KV usage per model and namespace, fullest engine",
        "Recording rule namespace_job_model_name:vllm_kv_cache_usage:max: the fullest "
        "engine of the namespace's servers.",
        [Q(q.KV_USAGE_FLEET, _PER_NAMESPACE_LEGEND)],
        RATIO,
        thresholds=_KV_THRESHOLDS,
    )


def fleet_preemptions_by_namespace() -> Panel:
    return timeseries(
        "Preemptions per model and namespace",
        "Recording rule namespace_job_model_name:vllm_num_preemptions:rate5m per namespace; "
        "dashed: summed over namespaces per model.",
        [
            Q(q.PREEMPTIONS_FLEET, _PER_NAMESPACE_LEGEND),
            fleet_q(q.PREEMPTIONS_BY_MODEL, "{{model_name}}, all namespaces"),
        ],
        PER_SECOND,
        thresholds=_ANY_PREEMPTION,
    )


def fleet_waiting_by_namespace() -> Panel:
    return timeseries(
        "Requests waiting per model and namespace",
        "Recording rule namespace_job_model_name:vllm_num_requests_waiting:sum per "
        "namespace; dashed: summed over namespaces per model.",
        [
            Q(q.WAITING_FLEET, _PER_NAMESPACE_LEGEND),
            fleet_q(q.WAITING_BY_MODEL, "{{model_name}}, all namespaces"),
        ],
        NUMBER,
    )


def fleet_headroom_by_namespace() -> Panel:
    return timeseries(
        "KV headroom per model and namespace",
        "Recording rule namespace_job_model_name:glassbox_kv_cache_headroom_requests:sum: "
        "whole requests of the current mean size that still fit, over the namespace's "
        "engines. Absent while no request runs.",
        [Q(q.KV_HEADROOM_FLEET, _PER_NAMESPACE_LEGEND)],
        NUMBER,
    )
