"""The exporter's series set beside the lab's own numbers: which, how each is written, and
the comparison of one segment, built once when the segment ends.

The sidecar reads the series from the exporter beside each server (`sidecar.py`), the lab
computes each over the same segment by the exporter's own rules
(`analysis.segment_values`), and the runner builds the comparison from both when the
segment ends (`compare_segment`); results.json stores it and the report words it
(`report.py`), neither computing a difference or a verdict of its own (the stored types:
`results.ComparedRow`, `results.SegmentComparison`).

Every compared series is per engine on the exporter's page, the weights excepted, so a
server of several data-parallel engines is compared engine by engine: a sum of two
engines' TPOTs is no TPOT. A page the exporter had not refreshed since the segment
ended (its latest successful poll began before: `ExporterPage.polled_since`) is older
than the lab's numbers: its rows are stale, never "agree".
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from vllm_glassbox.core import series
from vllm_glassbox.core.own_page import ExporterPage
from vllm_glassbox.core.series import Family
from vllm_glassbox.core.snapshot import EngineKey
from vllm_glassbox.core.units import GIB
from vllm_glassbox.lab import findings
from vllm_glassbox.lab.report_format import integer, num
from vllm_glassbox.lab.results import ComparedRow, SegmentComparison


@dataclass(frozen=True)
class Compared:
    family: Family  # the exporter's, from its catalogue
    title: str  # in the report's table
    scale: float = 1.0  # from the series' unit to the title's
    whole: bool = False  # a count: written as a whole number, not to four digits

    @property
    def name(self) -> str:
        return self.family.name

    def text(self, value: float | None) -> str:
        """A value of the series as the report writes it, in the title's unit."""
        return integer(value) if self.whole else num(value, 4, self.scale)


COMPARED: tuple[Compared, ...] = (
    Compared(series.BY_NAME["glassbox_time_per_output_token_seconds"], "TPOT ms", 1000.0),
    Compared(series.BY_NAME["glassbox_tokens_per_forward_pass"], "tokens/pass"),
    Compared(series.BY_NAME["glassbox_spec_decode_acceptance_ratio"], "acceptance"),
    Compared(series.KV_CAPACITY, "KV tokens", whole=True),
    Compared(series.WEIGHTS_BYTES, "weights GiB", 1 / GIB),
    Compared(
        series.BY_NAME["glassbox_weight_read_bandwidth_bytes_per_second"],
        "weight reads GB/s",
        1e-9,
    ),
    Compared(series.BY_NAME["glassbox_memory_bandwidth_utilization_ratio"], "of peak"),
)
COMPARED_NAMES = tuple(c.name for c in COMPARED)
BY_NAME = {c.name: c for c in COMPARED}

#: Read besides the compared series: whether the exporter sees vLLM, when it last did,
#: how many of its polls failed, and two series the report shows beside the comparison.
ALSO_READ = (
    "glassbox_target_up",
    "glassbox_last_scrape_success_timestamp_seconds",
    "glassbox_scrape_errors_total",
    "glassbox_preemptions_per_second",
    "glassbox_decode_floor_seconds",
)
#: What is kept of the exporter at the end of a segment (results.ExporterSeries):
#: `glassbox_scrape_errors_total` its failed polls only, beside SLOW_POLLS.
KEPT = (*ALSO_READ, *COMPARED_NAMES)
SLOW_POLLS = 'glassbox_scrape_errors_total{reason="slow"}'


def kept(page: ExporterPage) -> dict[str, float]:
    """The exporter's page as the lab keeps it at the end of a segment (KEPT): its polls
    answered late (read) apart from those that failed."""
    values = page.totals(KEPT)
    if values and page.has(series.SCRAPE_ERRORS.name):
        values["glassbox_scrape_errors_total"] = page.polls("failed")
        values[SLOW_POLLS] = page.polls("slow")
    return values


def row(name: str, exporter: float | None, lab: float | None, fresh: bool) -> ComparedRow:
    """One series compared by findings' rule; no verdict on a stale page."""
    return ComparedRow(
        name,
        exporter,
        lab,
        findings.difference(exporter, lab),
        findings.agree(exporter, lab) if fresh else None,
    )


def engine_values(page: ExporterPage, key: EngineKey) -> dict[str, float]:
    """The compared series of one engine on the exporter's page (a series of the whole
    server, the weights, is the same for every engine)."""
    values = {}
    for c in COMPARED:
        wanted = {"model_name": key.model_name, "engine": key.engine}
        labels = wanted if "engine" in c.family.labels else {}
        value = page.value(c.name, **labels)
        if value is not None:
            values[c.name] = value
    return values


def compare_segment(
    segment: str,
    page: ExporterPage,
    lab: Mapping[EngineKey, Mapping[str, float | None]],
    polled_since_end: bool,
) -> list[SegmentComparison]:
    """The segment compared engine by engine: the exporter's page at its end against the
    lab's numbers of each engine over it. A series neither side has is left out."""
    several = len(lab) > 1
    out = []
    for key, mine in sorted(lab.items()):
        theirs = engine_values(page, key)
        rows = tuple(
            row(c.name, theirs.get(c.name), mine.get(c.name), polled_since_end)
            for c in COMPARED
            if theirs.get(c.name) is not None or mine.get(c.name) is not None
        )
        out.append(
            SegmentComparison(segment, key.engine if several else None, polled_since_end, rows)
        )
    return out
