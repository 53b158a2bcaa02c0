"""vLLM glassbox / Decode efficiency: what does one generated token cost, and why?

Decode reads every weight once per step, so time per token follows the bytes of weights
over the achieved memory bandwidth; batching and speculation spread one read over more
tokens. These panels show each factor of that product.
"""

from __future__ import annotations

from vllm_glassbox.dashboards import panels as p
from vllm_glassbox.dashboards.common import Row
from vllm_glassbox.dashboards.common import dashboard as _dashboard

dashboard = _dashboard(
    uid="glassbox-decode",
    title="vLLM glassbox / Decode efficiency",
    description="TPOT, ITL against the decode floor, tokens per forward pass and per engine "
    "step, weight bytes per token and achieved weight-read bandwidth against the peak.",
    rows=[
        Row("Lab phases", [(p.lab_phase(), 24)], height=4),
        Row("Time per token", [(p.tpot(), 12), (p.decode_step(), 12)]),
        Row(
            "Tokens per step",
            [
                (p.tokens_per_forward_pass(), 12),
                (p.tokens_per_engine_step(), 12),
                (p.engine_steps(), 12),
                (p.generation_throughput_fleet(), 12),
            ],
        ),
        Row(
            "Weights and memory bandwidth",
            [
                (p.weights_bytes(), 5),
                (p.weights_source(), 4),
                (p.parallel_layout(), 5),
                (p.peak_bandwidth(), 5),
                (p.decode_floor(), 5),
            ],
            height=4,
        ),
        Row(
            "Bandwidth",
            [
                (p.weight_bytes_per_token(), 8),
                (p.weight_read_bandwidth(), 8),
                (p.bandwidth_utilization(), 8),
            ],
        ),
    ],
)
