"""Every family the exporter publishes, declared once: name, type, HELP and labels.

Like node_exporter's descriptors, these say what a family is; `exposition.py` fills them
with values from one poll. The dashboards quote their HELP (`dashboards/exporter_help.py`)
and docs/exporter.md's table of windowed series is generated from them
(`tests/exporter/test_cli.py` checks it), so a formula is written in one place.

A windowed family's HELP ends with the window's length (" Window: 60s."), which the
`--window` flag sets; `Family.help` is the text without it. The windowed ratios also carry
the derivation core's function that computes them over the window (`WindowedSeries`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from vllm_glassbox.core import derive
from vllm_glassbox.core import series_disagg as disagg
from vllm_glassbox.core.derive import Context, Increase
from vllm_glassbox.core.families import ENGINE as ENGINE
from vllm_glassbox.core.families import Family as Family
from vllm_glassbox.core.families import counter as counter
from vllm_glassbox.core.families import gauge as gauge
from vllm_glassbox.core.weights import Weights

START = ("model_name", "start")  # one start of vLLM, from its log


@dataclass(frozen=True, kw_only=True)
class WindowedSeries(Family):
    """A per-engine ratio of counter increases over the window."""

    compute: Callable[[Increase, Context], float | None]


def derivation_context(
    weights: Weights | None,
    peak_bandwidth: float | None,
    tensor_parallel: int,
    engine_hourly_cost: float | None = None,
) -> Context:
    """What the weight-based series are computed with, for the exporter's page and the
    lab's numbers beside it alike: the bytes one decode step reads (the whole model, or a
    mixture-of-experts model's active weights), one GPU's peak bandwidth and the
    tensor-parallel size of the layout; and what one engine's GPUs cost an hour."""
    return Context(
        weights_bytes=weights.read_per_step if weights else None,
        peak_bandwidth=peak_bandwidth,
        tensor_parallel=tensor_parallel,
        engine_hourly_cost=engine_hourly_cost,
    )


def _windowed(
    name: str, help: str, compute: Callable[[Increase, Context], float | None]
) -> WindowedSeries:
    return WindowedSeries(name, "gauge", help, ENGINE, windowed=True, compute=compute)


#: How the weight-based series read a mixture-of-experts model (in their HELP).
MOE_NOTE = (
    " (weights: of a mixture-of-experts model, its active weights; a batch reads more experts)"
)

# --- the exporter itself ----------------------------------------------------------------

TARGET_UP = gauge("glassbox_target_up", "1 if the last poll of vLLM succeeded, else 0.")
SCRAPE_DURATION = gauge(
    "glassbox_scrape_duration_seconds",
    "Wall time of the last poll of vLLM (fetch, parse, derive).",
)
WINDOW = gauge("glassbox_window_seconds", "Window of every windowed series.")
SCRAPE_ERRORS = counter(
    "glassbox_scrape_errors_total",
    "Failed polls of vLLM, by reason; reason slow counts polls answered after the "
    "interval, which are read and are not failures.",
    ("reason",),
)
TARGET_RESTARTS = counter(
    "glassbox_target_restarts_total",
    "Restarts of vLLM seen: process_start_time_seconds changed, or a _total or "
    "_count counter of an engine went down.",
)
LAST_RESTART = gauge(
    "glassbox_target_last_restart_timestamp_seconds",
    "Unix time of the poll that last saw vLLM restart (one of "
    "glassbox_target_restarts_total); absent until this exporter saw one.",
)
LAST_SUCCESS = gauge(
    "glassbox_last_scrape_success_timestamp_seconds", "Unix time of the last successful poll."
)
BUILD_INFO = gauge(
    "glassbox_build_info",
    "The exporter's version, the git commit it was built from (unknown when the build "
    "did not say) and the Python running it.",
    ("version", "revision", "python_version"),
)
VLLM_INFO = gauge("glassbox_vllm_info", "vLLM's version (from /version).", ("version",))
INPUT_UNRECOGNISED = gauge(
    "glassbox_input_unrecognised",
    "1 for each shape of vLLM's log or page that glassbox does not read or cannot place "
    "(source: log or page; shape: unknown_process_prefix, json_record_without_process, "
    "ray_deduplicated_lines, "
    "unplaced_engine, experts_across_engines, v0_engine_steps, v0_spec_counters, "
    "hybrid_kv_groups, no_cache_config_info, several_servers_behind_the_target, "
    "weights_of_another_model, steps_counted_per_api_server): the series it would feed "
    "are absent, "
    "not guessed.",
    ("source", "shape"),
)
FINDING_INFO = gauge(
    "glassbox_finding_info",
    "1 for each finding of glassbox explain's diagnoses over the window (diagnosis: "
    "glassbox, idle, kv_pool, speculation, decode, disaggregation, adapters, cold_start; "
    "finding: its outcome, such as preemption_storm or bypassed; severity: critical, "
    "warning, info, ok); the findings in words, with their numbers, at /findings.",
    ("model_name", "diagnosis", "finding", "severity"),
)
WEB_CONFIG_RELOAD = gauge(
    "glassbox_web_config_last_reload_successful",
    "Whether the last change of --web-config-file (or a file it names) loaded; "
    "0: the previous configuration is still in force.",
)

