"""The derivation core: every number glassbox publishes, as pure functions.

The exporter (over a sliding window), the lab (around one request), explain and the tests
all compute derived values here and nowhere else. Inputs are `Increase`s: how much each
canonical counter grew over some span (`increases`, where the one rule for a counter
that restarted is). A ratio whose denominator did not grow is None: absent, never 0 and
never NaN (`arithmetic`).

One module per concern, each standing only on the ones above it here:

- `arithmetic`: the ratio rule, what physics allows, shares and prediction errors, moments
- `increases`: counter increases, restarts, engines combined
- `rates`: rates and steps (decode, prefill, preemptions, a process's CPU)
- `objectives`: service-level objectives (bad requests, burn rates, error budgets)
- `speculation`: speculative decoding, and its break-even
- `bandwidth`: weights and memory bandwidth, and another precision
- `kv_cache`: the KV pool, its forecast, and another memory budget
- `startup`: cold start, and the first requests after it
- `disaggregation`: prompt tokens by source, KV transfers between a producer and a
  consumer, the adapters' deferred waits, and their what-ifs

Every public name is importable from the package, as callers use it
(`from vllm_glassbox.core import derive; derive.ratio`, or
`from vllm_glassbox.core.derive import Increase`). A new concern (say, the KV transfer of
disaggregated serving, or cost per token) is one new module here, standing on the
modules above; its public names imported below and listed in `__all__`; its tests in
tests/core/. tests/core/test_core_packages.py fails on a public name the package does
not export, a name two concerns define, and a concern that imports the package rather
than a module of it.
"""

from __future__ import annotations

from vllm_glassbox.core.derive.arithmetic import (
    moment_before,
    physically_possible,
    prediction_error,
    ratio,
    seconds_since,
    share_of,
)
from vllm_glassbox.core.derive.bandwidth import (
    Context,
    active_weights,
    active_weights_of,
    decode_floor_seconds,
    decode_step_at_bandwidth,
    decode_step_on_line,
    marginal_weight_read_bandwidth,
    memory_bandwidth_utilization,
    weight_bytes_per_output_token,
    weight_read_bandwidth_per_gpu,
    weights_at_bits,
    weights_from_log,
)
from vllm_glassbox.core.derive.disaggregation import (
    adapters_over_budget,
    deferred_share_of_waiting,
    kv_transfer_bandwidth,
    kv_transfer_bandwidth_needed,
    kv_transfer_bytes_per_second,
    kv_transfer_bytes_per_token,
    kv_transfer_decode_steps,
    kv_transfer_expirations_per_second,
    kv_transfer_failure_ratio,
    kv_transfer_failures_per_second,
    kv_transfer_link_utilization,
    kv_transfer_seconds,
    locally_prefilled_tokens_per_second,
    mean_queue_seconds,
    prefill_seconds_on_local_tokens,
    prompt_token_share,
    prompt_token_source_shares,
    prompt_tokens_by_source,
    prompt_tokens_computed_share,
    prompt_tokens_transferred_share,
    queue_seconds_deferred,
)
from vllm_glassbox.core.derive.increases import (
    Increase,
    counter_increase,
    counters_restarted,
    engines_together,
    increase_between,
    process_restarted,
    snapshot_increases,
)
from vllm_glassbox.core.derive.kv_cache import (
    KV_EXHAUSTION_WARNING_SECONDS,
    KV_POOL_FULL,
    engine_sleeping,
    gpu_memory_utilization_for,
    kv_cache_blocks,
    kv_cache_bytes_per_token,
    kv_cache_capacity_tokens,
    kv_cache_exhaustion_seconds,
    kv_cache_fill,
    kv_cache_free_tokens,
    kv_cache_headroom_requests,
    kv_cache_headroom_requests_at_completion,
    kv_cache_held_tokens,
    kv_cache_mean_request_tokens,
    kv_cache_memory_at_utilization,
    kv_cache_memory_bytes,
    kv_cache_memory_for_tokens,
    kv_cache_memory_with_weights,
    kv_cache_tokens_demanded,
    kv_cache_tokens_for_memory,
    kv_cache_used_tokens,
    request_tokens_at_completion,
    requests_that_fit,
    tokens_recomputed_by_preemptions,
)
from vllm_glassbox.core.derive.objectives import (
    burn_rate,
    error_budget_remaining,
    request_time_per_output_token,
    requests_over_threshold,
    slo_error_ratio,
)
from vllm_glassbox.core.derive.rates import (
    cpu_seconds_per_second,
    decode_tokens,
    engine_steps_per_second,
    generation_tokens_per_second,
    inter_token_latency,
    preemptions_per_second,
    request_prefill_seconds,
    steps_counted_once,
    time_per_output_token,
    time_per_token_of_step,
    time_to_first_token,
    tokens_per_engine_step,
    tokens_per_forward_pass,
)
from vllm_glassbox.core.derive.speculation import (
    spec_acceptance_ratio,
    spec_break_even_tokens_per_pass,
    spec_coverage_needed,
    spec_draft_coverage,
    spec_mean_acceptance_length,
    spec_position_acceptance,
    spec_speedup,
)
from vllm_glassbox.core.derive.startup import (
    STARTUP_STAGES,
    FirstRequests,
    LoggedStart,
    StartupStages,
    first_request_prefill_seconds,
    model_load_bytes_per_second,
    startup_stages,
    startup_without_stage,
    warm_request_prefill_seconds,
    weights_load_seconds,
)

