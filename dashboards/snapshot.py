"""A picture of the dashboards without Grafana: every panel's queries, drawn as PNG.

No Grafana server runs here, so this does what Grafana would do, minimally: substitute the
dashboard variables with "All" (`.*`) and the built-in intervals the way Grafana computes
them, run each target through Prometheus' `query_range` (tables: an instant query at the
end), and draw each panel with matplotlib — one PNG per panel and one sheet per dashboard
laid out like Grafana's grid. Panels whose queries return nothing are reported: the
picture doubles as proof that every panel has data.

    render_snapshots("http://127.0.0.1:9090", Path("out"), start, end)

I/O stays at the edges (`Prometheus`, file writing); substitution, reduction, formatting
and drawing are functions of their inputs.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import yaml
from vllm_glassbox.dashboards import catalog
from vllm_glassbox.units import parse_duration

# --- time ranges and Grafana's variables --------------------------------------------------


def parse_time(text: str, now: float) -> float:
    """Unix seconds ('1732900000'), RFC 3339 ('2024-11-29T16:00:00Z'), or relative to
    now ('now', '-15m', 'now-15m')."""
    raw = text.strip()
    try:
        return float(raw)
    except ValueError:
        pass
    relative = raw.removeprefix("now")
    if relative == "":
        return now
    if relative.startswith("-"):
        try:
            return now - parse_duration(relative[1:])
        except ValueError:
            pass
    try:
        moment = datetime.fromisoformat(raw)
    except ValueError:
        raise ValueError(
            f"not a time: {text!r} (use unix seconds, RFC 3339 like 2024-11-29T16:00:00Z, "
            "or relative like -15m)"
        ) from None
    if moment.tzinfo is None:
        raise ValueError(f"RFC 3339 time without a zone: {text!r} (add Z or +00:00)")
    return moment.timestamp()


@dataclass(frozen=True)
class TimeRange:
    start: float
    end: float
    step: float
    scrape_interval: float

    @property
    def rate_interval(self) -> float:
        """Grafana's $__rate_interval: max($__interval + scrape interval, 4 × scrape)."""
        return max(self.step + self.scrape_interval, 4 * self.scrape_interval)


def check_range(start: float, end: float) -> None:
    if not end > start:
        raise ValueError(f"the range is empty: start {start:g} is not before end {end:g}")


def time_range(start: float, end: float, scrape_interval: float, points: int = 400) -> TimeRange:
    """About `points` points over the range, never finer than the scrape interval."""
    check_range(start, end)
    step = max(scrape_interval, (end - start) / points)
    return TimeRange(start, end, float(math.ceil(step)) if step >= 1 else step, scrape_interval)


def _promql_duration(seconds: float) -> str:
    ms = max(1, round(seconds * 1000))
    return f"{ms // 1000}s" if ms % 1000 == 0 else f"{ms}ms"


_VARIABLE = re.compile(r"\$\{(\w+)(?::\w+)?\}|\$(\w+)|\[\[(\w+)\]\]")


def substitute(expr: str, variables: Iterable[str], span: TimeRange) -> str:
    """The expression Grafana would send with every variable on "All" (`.*`)."""
    builtin = {
        "__rate_interval": _promql_duration(span.rate_interval),
        "__interval": _promql_duration(span.step),
        "__range": _promql_duration(span.end - span.start),
    }
    names = set(variables)

    def replace(m: re.Match[str]) -> str:
        name = m.group(1) or m.group(2) or m.group(3)
        if name in builtin:
            return builtin[name]
        if name in names:
            return ".*"
        raise ValueError(f"unknown Grafana variable ${name} in: {expr}")

    return _VARIABLE.sub(replace, expr)


def variable_names(dashboard: dict[str, Any]) -> list[str]:
    return [str(v["name"]) for v in dashboard.get("templating", {}).get("list", [])]


# --- Prometheus (the I/O edge) ------------------------------------------------------------


class PrometheusError(RuntimeError):
    pass


