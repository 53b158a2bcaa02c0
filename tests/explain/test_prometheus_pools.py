"""Each engine's pool from Prometheus, against what was scraped, and against the exporter.

The recordings of a real Prometheus (tests/fixtures/prometheus/, tests/capture_prometheus.py)
keep, beside the answers to explain's queries, the raw samples of the pools' series over
the window. The oracle works each engine's facts out of those samples by hand: the peaks
and last values, the samples at which the preemption counter rose, the rises summed.
The Prometheus reader's pools must be those facts; and the same samples served as pages,
one a poll, to the real exporter's poller must be judged alike by the KV pool diagnosis.
"""

from __future__ import annotations

import itertools
import json
import re
from dataclasses import dataclass
from typing import Any

import pytest
from vllm_glassbox.explain.diagnoses import explain
from vllm_glassbox.explain.findings import Finding
from vllm_glassbox.explain.from_prometheus import scene_of
from vllm_glassbox.explain.promql import Answers, Selection, queries
from vllm_glassbox.explain.scene import EnginePool, Reading, Scene
from vllm_glassbox.exporter.exposition import unrecognised_inputs
from vllm_glassbox.exporter.scene import scene_from_state
from vllm_glassbox.exporter.service import Poller

from tests.exporter.test_exposition_golden import Clock, PageSequence, config
from tests.fixtures import page
from tests.prometheus_replay import RECORDINGS, load

RAW = re.compile(r'^\{.*__name__=~"vllm:kv_cache_usage_perc\|.*\}\[\d+(\.\d+)?s\]$')
#: An engine's labels, as the alerts tell engines apart (and pod, shared with its exporter).
LABELS = ("namespace", "job", "instance", "pod", "model_name", "engine")


def _raw(recording: dict[str, Any]) -> list[dict[str, Any]] | None:
    found = [a["result"] for a in recording["answers"] if RAW.match(a["query"])]
    return found[0] if found else None


RECORDED = sorted(
    p.stem
    for p in RECORDINGS.glob("*.json")
    if "refused" not in (r := json.loads(p.read_text())) and _raw(r)
)


@dataclass(frozen=True)
class Facts:
    """One engine's window, worked out by hand from its samples."""

    peak_usage: float
    usage_now: float
    peak_running: float | None
    peak_waiting: float | None
    peak_capacity: float | None
    peak_deferred: float | None
    rises: tuple[float, ...]  # the timestamps of the samples whose counter rose
    risen: float  # the rises summed (a fall is a restart: its new count from zero)
    samples: tuple[tuple[float, float], ...]  # the counter's (time, value)


def _series(raw: list[dict[str, Any]]) -> dict[tuple[str, ...], dict[str, list[list[Any]]]]:
    out: dict[tuple[str, ...], dict[str, list[list[Any]]]] = {}
    for result in raw:
        labels = result["metric"]
        name = labels["__name__"]
        if name == "vllm:num_requests_waiting_by_reason":
            name += "/" + labels.get("reason", "")
        engine = tuple(labels.get(k, "") for k in LABELS)
        out.setdefault(engine, {})[name] = result["values"]
    return out


def oracle(raw: list[dict[str, Any]]) -> dict[tuple[str, ...], Facts]:
    out = {}
    for engine, by_name in _series(raw).items():
        if "vllm:kv_cache_usage_perc" not in by_name:
            continue

        def peak(name: str, by_name: dict[str, list[list[Any]]] = by_name) -> float | None:
            values = [float(v) for _, v in by_name.get(name, [])]
            return max(values) if values else None

        counter = [(float(t), float(v)) for t, v in by_name.get("vllm:num_preemptions_total", [])]
        rises, risen = [], 0.0
        for (_, before), (t, value) in itertools.pairwise(counter):
            if value > before:
                rises.append(t)
            risen += value - before if value >= before else value
        usage = by_name["vllm:kv_cache_usage_perc"]
        out[engine] = Facts(
            peak_usage=max(float(v) for _, v in usage),
            usage_now=float(usage[-1][1]),
            peak_running=peak("vllm:num_requests_running"),
            peak_waiting=peak("vllm:num_requests_waiting"),
            peak_capacity=peak("vllm:num_requests_waiting_by_reason/capacity"),
            peak_deferred=peak("vllm:num_requests_waiting_by_reason/deferred"),
            rises=tuple(rises),
            risen=risen,
            samples=tuple(counter),
        )
    return out


