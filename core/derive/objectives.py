"""Service-level objectives: a request's time per output token, the share of requests
that missed an objective, how fast its error budget burns.

glassbox/slo_rules.yaml computes the same in PromQL (from the same counter increases:
tests/rules/test_slo.py holds the rules to these functions), the lab per request.
"""

from __future__ import annotations

from vllm_glassbox.core.derive.arithmetic import ratio


def request_time_per_output_token(
    e2e_seconds: float | None, ttft_seconds: float | None, output_tokens: int
) -> float | None:
    """vLLM's request_time_per_output_token_seconds of one request: its decode time (after
    the first token) over the tokens after the first; 0 for a request of one token, as
    vLLM records it."""
    if e2e_seconds is None or ttft_seconds is None or output_tokens < 1:
        return None
    if output_tokens == 1:
        return 0.0
    return (e2e_seconds - ttft_seconds) / (output_tokens - 1)


def requests_over_threshold(counted: float, within: float) -> float:
    """Requests a latency histogram counted beyond a boundary: all minus its bucket's."""
    return max(counted - within, 0.0)


def slo_error_ratio(bad: float, counted: float) -> float | None:
    """The share of counted requests that missed the objective (1 - its attainment)."""
    return ratio(bad, counted)


def burn_rate(error_ratio: float | None, target: float) -> float | None:
    """How many times faster than the objective allows its error budget is spent: the bad
    share over the budget (1 - target). 1 spends the budget exactly over the period."""
    if error_ratio is None or not 0 < target < 1:
        return None
    return error_ratio / (1.0 - target)


def error_budget_remaining(period_error_ratio: float | None, target: float) -> float | None:
    """The share of the period's budget not yet spent: 1 untouched, 0 spent, below 0
    overspent."""
    burned = burn_rate(period_error_ratio, target)
    return None if burned is None else 1.0 - burned
