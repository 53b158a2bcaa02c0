"""Speculative decoding: how much of a draft is accepted, at each position, how many
steps draft at all; and what would change it (the speed-up, the break-even).
"""

from __future__ import annotations

from vllm_glassbox.core import snapshot as s
from vllm_glassbox.core.derive.arithmetic import ratio
from vllm_glassbox.core.derive.increases import Increase
from vllm_glassbox.core.derive.rates import time_per_token_of_step


def spec_acceptance_ratio(d: Increase) -> float | None:
    return ratio(d[s.SPEC_ACCEPTED], d[s.SPEC_DRAFT_TOKENS])


def spec_mean_acceptance_length(d: Increase) -> float | None:
    r = ratio(d[s.SPEC_ACCEPTED], d[s.SPEC_DRAFTS])
    return None if r is None else 1.0 + r


def spec_position_acceptance(d: Increase) -> dict[str, float]:
    """Acceptance ratio at each draft position (absent when no draft was made)."""
    out: dict[str, float] = {}
    for position in s.spec_positions(d.counters):
        r = ratio(d[s.SPEC_ACCEPTED_AT + position], d[s.SPEC_DRAFTS])
        if r is not None:
            out[position] = r
    return out


def spec_draft_coverage(d: Increase) -> float | None:
    """Share of decode steps that speculated at all; absent without spec counters."""
    if not d.has(s.SPEC_DRAFTS):
        return None
    return ratio(d[s.SPEC_DRAFTS], d[s.ITL_COUNT])


def spec_speedup(
    step_seconds: float | None,
    tokens_per_forward_pass: float | None,
    plain_step_seconds: float | None,
) -> float | None:
    """Decode speed-up of speculation: a token's time without it (one token per step of
    `plain_step_seconds`) over its time with it."""
    with_it = time_per_token_of_step(step_seconds, tokens_per_forward_pass)
    if with_it is None or plain_step_seconds is None:
        return None
    return ratio(plain_step_seconds, with_it)


def spec_break_even_tokens_per_pass(
    step_seconds: float | None, plain_step_seconds: float | None
) -> float | None:
    """Tokens each speculative step must make to be as fast as plain decoding: a step
    with speculation (drafting, verifying) over a plain one."""
    if step_seconds is None or plain_step_seconds is None:
        return None
    return ratio(step_seconds, plain_step_seconds)


def spec_coverage_needed(
    tokens_per_pass_needed: float | None, mean_acceptance_length: float | None
) -> float | None:
    """Share of decode steps that must draft for speculation to make
    `tokens_per_pass_needed` tokens per step, when a drafting step makes
    `mean_acceptance_length` tokens and a step that does not draft makes one. Above 1:
    no coverage is enough at this acceptance; absent when a draft adds nothing."""
    if tokens_per_pass_needed is None or mean_acceptance_length is None:
        return None
    return ratio(max(tokens_per_pass_needed - 1.0, 0.0), mean_acceptance_length - 1.0)
