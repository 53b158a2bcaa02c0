"""Drawing panels with matplotlib as Grafana draws them: time series, stats, tables and
stacked bars, one panel to a PNG or a whole dashboard on one sheet laid out like
Grafana's grid. Pure in its inputs (the panels' data, the range, the regions to shade);
the only I/O is the PNG file written.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
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


# --- files ------------------------------------------------------------------------------

_SINGLE_SIZE = {"timeseries": (10.0, 5.2), "stat": (4.0, 2.4)}
# Sheet scale: 24 columns of Grafana's grid across, 30 px rows against ~80 px columns.
_SHEET_WIDTH = 22.0
_ROW_UNIT = _SHEET_WIDTH / 24 * 0.4


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
