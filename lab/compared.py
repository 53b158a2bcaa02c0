"""The exporter's series the lab sets beside its own numbers, named once.

The sidecar reads them from the exporter beside each server (`sidecar.py`), the lab
computes each over the same segment by the exporter's own rules
(`analysis.segment_values`), and the report titles them in its table of the two
(`report.py`).
"""

from __future__ import annotations

from dataclasses import dataclass

from vllm_glassbox.exporter import series
from vllm_glassbox.exporter.series import Family
from vllm_glassbox.units import GIB


@dataclass(frozen=True)
class Compared:
    family: Family  # the exporter's, from its catalogue
    title: str  # in the report's table
    scale: float  # from the series' unit to the title's

    @property
    def name(self) -> str:
        return self.family.name


COMPARED: tuple[Compared, ...] = (
    Compared(series.BY_NAME["glassbox_time_per_output_token_seconds"], "TPOT ms", 1000.0),
    Compared(series.BY_NAME["glassbox_tokens_per_forward_pass"], "tokens/pass", 1.0),
    Compared(series.BY_NAME["glassbox_spec_decode_acceptance_ratio"], "acceptance", 1.0),
    Compared(series.KV_CAPACITY, "KV tokens", 1.0),
    Compared(series.WEIGHTS_BYTES, "weights GiB", 1 / GIB),
    Compared(
        series.BY_NAME["glassbox_weight_read_bandwidth_bytes_per_second"],
        "weight reads GB/s",
        1e-9,
    ),
    Compared(series.BY_NAME["glassbox_memory_bandwidth_utilization_ratio"], "of peak", 1.0),
)
COMPARED_NAMES = tuple(c.name for c in COMPARED)
