"""How each of Grafana's visualizations is drawn with matplotlib into a box of a figure:
time series (with the regions to shade, the legend folded to what fits), stats, tables
and stacked bars; and what they share (the box, Grafana's colours, the panel's field
defaults). Pure in its inputs: no file is written here (`drawing.py` writes them).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from vllm_glassbox.dashboards.formatting import format_value, mapped
from vllm_glassbox.dashboards.grafana import TimeRange
from vllm_glassbox.dashboards.panel_data import PanelData, Region, Series, stacked_bar_cells


def _unit(panel: dict[str, Any]) -> str:
    return str(panel.get("fieldConfig", {}).get("defaults", {}).get("unit") or "")


def _defaults(panel: dict[str, Any]) -> dict[str, Any]:
    defaults: dict[str, Any] = panel.get("fieldConfig", {}).get("defaults", {})
    return defaults


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


class PanelTooSmall(ValueError):
    """A panel's box leaves no room for what it must draw."""


def axes_in(fig: Any, box: Box, fig_w: float, fig_h: float) -> Any:
    if box.w <= 0 or box.h <= 0:  # matplotlib refuses such a rectangle
        raise PanelTooSmall(f"no room to draw it in {max(box.w, 0):.2f} × {max(box.h, 0):.2f} in")
    rect = (box.x / fig_w, 1 - (box.y + box.h) / fig_h, box.w / fig_w, box.h / fig_h)
    return fig.add_axes(rect)


def message(ax: Any, text: str, font: float, colour: str) -> None:
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


@dataclass(frozen=True)
class _Legend:
    """Where a time series panel's legend goes: `named` series named in `columns`, one
    more entry saying "… and N more" when `folded`, in `height` inches above the plot."""

    columns: int
    named: int
    folded: bool
    rows: int
    height: float


def _legend_room(box: Box, series: int, font: float, bottom_axis: float) -> _Legend:
    """The legend takes at most half the panel and leaves the plot room for a few ticks;
    what does not fit is folded into "… and N more" (Grafana scrolls instead)."""
    cols = 2 if box.w > 5.5 else 1
    row_h = font * 1.45 / 72
    room = min(box.h / 2, box.h - bottom_axis - 0.16 - font * 4 / 72) - 0.08
    named, folded = legend_entries(series, max(0, math.floor(room / row_h)) * cols)
    rows = math.ceil((named + folded) / cols)
    return _Legend(cols, named, folded, rows, rows * row_h + 0.08 if rows else 0.0)


def _shade(ax: Any, marks: Sequence[Region], font: float) -> None:
    """The annotation regions, behind the lines, each with its text at the top."""
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


def _plot_series(
    ax: Any,
    series: Sequence[Series],
    styles: Sequence[str],
    span: TimeRange,
    band: bool,
    value_text: Callable[[float], str],
) -> list[tuple[Any, str]]:
    """Each series' line (or step band), and its legend entry with its last value."""
    from matplotlib.lines import Line2D

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
        shown_last = value_text(last) if last is not None else ""
        line = Line2D([], [], color=colour, lw=2, ls=style)
        handles.append((line, f"{s.legend}  (last {shown_last})"))
    return handles


def _time_axes(
    ax: Any,
    defaults: dict[str, Any],
    span: TimeRange,
    band: bool,
    value_text: Callable[[float], str],
    font: float,
) -> None:
    """Thresholds as dashed lines, the range, the value axis (a state's mapped values, a
    band's 0 and 1) and the clock, as Grafana shows them."""
    from matplotlib import dates as mdates
    from matplotlib import ticker

    custom = defaults.get("custom", {})
    mappings = defaults.get("mappings", [])
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
    ax.yaxis.set_major_formatter(ticker.FuncFormatter(lambda v, _: value_text(v)))
    locator = mdates.AutoDateLocator(minticks=3, maxticks=7)
    ax.xaxis.set_major_locator(locator)
    ax.xaxis.set_major_formatter(mdates.DateFormatter("%H:%M:%S", tz=UTC))
    ax.tick_params(labelsize=font - 1)
    ax.grid(True, color="#E5E5E5", lw=0.6)
    for spine in ("top", "right"):
        ax.spines[spine].set_visible(False)


