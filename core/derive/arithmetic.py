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
