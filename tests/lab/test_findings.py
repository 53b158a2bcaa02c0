"""The lab's statistics (lab/findings.py): the least-squares line and the spread of repeated
measurements, and the copy benchmark's median of its repetitions (lab/membench.py).
"""

from __future__ import annotations

import pytest
from vllm_glassbox.lab.findings import fit_line, spread


def test_line_fit_is_least_squares_and_r_squared_needs_three_points() -> None:
    # Any two points lie on a line: an R² through them would always be 1.
    assert fit_line([(1.0, 3.0), (3.0, 7.0)]) == (2.0, 1.0, None)
    slope, intercept, r2 = fit_line([(0.0, 0.0), (1.0, 1.0), (2.0, 1.0)])
    assert (slope, intercept) == pytest.approx((0.5, 1 / 6))
    assert r2 == pytest.approx(0.75)
    with pytest.raises(ValueError, match="two points with different x"):
        fit_line([(1.0, 2.0), (1.0, 3.0)])


def test_spread_is_the_median_with_its_extremes() -> None:
    measured = spread([0.012, None, 0.010, 0.011, 0.020])
    assert measured is not None
    assert (measured.median, measured.low, measured.high, measured.n) == (
        pytest.approx(0.0115),
        0.010,
        0.020,
        4,
    )
    assert measured.relative == pytest.approx(0.010 / 0.0115)
    assert spread([None]) is None


def test_the_copy_benchmark_reports_the_median_of_its_repetitions() -> None:
    from vllm_glassbox.lab.membench import copy_bandwidths

    ticks = iter([0.0, 0.01, 1.0, 1.02, 2.0, 2.04])
    rates = copy_bandwidths(8 * 1024**2, 3, clock=lambda: next(ticks))
    moved = 2 * 8 * 1024**2  # read and written
    assert rates == pytest.approx([moved / 0.01, moved / 0.02, moved / 0.04])
    measured = spread(rates)
    assert measured is not None and measured.median == pytest.approx(moved / 0.02)
