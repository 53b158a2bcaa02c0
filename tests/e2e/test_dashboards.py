"""The dashboards on real data: every panel's queries against the real stack's Prometheus
(vLLM CPU with ngram speculation and a 4,096-token pool that preempts, the exporter, the
recording rules and alerts), and the snapshot command drawing all of them.

Queries go through the snapshot's own code path (variables on All, Grafana's intervals),
so what is checked here is what `glassbox dashboards snapshot` draws.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from vllm_glassbox.core.prometheus import Prometheus
from vllm_glassbox.dashboards import catalog
from vllm_glassbox.dashboards.cli import main
from vllm_glassbox.dashboards.grafana import panels_of, time_range
from vllm_glassbox.dashboards.panel_data import PanelData, query_dashboard

from tests.realstack import RealStack

pytestmark = pytest.mark.vllm

# Targets that cannot have data on the test stack, by (panel title, refId), and why.
NOT_ON_THE_STACK = {
    ("Lab phase", "A"): "no lab runs beside the stack; the lab serves glassbox_lab_phase_info "
    "only while one of its phases runs",
    ("Process start to ready", "B"): "the stack starts vLLM once: no previous start to "
    "compare with",
    ("Out of KV headroom", "A"): "a table, read at the range's end, 2 s after the flood: "
    "nothing runs then, so no server is out of headroom",
    ("Firing alerts per namespace", "A"): "every alert waits minutes (`for:` 3 to 15 m) or "
    "needs a restart or an earlier start; the stack's flood lasts under a minute",
    # No price on the stack: its exporter runs without --gpu-hour-price, and no OpenCost.
    **{
        (title, ref): "no price of a GPU hour on the stack (no --gpu-hour-price, no OpenCost)"
        for title, refs in (
            ("Cost per million tokens per model and namespace", "AB"),
            ("Cost per million tokens per engine (the exporters')", "AB"),
            ("GPU cost an hour, and the KV room no request used", "AB"),
        )
        for ref in refs
    },
    # No GPU on the stack, so no dcgm-exporter.
    **{
        (title, ref): "no GPU on the stack: no dcgm-exporter"
        for title, refs in (
            ("DRAM activity beside glassbox's weight reads", "AC"),
            ("DRAM activity beyond the weight reads", "A"),
            ("GPU memory of each vLLM pod", "AB"),
            ("GPU power of each vLLM pod", "A"),
        )
        for ref in refs
    },
}
# Panels whose data depends on where the minute falls: an hour's average at 1-minute steps
# has data from the first whole minute after Prometheus began scraping, which the stack's
# run from its first scrape to the flood's end (about a minute) may or may not reach.
MAY_BE_EMPTY = {
    ("Share of GPU hours no request used, over the hour", "A"),
    ("Share of GPU hours no request used, over the hour", "B"),
}
# Dashboards of what the stack is not: it runs one vLLM server, with no KV connector and no
# adapters. Their queries answer without error here and may have data (a server's prompt
# tokens by source) or none; they are checked with data on a page that has every series
# (tests/dashboards/test_dashboards.py) and drawn from a real NIXL pair
# (tests/picture_disagg.py).
NOT_THIS_STACK = {"glassbox-disaggregation"}


def _span(stack: RealStack) -> tuple[float, float]:
    return stack.times["spec_start"] - 5, stack.times["flood_end"] + 2


@pytest.fixture(scope="module")
def panels(stack: RealStack) -> Iterator[list[PanelData]]:
    prometheus = Prometheus(stack.prometheus_url)
    try:
        span = time_range(*_span(stack), prometheus.scrape_interval())
        yield [
            panel
            for d in catalog.dashboards()
            for panel in query_dashboard(catalog.as_json(d), prometheus, span)
        ]
    finally:
        prometheus.close()


def _panel(panels: list[PanelData], uid: str, title: str) -> PanelData:
    return next(p for p in panels if p.dashboard_uid == uid and p.title == title)


def test_every_query_returns_data_over_the_stacks_run(panels: list[PanelData]) -> None:
    assert len(panels) == sum(len(panels_of(catalog.as_json(d))) for d in catalog.dashboards())
    missing, failed, unexpected = [], [], []
    for panel in panels:
        for target in panel.targets:
            where = f"{panel.dashboard_uid} / {panel.title} / {target.ref_id}: {target.expr}"
            excused = (panel.title, target.ref_id) in NOT_ON_THE_STACK
            if target.error:
                failed.append(f"{where}: {target.error}")
            elif (
                panel.dashboard_uid in NOT_THIS_STACK
                or (panel.title, target.ref_id) in MAY_BE_EMPTY
            ):
                continue
            elif not target.has_data and not excused:
                missing.append(where)
            elif target.has_data and excused:
                unexpected.append(where)
    assert not failed, "\n".join(failed)
    assert not missing, "no data:\n" + "\n".join(missing)
    assert not unexpected, "data where none was expected (update NOT_ON_THE_STACK):\n" + "\n".join(
        unexpected
    )


def test_pool_panels_show_the_stacks_pool(panels: list[PanelData]) -> None:
    # --kv-cache-memory-bytes 8388608 on the tiny model: 32 blocks of 128 tokens.
    def last(title: str) -> float | None:
        (series,) = _panel(panels, "glassbox-kv-cache", title).targets[0].series
        return series.last

    assert last("KV capacity") == 4096
    assert last("KV blocks") == 32
    assert last("KV block size") == 128
    config = _panel(panels, "glassbox-kv-cache", "vLLM cache configuration").targets[0]
    (row,) = config.series
    assert row.labels["block_size"] == "128" and row.labels["num_gpu_blocks"] == "32"


def test_pool_fills_and_preempts_during_the_flood(
    stack: RealStack, panels: list[PanelData]
) -> None:
    flood = (stack.times["flood_start"], stack.times["flood_end"] + 2)

    def peak(title: str, ref_id: str = "A", uid: str = "glassbox-kv-cache") -> float:
        target = next(t for t in _panel(panels, uid, title).targets if t.ref_id == ref_id)
        return max(
            v
            for s in target.series
            for t, v in zip(s.times, s.values, strict=True)
            if flood[0] <= t <= flood[1] and v == v
        )

    assert peak("KV cache usage") > 0.9
    assert peak("KV pool: capacity, used and free tokens", "B") > 0.9 * 4096
    assert peak("Preemptions per second") > 0


def test_preemption_storm_panel_follows_prometheus_alerts(
    stack: RealStack, panels: list[PanelData]
) -> None:
    start, end = _span(stack)
    alerts = stack.query_range('ALERTS{alertname="VLLMPreemptionStorm"}', start, end)
    states = {a["metric"]["alertstate"] for a in alerts}
    (state,) = _panel(panels, "glassbox-kv-cache", "VLLMPreemptionStorm alert").targets[0].series
    expected = 2 if "firing" in states else 1 if "pending" in states else 0
    assert max(state.values) == expected


def test_snapshot_command_draws_every_panel(
    stack: RealStack, panels: list[PanelData], tmp_path: Path
) -> None:
    start, end = _span(stack)
    code = main(
        [
            "snapshot",
            "--prometheus",
            stack.prometheus_url,
            "--out",
            str(tmp_path),
            "--from",
            str(start),
            "--to",
            str(end),
        ]
    )
    assert code == 0
    boards = [catalog.as_json(d) for d in catalog.dashboards()]
    for board in boards:
        drawn = sorted((tmp_path / board["uid"]).glob("*.png"))
        assert len(drawn) == len(panels_of(board)), board["uid"]
        assert (tmp_path / f"{board['uid']}.png").stat().st_size > 100_000
    index = (tmp_path / "index.md").read_text()
    # Exactly the panels none of whose queries has data on the stack (NOT_ON_THE_STACK):
    # the lab phase band of each board that has one, and the fleet view's two tables; and
    # those of the dashboards of what the stack is not that have none here.
    empty = [
        p["title"]
        for board in boards
        if board["uid"] not in NOT_THIS_STACK
        for p in panels_of(board)
        if all((p["title"], t["refId"]) in NOT_ON_THE_STACK for t in p["targets"])
    ] + [
        panel.title
        for panel in panels
        if (
            panel.dashboard_uid in NOT_THIS_STACK
            or all((panel.title, t.ref_id) in MAY_BE_EMPTY for t in panel.targets)
        )
        and not any(t.has_data for t in panel.targets)
    ]
    assert index.count("**no data**") == len(empty)
