"""Each panel's data: its queries run against Prometheus, as Grafana would run them.

Every target with the variables on "All" and Grafana's intervals (`grafana.substitute`):
time series through `query_range`, tables and bar charts (`instant`) as an instant query
at the end of the range. A query Prometheus rejects is kept with its error, not raised:
the picture shows it. The dashboard's Prometheus annotations become regions of time.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from vllm_glassbox.core.prometheus import Prometheus, PrometheusError
from vllm_glassbox.dashboards.grafana import (
    TimeRange,
    legend,
    panels_of,
    substitute,
    variable_names,
)


@dataclass(frozen=True)
class Series:
    legend: str
    labels: dict[str, str]
    times: tuple[float, ...]
    values: tuple[float, ...]

    @property
    def has_data(self) -> bool:
        return any(math.isfinite(v) for v in self.values)

    @property
    def last(self) -> float | None:
        """Grafana's "lastNotNull": the last finite value."""
        return next((v for v in reversed(self.values) if math.isfinite(v)), None)


@dataclass(frozen=True)
class TargetData:
    ref_id: str
    expr: str  # as sent to Prometheus
    series: tuple[Series, ...] = ()
    error: str | None = None

    @property
    def has_data(self) -> bool:
        return any(s.has_data for s in self.series)


@dataclass(frozen=True)
class PanelData:
    dashboard_uid: str
    panel: dict[str, Any]  # the panel's JSON
    targets: tuple[TargetData, ...] = field(default=())

    @property
    def title(self) -> str:
        return str(self.panel.get("title", ""))

    @property
    def kind(self) -> str:
        return str(self.panel.get("type", ""))

    @property
    def has_data(self) -> bool:
        return any(t.has_data for t in self.targets)

    @property
    def errors(self) -> list[str]:
        return [f"{t.ref_id}: {t.error}" for t in self.targets if t.error]


def _number(text: str) -> float:
    return float(text)  # Prometheus writes NaN and ±Inf as "NaN", "+Inf", "-Inf"


def _series(result: list[dict[str, Any]], template: str) -> tuple[Series, ...]:
    out = []
    for item in result:
        labels = {str(k): str(v) for k, v in item.get("metric", {}).items()}
        points = item.get("values") or ([item["value"]] if "value" in item else [])
        out.append(
            Series(
                legend(template, labels),
                labels,
                tuple(float(t) for t, _ in points),
                tuple(_number(v) for _, v in points),
            )
        )
    return tuple(sorted(out, key=lambda s: s.legend))


def _query_range(prometheus: Prometheus, expr: str, span: TimeRange) -> list[dict[str, Any]]:
    return prometheus.query_range(expr, span.start, span.end, span.step)


def query_dashboard(
    dashboard: dict[str, Any], prometheus: Prometheus, span: TimeRange
) -> list[PanelData]:
    names = variable_names(dashboard)
    panels = []
    for panel in panels_of(dashboard):
        targets = []
        for target in panel.get("targets", []):
            expr = substitute(str(target["expr"]), names, span)
            try:
                result = (
                    prometheus.query(expr, span.end)
                    if target.get("instant")
                    else _query_range(prometheus, expr, span)
                )
                data = TargetData(target["refId"], expr, _series(result, target["legendFormat"]))
            except PrometheusError as e:
                data = TargetData(target["refId"], expr, error=str(e))
            targets.append(data)
        panels.append(PanelData(str(dashboard["uid"]), panel, tuple(targets)))
    return panels


@dataclass(frozen=True)
class Region:
    """A stretch of time an annotation marks (a lab phase): drawn behind time series."""

    start: float
    end: float
    text: str


def regions(series: Sequence[Series], step: float) -> list[Region]:
    """Contiguous runs of samples of each series, as Grafana turns them into regions."""
    out = []
    for s in series:
        times = [t for t, v in zip(s.times, s.values, strict=True) if math.isfinite(v) and v]
        run_start = None
        for i, t in enumerate(times):
            run_start = t if run_start is None else run_start
            if i + 1 == len(times) or times[i + 1] - t > 1.5 * step:
                out.append(Region(run_start, t, s.legend))
                run_start = None
    return sorted(out, key=lambda r: r.start)


def query_annotations(
    dashboard: dict[str, Any], prometheus: Prometheus, span: TimeRange
) -> list[Region]:
    """Regions of the dashboard's Prometheus annotations (Grafana's own need Grafana)."""
    names = variable_names(dashboard)
    found: list[Region] = []
    for annotation in dashboard.get("annotations", {}).get("list", []):
        if "expr" not in annotation or not annotation.get("enable", True):
            continue
        expr = substitute(str(annotation["expr"]), names, span)
        try:
            result = _query_range(prometheus, expr, span)
        except PrometheusError:
            continue  # an annotation that cannot be drawn must not stop the picture
        found += regions(_series(result, str(annotation.get("titleFormat", ""))), span.step)
    return found


def stacked_bar_cells(data: PanelData) -> tuple[list[str], list[str], dict[tuple[str, str], float]]:
    """A bar chart after Grafana's "grouping to matrix": the bars (values of the row
    field), the stacks (values of the column field, in order of appearance) and the
    value of each (bar, stack)."""
    options: dict[str, Any] = next(
        (
            t.get("options", {})
            for t in data.panel.get("transformations", [])
            if t.get("id") == "groupingToMatrix"
        ),
        {},
    )
    bar_field, stack_field = str(options.get("rowField", "")), str(options.get("columnField", ""))
    cells: dict[tuple[str, str], float] = {}
    for series in (s for t in data.targets for s in t.series):
        if series.last is not None:
            key = (series.labels.get(bar_field, ""), series.labels.get(stack_field, ""))
            cells[key] = series.last
    bars = sorted({bar for bar, _ in cells})
    stacks = list(dict.fromkeys(stack for _, stack in cells))
    return bars, stacks, cells
