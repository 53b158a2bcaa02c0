"""Pictures of the dashboards without Grafana: every panel's queries, drawn as PNG.

No Grafana server runs here, so this does what Grafana would do, minimally: substitute
the dashboard variables with "All" (`.*`) and the built-in intervals the way Grafana
computes them (`grafana`), run each target through Prometheus (`panel_data`), and draw
each panel with matplotlib (`drawing`) — one PNG per panel and one sheet per dashboard
laid out like Grafana's grid, with an index. Panels whose queries return nothing are
reported: the pictures double as proof that every panel has data.

    draw_dashboards("http://127.0.0.1:9090", Path("out"), start, end)
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from vllm_glassbox.core.prometheus import Prometheus
from vllm_glassbox.dashboards import catalog
from vllm_glassbox.dashboards.drawing import render_panel, render_sheet
from vllm_glassbox.dashboards.grafana import TimeRange, check_range, time_range
from vllm_glassbox.dashboards.panel_data import PanelData, query_annotations, query_dashboard


def _slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-") or "panel"


@dataclass(frozen=True)
class Pictures:
    """The PNG files drawn, and the data of every panel they show."""

    files: list[Path]
    panels: list[PanelData]
    #: Panels that could not be drawn: "dashboard uid / title" -> why, on the sheet or
    #: in the panel's own picture.
    not_drawn: dict[str, str] = field(default_factory=dict)

    @property
    def empty(self) -> list[PanelData]:
        return [p for p in self.panels if not p.has_data]

    @property
    def failed(self) -> list[PanelData]:
        return [p for p in self.panels if p.errors]


def draw_pictures(
    prometheus: Prometheus,
    out_dir: Path,
    start: float,
    end: float,
    dashboards: Sequence[dict[str, Any]] | None = None,
) -> Pictures:
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
    not_drawn: dict[str, str] = {}
    for board in boards:
        panels = query_dashboard(board, prometheus, span)
        marks = query_annotations(board, prometheus, span)
        folder = out_dir / str(board["uid"])
        folder.mkdir(exist_ok=True)
        drawings = [render_sheet(board, panels, span, out_dir / f"{board['uid']}.png", marks)]
        for i, data in enumerate(panels, 1):
            path = folder / f"{i:02d}-{_slug(data.title)}.png"
            drawings.append(render_panel(data, span, path, marks))
        for drawing in drawings:
            files.append(drawing.path)
            for title, why in drawing.not_drawn:
                not_drawn.setdefault(f"{board['uid']} / {title}", why)
        everything.extend(panels)
    (out_dir / "index.md").write_text(_index(boards, everything, span, not_drawn))
    return Pictures(files, everything, not_drawn)


def _index(
    boards: Sequence[dict[str, Any]],
    panels: Sequence[PanelData],
    span: TimeRange,
    not_drawn: dict[str, str],
) -> str:
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
            why = not_drawn.get(f"{board['uid']} / {data.title}")
            state += f", **not drawn**: {why}" if why else ""
            lines.append(
                f"- [{data.title}]({board['uid']}/{i:02d}-{_slug(data.title)}.png): {state}"
            )
        lines.append("")
    return "\n".join(lines)


def draw_dashboards(prometheus_url: str, out_dir: Path, start: float, end: float) -> list[Path]:
    """Draw every glassbox dashboard over [start, end] (unix seconds) as PNG files."""
    with Prometheus(prometheus_url) as prometheus:
        return draw_pictures(prometheus, out_dir, start, end).files