# --- the model and the hardware ---------------------------------------------------------

PARALLEL_INFO = gauge(
    "glassbox_parallel_info",
    "The parallel layout the weight and bandwidth series assume (vLLM's engine-config "
    "log line, else --tensor-parallel-size / --pipeline-parallel-size, else 1).",
    ("tensor_parallel", "pipeline_parallel", "data_parallel"),
)
WEIGHTS_BYTES = gauge(
    "glassbox_model_weights_bytes",
    "Bytes of the whole model's weights as vLLM holds them: a tensor- or "
    "pipeline-parallel model once, a data-parallel copy not twice "
    "(see glassbox_model_weights_info).",
)
WEIGHTS_INFO = gauge(
    "glassbox_model_weights_info",
    "Where the weight bytes come from: flag, log, safetensors or config.",
    ("source",),
)
ACTIVE_WEIGHTS_BYTES = gauge(
    "glassbox_model_active_weights_bytes",
    "Mixture-of-experts model: the weight bytes one token's forward pass reads "
    "(shared weights plus its top-k experts, in the checkpoint's proportions).",
)
PEAK_BANDWIDTH = gauge(
    "glassbox_gpu_memory_bandwidth_bytes_per_second",
    "Peak memory bandwidth of one GPU (datasheet or flag).",
)
DECODE_FLOOR = gauge(
    "glassbox_decode_floor_seconds",
    "Lower bound of one decode step: weights / (tensor-parallel size × peak "
    "memory bandwidth of one GPU)" + MOE_NOTE + ".",
)
KV_LOGGED_CAPACITY = gauge(
    "glassbox_kv_cache_logged_capacity_tokens",
    "KV pool in tokens as vLLM's startup log states it (KV cache size: N tokens).",
)
KV_MEMORY = gauge(
    "glassbox_kv_cache_memory_bytes",
    "Memory vLLM gave the KV cache of one GPU at startup (its log: Available KV cache "
    "memory; else the --kv-cache-memory-bytes it was started with).",
)

# --- ratios over the window, per engine -------------------------------------------------