def prometheus_scenes(name: str) -> tuple[Selection, list[Scene]]:
    """The recording's scenes as the reader builds them from the recorded answers."""
    recording = load(name)
    sel = Selection(
        "http://prometheus.invalid",
        recording.get("namespace"),
        recording.get("model"),
        float(recording["since"]),
        float(recording["at"]),
    )
    recorded = {a["query"]: a["result"] for a in recording["answers"]}
    asked = queries(sel)
    answers = Answers(asked, {n: recorded[q] for n, q in asked.items() if q in recorded})
    keys = sorted({(k, m) for k, m in answers.by_key("pool_usage_peak")})
    return sel, [scene_of(answers, key, sel, None) for key in keys]


def _value(reading: Reading | None) -> float | None:
    return None if reading is None else reading.value


def _engine_of(pool: EnginePool, facts: dict[tuple[str, ...], Facts]) -> tuple[str, ...]:
    """The oracle's engine a pool is of, by its name (model/engine, with its pod or
    instance where replicas share them)."""
    model, _, rest = pool.engine.partition("/")
    engine, _, where = rest.partition(" of ")
    found = [
        e
        for e in facts
        if e[4] == model and e[5] == engine and (not where or where in (e[3], e[2]))
    ]
    assert len(found) == 1, (pool.engine, found)
    return found[0]


@pytest.mark.parametrize("name", RECORDED)
def test_each_engines_pool_is_what_was_scraped(name: str) -> None:
    facts = oracle(_raw(load(name)) or [])
    _, scenes = prometheus_scenes(name)
    pools = [p for scene in scenes for p in scene.pools]
    assert len(pools) == len(facts) > 0
    for pool in pools:
        f = facts[_engine_of(pool, facts)]
        assert _value(pool.peak_usage) == f.peak_usage
        assert _value(pool.usage_now) == f.usage_now
        assert _value(pool.peak_running) == f.peak_running
        assert _value(pool.peak_waiting) == f.peak_waiting
        assert _value(pool.peak_waiting_capacity) == f.peak_capacity
        assert _value(pool.peak_waiting_deferred) == f.peak_deferred
        # The window's first sample is compared with the one before the window, which the
        # raw samples do not hold: a rise there is Prometheus' (the oracle cannot see it).
        first = _value(pool.first_preemption_at)
        if f.samples and first == f.samples[0][0] and first not in f.rises:
            assert f.samples[0][1] > 0  # the counter had counted before the window
        else:
            assert first == (f.rises[0] if f.rises else None)
        assert _value(pool.last_preemption_at) == (f.rises[-1] if f.rises else None)
        if not f.samples:
            assert pool.preemptions is None
            continue
        # increase() extrapolates the samples' span towards the window's ends, by at most
        # 1.1 mean intervals a side (Prometheus' extrapolatedRate).
        counted = _value(pool.preemptions)
        assert counted is not None
        span = f.samples[-1][0] - f.samples[0][0]
        if span <= 0:
            continue
        mean = span / (len(f.samples) - 1)
        assert f.risen - 1e-9 <= counted <= f.risen * (span + 2.2 * mean) / span + 1e-9


# --- the exporter, on the same samples ----------------------------------------------------

#: A vLLM CPU 0.32 page (the stack's build), each poll's values set from the samples.
CAPTURED = page("cpu-0.32/flood-mid.txt")


def served(values: dict[str, float]) -> str:
    text = CAPTURED
    for pattern, key in (
        (r"vllm:kv_cache_usage_perc\{[^}]*\}", "vllm:kv_cache_usage_perc"),
        (r"vllm:num_requests_running\{[^}]*\}", "vllm:num_requests_running"),
        (r"vllm:num_requests_waiting\{[^}]*\}", "vllm:num_requests_waiting"),
        (r'vllm:num_requests_waiting_by_reason\{[^}]*reason="capacity"\}', "capacity"),
        (r'vllm:num_requests_waiting_by_reason\{[^}]*reason="deferred"\}', "deferred"),
        (r"vllm:num_preemptions_total\{[^}]*\}", "vllm:num_preemptions_total"),
    ):
        text, n = re.subn(rf"^({pattern}) \S+$", rf"\g<1> {values[key]!r}", text, flags=re.M)
        assert n == 1, pattern
    return text


def pages_of(series: dict[str, list[list[Any]]]) -> list[tuple[float, str]]:
    """One page a scrape of the engine's usage, each series at its latest sample then."""
    names = {
        "vllm:kv_cache_usage_perc": "vllm:kv_cache_usage_perc",
        "vllm:num_requests_running": "vllm:num_requests_running",
        "vllm:num_requests_waiting": "vllm:num_requests_waiting",
        "vllm:num_requests_waiting_by_reason/capacity": "capacity",
        "vllm:num_requests_waiting_by_reason/deferred": "deferred",
        "vllm:num_preemptions_total": "vllm:num_preemptions_total",
    }
    out = []
    for t, _ in series["vllm:kv_cache_usage_perc"]:
        values = {}
        for name, key in names.items():
            before = [float(v) for at, v in series.get(name, []) if float(at) <= float(t)]
            values[key] = before[-1] if before else 0.0
        out.append((float(t), served(values)))
    return out


