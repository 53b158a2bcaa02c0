"""The KV-pressure experiment (lab/experiments/kv_pressure/): a timeline point read off real
pages of a flood, the timeline cut into the article's acts, and a hole in the timeline
called out in the report with its cause.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from vllm_glassbox.core.snapshot import read_snapshot
from vllm_glassbox.lab.experiments.kv_pressure import (
    KvPressureResult,
    TimelinePoint,
    act_names,
    missing_acts,
    name_acts,
    pressure_summary,
    timeline_point,
)
from vllm_glassbox.lab.report import write_outputs

from tests.fixtures import page
from tests.lab_results import point_at, results_with, startup


def test_the_flood_page_shows_the_pool_full_with_a_queue_and_preemptions() -> None:
    baseline = read_snapshot(page("cpu-0.32/spec-after-2x256.txt"))
    mid = read_snapshot(page("cpu-0.32/flood-mid.txt"))
    point = timeline_point(20.0, baseline, mid)
    assert (point.running, point.waiting, point.kv_cache_usage) == (11, 1, 1.0)
    assert point.preemptions == 2
    assert point.generated_tokens == 3436 - 512


def test_the_timeline_is_cut_into_the_articles_acts() -> None:
    timeline = [
        point_at(0, 32, 0, 0.10, 0),
        point_at(5, 32, 0, 0.60, 0),
        point_at(10, 30, 2, 0.99, 0),
        point_at(15, 28, 4, 1.00, 0),
        point_at(20, 20, 3, 0.40, 13),  # one poll: 13 preemptions at once
        point_at(25, 22, 5, 0.98, 13),  # between two bursts: still the storm
        point_at(30, 22, 1, 0.97, 15),
        point_at(35, 18, 0, 0.80, 15),
        point_at(40, 0, 0, 0.0, 15),
    ]
    acts = [
        (a.name, a.start_t, a.end_t, a.polls, a.preemptions, a.peak_waiting)
        for a in name_acts(timeline, 0.95)
    ]
    assert acts == [
        ("filling", 0, 5, 2, 0, 0),
        ("saturated with a queue", 10, 15, 2, 0, 4),
        ("preemption storm", 20, 30, 3, 15, 5),
        ("draining", 35, 40, 2, 0, 0),
    ]
    summary = pressure_summary(timeline, 0.95)
    assert summary.missing_acts == ()
    assert summary.max_preemption_jump == 13
    assert summary.max_preemption_jump_at == 20
    assert summary.preemptions_total == 15
    assert (summary.first_full_at, summary.first_waiting_at) == (10, 10)
    assert summary.first_preemption_at == 20
    assert summary.peak_waiting == 5
    assert summary.max_gap_seconds == 5


def test_an_act_is_named_only_where_its_condition_holds() -> None:
    # The pool is full at 10 s but nobody waits until 15 s; the queue empties at 20 s and
    # comes back: a poll without a queue is never "saturated with a queue".
    timeline = [
        point_at(0, 12, 0, 0.3, 0),
        point_at(10, 12, 0, 1.0, 0),
        point_at(15, 10, 2, 1.0, 0),
        point_at(20, 10, 0, 0.99, 0),
        point_at(25, 8, 4, 0.9, 0),
        point_at(30, 6, 2, 0.95, 4),
        point_at(35, 2, 0, 0.3, 4),
    ]
    names = act_names(timeline, 0.95)
    assert names == [
        "filling",
        "filling",  # full, but nobody waits yet
        "saturated with a queue",
        "full, nobody waiting",
        "saturated with a queue",  # usage below 95 %, but the pool has been full
        "preemption storm",
        "draining",
    ]
    for point, name in zip(timeline, names, strict=True):
        if name == "saturated with a queue":
            assert point.waiting
        if name == "filling":
            assert not point.waiting


def test_a_queue_before_the_pool_is_full_is_no_first_act() -> None:
    # Requests wait from the first poll (an admission backlog), then the pool fills.
    timeline = [
        point_at(0, 2, 10, 0.1, 0),
        point_at(2, 12, 0, 0.6, 0),
        point_at(4, 9, 3, 1.0, 0),
        point_at(6, 4, 1, 0.9, 3),
        point_at(8, 0, 0, 0.0, 3),
    ]
    acts = name_acts(timeline, 0.95)
    assert [a.name for a in acts] == [
        "queue before the pool is full",
        "filling",
        "saturated with a queue",
        "preemption storm",
        "draining",
    ]
    assert missing_acts(acts) == ["filling"]


def test_acts_without_preemptions_and_without_pressure() -> None:
    queued = [point_at(0, 8, 0, 0.5, 0), point_at(1, 8, 2, 0.99, 0), point_at(2, 3, 0, 0.4, 0)]
    assert [a.name for a in name_acts(queued, 0.95)] == [
        "filling",
        "saturated with a queue",
        "draining",
    ]
    assert missing_acts(name_acts(queued, 0.95)) == ["preemption storm"]
    roomy = [point_at(0, 4, 0, 0.2, 0), point_at(1, 2, 0, 0.1, 0)]
    assert [(a.name, a.polls) for a in name_acts(roomy, 0.95)] == [("pool never full", 2)]


def _flood_polled_every_2s(timeline: list[TimelinePoint], late_polls: int = 0) -> KvPressureResult:
    """Twelve requests on a 4,096-token pool, every one completed, polled every 2 s."""
    return KvPressureResult(
        startup=startup(0.05, 4096),
        requests=12,
        completed=12,
        failed=0,
        flood_seconds=timeline[-1].t,
        timeline=tuple(timeline),
        poll_seconds=2.0,
        late_polls=late_polls,
        pressure=pressure_summary(timeline, 0.95),
    )


def test_a_hole_in_the_timeline_is_called_out_with_its_cause(tmp_path: Path) -> None:
    # Polled every 2 s; the page at 11 s closes a 7 s gap: its poll was sent 2.4 s after
    # its tick and vLLM took 4.6 s to answer it.
    timeline = [
        point_at(0, 0, 0, 0.0, 0),
        point_at(2, 12, 0, 0.4, 0),
        point_at(4, 12, 0, 0.8, 0),
        replace(point_at(11, 8, 4, 1.0, 0), latency_seconds=4.6, delay_seconds=2.4),
        point_at(13, 0, 0, 0.0, 0),
    ]
    flood = _flood_polled_every_2s(timeline, late_polls=1)
    assert (flood.pressure.max_gap_seconds, flood.pressure.max_gap_ended_at) == (7, 11)
    write_outputs(results_with(flood), tmp_path)
    report = (tmp_path / "report.md").read_text()
    assert (
        "the largest gap between two pages 7 s — **a hole in the timeline** (more than two "
        "periods): its closing poll was sent 2.4 s after its tick (this machine's CPU was "
        "taken) and vLLM took 4.6 s to answer it." in report
    )


def test_an_act_seen_in_fewer_than_three_polls_is_called_out(tmp_path: Path) -> None:
    # A fast CPU fills a 4,096-token pool in about 4 s: polled every 2 s, the first act
    # is two pages (the empty pool and one half full); the storm one page.
    timeline = [
        point_at(0, 0, 0, 0.0, 0),
        point_at(2, 12, 0, 0.77, 0),
        point_at(4, 10, 2, 0.97, 0),
        point_at(6, 7, 5, 0.90, 0),
        point_at(8, 5, 6, 0.81, 0),
        point_at(10, 6, 0, 0.58, 6),
        point_at(12, 2, 0, 0.26, 6),
    ]
    flood = _flood_polled_every_2s(timeline)
    write_outputs(results_with(flood), tmp_path)
    report = (tmp_path / "report.md").read_text()
    assert (
        "**Filling was seen in 2 poll(s) only** (under 3): it passed faster than the polls; "
        "a shorter `poll` shows it." in report
    )
    assert "**Preemption storm was seen in 1 poll(s) only**" in report
    assert "Saturated with a queue was seen" not in report  # three polls: a stretch
