"""This machine's memory bandwidth, measured: a short copy benchmark.

Where no datasheet applies (the demo on a CPU), the peak that achieved weight-read
bandwidth is compared against comes from here: numpy copies one large array into
another a few times, in one thread like vLLM's CPU worker, and each copy moves the
array's bytes twice (read and write), as STREAM's copy counts them. The arrays are
much larger than any CPU cache, so the copies stream from memory. It takes a second or
two; the median of the repetitions is the peak.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import numpy as np
from vllm_glassbox.lab import findings
from vllm_glassbox.lab.results import Peak

COPY_BYTES = 256 * 1024**2
REPEATS = 7


def copy_bandwidths(
    size_bytes: int = COPY_BYTES,
    repeats: int = REPEATS,
    clock: Callable[[], float] = time.perf_counter,
) -> list[float]:
    """Bytes per second of each copy (2 × size_bytes moved)."""
    src = np.ones(size_bytes // 8, dtype=np.float64)
    dst = np.empty_like(src)
    np.copyto(dst, src)  # first touch: page faults are not bandwidth
    rates = []
    for _ in range(repeats):
        started = clock()
        np.copyto(dst, src)
        rates.append(2 * src.nbytes / max(clock() - started, 1e-9))
    return rates


def measure_peak(size_bytes: int = COPY_BYTES, repeats: int = REPEATS) -> Peak:
    """The copy benchmark as the run's peak, with every repetition kept."""
    rates = copy_bandwidths(size_bytes, repeats)
    summary = findings.spread(rates)
    assert summary is not None
    return Peak(
        bytes_per_second=summary.median,
        source=(
            f"measured on this machine: median of {repeats} single-threaded copies of "
            f"{size_bytes / 1024**2:.0f} MiB (read + write), "
            f"{summary.low / 1e9:.1f}–{summary.high / 1e9:.1f} GB/s"
        ),
        samples=tuple(rates),
    )
