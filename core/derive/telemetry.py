"""The GPU's own counters beside glassbox's: dcgm-exporter's framebuffer and DRAM activity,
nvidia-smi's memory utilization.

glassbox's bandwidth figure (`memory_bandwidth_utilization`) counts the weights each
decode step reads; the GPU counts every byte of DRAM traffic. The two agree within a
tolerance when weight reads are the traffic; DRAM busier than the weights explain means
the counters' model misses a reader (the KV cache reads of attention share that
bandwidth, and grow with the tokens held); DRAM less busy than the weights explain means
the layout or the weights are misread.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from vllm_glassbox.core.derive.arithmetic import ratio

MIB = 1024**2

#: How far DRAM activity and glassbox's weight-read share may differ (in share of peak)
#: and still agree: DCGM samples its profiling counters over its own interval, glassbox
#: averages decode steps over the window.
BANDWIDTH_AGREEMENT_TOLERANCE = 0.10


def gpu_memory_from_framebuffer(used_mib: float | None, free_mib: float | None) -> float | None:
    """Bytes of one GPU's memory vLLM can budget from, as DCGM sees it:
    DCGM_FI_DEV_FB_USED + DCGM_FI_DEV_FB_FREE (MiB; the driver's reserve left out)."""
    if used_mib is None or free_mib is None or used_mib < 0 or free_mib < 0:
        return None
    total = (used_mib + free_mib) * MIB
    return total if total > 0 else None


def mean_of(values: Sequence[float]) -> float | None:
    """The mean of readings (a telemetry sampler's, over one load)."""
    return ratio(sum(values), len(values))


def percent_as_ratio(percent: float | None) -> float | None:
    """nvidia-smi's and DCGM's percentages (0..100) as a share (0..1)."""
    return None if percent is None else percent / 100.0


@dataclass(frozen=True)
class BandwidthCheck:
    """DRAM activity beside glassbox's weight-read share of the peak."""

    dram_active: float  # share of time DRAM was busy (DCGM_FI_PROF_DRAM_ACTIVE, 0..1)
    weight_reads: float  # glassbox_memory_bandwidth_utilization_ratio
    gap: float  # dram_active − weight_reads
    verdict: Literal["agree", "unmodelled_reads", "weights_overcounted"]


def bandwidth_check(
    dram_active: float | None,
    weight_reads: float | None,
    tolerance: float = BANDWIDTH_AGREEMENT_TOLERANCE,
) -> BandwidthCheck | None:
    """Whether the GPU's DRAM activity and glassbox's weight reads agree within
    `tolerance`; absent without both."""
    if dram_active is None or weight_reads is None:
        return None
    gap = dram_active - weight_reads
    if abs(gap) <= tolerance:
        verdict: Literal["agree", "unmodelled_reads", "weights_overcounted"] = "agree"
    elif gap > 0:
        verdict = "unmodelled_reads"
    else:
        verdict = "weights_overcounted"
    return BandwidthCheck(dram_active, weight_reads, gap, verdict)


def dram_active_beyond_weight_reads(
    dram_active: float | None, weight_reads: float | None
) -> float | None:
    """DRAM activity less glassbox's weight-read share of the peak (`bandwidth_check`'s gap;
    the rule namespace_model_name:dcgm_dram_active_beyond_weight_reads:avg)."""
    check = bandwidth_check(dram_active, weight_reads)
    return None if check is None else check.gap