class Prometheus:
    """Prometheus' HTTP API, the three calls a snapshot needs."""

    def __init__(self, url: str, timeout_seconds: float = 30.0) -> None:
        self.url = url.rstrip("/")
        self._client = httpx.Client(timeout=timeout_seconds, trust_env=False)

    def close(self) -> None:
        self._client.close()

    def _get(self, path: str, params: dict[str, str | float]) -> Any:
        try:
            r = self._client.get(self.url + path, params=params)
        except httpx.HTTPError as e:
            raise PrometheusError(f"cannot reach Prometheus at {self.url}: {e}") from None
        try:
            body = r.json()
        except ValueError:
            raise PrometheusError(
                f"{self.url}{path}: HTTP {r.status_code}, not Prometheus' JSON API"
            ) from None
        if body.get("status") != "success":
            raise PrometheusError(f"{body.get('errorType', 'error')}: {body.get('error', body)}")
        return body["data"]

    def query_range(self, expr: str, span: TimeRange) -> list[dict[str, Any]]:
        params: dict[str, str | float] = {
            "query": expr,
            "start": span.start,
            "end": span.end,
            "step": span.step,
        }
        result: list[dict[str, Any]] = self._get("/api/v1/query_range", params)["result"]
        return result

    def query(self, expr: str, at: float) -> list[dict[str, Any]]:
        data = self._get("/api/v1/query", {"query": expr, "time": at})
        if data.get("resultType") != "vector":
            raise PrometheusError(f"expected an instant vector, got {data.get('resultType')}")
        result: list[dict[str, Any]] = data["result"]
        return result

    def scrape_interval(self) -> float:
        """The global scrape interval from Prometheus' loaded configuration."""
        config = yaml.safe_load(self._get("/api/v1/status/config", {})["yaml"]) or {}
        return parse_duration(str(config.get("global", {}).get("scrape_interval", "1m")))


# --- panel data ---------------------------------------------------------------------------


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


_LEGEND = re.compile(r"\{\{\s*(\w+)\s*\}\}")


def legend(template: str, labels: dict[str, str]) -> str:
    """Grafana's legend format: {{label}} replaced, absent labels empty; else the series."""
    if template:
        text = _LEGEND.sub(lambda m: labels.get(m.group(1), ""), template)
        return re.sub(r"\s+", " ", text.replace("()", "")).strip()
    name = labels.get("__name__", "")
    rest = ", ".join(f'{k}="{v}"' for k, v in sorted(labels.items()) if k != "__name__")
    return f"{name}{{{rest}}}" if rest else name or "{}"


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


def panels_of(dashboard: dict[str, Any]) -> list[dict[str, Any]]:
    """Panels with queries, in grid order (rows are headings, not panels)."""
    flat: list[dict[str, Any]] = []
    for panel in dashboard.get("panels", []):
        flat.extend(panel.get("panels", []) if panel.get("type") == "row" else [panel])
    return sorted(flat, key=lambda p: (p["gridPos"]["y"], p["gridPos"]["x"]))


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
                    else prometheus.query_range(expr, span)
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
            result = prometheus.query_range(expr, span)
        except PrometheusError:
            continue  # an annotation that cannot be drawn must not stop the picture
        found += regions(_series(result, str(annotation.get("titleFormat", ""))), span.step)
    return found


# --- units --------------------------------------------------------------------------------


def _scaled(value: float, steps: Sequence[tuple[float, str]], unit_gap: str = " ") -> str:
    """value in the largest step it reaches, 3 significant digits."""
    magnitude = abs(value)
    factor, suffix = steps[0]
    for f, s in steps:
        if magnitude >= f:
            factor, suffix = f, s
    scaled = value / factor
    text = f"{scaled:.3g}" if abs(scaled) < 1000 else f"{scaled:.0f}"
    return f"{text}{unit_gap}{suffix}".rstrip()


_SI = [(1.0, ""), (1e3, "k"), (1e6, "M"), (1e9, "G"), (1e12, "T")]


