"""What repeated measurements mean, for every kind: pure judgements that results.json and
the report share.

Every number here is computed once and stored in the results; the report only words it.
The per-request numbers themselves come from the derivation core (`core/derive/`);
this module adds the lab's own arithmetic over many of them, the same for every kind:

- the spread of repeated measurements (median, extremes) and when it says "noisy";
- a least-squares line (the quantization line, a backlog's growth in a rate sweep);
- agreement between the exporter's live series and the lab's numbers.

Each kind's own judgements (the quantization line, the KV-pressure acts, the
speculative speed-ups) are in its module (`lab/experiments/`).
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence

from vllm_glassbox.lab.results import Spread

#: Repetitions further apart than this (relative to their median) mean a noisy machine.
NOISY_SPREAD = 0.10
#: The exporter and the lab agree when their values differ by at most this ratio.
AGREEMENT = 0.01


# --- repeated measurements ------------------------------------------------------------------


def spread(values: Sequence[float | None]) -> Spread | None:
    """Median and extremes of the measured values (None ones were not measurable)."""
    present = [v for v in values if v is not None]
    if not present:
        return None
    return Spread(statistics.median(present), min(present), max(present), len(present))


def is_noisy(measured: Spread | None) -> bool:
    relative = measured.relative if measured else None
    return measured is not None and measured.n > 1 and (relative or 0.0) > NOISY_SPREAD


def fit_line(points: Sequence[tuple[float, float]]) -> tuple[float, float, float | None]:
    """Least squares y = a·x + b: (a, b, R²). Needs two distinct x.

    R² is None through two distinct x (any two points lie on a line: it would always be 1)
    and when every y is the same.
    """
    n = len(points)
    xs = [p[0] for p in points]
    ys = [p[1] for p in points]
    if n < 2 or len(set(xs)) < 2:
        raise ValueError("a line needs at least two points with different x")
    mean_x, mean_y = sum(xs) / n, sum(ys) / n
    sxx = sum((x - mean_x) ** 2 for x in xs)
    slope = sum((x - mean_x) * (y - mean_y) for x, y in points) / sxx
    intercept = mean_y - slope * mean_x
    ss_res = sum((y - (slope * x + intercept)) ** 2 for x, y in points)
    ss_tot = sum((y - mean_y) ** 2 for y in ys)
    r_squared = None if len(set(xs)) < 3 or ss_tot == 0 else 1.0 - ss_res / ss_tot
    return slope, intercept, r_squared


# --- the exporter against the lab ------------------------------------------------------------


def difference(exporter: float | None, lab: float | None) -> float | None:
    """exporter / lab − 1; None when either is unknown or the lab's is 0."""
    if exporter is None or lab is None or lab == 0:
        return None
    return exporter / lab - 1.0


def agree(exporter: float | None, lab: float | None) -> bool | None:
    d = difference(exporter, lab)
    if d is None:
        return None if exporter is None or lab is None else exporter == lab
    return abs(d) <= AGREEMENT
