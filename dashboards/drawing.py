"""Drawing panels with matplotlib as Grafana draws them: a panel's frame and title around
its visualization (`visualizations.py`), one panel to a PNG or a whole dashboard on one
sheet laid out like Grafana's grid. Pure in its inputs (the panels' data, the range, the
regions to shade); the only I/O is the PNG file written.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from vllm_glassbox.dashboards.grafana import TimeRange
from vllm_glassbox.dashboards.panel_data import PanelData, Region
from vllm_glassbox.dashboards.visualizations import (
    Box,
    PanelTooSmall,
    axes_in,
    draw_stacked_bars,
    draw_stat,
    draw_table,
    draw_timeseries,
    message,
)


def draw_panel(
    fig: Any,
    box: Box,
    data: PanelData,
    span: TimeRange,
    fig_w: float,
    fig_h: float,
    font: float = 8.0,
    marks: Sequence[Region] = (),
) -> str | None:
    """Draw one panel into `box` of `fig`: title, then its visualization; time series
    get the annotation regions `marks` behind their lines. A panel that cannot be drawn
    says so in its box, and the reason is returned (None when it was drawn): one panel
    never takes the rest of the picture with it."""
    title_h = font * 2.4 / 72
    try:
        frame = axes_in(fig, box, fig_w, fig_h)
    except PanelTooSmall as e:
        return str(e)
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
        message(frame, "query failed:\n" + "\n".join(data.errors)[:300], font, "#E02F44")
        return None
    if not data.has_data:
        message(frame, "No data", font + 2, "#888888")
        return None
    drawn_before = len(fig.axes)
    try:
        if data.kind == "stat":
            draw_stat(fig, inner, data, fig_w, fig_h, font)
        elif data.kind == "table":
            draw_table(fig, inner, data, fig_w, fig_h, font)
        elif data.kind == "barchart":
            draw_stacked_bars(fig, inner, data, fig_w, fig_h, font)
        else:
            draw_timeseries(fig, inner, data, span, fig_w, fig_h, font, marks)
    except Exception as e:  # whatever broke, the panel says so and the sheet goes on
        for ax in fig.axes[drawn_before:]:
            ax.remove()
        reason = str(e) if isinstance(e, PanelTooSmall) else f"{type(e).__name__}: {e}"
        message(frame, "not drawn: " + reason, font, "#E02F44")
        return reason
    return None


_DPI = 110

# --- files ------------------------------------------------------------------------------

_SINGLE_SIZE = {"timeseries": (10.0, 5.2), "stat": (4.0, 2.4)}
# Sheet scale: 24 columns of Grafana's grid across, 30 px rows against ~80 px columns.
_SHEET_WIDTH = 22.0
_ROW_UNIT = _SHEET_WIDTH / 24 * 0.4


def _figure(w: float, h: float) -> Any:
    from matplotlib.figure import Figure

    return Figure(figsize=(w, h), dpi=_DPI, facecolor="white")


@dataclass(frozen=True)
class Drawing:
    """A PNG written, and the panels it could not draw: (panel title, why)."""

    path: Path
    not_drawn: tuple[tuple[str, str], ...] = ()


def render_panel(
    data: PanelData, span: TimeRange, path: Path, marks: Sequence[Region] = ()
) -> Drawing:
    if data.kind == "table":
        rows = sum(len(t.series) for t in data.targets)
        w, h = 12.0, 1.2 + 0.3 * max(rows, 1)
    else:
        w, h = _SINGLE_SIZE.get(data.kind, _SINGLE_SIZE["timeseries"])
    fig = _figure(w, h)
    why = draw_panel(fig, Box(0.05, 0.05, w - 0.1, h - 0.1), data, span, w, h, 9.0, marks)
    fig.savefig(path)
    return Drawing(path, ((data.title, why),) if why else ())


def render_sheet(
    dashboard: dict[str, Any],
    panels: Sequence[PanelData],
    span: TimeRange,
    path: Path,
    marks: Sequence[Region] = (),
) -> Drawing:
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
    not_drawn = []
    for data in panels:
        g = data.panel["gridPos"]
        box = Box(
            g["x"] * col + 0.04,
            header + g["y"] * _ROW_UNIT + 0.04,
            g["w"] * col - 0.08,
            g["h"] * _ROW_UNIT - 0.08,
        )
        why = draw_panel(fig, box, data, span, w, h, 7.5, marks)
        if why:
            not_drawn.append((data.title, why))
    fig.savefig(path)
    return Drawing(path, tuple(not_drawn))