def format_value(value: float, unit: str) -> str:
    """A value as Grafana would label it in `unit` (the units these dashboards use)."""
    if not math.isfinite(value):
        return str(value)
    if unit == "s":
        if value == 0:
            return "0 s"
        return _scaled(value, [(1e-9, "ns"), (1e-6, "µs"), (1e-3, "ms"), (1.0, "s")])
    if unit == "percentunit":
        return f"{value * 100:.3g}%"
    if unit == "bytes":
        return _scaled(
            value, [(1, "B"), (1024, "KiB"), (1024**2, "MiB"), (1024**3, "GiB"), (1024**4, "TiB")]
        )
    if unit == "Bps":
        return _scaled(
            value, [(1, "B/s"), (1e3, "kB/s"), (1e6, "MB/s"), (1e9, "GB/s"), (1e12, "TB/s")]
        )
    if abs(value) >= 1e5:
        short = _scaled(value, _SI, unit_gap="")
    elif abs(value) >= 1000 or value == int(value):
        short = f"{value:,.0f}"  # counts as counted: 4,096 tokens, not 4.1k
    else:
        short = f"{value:.3g}"
    if unit.startswith("suffix:"):
        return short + unit.removeprefix("suffix:")
    return short


def mapped(value: float, mappings: Sequence[dict[str, Any]]) -> str | None:
    """Text of a Grafana value mapping that matches `value` exactly, if any."""
    for mapping in mappings:
        if mapping.get("type") != "value":
            continue
        for key, target in mapping.get("options", {}).items():
            try:
                if float(key) == value:
                    return str(target.get("text", key))
            except ValueError:
                continue
    return None


def _unit(panel: dict[str, Any]) -> str:
    return str(panel.get("fieldConfig", {}).get("defaults", {}).get("unit") or "")


def _defaults(panel: dict[str, Any]) -> dict[str, Any]:
    defaults: dict[str, Any] = panel.get("fieldConfig", {}).get("defaults", {})
    return defaults


# --- drawing ------------------------------------------------------------------------------

# Grafana's named colours, as matplotlib draws them.
_COLOURS = {
    "green": "#56A64B",
    "orange": "#FF9830",
    "red": "#E02F44",
    "text": "#222222",
    "blue": "#3274D9",
    "purple": "#A352CC",
}
_MAX_LEGEND = 12
_DPI = 110


def _colour(name: str | None) -> str:
    return _COLOURS.get(name or "text", name or "#222222")


def _threshold_colour(value: float, steps: Sequence[dict[str, Any]]) -> str:
    colour = "text"
    for step in steps:
        if step.get("value") is None or value >= float(step["value"]):
            colour = str(step.get("color", colour))
    return _colour(colour)


@dataclass(frozen=True)
class Box:
    """A rectangle of the figure, in inches from the top-left corner."""

    x: float
    y: float
    w: float
    h: float


def _axes(fig: Any, box: Box, fig_w: float, fig_h: float) -> Any:
    rect = (box.x / fig_w, 1 - (box.y + box.h) / fig_h, box.w / fig_w, box.h / fig_h)
    return fig.add_axes(rect)


def draw_panel(
    fig: Any,
    box: Box,
    data: PanelData,
    span: TimeRange,
    fig_w: float,
    fig_h: float,
    font: float = 8.0,
    marks: Sequence[Region] = (),
) -> None:
    """Draw one panel into `box` of `fig`: title, then its visualization; time series
    get the annotation regions `marks` behind their lines."""
    title_h = font * 2.4 / 72
    frame = _axes(fig, box, fig_w, fig_h)
    frame.set_xticks([])
    frame.set_yticks([])
    for spine in frame.spines.values():
        spine.set_color("#CCCCCC")
    frame.text(
        0.01,
        1 - 0.5 * title_h / box.h,
        data.title,
        transform=frame.transAxes,
        fontsize=font + 1,
        fontweight="bold",
        va="center",
        ha="left",
    )
    inner = Box(box.x, box.y + title_h, box.w, box.h - title_h)
    if data.errors:
        _message(frame, "query failed:\n" + "\n".join(data.errors)[:300], font, "#E02F44")
    elif not data.has_data:
        _message(frame, "No data", font + 2, "#888888")
    elif data.kind == "stat":
        _draw_stat(fig, inner, data, fig_w, fig_h, font)
    elif data.kind == "table":
        _draw_table(fig, inner, data, fig_w, fig_h, font)
    elif data.kind == "barchart":
        _draw_stacked_bars(fig, inner, data, fig_w, fig_h, font)
    else:
        _draw_timeseries(fig, inner, data, span, fig_w, fig_h, font, marks)