WINDOWED: tuple[WindowedSeries, ...] = (
    _windowed(
        "glassbox_time_per_output_token_seconds",
        "Seconds per decode token, correct under speculative decoding: "
        "Δ ITL sum / (Δ generation tokens − Δ TTFT count).",
        lambda d, c: derive.time_per_output_token(d),
    ),
    _windowed(
        "glassbox_inter_token_latency_seconds",
        "Mean seconds of one decode step of one sequence: Δ ITL sum / Δ ITL count.",
        lambda d, c: derive.inter_token_latency(d),
    ),
    _windowed(
        "glassbox_tokens_per_forward_pass",
        "Decode tokens per decode step of one sequence (1.0 without speculation): "
        "(Δ generation tokens − Δ TTFT count) / Δ ITL count.",
        lambda d, c: derive.tokens_per_forward_pass(d),
    ),
    _windowed(
        "glassbox_engine_steps_per_second",
        "Engine steps per second: Δ iteration_tokens_total_count / window seconds.",
        lambda d, c: derive.engine_steps_per_second(d),
    ),
    _windowed(
        "glassbox_tokens_per_engine_step",
        "Generated tokens per engine step across the batch: Δ generation tokens / Δ engine "
        "steps; absent below 1 (no engine step makes less: a misread input).",
        lambda d, c: derive.tokens_per_engine_step(d),
    ),
    _windowed(
        "glassbox_time_to_first_token_seconds",
        "Mean time to first token: Δ TTFT sum / Δ TTFT count.",
        lambda d, c: derive.time_to_first_token(d),
    ),
    _windowed(
        "glassbox_spec_decode_acceptance_ratio",
        "Share of draft tokens accepted: Δ accepted tokens / Δ draft tokens.",
        lambda d, c: derive.spec_acceptance_ratio(d),
    ),
    _windowed(
        "glassbox_spec_decode_mean_acceptance_length",
        "Tokens emitted per verified draft: 1 + Δ accepted tokens / Δ drafts.",
        lambda d, c: derive.spec_mean_acceptance_length(d),
    ),
    _windowed(
        "glassbox_spec_decode_draft_coverage_ratio",
        "Share of decode steps that speculated at all: Δ drafts / Δ ITL count "
        "(requests that bypass speculation pull it toward 0).",
        lambda d, c: derive.spec_draft_coverage(d),
    ),
    _windowed(
        "glassbox_weight_bytes_per_output_token",
        "Weight bytes read per generated token, all GPUs together: "
        "weights × Δ engine steps / Δ generation tokens" + MOE_NOTE + "; absent above the "
        "weights (fewer than one token per engine step).",
        lambda d, c: derive.weight_bytes_per_output_token(d, c.weights_bytes),
    ),
    _windowed(
        "glassbox_weight_read_bandwidth_bytes_per_second",
        "Achieved weight-read bandwidth of one GPU, from the mean decode step: "
        "weights / (tensor-parallel size × Δ ITL sum / Δ ITL count)" + MOE_NOTE + ".",
        lambda d, c: derive.weight_read_bandwidth_per_gpu(d, c.weights_bytes, c.tensor_parallel),
    ),
    _windowed(
        "glassbox_memory_bandwidth_utilization_ratio",
        "Achieved weight-read bandwidth of one GPU / peak memory bandwidth of one GPU; "
        "absent above 1 (no GPU reads faster than its peak: a misread layout).",
        lambda d, c: derive.memory_bandwidth_utilization(
            d, c.weights_bytes, c.peak_bandwidth, c.tensor_parallel
        ),
    ),
    _windowed(
        "glassbox_request_size_at_completion_tokens",
        "KV tokens a request held when it finished: Δ request_prompt_tokens sum / count + "
        "Δ request_generation_tokens sum / count (requests that finished in the window).",
        lambda d, c: derive.request_tokens_at_completion(d),
    ),
    _windowed(
        "glassbox_preemptions_per_second",
        "Preemptions per second: Δ num_preemptions_total / window seconds.",
        lambda d, c: derive.preemptions_per_second(d),
    ),
    _windowed(
        "glassbox_cost_per_million_generated_tokens",
        "Cost of a million generated tokens, in the unit of --gpu-hour-price: "
        "glassbox_engine_hourly_cost × window seconds / 3600 / Δ generation tokens × 10^6 "
        "(every GPU hour of the window, busy or idle); absent without a price.",
        lambda d, c: derive.cost_per_million_generated_tokens(d, c.engine_hourly_cost),
    ),
    _windowed(
        "glassbox_cost_per_million_prompt_tokens",
        "Cost of a million prompt tokens, in the unit of --gpu-hour-price: "
        "glassbox_engine_hourly_cost × window seconds / 3600 / Δ prompt tokens × 10^6 "
        "(the same GPU hours over the prompt tokens); absent without a price.",
        lambda d, c: derive.cost_per_million_prompt_tokens(d, c.engine_hourly_cost),
    ),
)

