"""An exporter's own /metrics page, read back: by `glassbox probe`, the lab's sidecar and
the tests. Its values, whether its latest poll of vLLM succeeded, and whether it has
polled vLLM since a given moment.

"Polled since t" has one meaning everywhere: the exporter's latest poll succeeded and
*started* after unix time t, so the counters it published are vLLM's after t (a poll that
only finished after t may have read them before). The page says when the latest
successful poll ended (`glassbox_last_scrape_success_timestamp_seconds`) and how long the
latest poll took (`glassbox_scrape_duration_seconds`); while the latest poll succeeded
(`glassbox_target_up 1`) both are of that poll, and its start is the one less the other.
The duration also covers reading vLLM's log after the page, so the start errs early: the
rule errs strict, never lenient.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from prometheus_client.parser import text_string_to_metric_families
from vllm_glassbox.core import series
from vllm_glassbox.core.errors import ScrapeError
from vllm_glassbox.core.fetch import TargetCredentials, fetch_once

Samples = Mapping[str, Sequence[tuple[Mapping[str, str], float]]]


@dataclass(frozen=True)
class ExporterPage:
    """One read of an exporter's page: each sample name's series (labels, value)."""

    samples: Samples

    @classmethod
    def parse(cls, text: str) -> ExporterPage:
        """The page's samples; ValueError when the text is not exposition text."""
        samples: dict[str, list[tuple[Mapping[str, str], float]]] = {}
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                samples.setdefault(sample.name, []).append((sample.labels, sample.value))
        return cls(samples)

    def has(self, name: str) -> bool:
        return bool(self.samples.get(name))

    def value(self, name: str, **labels: str) -> float | None:
        """The first series of `name` with these labels (any, when none are given)."""
        for have, value in self.samples.get(name, ()):
            if all(have.get(k) == want for k, want in labels.items()):
                return value
        return None

    def totals(self, names: Iterable[str]) -> dict[str, float]:
        """Each of `names` on the page, summed over its series (engines, reasons)."""
        return {
            name: sum(value for _, value in self.samples[name]) for name in names if self.has(name)
        }

    def polls(self, reasons: str = "failed") -> float:
        """The exporter's polls counted by `glassbox_scrape_errors_total`: those that failed
        (every reason but `slow`), or the `slow` ones (answered after the interval, read)."""
        values = self.samples.get(series.SCRAPE_ERRORS.name, ())
        slow = [v for labels, v in values if labels.get("reason") == "slow"]
        return sum(slow) if reasons == "slow" else sum(v for _, v in values) - sum(slow)

    @property
    def target_up(self) -> bool | None:
        """Whether the latest poll of vLLM succeeded; None before the first one ended."""
        up = self.value(series.TARGET_UP.name)
        return None if up is None else up == 1

    @property
    def poll_started_at(self) -> float | None:
        """Unix time the latest poll started, while it succeeded; else None."""
        ended = self.value(series.LAST_SUCCESS.name)
        took = self.value(series.SCRAPE_DURATION.name)
        if not self.target_up or ended is None or took is None:
            return None
        return ended - took

    def polled_since(self, unix_time: float) -> bool:
        """Whether the latest poll succeeded and started after `unix_time`."""
        started = self.poll_started_at
        return started is not None and started > unix_time


def read_exporter_page(
    base_url: str, timeout_seconds: float, credentials: TargetCredentials | None = None
) -> ExporterPage:
    """One read of `base_url`/metrics; ScrapeError when it fails or is not exposition text."""
    text = fetch_once(base_url, "/metrics", timeout_seconds, credentials)
    try:
        return ExporterPage.parse(text)
    except ValueError as e:
        raise ScrapeError("parse", f"not exposition text: {e}") from None
