"""Drawing the dashboards without Grafana: every shipped panel draws whatever its series
count and size, its legend folded to what fits; a panel that cannot be drawn says so in
its picture and the rest of the sheet is drawn.

The data are made here (no Prometheus): many series with long legends, as a demo's
seven servers give a panel, in the shipped layout and in panels squeezed to a few rows.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
from vllm_glassbox.dashboards import catalog
from vllm_glassbox.dashboards.drawing import draw_panel, render_panel, render_sheet
from vllm_glassbox.dashboards.grafana import TimeRange, panels_of
from vllm_glassbox.dashboards.panel_data import PanelData, Series, TargetData
from vllm_glassbox.dashboards.visualizations import Box, legend_entries, shorten

BOARDS = [catalog.as_json(d) for d in catalog.dashboards()]
SPAN = TimeRange(start=0.0, end=600.0, step=15.0, scrape_interval=15.0)
PNG = b"\x89PNG\r\n\x1a\n"


def _series(n: int) -> tuple[Series, ...]:
    times = tuple(float(t) for t in range(0, 601, 15))
    return tuple(
        Series(
            f"tiny:model-number-{i} engine 0 (127.0.0.1:{8000 + i}) with a long legend",
            {"model_name": f"m{i}", "engine": "0", "stage": f"s{i % 3}", "pod": f"p{i}"},
            times,
            tuple(float(i + (t % 7)) for t in range(len(times))),
        )
        for i in range(n)
    )


def _crowded(board: dict[str, Any], panel: dict[str, Any], n: int) -> PanelData:
    """`panel` with `n` series on every one of its queries."""
    targets = tuple(TargetData(t["refId"], t["expr"], _series(n)) for t in panel["targets"])
    return PanelData(str(board["uid"]), panel, targets)


def _squeezed(board: dict[str, Any], rows: int) -> dict[str, Any]:
    """A copy of `board` whose panels are each `rows` of Grafana's grid high."""
    board = copy.deepcopy(board)
    for panel in panels_of(board):
        panel["gridPos"]["h"] = rows
    return board


def _legend_texts(fig: Any) -> list[str]:
    return [t.get_text() for ax in fig.axes if ax.get_legend() for t in ax.get_legend().texts]


@pytest.mark.parametrize("rows", [None, 3], ids=["shipped", "3 rows"])
@pytest.mark.parametrize("board", BOARDS, ids=[b["uid"] for b in BOARDS])
def test_every_shipped_panel_draws_sixteen_series_in_its_size_and_squeezed(
    board: dict[str, Any], rows: int | None, tmp_path: Path
) -> None:
    board = board if rows is None else _squeezed(board, rows)
    panels = [_crowded(board, p, 16) for p in panels_of(board)]  # more than a legend names
    drawing = render_sheet(board, panels, SPAN, tmp_path / "sheet.png")
    assert drawing.not_drawn == ()
    assert drawing.path.read_bytes().startswith(PNG)


def test_a_panel_too_small_to_draw_is_marked_and_named_and_the_sheet_is_drawn(
    tmp_path: Path,
) -> None:
    board = copy.deepcopy(next(b for b in BOARDS if b["uid"] == "glassbox-kv-cache"))
    panels = panels_of(board)
    panels[0]["gridPos"]["h"] = 1  # one grid row: the title fills it, no room for a plot
    data = [_crowded(board, p, 3) for p in panels]
    drawing = render_sheet(board, data, SPAN, tmp_path / "sheet.png")
    ((title, why),) = drawing.not_drawn
    assert title == panels[0]["title"]
    assert why.startswith("no room to draw it in ")
    assert drawing.path.read_bytes().startswith(PNG)


def test_a_legend_names_what_fits_and_counts_the_rest() -> None:
    from matplotlib.figure import Figure

    board = next(b for b in BOARDS if b["uid"] == "glassbox-overview")
    panel = next(p for p in panels_of(board) if p["type"] == "timeseries")
    one_target = {**panel, "targets": panel["targets"][:1]}
    data = _crowded(board, one_target, 30)
    fig = Figure(figsize=(10, 5.2))
    assert draw_panel(fig, Box(0.05, 0.05, 9.9, 5.1), data, SPAN, 10, 5.2) is None
    texts = _legend_texts(fig)
    assert texts[-1] == "… and 18 more series"  # 12 named, as many as a legend names
    assert len(texts) == 13
    small = Figure(figsize=(4, 2))
    assert draw_panel(small, Box(0.05, 0.05, 3.9, 1.9), data, SPAN, 4, 2) is None
    texts = _legend_texts(small)
    assert texts[-1] == f"… and {30 - (len(texts) - 1)} more series"
    assert 1 <= len(texts) < 6  # half of a 1.9-inch panel holds a few rows
    # One column of 3.7 inches: every label cut to fit it, its start and end kept.
    assert all(len(t) <= 3.7 / (7 * 0.55 / 72) for t in texts)
    assert texts[0].startswith("tiny:model-number-0") and texts[0].endswith(")")


def test_legend_entries_keep_one_entry_for_the_rest() -> None:
    assert legend_entries(3, 5) == (3, False)
    assert legend_entries(5, 5) == (5, False)
    assert legend_entries(6, 5) == (4, True)
    assert legend_entries(13, 40) == (12, True)  # never more than 12 named
    assert legend_entries(12, 40) == (12, False)
    assert legend_entries(2, 1) == (0, True)
    assert legend_entries(2, 0) == (0, False)


def test_shorten_keeps_both_ends() -> None:
    assert shorten("abcdef", 6) == "abcdef"
    assert shorten("abcdefghij", 5) == "ab…ij"
    assert len(shorten("x" * 100, 20)) == 20


@pytest.mark.parametrize("kind", ["timeseries", "stat", "table", "barchart"])
def test_a_single_panel_picture_draws_forty_series(kind: str, tmp_path: Path) -> None:
    board, panel = next((b, p) for b in BOARDS for p in panels_of(b) if p["type"] == kind)
    drawing = render_panel(_crowded(board, panel, 40), SPAN, tmp_path / "panel.png")
    assert drawing.not_drawn == ()
    assert drawing.path.read_bytes().startswith(PNG)