def _message(ax: Any, text: str, font: float, colour: str) -> None:
    ax.text(
        0.5,
        0.45,
        text,
        transform=ax.transAxes,
        ha="center",
        va="center",
        fontsize=font,
        color=colour,
        wrap=True,
    )


def _draw_timeseries(
    fig: Any,
    box: Box,
    data: PanelData,
    span: TimeRange,
    fig_w: float,
    fig_h: float,
    font: float,
    marks: Sequence[Region],
) -> None:
    from matplotlib import dates as mdates
    from matplotlib import ticker
    from matplotlib.lines import Line2D

    panel, unit = data.panel, _unit(data.panel)
    defaults = _defaults(panel)
    custom = defaults.get("custom", {})
    band = custom.get("lineInterpolation") == "stepAfter" and custom.get("fillOpacity", 0) > 0
    mappings = defaults.get("mappings", [])
    dashed = _dashed_ref_ids(panel)
    styled = [(s, "--" if t.ref_id in dashed else "-") for t in data.targets for s in t.series]
    series = [s for s, _ in styled if s.has_data]
    styles = [style for s, style in styled if s.has_data]
    shown = series[:_MAX_LEGEND]
    cols = 2 if box.w > 5.5 else 1
    rows = math.ceil((len(shown) + (len(series) > len(shown))) / cols)
    legend_h = rows * font * 1.45 / 72 + 0.08
    left, bottom_axis = 0.75 if not mappings else 0.85, font * 2.6 / 72
    plot = Box(
        box.x + left, box.y + 0.08, box.w - left - 0.15, box.h - legend_h - bottom_axis - 0.08
    )
    ax = _axes(fig, plot, fig_w, fig_h)
    for mark in marks:
        ax.axvspan(
            datetime.fromtimestamp(mark.start, UTC),
            datetime.fromtimestamp(mark.end, UTC),
            color=_COLOURS["orange"],
            alpha=0.12,
            lw=0,
        )
        ax.text(
            datetime.fromtimestamp(mark.start, UTC),
            1.0,
            " " + mark.text,
            transform=ax.get_xaxis_transform(),
            fontsize=font - 2,
            color="#B35C00",
            va="top",
            clip_on=True,
        )
    colours = [f"C{i % 10}" for i in range(len(series))]
    handles = []
    for s, colour, style in zip(series, colours, styles, strict=True):
        stamps, values = with_gaps(s, span.step)
        times = [datetime.fromtimestamp(t, UTC) for t in stamps]
        if band:
            ax.fill_between(times, values, step="post", color=colour, alpha=0.45, lw=0)
            ax.step(times, values, where="post", color=colour, lw=1)
        else:
            ax.plot(times, values, color=colour, lw=1.4, ls=style)
        last = s.last
        shown_last = mapped(last, mappings) or format_value(last, unit) if last is not None else ""
        line = Line2D([], [], color=colour, lw=2, ls=style)
        handles.append((line, f"{s.legend}  (last {shown_last})"))
    for step in defaults.get("thresholds", {}).get("steps", []):
        if step.get("value") is not None and custom.get("thresholdsStyle", {}).get("mode") != "off":
            ax.axhline(float(step["value"]), color=_colour(step.get("color")), lw=1, ls="--")
    ax.set_xlim(datetime.fromtimestamp(span.start, UTC), datetime.fromtimestamp(span.end, UTC))
    if defaults.get("min") is not None:
        ax.set_ylim(bottom=float(defaults["min"]))
    keys = sorted(float(k) for m in mappings for k in m.get("options", {}))
    if keys:  # a state: one tick per mapped value, all of them in view
        ax.set_yticks(keys)
        ax.set_ylim(keys[0] - 0.1, keys[-1] + 0.3)
    elif band:
        ax.set_yticks([0, 1])
    ax.yaxis.set_major_formatter(
        ticker.FuncFormatter(lambda v, _: mapped(v, mappings) or format_value(v, unit))
    )
    locator = mdates.AutoDateLocator(minticks=3, maxticks=7)
    ax.xaxis.set_major_locator(locator)
    ax.xaxis.set_major_formatter(mdates.DateFormatter("%H:%M:%S", tz=UTC))
    ax.tick_params(labelsize=font - 1)
    ax.grid(True, color="#E5E5E5", lw=0.6)
    for spine in ("top", "right"):
        ax.spines[spine].set_visible(False)
    labels = [label for _, label in handles[: len(shown)]]
    lines = [line for line, _ in handles[: len(shown)]]
    if len(series) > len(shown):
        lines.append(Line2D([], [], color="none"))
        labels.append(f"… and {len(series) - len(shown)} more series")
    legend_box = Box(box.x + 0.1, box.y + box.h - legend_h, box.w - 0.2, legend_h)
    legend_ax = _axes(fig, legend_box, fig_w, fig_h)
    legend_ax.axis("off")
    legend_ax.legend(
        lines,
        labels,
        loc="upper left",
        ncol=cols,
        frameon=False,
        fontsize=font - 1,
        handlelength=1.5,
        borderaxespad=0,
        columnspacing=1.5,
    )


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