def kv_finding(scene: Scene) -> Finding | None:
    found = [f for f in explain(scene).findings if f.diagnosis == "kv_pool"]
    return found[0] if found else None


def exporter_scene(pages: list[tuple[float, str]], window: float) -> Scene:
    clock = Clock(now=pages[0][0])
    poller = Poller(
        config(interval_seconds=1.0, window_seconds=window),
        fetcher=PageSequence([text for _, text in pages], "0.32.0"),
        clock=clock,
    )
    for at, _ in pages:
        clock.now = at
        assert poller.poll_once()
    assert poller.state is not None
    return scene_from_state(poller.state, unrecognised_inputs(poller.state))


@pytest.mark.parametrize("name", [n for n in RECORDED if n.startswith("stack-")])
def test_the_exporter_judges_the_same_samples_alike(name: str) -> None:
    """The stack's one engine: its samples, polled by the real exporter over the same
    window, give the same KV pool finding with the same peaks and preemption times."""
    sel, scenes = prometheus_scenes(name)
    (series,) = _series(_raw(load(name)) or []).values()
    pages = pages_of(series)
    ours = exporter_scene(pages, sel.window_seconds)
    (theirs,) = scenes
    mine, seen = kv_finding(ours), kv_finding(theirs)
    assert (mine and mine.finding) == (seen and seen.finding)
    (pool,) = ours.pools
    (read,) = theirs.pools
    assert _value(pool.peak_usage) == _value(read.peak_usage)
    assert _value(pool.usage_now) == _value(read.usage_now)
    assert _value(pool.peak_waiting_capacity) == _value(read.peak_waiting_capacity)
    # The exporter's moments are its wall clock's, less the monotonic span back.
    assert ours.scope.at is not None
    for field in ("first_preemption_at", "last_preemption_at"):
        exported, queried = _value(getattr(pool, field)), _value(getattr(read, field))
        assert (exported is None) == (queried is None)
        if exported is not None and queried is not None:
            assert exported - ours.scope.at == pytest.approx(queried - pages[-1][0])


# --- the forecasts, by hand ---------------------------------------------------------------

SEL = Selection("http://prometheus.invalid", None, "m", 60.0, 1000.0)


def _answer(value: float, **labels: str) -> dict[str, Any]:
    return {"metric": {"model_name": "m", "engine": "0", **labels}, "value": [1000.0, str(value)]}


def hand_scene(exhaustion: float | None, at_completion: float | None, pods: int = 1) -> Scene:
    """A pool half full, nobody waiting, no preemption; its exporter's two forecasts."""
    answered: dict[str, list[dict[str, Any]]] = {name: [] for name in queries(SEL)}
    for i in range(pods):
        target = {"job": "vllm", "instance": f"10.0.0.{i}:8000"}
        answered["pool_usage_peak"].append(_answer(0.5, **target))
        answered["pool_usage_now"].append(_answer(0.5, **target))
        answered["pool_preemptions"].append(_answer(0.0, **target))
        exporter = {"job": "glassbox", "instance": f"10.0.0.{i}:9400"}
        if exhaustion is not None:
            answered["pool_exhaustion"].append(_answer(exhaustion, **exporter))
        if at_completion is not None:
            answered["pool_at_completion"].append(_answer(at_completion, **exporter))
    answered["kv_capacity"] = [{"metric": {"model_name": "m"}, "value": [1000.0, "4096"]}]
    scene = scene_of(Answers(queries(SEL), answered), ("", "m"), SEL, None)
    return scene


@pytest.mark.parametrize(
    ("exhaustion", "at_completion", "filling"),
    [(120.0, -2.0, True), (120.0, 3.0, False), (900.0, -2.0, False), (None, -2.0, False)],
)
def test_filling_needs_both_forecasts_as_the_alert_does(
    exhaustion: float | None, at_completion: float | None, filling: bool
) -> None:
    found = kv_finding(hand_scene(exhaustion, at_completion))
    assert (found is not None and found.finding == "filling") == filling
    if filling:
        assert found is not None
        assert found.what.figures["exhaustion"].value == 120.0
        assert found.what.figures["at_completion"].value == -2.0


def test_replicas_without_a_pod_label_get_no_forecast_of_anothers_exporter() -> None:
    """Two vLLM targets of one model with no `pod`: which exporter is whose cannot be
    told, so neither engine takes a forecast (and neither is said to fill)."""
    scene = hand_scene(120.0, -2.0, pods=2)
    assert len(scene.pools) == 2
    assert all(p.exhaustion_seconds is None for p in scene.pools)
    assert kv_finding(scene) is None
