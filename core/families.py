"""What an exported family is: name, type, HELP and labels (`series.py` declares each).

Like node_exporter's descriptors, a family says what it is; the exporter fills it with
values from one poll.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

ENGINE = ("model_name", "engine")  # vLLM's labels of one engine (data-parallel rank)


@dataclass(frozen=True)
class Family:
    name: str  # as exposed: a counter's ends in _total
    kind: Literal["gauge", "counter"]
    help: str
    labels: tuple[str, ...] = ()
    windowed: bool = False  # a value over the window: HELP says how long it is

    def help_text(self, window_seconds: float) -> str:
        """The HELP line as exposed."""
        return f"{self.help} Window: {window_seconds:g}s." if self.windowed else self.help

    def new(self, window_seconds: float = 0.0) -> GaugeMetricFamily | CounterMetricFamily:
        """An empty family of this kind, to add samples to."""
        kind = GaugeMetricFamily if self.kind == "gauge" else CounterMetricFamily
        return kind(self.name, self.help_text(window_seconds), labels=self.labels)

    def single(self, value: float, *label_values: str) -> GaugeMetricFamily | CounterMetricFamily:
        """The family holding one series: `value`, with these label values."""
        family = self.new()
        family.add_metric(list(label_values), value)
        return family


def gauge(name: str, help: str, labels: tuple[str, ...] = ()) -> Family:
    return Family(name, "gauge", help, labels)


def counter(name: str, help: str, labels: tuple[str, ...] = ()) -> Family:
    return Family(name, "counter", help, labels)