def _draw_stacked_bars(
    fig: Any, box: Box, data: PanelData, fig_w: float, fig_h: float, font: float
) -> None:
    from matplotlib import ticker

    unit = _unit(data.panel)
    bars, stacks, cells = stacked_bar_cells(data)
    legend_w = min(2.2, box.w * 0.3)
    bottom_axis = font * 7.0 / 72  # room for the slanted bar labels
    plot = Box(box.x + 0.75, box.y + 0.08, box.w - 0.9 - legend_w, box.h - bottom_axis - 0.1)
    ax = _axes(fig, plot, fig_w, fig_h)
    base = [0.0] * len(bars)
    for i, stack in enumerate(stacks):
        heights = [cells.get((bar, stack), 0.0) for bar in bars]
        ax.bar(range(len(bars)), heights, bottom=base, color=f"C{i % 10}", label=stack, width=0.7)
        base = [b + h for b, h in zip(base, heights, strict=True)]
    ax.set_xticks(range(len(bars)))
    ax.set_xticklabels(bars, rotation=30, ha="right")
    ax.yaxis.set_major_formatter(ticker.FuncFormatter(lambda v, _: format_value(v, unit)))
    ax.tick_params(labelsize=font - 1)
    ax.grid(True, axis="y", color="#E5E5E5", lw=0.6)
    for spine in ("top", "right"):
        ax.spines[spine].set_visible(False)
    ax.legend(
        loc="upper left",
        bbox_to_anchor=(1.02, 1.0),
        frameon=False,
        fontsize=font - 1,
        reverse=True,  # top of the stack first, as Grafana lists it
    )


def with_gaps(series: Series, step: float) -> tuple[list[float], list[float]]:
    """The points with a NaN wherever steps are missing, so the line breaks there as in
    Grafana (spanNulls off) instead of bridging a time without data."""
    times: list[float] = []
    values: list[float] = []
    for t, v in zip(series.times, series.values, strict=True):
        if times and t - times[-1] > 1.5 * step:
            times.append(times[-1] + step)
            values.append(math.nan)
        times.append(t)
        values.append(v)
    return times, values


def _dashed_ref_ids(panel: dict[str, Any]) -> set[str]:
    """Queries whose lines a field override draws dashed."""
    return {
        str(o["matcher"]["options"])
        for o in panel.get("fieldConfig", {}).get("overrides", [])
        if o.get("matcher", {}).get("id") == "byFrameRefID"
        and any(
            p.get("id") == "custom.lineStyle" and p.get("value", {}).get("fill") == "dash"
            for p in o.get("properties", [])
        )
    }


