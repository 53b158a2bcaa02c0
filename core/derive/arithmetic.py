"""The rules every derived number obeys: a ratio whose denominator did not grow is
absent (None), never 0 and never NaN; a value outside what physics allows is absent.
"""

from __future__ import annotations

import math


def ratio(numerator: float, denominator: float) -> float | None:
    """numerator / denominator; absent when the denominator did not grow, or when either
    is unknown (NaN: a counter the window's polls did not all see, exporter/history.py)."""
    if not (denominator > 0 and math.isfinite(numerator) and math.isfinite(denominator)):
        return None
    return numerator / denominator


def physically_possible(
    value: float | None, at_least: float | None = None, at_most: float | None = None
) -> float | None:
    """The one rule for numbers that cannot be: a value outside what physics allows comes
    from an input glassbox misread (a layout, a counter of another meaning), so it is
    absent, never published. Every engine step of a serving engine makes at least one
    token; no GPU reads faster than its peak."""
    if value is None:
        return None
    if (at_least is not None and value < at_least) or (at_most is not None and value > at_most):
        return None
    return value


def share_of(part: float | None, whole: float | None) -> float | None:
    """`part` / `whole`: a stage's share of a start, one engine's share of a total."""
    if part is None or whole is None:
        return None
    return ratio(part, whole)


def prediction_error(predicted: float | None, measured: float | None) -> float | None:
    """How far a prediction landed from the measured value: predicted / measured − 1."""
    if predicted is None or measured is None:
        return None
    r = ratio(predicted, measured)
    return None if r is None else r - 1.0


def moment_before(now_unix: float | None, seconds_ago: float | None) -> float | None:
    """The unix time `seconds_ago` before `now_unix` (a poll's moment, from the monotonic
    clock's span back to it and the wall clock of the latest poll)."""
    if now_unix is None or seconds_ago is None:
        return None
    return now_unix - seconds_ago


def seconds_since(then_unix: float | None, now_unix: float | None) -> float | None:
    """How long before `now_unix` the moment `then_unix` was; absent when either is, or
    when it is later (two clocks disagreeing say nothing)."""
    if then_unix is None or now_unix is None or then_unix > now_unix:
        return None
    return now_unix - then_unix
