"""vLLM glassbox / Decode efficiency: what does one generated token cost, and why?

Decode reads every weight once per step, so time per token follows the bytes of weights
over the achieved memory bandwidth; batching and speculation spread one read over more
tokens. These panels show each factor of that product.
"""

from __future__ import annotations

from grafanalib.core import Panel
from vllm_glassbox.dashboards import panels as p
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
    TOKENS_PER_SECOND,
    Q,
    Row,
    stat,
    timeseries,
)
from vllm_glassbox.dashboards.common import dashboard as _dashboard
from vllm_glassbox.dashboards.exporter_help import help_of, per_engine
from vllm_glassbox.dashboards.panels import (
    NO_PEAK,
    NO_WEIGHTS,
    YOUNG,
    fleet_q,
    per_engine_and_fleet,
)


def decode_step() -> Panel:
    return timeseries(
        "Decode step (ITL) vs the decode floor",
        "How long one decode step of one sequence takes, against the floor set by memory "
        "bandwidth: in each step every GPU reads its share of the weights once.\n\n"
        + per_engine_and_fleet(
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


def tokens_per_engine_step() -> Panel:
    return timeseries(
        "Tokens per engine step",
        "What one engine step yields across the whole batch: grows with batching and "
        "with speculation.\n\n"
        + per_engine_and_fleet(
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
        per_engine_and_fleet(
            "glassbox_engine_steps_per_second", "namespace_job_model_name:vllm_engine_steps:rate5m"
        )
        + YOUNG,
        [Q(q.ENGINE_STEPS, ENGINE_LEGEND), fleet_q(q.ENGINE_STEPS_FLEET, FLEET_LEGEND)],
        PER_SECOND,
    )


def generation_throughput_fleet() -> Panel:
    return timeseries(
        "Generated tokens per second",
        "Fleet: recording rule namespace_job_model_name:vllm_generation_tokens:rate5m, "
        "rate of vllm:generation_tokens_total over 5 minutes, summed over engines." + YOUNG,
        [fleet_q(q.GENERATION_TOKENS_FLEET, FLEET_LEGEND)],
        TOKENS_PER_SECOND,
    )


def weight_bytes_per_token() -> Panel:
    return timeseries(
        "Weight bytes read per output token",
        "How well batching and speculation amortize the weight reads: each engine step "
        "reads every weight once, whatever the batch.\n\n"
        + per_engine("glassbox_weight_bytes_per_output_token")
        + NO_WEIGHTS,
        [Q(q.WEIGHT_BYTES_PER_TOKEN, ENGINE_LEGEND)],
        BYTES,
    )


def weight_read_bandwidth() -> Panel:
    return timeseries(
        "Achieved weight-read bandwidth of one GPU vs its peak",
        per_engine("glassbox_weight_read_bandwidth_bytes_per_second")
        + NO_WEIGHTS
        + f"\n\nPeak: {help_of('glassbox_gpu_memory_bandwidth_bytes_per_second')}"
        + NO_PEAK,
        [
            Q(q.WEIGHT_READ_BANDWIDTH, ENGINE_LEGEND),
            Q(q.PEAK_BANDWIDTH, "peak ({{instance}})"),
        ],
        BYTES_PER_SECOND,
    )


def bandwidth_utilization() -> Panel:
    return timeseries(
        "Memory bandwidth utilization",
        per_engine("glassbox_memory_bandwidth_utilization_ratio") + NO_PEAK + NO_WEIGHTS,
        [Q(q.BANDWIDTH_UTILIZATION, ENGINE_LEGEND)],
        RATIO,
    )


def weights_source() -> Panel:
    return stat(
        "Weights known from",
        help_of("glassbox_model_weights_info") + NO_WEIGHTS,
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
        help_of("glassbox_gpu_memory_bandwidth_bytes_per_second") + NO_PEAK,
        [Q(q.PEAK_BANDWIDTH, "{{instance}}")],
        BYTES_PER_SECOND,
    )


def decode_floor() -> Panel:
    return stat(
        "Decode floor",
        help_of("glassbox_decode_floor_seconds") + NO_PEAK + NO_WEIGHTS,
        [Q(q.DECODE_FLOOR, "{{instance}}")],
        SECONDS,
    )


dashboard = _dashboard(
    uid="glassbox-decode",
    title="vLLM glassbox / Decode efficiency",
    description="TPOT, ITL against the decode floor, tokens per forward pass and per engine "
    "step, weight bytes per token and achieved weight-read bandwidth against the peak.",
    rows=[
        Row("Lab phases", [(p.lab_phase(), 24)], height=4),
        Row("Time per token", [(p.tpot(), 12), (decode_step(), 12)]),
        Row(
            "Tokens per step",
            [
                (p.tokens_per_forward_pass(), 12),
                (tokens_per_engine_step(), 12),
                (engine_steps(), 12),
                (generation_throughput_fleet(), 12),
            ],
        ),
        Row(
            "Weights and memory bandwidth",
            [
                (p.weights_bytes(), 5),
                (weights_source(), 4),
                (parallel_layout(), 5),
                (peak_bandwidth(), 5),
                (decode_floor(), 5),
            ],
            height=4,
        ),
        Row(
            "Bandwidth",
            [
                (weight_bytes_per_token(), 8),
                (weight_read_bandwidth(), 8),
                (bandwidth_utilization(), 8),
            ],
        ),
    ],
)