def _draw_stat(
    fig: Any, box: Box, data: PanelData, fig_w: float, fig_h: float, font: float
) -> None:
    panel, unit = data.panel, _unit(data.panel)
    defaults = _defaults(panel)
    mappings = defaults.get("mappings", [])
    steps = defaults.get("thresholds", {}).get("steps", [])
    by_name = panel.get("options", {}).get("textMode") == "name"
    series = [s for t in data.targets for s in t.series if s.has_data][:4]
    ax = _axes(fig, box, fig_w, fig_h)
    ax.axis("off")
    n = len(series)
    for i, s in enumerate(series):
        value = s.last if s.last is not None else math.nan
        text = s.legend if by_name else mapped(value, mappings) or format_value(value, unit)
        x = (i + 0.5) / n
        size = min(font * 2.6, 72 * box.h * 0.45, 72 * box.w / n / max(len(text), 1) * 1.6)
        ax.text(
            x,
            0.55,
            text,
            ha="center",
            va="center",
            fontsize=size,
            fontweight="bold",
            color=_threshold_colour(value, steps),
            transform=ax.transAxes,
        )
        if n > 1 or not by_name:
            ax.text(
                x,
                0.12,
                s.legend,
                ha="center",
                va="center",
                fontsize=font - 1.5,
                color="#555555",
                transform=ax.transAxes,
            )


def _draw_table(
    fig: Any, box: Box, data: PanelData, fig_w: float, fig_h: float, font: float
) -> None:
    columns: list[str] = []
    for transformation in data.panel.get("transformations", []):
        if transformation.get("id") == "filterFieldsByName":
            columns = list(transformation["options"]["include"]["names"])
    rows = [s for t in data.targets for s in t.series]
    if not columns:
        columns = [*sorted({k for s in rows for k in s.labels} - {"__name__"}), "Value"]
    cells = [
        [
            format_value(s.last, "short")
            if c == "Value" and s.last is not None
            else s.labels.get(c, "")
            for c in columns
        ]
        for s in rows
    ]
    ax = _axes(fig, Box(box.x + 0.1, box.y + 0.05, box.w - 0.2, box.h - 0.1), fig_w, fig_h)
    ax.axis("off")
    # Columns as wide as their longest text (the header is bold: count it a little wider).
    chars = [
        max([len(c) * 1.15] + [len(row[i]) for row in cells]) + 2 for i, c in enumerate(columns)
    ]
    table = ax.table(
        cellText=cells,
        colLabels=columns,
        colWidths=[n / sum(chars) for n in chars],
        loc="upper left",
        cellLoc="left",
        colLoc="left",
    )
    table.auto_set_font_size(False)
    table.set_fontsize(font - 0.5)
    for (row, _), cell in table.get_celld().items():
        cell.set_edgecolor("#DDDDDD")
        if row == 0:
            cell.set_text_props(fontweight="bold")
            cell.set_facecolor("#F2F2F2")


# --- files --------------------------------------------------------------------------------

_SINGLE_SIZE = {"timeseries": (10.0, 5.2), "stat": (4.0, 2.4)}
# Sheet scale: 24 columns of Grafana's grid across, 30 px rows against ~80 px columns.
_SHEET_WIDTH = 22.0
_ROW_UNIT = _SHEET_WIDTH / 24 * 0.4


def _slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-") or "panel"


def _figure(w: float, h: float) -> Any:
    from matplotlib.figure import Figure

    return Figure(figsize=(w, h), dpi=_DPI, facecolor="white")


def render_panel(
    data: PanelData, span: TimeRange, path: Path, marks: Sequence[Region] = ()
) -> Path:
    if data.kind == "table":
        rows = sum(len(t.series) for t in data.targets)
        w, h = 12.0, 1.2 + 0.3 * max(rows, 1)
    else:
        w, h = _SINGLE_SIZE.get(data.kind, _SINGLE_SIZE["timeseries"])
    fig = _figure(w, h)
    draw_panel(fig, Box(0.05, 0.05, w - 0.1, h - 0.1), data, span, w, h, 9.0, marks)
    fig.savefig(path)
    return path


