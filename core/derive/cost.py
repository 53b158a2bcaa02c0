"""Cost: what the GPU hours serving a model buy, per token and in room no request uses.

A price is of one GPU hour (core/prices.py); one engine holds tensor-parallel ×
pipeline-parallel GPUs for the whole window, busy or not, so its cost over a window is
price × GPUs × seconds / 3600, and the cost of a million tokens is that over the tokens
made in the window, times a million. Generated and prompt tokens are two readings of the
same cost (the GPU hours are not split between them). Engines combine by summing their
costs and their tokens, never by averaging their ratios (`engines_together` and the sum
of their hourly costs).

What no request used, two ways: idle time (the share of the window's readings in which
no request ran on the engine) and an empty pool (the mean of 1 − KV cache usage over the
window: idle time counts whole). A share of the GPU's hours is that share of its cost.
"""

from __future__ import annotations

from collections.abc import Sequence

from vllm_glassbox.core import snapshot as s
from vllm_glassbox.core.derive.arithmetic import ratio
from vllm_glassbox.core.derive.increases import Increase

SECONDS_PER_HOUR = 3600.0
PER_MILLION = 1e6


def engine_hourly_cost(
    gpu_hour_price: float | None, tensor_parallel: int = 1, pipeline_parallel: int = 1
) -> float | None:
    """What one engine's GPUs cost per hour: price of one GPU hour × TP × PP."""
    if gpu_hour_price is None:
        return None
    return gpu_hour_price * tensor_parallel * pipeline_parallel


def cost_over(hourly_cost: float | None, seconds: float) -> float | None:
    """The cost of holding GPUs of `hourly_cost` for `seconds`."""
    if hourly_cost is None or seconds <= 0:
        return None
    return hourly_cost * seconds / SECONDS_PER_HOUR


def cost_per_million_tokens(
    hourly_cost: float | None, seconds: float, tokens: float
) -> float | None:
    """Cost of a million tokens when GPUs of `hourly_cost` made `tokens` in `seconds`;
    absent when no token was made."""
    cost = cost_over(hourly_cost, seconds)
    per_token = None if cost is None else ratio(cost, tokens)
    return None if per_token is None else per_token * PER_MILLION


def _per_million(d: Increase, counter: str, hourly_cost: float | None) -> float | None:
    # A page that does not show the counter gives no cost, not an infinite one.
    if not d.has(counter):
        return None
    return cost_per_million_tokens(hourly_cost, d.seconds, d[counter])


def cost_per_million_generated_tokens(d: Increase, hourly_cost: float | None) -> float | None:
    """The GPU hours of the window over the tokens generated in it, per million."""
    return _per_million(d, s.GENERATION_TOKENS, hourly_cost)


def cost_per_million_prompt_tokens(d: Increase, hourly_cost: float | None) -> float | None:
    """The GPU hours of the window over the prompt tokens prefilled in it, per million."""
    return _per_million(d, s.PROMPT_TOKENS, hourly_cost)


def idle_ratio(running: Sequence[float]) -> float | None:
    """Share of the window's readings of running requests in which none ran."""
    return ratio(sum(1.0 for r in running if r <= 0), len(running))


def unused_pool_ratio(usages: Sequence[float]) -> float | None:
    """Mean share of the KV pool no request held over the window's readings of KV cache
    usage (0..1): 1 − usage, idle readings counting whole."""
    return ratio(sum(1.0 - min(max(u, 0.0), 1.0) for u in usages), len(usages))


def cost_of_share(hourly_cost: float | None, share: float | None) -> float | None:
    """What `share` of GPU hours of `hourly_cost` costs per hour."""
    if hourly_cost is None or share is None:
        return None
    return hourly_cost * share


def cost_per_million_tokens_at_step(
    cost_per_million: float | None, step_seconds: float | None, new_step_seconds: float | None
) -> float | None:
    """The cost of a million tokens if each decode step took `new_step_seconds` instead of
    `step_seconds`, at this load (the same batch and tokens per step: tokens per second
    scale with 1 / step, the GPU hours stay)."""
    if cost_per_million is None or new_step_seconds is None or step_seconds is None:
        return None
    scale = ratio(new_step_seconds, step_seconds)
    return None if scale is None else cost_per_million * scale


def pool_fill_of_engines(
    used_tokens: float | None, capacity_tokens: float | None, engines: int
) -> float | None:
    """Mean share of the model's KV pools that requests held: the mean used tokens of the
    window (engines summed) over one engine's capacity × engines (engines alike)."""
    if used_tokens is None or capacity_tokens is None or engines <= 0:
        return None
    return ratio(used_tokens, capacity_tokens * engines)


def unused_share(fill: float | None) -> float | None:
    """The share of the pool no request held, of a mean fill (0..1): 1 − fill (the mean
    of 1 − usage is 1 − the mean usage, so it is `unused_pool_ratio` of the same readings)."""
    return None if fill is None else 1.0 - min(max(fill, 0.0), 1.0)