#: The windowed series a price of a GPU hour gives (--gpu-hour-price): absent without one.
PRICED = frozenset(
    {"glassbox_cost_per_million_generated_tokens", "glassbox_cost_per_million_prompt_tokens"}
)
WINDOW_COVERED = gauge(
    "glassbox_window_covered_seconds",
    "Seconds of polls the windowed series of this engine span: the window, less up to "
    "one poll interval; shorter right after the exporter or the engine started.",
    ENGINE,
)
POSITION_ACCEPTANCE = Family(
    "glassbox_spec_decode_position_acceptance_ratio",
    "gauge",
    "Acceptance at each draft position: Δ accepted_per_pos / Δ drafts.",
    (*ENGINE, "position"),
    windowed=True,
)

# --- what the GPU hours cost, per engine (with --gpu-hour-price) --------------------------

GPU_HOUR_PRICE = gauge(
    "glassbox_gpu_hour_price",
    "Price of one GPU hour the cost series use (--gpu-hour-price, for --gpu or "
    "--node-pool); absent without a price.",
)
ENGINE_HOURLY_COST = gauge(
    "glassbox_engine_hourly_cost",
    "What one engine's GPUs cost an hour: glassbox_gpu_hour_price × tensor-parallel × "
    "pipeline-parallel size.",
    ENGINE,
)
COST_IDLE = Family(
    "glassbox_cost_idle_ratio",
    "gauge",
    "Share of the GPU hours paid while no request ran: polls with "
    "vllm:num_requests_running 0 / polls in the window; absent without a price.",
    ENGINE,
    windowed=True,
)
COST_UNUSED_POOL = Family(
    "glassbox_cost_unused_pool_ratio",
    "gauge",
    "Share of the GPU hours that bought KV room no request used: mean over the window's "
    "polls of 1 − kv_cache_usage_perc (idle polls count whole); absent without a price.",
    ENGINE,
    windowed=True,
)
COST_UNUSED_POOL_HOURLY = Family(
    "glassbox_cost_unused_pool_hourly",
    "gauge",
    "What the KV room no request used costs an hour: glassbox_engine_hourly_cost × "
    "glassbox_cost_unused_pool_ratio.",
    ENGINE,
    windowed=True,
)

# --- the KV pool, per engine ------------------------------------------------------------

KV_BLOCKS = gauge(
    "glassbox_kv_cache_blocks",
    "KV cache blocks of this engine (vllm:cache_config_info num_gpu_blocks / engines).",
    ENGINE,
)
KV_BLOCK_SIZE = gauge("glassbox_kv_cache_block_size_tokens", "Tokens per KV cache block.", ENGINE)
KV_CAPACITY = gauge(
    "glassbox_kv_cache_capacity_tokens",
    "Tokens the KV pool of this engine holds (kv_cache_size_tokens, "
    "else blocks × block_size, else vLLM's startup log); 0 while the engine sleeps "
    "(vLLM's sleep mode discards the pool).",
    ENGINE,
)
KV_USED = gauge(
    "glassbox_kv_cache_used_tokens",
    "Tokens held by running requests: kv_cache_usage_perc × capacity.",
    ENGINE,
)
SLEEPING = gauge(
    "glassbox_engine_sleeping",
    "1 while vLLM's sleep mode has put this engine to sleep (vllm:engine_sleep_state "
    "awake 0, vLLM 0.11.1+; its KV pool discarded: capacity 0, no free tokens, headroom "
    "or exhaustion forecast), 0 while it is awake; absent where vLLM does not say.",
    ENGINE,
)
KV_FREE = gauge(
    "glassbox_kv_cache_free_tokens",
    "Tokens of the KV pool no running request holds: capacity − used; absent while the "
    "engine sleeps (no pool).",
    ENGINE,
)
KV_HEADROOM = gauge(
    "glassbox_kv_cache_headroom_requests",
    "How many more requests of the current mean size fit in the KV pool: "
    "floor(free tokens / (used tokens / running requests)); absent while none runs.",
    ENGINE,
)
KV_HEADROOM_AT_COMPLETION = Family(
    "glassbox_kv_cache_headroom_requests_at_completion",
    "gauge",
    "How many more requests fit once every running request has grown to the size "
    "requests reached at completion over the window (glassbox_request_size_at_completion_"
    "tokens): floor((capacity − running × size) / size); negative when the running "
    "requests alone will outgrow the pool; absent until a request finished in the window.",
    ENGINE,
    windowed=True,
)
KV_EXHAUSTION = gauge(
    "glassbox_kv_cache_exhaustion_seconds",
    "Seconds until the KV pool is full at the recent growth of used tokens: "
    "free tokens / (Δ used tokens / seconds) over the forecast window (--forecast-window, "
    "by default the window); absent unless used tokens grew.",
    ENGINE,
)