__all__ = [
    "KV_EXHAUSTION_WARNING_SECONDS",
    "KV_POOL_FULL",
    "STARTUP_STAGES",
    "Context",
    "FirstRequests",
    "Increase",
    "LoggedStart",
    "StartupStages",
    "active_weights",
    "active_weights_of",
    "adapters_over_budget",
    "burn_rate",
    "counter_increase",
    "counters_restarted",
    "cpu_seconds_per_second",
    "decode_floor_seconds",
    "decode_step_at_bandwidth",
    "decode_step_on_line",
    "decode_tokens",
    "deferred_share_of_waiting",
    "engine_sleeping",
    "engine_steps_per_second",
    "engines_together",
    "error_budget_remaining",
    "first_request_prefill_seconds",
    "generation_tokens_per_second",
    "gpu_memory_utilization_for",
    "increase_between",
    "inter_token_latency",
    "kv_cache_blocks",
    "kv_cache_bytes_per_token",
    "kv_cache_capacity_tokens",
    "kv_cache_exhaustion_seconds",
    "kv_cache_fill",
    "kv_cache_free_tokens",
    "kv_cache_headroom_requests",
    "kv_cache_headroom_requests_at_completion",
    "kv_cache_held_tokens",
    "kv_cache_mean_request_tokens",
    "kv_cache_memory_at_utilization",
    "kv_cache_memory_bytes",
    "kv_cache_memory_for_tokens",
    "kv_cache_memory_with_weights",
    "kv_cache_tokens_demanded",
    "kv_cache_tokens_for_memory",
    "kv_cache_used_tokens",
    "kv_transfer_bandwidth",
    "kv_transfer_bandwidth_needed",
    "kv_transfer_bytes_per_second",
    "kv_transfer_bytes_per_token",
    "kv_transfer_decode_steps",
    "kv_transfer_expirations_per_second",
    "kv_transfer_failure_ratio",
    "kv_transfer_failures_per_second",
    "kv_transfer_link_utilization",
    "kv_transfer_seconds",
    "locally_prefilled_tokens_per_second",
    "marginal_weight_read_bandwidth",
    "mean_queue_seconds",
    "memory_bandwidth_utilization",
    "model_load_bytes_per_second",
    "moment_before",
    "physically_possible",
    "prediction_error",
    "preemptions_per_second",
    "prefill_seconds_on_local_tokens",
    "process_restarted",
    "prompt_token_share",
    "prompt_token_source_shares",
    "prompt_tokens_by_source",
    "prompt_tokens_computed_share",
    "prompt_tokens_transferred_share",
    "queue_seconds_deferred",
    "ratio",
    "request_prefill_seconds",
    "request_time_per_output_token",
    "request_tokens_at_completion",
    "requests_over_threshold",
    "requests_that_fit",
    "seconds_since",
    "share_of",
    "slo_error_ratio",
    "snapshot_increases",
    "spec_acceptance_ratio",
    "spec_break_even_tokens_per_pass",
    "spec_coverage_needed",
    "spec_draft_coverage",
    "spec_mean_acceptance_length",
    "spec_position_acceptance",
    "spec_speedup",
    "startup_stages",
    "startup_without_stage",
    "steps_counted_once",
    "time_per_output_token",
    "time_per_token_of_step",
    "time_to_first_token",
    "tokens_per_engine_step",
    "tokens_per_forward_pass",
    "tokens_recomputed_by_preemptions",
    "warm_request_prefill_seconds",
    "weight_bytes_per_output_token",
    "weight_read_bandwidth_per_gpu",
    "weights_at_bits",
    "weights_from_log",
    "weights_load_seconds",
]
