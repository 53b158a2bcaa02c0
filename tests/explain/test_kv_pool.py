"""The KV pool judged engine by engine over the window, as its alerts judge it: scenes
with each engine's pool written by hand, the words and numbers worked out by hand."""

from __future__ import annotations

import datetime
from dataclasses import replace

from vllm_glassbox.explain.diagnoses import explain
from vllm_glassbox.explain.findings import Finding
from vllm_glassbox.explain.from_exporter import findings_document
from vllm_glassbox.explain.render import sentence
from vllm_glassbox.explain.scene import EnginePool, Scene, scene_from_json, scene_to_json

from tests.explain import scenes
from tests.explain.scenes import r
from tests.explain.test_exporter import polled, scene_of


def unix(hms: str) -> float:
    return datetime.datetime.fromisoformat(f"2026-12-04T{hms}+00:00").timestamp()


def storm_pool(**changes: object) -> EnginePool:
    """59 preemptions between 08:17:05 and 08:17:42 on a pool 100 % full at its peak,
    79 % at the window's end (08:17:56), up to 17 waiting for room."""
    pool = EnginePool(
        engine="tiny/0",
        peak_usage=r(1.0),
        usage_now=r(0.79),
        peak_running=r(11),
        peak_waiting=r(17),
        peak_waiting_capacity=r(17),
        peak_waiting_deferred=r(0),
        preemptions=r(59),
        first_preemption_at=r(unix("08:17:05")),
        last_preemption_at=r(unix("08:17:42")),
    )
    return replace(pool, **changes)  # type: ignore[arg-type]


def scene(*pools: EnginePool, window: float = 55.0) -> Scene:
    base = scenes.storm()
    return replace(
        base, scope=replace(base.scope, window_seconds=window, at=unix("08:17:56")), pools=pools
    )


def kv(s: Scene) -> Finding | None:
    found = [f for f in explain(s).findings if f.diagnosis == "kv_pool"]
    return found[0] if found else None


def test_a_storm_says_when_it_ran_and_that_it_ended() -> None:
    f = kv(scene(storm_pool()))
    assert f is not None and (f.finding, f.severity) == ("preemption_storm", "critical")
    assert sentence(f.what) == (
        "Over the 55.0 s window vLLM preempted requests 59 times, between 08:17:05 and "
        "08:17:42, the last 14.0 s ago, none since; its KV pool (4,096 tokens an engine) ran "
        "100 % full at most (79 % now), while up to 17 requests waited for room."
    )
    assert f.runbook is not None and f.runbook.endswith("#vllmpreemptionstorm")
    assert f.unseen == ()  # the page says why requests waited


def test_a_storm_still_running_says_so() -> None:
    f = kv(scene(storm_pool(last_preemption_at=r(unix("08:17:56")))))
    assert f is not None and "the last at the latest poll (still preempting)" in sentence(f.what)


def test_the_storms_conditions_hold_on_one_engine_together() -> None:
    """Engine 0 full with nobody waiting, engine 1 waiting on a half-full pool: as the
    alert matches them on the engine, no storm; engine 0's preemptions are told as seen
    between polls (a warning, not the storm's critical)."""
    full = storm_pool(engine="tiny/0", peak_waiting=r(0), peak_waiting_capacity=r(0))
    queued = storm_pool(engine="tiny/1", peak_usage=r(0.5), usage_now=r(0.5))
    f = kv(scene(full, queued))
    assert f is not None and (f.finding, f.severity) == ("preempted", "warning")
    assert sentence(f.what).startswith("Engine tiny/0: over the 55.0 s window")
    none = {"preemptions": r(0), "first_preemption_at": None, "last_preemption_at": None}
    f = kv(scene(replace(full, **none), replace(queued, **none)))  # type: ignore[arg-type]
    assert f is not None and (f.finding, f.severity) == ("full", "info")
    assert sentence(f.what).startswith("Engine tiny/0: the KV pool")