def _draw_legend(
    fig: Any,
    box: Box,
    legend: _Legend,
    handles: Sequence[tuple[Any, str]],
    fig_w: float,
    fig_h: float,
    font: float,
) -> None:
    """The legend above the plot: the series it names, their labels shortened to fit."""
    from matplotlib.lines import Line2D

    label_chars = max(8, int((box.w - 0.2) / legend.columns / (font * 0.55 / 72)) - 4)
    labels = [shorten(label, label_chars) for _, label in handles[: legend.named]]
    lines = [line for line, _ in handles[: legend.named]]
    if legend.folded:
        lines.append(Line2D([], [], color="none"))
        labels.append(f"… and {len(handles) - legend.named} more series")
    legend_box = Box(box.x + 0.1, box.y + box.h - legend.height, box.w - 0.2, legend.height)
    legend_ax = axes_in(fig, legend_box, fig_w, fig_h)
    legend_ax.axis("off")
    legend_ax.legend(
        lines,
        labels,
        loc="upper left",
        ncol=legend.columns,
        frameon=False,
        fontsize=font - 1,
        handlelength=1.5,
        borderaxespad=0,
        columnspacing=1.5,
    )


def draw_timeseries(
    fig: Any,
    box: Box,
    data: PanelData,
    span: TimeRange,
    fig_w: float,
    fig_h: float,
    font: float,
    marks: Sequence[Region],
) -> None:
    """A time series panel: its regions shaded, its series, thresholds and axes, and its
    legend above (series drawn dashed where a field override says so)."""
    panel, unit = data.panel, _unit(data.panel)
    defaults = _defaults(panel)
    custom = defaults.get("custom", {})
    band = custom.get("lineInterpolation") == "stepAfter" and custom.get("fillOpacity", 0) > 0
    mappings = defaults.get("mappings", [])

    def value_text(v: float) -> str:
        return mapped(v, mappings) or format_value(v, unit)

    dashed = _dashed_ref_ids(panel)
    styled = [(s, "--" if t.ref_id in dashed else "-") for t in data.targets for s in t.series]
    series = [s for s, _ in styled if s.has_data]
    styles = [style for s, style in styled if s.has_data]
    left, bottom_axis = 0.75 if not mappings else 0.85, font * 2.6 / 72
    legend = _legend_room(box, len(series), font, bottom_axis)
    plot = Box(
        box.x + left,
        box.y + 0.08,
        box.w - left - 0.15,
        box.h - legend.height - bottom_axis - 0.08,
    )
    ax = axes_in(fig, plot, fig_w, fig_h)
    _shade(ax, marks, font)
    handles = _plot_series(ax, series, styles, span, band, value_text)
    _time_axes(ax, defaults, span, band, value_text, font)
    if legend.rows:
        _draw_legend(fig, box, legend, handles, fig_w, fig_h, font)


def draw_stacked_bars(
    fig: Any, box: Box, data: PanelData, fig_w: float, fig_h: float, font: float
) -> None:
    from matplotlib import ticker

    unit = _unit(data.panel)
    bars, stacks, cells = stacked_bar_cells(data)
    legend_w = min(2.2, box.w * 0.3)
    bottom_axis = min(font * 7.0 / 72, box.h * 0.4)  # the slanted bar labels, in a squeeze
    plot = Box(box.x + 0.75, box.y + 0.08, box.w - 0.9 - legend_w, box.h - bottom_axis - 0.1)
    ax = axes_in(fig, plot, fig_w, fig_h)
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


def legend_entries(series: int, room: int) -> tuple[int, bool]:
    """How many series a legend with `room` entries names, and whether one entry says
    "… and N more" for the rest (never more than _MAX_LEGEND named)."""
    fits = min(room, _MAX_LEGEND + 1)
    if series <= min(fits, _MAX_LEGEND):
        return series, False
    if fits == 0:
        return 0, False
    return fits - 1, True


def shorten(text: str, chars: int) -> str:
    """`text` cut to `chars` characters, its middle replaced by an ellipsis: a legend's
    end (the last value) and its start (the model) are what tell series apart."""
    if len(text) <= chars:
        return text
    head = (chars - 1) // 2
    return text[:head] + "…" + text[len(text) - (chars - 1 - head) :]


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


def draw_stat(fig: Any, box: Box, data: PanelData, fig_w: float, fig_h: float, font: float) -> None:
    panel, unit = data.panel, _unit(data.panel)
    defaults = _defaults(panel)
    mappings = defaults.get("mappings", [])
    steps = defaults.get("thresholds", {}).get("steps", [])
    by_name = panel.get("options", {}).get("textMode") == "name"
    series = [s for t in data.targets for s in t.series if s.has_data][:4]
    ax = axes_in(fig, box, fig_w, fig_h)
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


def draw_table(
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
    # The rows that fit under the header; the rest counted in a last row (Grafana scrolls).
    fits = max(1, math.floor((box.h - 0.1) / (font * 2.1 / 72)) - 1)
    if len(cells) > fits:
        more = len(cells) - fits + 1
        cells = [*cells[: fits - 1], [f"… and {more} more rows", *[""] * (len(columns) - 1)]]
    ax = axes_in(fig, Box(box.x + 0.1, box.y + 0.05, box.w - 0.2, box.h - 0.1), fig_w, fig_h)
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