def render_sheet(
    dashboard: dict[str, Any],
    panels: Sequence[PanelData],
    span: TimeRange,
    path: Path,
    marks: Sequence[Region] = (),
) -> Path:
    """The whole dashboard on one image, each panel where Grafana's grid puts it."""
    header = 0.7
    bottom = max(p["gridPos"]["y"] + p["gridPos"]["h"] for p in dashboard["panels"])
    w, h = _SHEET_WIDTH, header + bottom * _ROW_UNIT + 0.1
    col = w / 24
    fig = _figure(w, h)
    start = datetime.fromtimestamp(span.start, UTC).strftime("%Y-%m-%d %H:%M:%S")
    end = datetime.fromtimestamp(span.end, UTC).strftime("%H:%M:%S UTC")
    fig.text(
        0.01,
        1 - 0.35 / h,
        f"{dashboard['title']}   ({start} – {end}, variables: All)",
        fontsize=13,
        fontweight="bold",
        va="center",
    )
    for row in (p for p in dashboard["panels"] if p.get("type") == "row"):
        y = header + row["gridPos"]["y"] * _ROW_UNIT
        fig.text(
            0.01,
            1 - (y + 0.5 * _ROW_UNIT) / h,
            row["title"],
            fontsize=10.5,
            fontweight="bold",
            color="#444444",
            va="center",
        )
    for data in panels:
        g = data.panel["gridPos"]
        box = Box(
            g["x"] * col + 0.04,
            header + g["y"] * _ROW_UNIT + 0.04,
            g["w"] * col - 0.08,
            g["h"] * _ROW_UNIT - 0.08,
        )
        draw_panel(fig, box, data, span, w, h, 7.5, marks)
    fig.savefig(path)
    return path


@dataclass(frozen=True)
class Snapshot:
    files: list[Path]
    panels: list[PanelData]

    @property
    def empty(self) -> list[PanelData]:
        return [p for p in self.panels if not p.has_data]

    @property
    def failed(self) -> list[PanelData]:
        return [p for p in self.panels if p.errors]


def take_snapshot(
    prometheus: Prometheus,
    out_dir: Path,
    start: float,
    end: float,
    dashboards: Sequence[dict[str, Any]] | None = None,
) -> Snapshot:
    """Query and draw `dashboards` (default: all of glassbox's) into `out_dir`."""
    import matplotlib

    matplotlib.use("Agg")
    check_range(start, end)  # before asking Prometheus anything
    boards = (
        list(dashboards)
        if dashboards is not None
        else [catalog.as_json(d) for d in catalog.dashboards()]
    )
    span = time_range(start, end, prometheus.scrape_interval())
    out_dir.mkdir(parents=True, exist_ok=True)
    files: list[Path] = []
    everything: list[PanelData] = []
    for board in boards:
        panels = query_dashboard(board, prometheus, span)
        marks = query_annotations(board, prometheus, span)
        folder = out_dir / str(board["uid"])
        folder.mkdir(exist_ok=True)
        files.append(render_sheet(board, panels, span, out_dir / f"{board['uid']}.png", marks))
        for i, data in enumerate(panels, 1):
            path = folder / f"{i:02d}-{_slug(data.title)}.png"
            files.append(render_panel(data, span, path, marks))
        everything.extend(panels)
    (out_dir / "index.md").write_text(_index(boards, everything, span))
    return Snapshot(files, everything)


def _index(boards: Sequence[dict[str, Any]], panels: Sequence[PanelData], span: TimeRange) -> str:
    start = datetime.fromtimestamp(span.start, UTC).isoformat()
    end = datetime.fromtimestamp(span.end, UTC).isoformat()
    lines = [
        f"# Dashboard snapshot, {start} to {end}",
        "",
        "Every panel's queries run against Prometheus with all variables on All.",
        "",
    ]
    for board in boards:
        lines += [f"## {board['title']}", "", f"![{board['uid']}]({board['uid']}.png)", ""]
        for i, data in enumerate((p for p in panels if p.dashboard_uid == board["uid"]), 1):
            state = "query failed" if data.errors else "data" if data.has_data else "**no data**"
            lines.append(
                f"- [{data.title}]({board['uid']}/{i:02d}-{_slug(data.title)}.png): {state}"
            )
        lines.append("")
    return "\n".join(lines)


def render_snapshots(prometheus_url: str, out_dir: Path, start: float, end: float) -> list[Path]:
    """Draw every glassbox dashboard over [start, end] (unix seconds) as PNG files."""
    prometheus = Prometheus(prometheus_url)
    try:
        return take_snapshot(prometheus, out_dir, start, end).files
    finally:
        prometheus.close()