# --- the latest start of vLLM, from its log ---------------------------------------------

STARTUP_STAGE = gauge(
    "glassbox_startup_stage_seconds",
    "Seconds of each stage of the latest start of vLLM, from its log: weights_load, "
    "compile (torch.compile), cuda_graphs (graph capture), engine_init (vLLM's init "
    "engine less compile and graph capture: profiling, KV allocation, warm-up), other "
    "(the rest of process start to ready); absent for stages the version does not log.",
    (*START, "stage"),
)
STARTUP = gauge(
    "glassbox_startup_seconds",
    "Seconds from process start to ready of the latest start of vLLM: its log's time "
    "from the server-version line to the Starting vLLM server line.",
    START,
)
MODEL_LOAD_RATE = gauge(
    "glassbox_model_load_bytes_per_second",
    "How fast the latest start loaded the weights: model weight bytes / weights_load "
    "seconds (tensor-parallel ranks load side by side: their sum).",
    START,
)

# --- the first request after a start ----------------------------------------------------

FIRST_PREFILL = gauge(
    "glassbox_first_request_prefill_seconds",
    "Mean prefill seconds of the first request(s) to finish after vLLM started (the "
    "first poll that saw any): first-use compilation lands here.",
    ENGINE,
)
WARM_PREFILL = Family(
    "glassbox_warm_request_prefill_seconds",
    "gauge",
    "Mean prefill seconds of the requests that finished in the window, without the "
    "first ones after a start: Δ prefill sum / Δ prefill count (vLLM's "
    "request_prefill_time_seconds).",
    ENGINE,
    windowed=True,
)

#: Every family, in the order the exporter's page shows them.
ALL: tuple[Family, ...] = (
    TARGET_UP,
    SCRAPE_DURATION,
    WINDOW,
    SCRAPE_ERRORS,
    TARGET_RESTARTS,
    LAST_RESTART,
    LAST_SUCCESS,
    BUILD_INFO,
    VLLM_INFO,
    PARALLEL_INFO,
    WEIGHTS_BYTES,
    WEIGHTS_INFO,
    ACTIVE_WEIGHTS_BYTES,
    PEAK_BANDWIDTH,
    DECODE_FLOOR,
    KV_LOGGED_CAPACITY,
    KV_MEMORY,
    *WINDOWED,
    WINDOW_COVERED,
    POSITION_ACCEPTANCE,
    KV_BLOCKS,
    KV_BLOCK_SIZE,
    KV_CAPACITY,
    KV_USED,
    SLEEPING,
    STARTUP_STAGE,
    STARTUP,
    MODEL_LOAD_RATE,
    KV_FREE,
    KV_HEADROOM,
    KV_HEADROOM_AT_COMPLETION,
    KV_EXHAUSTION,
    FIRST_PREFILL,
    WARM_PREFILL,
    GPU_HOUR_PRICE,
    ENGINE_HOURLY_COST,
    COST_IDLE,
    COST_UNUSED_POOL,
    COST_UNUSED_POOL_HOURLY,
    *disagg.ALL,
    INPUT_UNRECOGNISED,
    FINDING_INFO,
    WEB_CONFIG_RELOAD,
)
BY_NAME: dict[str, Family] = {family.name: family for family in ALL}