def test_preemptions_the_polls_saw_no_full_pool_for_are_told_not_dropped() -> None:
    """The H200 storm at 5 s polls: 14 preemptions in 4 s while the polls saw the pool 71 %
    full at most and nobody waiting. The storm's alert reads the same gauges and stays
    quiet; explain says what the counter saw, as a warning."""
    between = storm_pool(
        peak_usage=r(0.71),
        usage_now=r(0.0),
        peak_waiting=r(0),
        peak_waiting_capacity=r(0),
        preemptions=r(14),
        first_preemption_at=r(unix("08:17:35")),
        last_preemption_at=r(unix("08:17:39")),
    )
    f = kv(scene(between, window=60.0))
    assert f is not None and (f.finding, f.severity) == ("preempted", "warning")
    assert sentence(f.what) == (
        "Over the 60.0 s window vLLM preempted requests 14 times, between 08:17:35 and "
        "08:17:39, the last 17.0 s ago, none since; the polls saw its KV pool (4,096 tokens "
        "an engine) 71 % full at most (0 % now) and no request waiting for room: vLLM "
        "preempts only on a full pool, so it ran full between two polls, too briefly for "
        "them to see (and for VLLMPreemptionStorm, which reads the same gauges, to fire)."
    )
    assert f.runbook is not None and f.runbook.endswith("#vllmpreemptionstorm")
    assert kv(scene(replace(between, preemptions=r(2)))) is None  # under the storm's count


def test_two_preemptions_are_no_storm_and_deferred_requests_wait_for_no_room() -> None:
    f = kv(scene(storm_pool(preemptions=r(2))))
    assert f is not None and f.finding == "saturated"
    assert "100 % full at most in 55.0 s (79 % now), with up to 17 requests" in sentence(f.what)
    deferred = storm_pool(
        peak_waiting=r(4), peak_waiting_capacity=r(0), peak_waiting_deferred=r(4), preemptions=r(2)
    )
    f = kv(scene(deferred))
    assert f is not None and f.finding == "full"


def test_fills_soon_only_with_both_forecasts_of_the_alert() -> None:
    filling = storm_pool(
        peak_usage=r(0.27),
        usage_now=r(0.27),
        preemptions=r(0),
        peak_waiting=r(0),
        peak_waiting_capacity=r(0),
        first_preemption_at=None,
        last_preemption_at=None,
        exhaustion_seconds=r(58.4),
        headroom_at_completion=r(3),
    )
    assert kv(scene(filling)) is None  # the time to exhaustion alone is no warning
    f = kv(scene(replace(filling, headroom_at_completion=r(-2))))
    assert f is not None and (f.finding, f.severity) == ("filling", "warning")
    assert "full in 58.4 s" in sentence(f.what) and "headroom at completion: -2" in sentence(f.what)
    assert f.runbook is not None and f.runbook.endswith("#vllmkvcacheexhaustionforecast")
    assert kv(scene(replace(filling, headroom_at_completion=None))) is None


def test_why_requests_waited_is_unseen_only_where_the_source_lacks_it() -> None:
    f = kv(scene(storm_pool(peak_waiting_capacity=None)))
    assert f is not None and any("why requests waited" in u for u in f.unseen)


def test_the_pools_travel_through_json() -> None:
    s = scene(storm_pool(), storm_pool(engine="tiny/1", exhaustion_seconds=r(3.5)))
    assert scene_from_json(scene_to_json(s)) == s


def test_the_exporter_carries_why_requests_waited_into_its_findings() -> None:
    """vLLM 0.24's pages have num_requests_waiting_by_reason: through the real poller and
    /findings' JSON, the pool's peaks of waiting for capacity are the pages' (4, then 10),
    and nothing is said to be unseen about why requests waited."""
    h200 = [f"cuda-0.24.0-h200/{n}.txt" for n in ("flood-filling", "flood-preempting")]
    h200.append("cuda-0.24.0-h200/flood-preempting-later.txt")
    s = scene_of(polled(h200, "0.24.0", interval=3.0))
    read_back = scene_from_json(findings_document(s)["scenes_observed"][0])
    (pool,) = read_back.pools
    assert pool.peak_waiting_capacity is not None and pool.peak_waiting_capacity.value == 10
    assert pool.preemptions is not None and pool.preemptions.value == 10
    f = kv(read_back)
    assert f is not None and f.finding == "preemption_storm"
    assert not any("why requests waited" in u for u in f.unseen)
