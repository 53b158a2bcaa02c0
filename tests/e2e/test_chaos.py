"""Chaos on the real stack: vLLM killed in the middle of a flood and started again, the
exporter restarted, Prometheus restarted; then Prometheus' record of the whole run is read.

One vLLM CPU server (ngram speculation, a 4,096-token pool: tests/realstack.py), the
`glassbox exporter` command polling it every second, Prometheus scraping both and
evaluating alerts/*.yaml every second. In order:

  flood      12 long requests; once vLLM preempts, its process group gets SIGKILL
  outage     until vLLM, started again on the same port, answers /health
  traffic    a few requests, so the derived series come back
  exporter   SIGTERM, then started again on the same port
  prometheus SIGTERM, then started again on the same TSDB

What must hold afterwards:

- no series of the exporter is ever negative, and no windowed series spikes: each value
  lies within the values the derivation core (core/derive/) gives on vLLM's raw
  counters, as Prometheus scraped them independently, for every window whose ends lie
  within a few seconds of the exporter's own window (`SPIKE_FACTOR` of slack);
- `VLLMTargetRestarted` fires after the kill, from both signals, never before, and the
  exporter's and Prometheus' restarts add nothing to it (one vLLM restart counted);
- `GlassboxTargetDown` is pending from the kill until vLLM is back, and at no other
  time: not while vLLM was flooded (busy is slow, not down), not when the exporter
  restarted. Its `for: 5m` starts at the kill, so it would fire after 5 minutes;
- `GlassboxExporterAbsent` is pending only while the exporter or Prometheus restarts (or
  after a scrape that failed while the machine or Prometheus stalled: FailedScrape);
- a restart is not a preemption storm: no storm episode starts after the kill.

The figures are printed (pytest -s): the closing note of the run.
"""

from __future__ import annotations

import bisect
import concurrent.futures
import itertools
import math
import os
import signal
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families
from vllm_glassbox.core.derive import Context, Increase, snapshot_increases
from vllm_glassbox.core.own_page import read_exporter_page
from vllm_glassbox.core.series import PRICED, WINDOWED
from vllm_glassbox.core.snapshot import EngineKey, Snapshot, read_snapshot
from vllm_glassbox.lab.backends.prometheus_process import PrometheusProcess
from vllm_glassbox.lab.backends.server_process import ChildProcess, ServerProcess, free_port
from vllm_glassbox.lab.backends.tinymodel import TinyModelSpec, generate

from tests.realstack import (
    FLOOD_MAX_TOKENS,
    FLOOD_REQUESTS,
    REPETITIVE_PROMPT,
    complete,
    failed_scrapes,
    machine_stalls,
    prometheus_query,
    stall_watch,
    start_exporter,
    start_prometheus,
    vllm_server,
    wait_scraped,
    wait_until,
)
from tests.vllm_pause import pause

pytestmark = pytest.mark.vllm

MODEL = "tiny"
PEAK_BANDWIDTH = 20e9  # what start_exporter tells the exporter
# A value is a spike when it leaves, by this factor, the range the derivation core gives
# for windows of the raw counters whose ends are within ALIGN_SECONDS of the exporter's.
# The windows differ by the 1 s scrape and poll periods only; a miscounted restart adds
# a whole process's counters at once, which is many times more.
SPIKE_FACTOR = 1.5
ALIGN_SECONDS = 2.5
# A raw scrape of vLLM (every second) within this of the exporter's poll (every second)
# read the same counters, but for events between the two.
POLL_SLACK_SECONDS = 1.5
# Windows shorter than this are compared with nothing: over a second or two, moving an
# end by one poll changes a ratio's numerator and denominator by different events.
MIN_SPAN_SECONDS = 10.0
SCRAPE_SKEW = 2.0


@dataclass
class Chaos:
    prometheus_url: str
    stall_log: Path  # what the stall watch wrote (tests/realstack.py: machine_stalls)
    times: dict[str, float] = field(default_factory=dict)
    exporter_exit_code: int | None = None
    preempted_before_kill: float = 0.0
    exporter_log: str = ""

    def query(self, expr: str, at: float | None = None) -> list[dict[str, Any]]:
        return prometheus_query(self.prometheus_url, expr, at)

    @property
    def run_range(self) -> str:
        return f"{math.ceil(self.times['end'] - self.times['start']) + 1}s"

    def samples(self, selector: str) -> list[dict[str, Any]]:
        """Every sample Prometheus holds for `selector` over the run (scrape timestamps)."""
        return self.query(f"{selector}[{self.run_range}]", at=self.times["end"])


def _vllm_value(url: str, name: str) -> float:
    text = httpx.get(url + "/metrics", timeout=30).text
    return sum(
        s.value for f in text_string_to_metric_families(text) for s in f.samples if s.name == name
    )


def _exporter_value(url: str, name: str) -> float | None:
    text = httpx.get(url + "/metrics", timeout=30).text
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == name:
                return float(s.value)
    return None


def _exporter_polled_after(url: str, t: float) -> bool:
    """Whether the exporter has finished a poll that started after unix time t."""
    return read_exporter_page(url, 30.0).polled_since(t)


def _flood(url: str, cut: threading.Event) -> None:
    """The real stack's flood (one client, the requests released together so that they
    overlap however busy the machine is); the kill cuts them, which is the point."""
    together = threading.Barrier(FLOOD_REQUESTS)
    limits = httpx.Limits(max_connections=FLOOD_REQUESTS)
    with httpx.Client(limits=limits, timeout=600) as client:

        def send(i: int) -> None:
            body = {
                "model": MODEL,
                "prompt": f"Write an extremely long and detailed essay, number {i}.",
                "max_tokens": FLOOD_MAX_TOKENS,
                "temperature": 0,
                "ignore_eos": True,
            }
            together.wait()
            try:
                client.post(url + "/v1/completions", json=body).raise_for_status()
            except httpx.HTTPError:
                assert cut.is_set(), "a flood request failed before the kill"

        with concurrent.futures.ThreadPoolExecutor(max_workers=FLOOD_REQUESTS) as pool:
            list(pool.map(send, range(FLOOD_REQUESTS)))


def _traffic(vllm: ServerProcess) -> None:
    """Four concurrent speculative requests: every derived series has data again."""
    with concurrent.futures.ThreadPoolExecutor(max_workers=4) as pool:
        list(
            pool.map(
                lambda _: complete(
                    vllm.url, MODEL, REPETITIVE_PROMPT, 64, repetition_penalty=1.0, ignore_eos=True
                ),
                range(4),
            )
        )


def _traffic_until_window(vllm: ServerProcess, exporter_url: str, seconds: float) -> None:
    """Traffic until the exporter's window spans `seconds` of polls."""
    while (_exporter_value(exporter_url, "glassbox_window_covered_seconds") or 0.0) < seconds:
        _traffic(vllm)


@pytest.fixture(scope="module")
def chaos(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Chaos]:
    work = tmp_path_factory.mktemp("chaos")
    model_dir = generate(TinyModelSpec("tiny-stack"), work / "models")
    vllm_port, exporter_port, prometheus_port = free_port(), free_port(), free_port()
    exporter_url = f"http://127.0.0.1:{exporter_port}"
    jobs = {"vllm": f"127.0.0.1:{vllm_port}", "glassbox": f"127.0.0.1:{exporter_port}"}
    vllm = vllm_server(work, model_dir, vllm_port)
    exporter: ChildProcess | None = None
    prometheus: PrometheusProcess | None = None
    watch = stall_watch(work).start()
    run = Chaos(f"http://127.0.0.1:{prometheus_port}", watch.log_path)
    t = run.times
    try:
        vllm.start()
        vllm.wait_ready()
        # Prometheus first: its record of vLLM's raw counters covers every poll the
        # exporter makes (the spike check compares the two over the same windows).
        prometheus = start_prometheus(work, jobs, prometheus_port)
        wait_scraped(run.prometheus_url, {"vllm"})
        exporter = start_exporter(vllm, model_dir, exporter_port, work)
        wait_scraped(run.prometheus_url, set(jobs), after=time.time())
        t["start"] = time.time()
        # Speculative traffic first, so that every derived series has a past to compare.
        _traffic_until_window(vllm, exporter_url, MIN_SPAN_SECONDS + 5)

        # The flood, and SIGKILL once vLLM preempts: requests in flight, pool full.
        cut = threading.Event()
        flood = threading.Thread(target=_flood, args=(vllm.url, cut))
        t["flood_start"] = time.time()
        flood.start()
        wait_until(
            lambda: _vllm_value(vllm.url, "vllm:num_preemptions_total") > 0,
            "vLLM preempting",
            timeout_seconds=300,
        )
        # Freeze vLLM's counters (its engine stopped, requests in flight, pool full) until
        # the exporter has polled them and Prometheus has scraped them: both then hold the
        # same last counts before the kill.
        frozen = pause(vllm)
        wait_until(lambda: _exporter_polled_after(exporter_url, frozen), "a poll of the freeze")
        wait_scraped(run.prometheus_url, {"vllm"}, after=frozen)
        run.preempted_before_kill = _vllm_value(vllm.url, "vllm:num_preemptions_total")
        cut.set()
        t["kill"] = time.time()
        assert vllm.pid is not None
        os.killpg(vllm.pid, signal.SIGKILL)
        vllm.stop()  # reaps what the kill left
        flood.join()
        wait_until(lambda: _exporter_value(exporter_url, "glassbox_target_up") == 0.0, "down")

        # vLLM again, on the same port; traffic until the derived series are back.
        vllm = vllm_server(work, model_dir, vllm_port)
        vllm.start()
        vllm.wait_ready()
        t["vllm_ready"] = time.time()
        _traffic(vllm)
        wait_until(
            lambda: _exporter_value(exporter_url, "glassbox_tokens_per_forward_pass") is not None,
            "derived series back",
        )
        t["vllm_back"] = time.time()
        # Prometheus has scraped the restart the exporter saw (an exporter restarted before
        # any scrape took it leaves no trace of it: that is no fault of the rules).
        wait_until(
            lambda: bool(run.query("glassbox_target_last_restart_timestamp_seconds > 0")),
            "the exporter's restart scraped",
        )

        # The exporter, restarted; traffic until its new window spans MIN_SPAN_SECONDS.
        t["exporter_stop"] = time.time()
        run.exporter_exit_code = exporter.stop()
        exporter = start_exporter(vllm, model_dir, exporter_port, work)
        t["exporter_start"] = time.time()
        wait_scraped(run.prometheus_url, {"glassbox"}, after=t["exporter_start"])
        _traffic_until_window(vllm, exporter_url, MIN_SPAN_SECONDS + 2)

        # Prometheus, restarted on the same TSDB.
        t["prometheus_stop"] = time.time()
        prometheus.stop()
        prometheus = start_prometheus(work, jobs, prometheus_port)
        t["prometheus_start"] = time.time()
        wait_scraped(run.prometheus_url, set(jobs), after=t["prometheus_start"])
        _traffic_until_window(vllm, exporter_url, 3 * MIN_SPAN_SECONDS)
        # The exporter polls the last counters, and Prometheus scrapes it after that.
        wait_scraped(run.prometheus_url, set(jobs), after=time.time() + 2)
        t["end"] = time.time()
        run.exporter_log = exporter.log_text()
        yield run
    finally:
        for service in (prometheus, exporter, watch):
            if service is not None:
                service.stop()
        vllm.stop()


# --- the alerts -------------------------------------------------------------------------


def _alert_samples(run: Chaos, name: str, state: str = "pending|firing") -> list[float]:
    """Evaluation times in the run at which Prometheus wrote ALERTS{alertname=name} in
    `state`."""
    result = run.samples(f'ALERTS{{alertname="{name}", alertstate=~"{state}"}}')
    times = (float(ts) for series in result for ts, _ in series["values"])
    return sorted(x for x in times if x >= run.times["start"])


def _active_since(run: Chaos, name: str, before: float) -> list[float]:
    """ALERTS_FOR_STATE: when each episode of the alert that was active before `before`
    became active. (After a restart Prometheus shifts a restored episode's start by its
    downtime, so only samples before a Prometheus restart say when an episode began.)"""
    result = run.samples(f'ALERTS_FOR_STATE{{alertname="{name}"}}')
    return sorted(
        {float(v) for series in result for ts, v in series["values"] if float(ts) < before}
    )


def _outside(times: list[float], *spans: tuple[float, float]) -> list[float]:
    """The times outside every span. A span opens SCRAPE_SKEW early: Prometheus stamps a
    sample with the time its scrape began, and the answer may come from a moment later."""
    return [x for x in times if not any(a - SCRAPE_SKEW <= x <= b for a, b in spans)]


def test_vllm_restart_fires_vllm_target_restarted_from_both_signals_and_counts_once(
    chaos: Chaos,
) -> None:
    t = chaos.times
    firing = _alert_samples(chaos, "VLLMTargetRestarted", "firing")
    print(
        f"VLLMTargetRestarted firing from {min(firing) - t['kill']:.1f}s after the kill"
        if firing
        else "VLLMTargetRestarted never fired"
    )
    assert firing and min(firing) >= t["kill"] - SCRAPE_SKEW, "fired before vLLM was killed"
    at_end = chaos.query('ALERTS{alertname="VLLMTargetRestarted"}', at=t["end"])
    # Both signals: the exporter's restart counter (job glassbox) and Prometheus' own view
    # of vLLM's process_start_time_seconds (job vllm).
    assert {r["metric"]["job"] for r in at_end} == {"glassbox", "vllm"}
    # One restart: the exporter's and Prometheus' own restarts add none.
    counted = chaos.query(f"max_over_time(glassbox_target_restarts_total[{chaos.run_range}])")
    assert [float(r["value"][1]) for r in counted] == [1.0]
    changes = chaos.query(
        f'changes(process_start_time_seconds{{job="vllm"}}[{chaos.run_range}])', at=t["end"]
    )
    assert [float(r["value"][1]) for r in changes] == [1.0]


def test_target_down_is_pending_from_the_kill_until_vllm_is_back_and_at_no_other_time(
    chaos: Chaos,
) -> None:
    t = chaos.times
    pending = _alert_samples(chaos, "GlassboxTargetDown")
    since = _active_since(chaos, "GlassboxTargetDown", t["prometheus_stop"])
    print(
        f"GlassboxTargetDown pending for {len(pending)} evaluations, active since "
        f"{[round(s - t['kill'], 1) for s in since]}s after the kill; vLLM was back "
        f"{t['vllm_ready'] - t['kill']:.0f}s after it"
    )
    assert pending, "the outage was not seen"
    # Only during the outage (plus the exporter's next poll and Prometheus' next scrape
    # and evaluation): not in the flood before the kill, not at the exporter's restart.
    assert _outside(pending, (t["kill"], t["vllm_ready"] + 10)) == []
    # `for: 5m` counts from the kill: it would fire if the outage lasted 5 minutes.
    assert len(since) == 1 and t["kill"] - SCRAPE_SKEW <= since[0] <= t["kill"] + 10
    errors = {
        r["metric"]["reason"]: float(r["value"][1])
        for r in chaos.query(
            f"max_over_time(glassbox_scrape_errors_total[{chaos.run_range}]) > 0", at=t["end"]
        )
    }
    print(f"the exporter's polls by reason (first exporter process): {errors}")
    assert errors.get("connect", 0) > 0, "the outage was not counted as connect"


def test_exporter_absent_is_pending_only_while_the_exporter_or_prometheus_restarts(
    chaos: Chaos,
) -> None:
    t = chaos.times
    pending = _alert_samples(chaos, "GlassboxExporterAbsent")
    print(f"GlassboxExporterAbsent pending for {len(pending)} evaluations")
    restarts = (
        (t["exporter_stop"], t["exporter_start"] + 10),
        (t["prometheus_stop"], t["prometheus_start"] + 10),
    )
    # Elsewhere only a scrape failed while the machine or Prometheus stalled (see
    # FailedScrape), never by the exporter's fault, sets it pending until the next
    # scrape: its `for: 5m` is for those.
    stalls = machine_stalls(chaos.stall_log)
    missed = [
        f
        for f in failed_scrapes(chaos.prometheus_url, "glassbox", t["start"], t["end"])
        if _outside([f.at], *restarts)
    ]
    seen = [
        (round(f.at - t["start"], 1), round(f.seconds, 2), f.machine_stalled(stalls))
        for f in missed
    ]
    print(
        f"the machine stalled {len(stalls)} times; failed scrapes of the exporter outside "
        f"the restarts (s into the run, s Prometheus took, the machine stalled): {seen}"
    )
    assert not [f for f in missed if f.the_targets_fault(stalls)]
    # Pending from the failed scrape's answer to the next scrape's.
    until_next = [(f.at, f.at + f.seconds + SCRAPE_SKEW) for f in missed]
    assert _outside(pending, *restarts, *until_next) == [], [
        round(x - t["start"], 1) for x in _outside(pending, *restarts)
    ]
    assert chaos.exporter_exit_code == 0, "the exporter did not stop cleanly on SIGTERM"


def test_a_restart_is_not_a_preemption_storm(chaos: Chaos) -> None:
    t = chaos.times
    storm = _alert_samples(chaos, "VLLMPreemptionStorm")
    restarted = chaos.samples(f'vllm:num_preemptions_total{{job="vllm", model_name="{MODEL}"}}')
    after_restart = [
        float(v) for series in restarted for ts, v in series["values"] if float(ts) > t["kill"]
    ]
    pending = (
        f"from {min(storm) - t['kill']:.0f}s to {max(storm) - t['kill']:.0f}s after the kill"
        if storm
        else "never"
    )
    print(
        f"{chaos.preempted_before_kill:g} preemptions before the kill, "
        f"{max(after_restart, default=0):g} after the restart; storm pending {pending}"
    )
    # The restarted vLLM preempted nothing, and the storm's 2-minute window holds the
    # real preemptions from before the kill for 2 minutes at most: the restart itself
    # never counts as preemptions (Prometheus' increase() takes the drop as a reset).
    assert max(after_restart, default=0) == 0
    assert [x for x in storm if x > t["kill"] + 125] == []


def test_no_alert_the_faults_did_not_deserve(chaos: Chaos) -> None:
    t = chaos.times
    seen = {
        r["metric"]["alertname"]
        for r in chaos.query(f"max_over_time(ALERTS[{chaos.run_range}])", at=t["end"])
    }
    print("alerts seen over the run:", sorted(seen))
    deserved = {
        "VLLMPreemptionStorm",  # the flood: a full pool, a queue, preemptions
        "VLLMKVCacheSaturated",
        "VLLMRequestQueueGrowing",
        "VLLMSpecDecodeAcceptanceLow",  # the flood's essays give ngram little to match
        "VLLMSpecDecodeBypassed",
        "VLLMDecodeBandwidthLow",  # a tiny model on CPU against a 20 GB/s peak
        "GlassboxTargetDown",  # the kill
        "VLLMTargetRestarted",
        "GlassboxExporterAbsent",  # the exporter's and Prometheus' restarts
    }
    assert seen <= deserved, seen - deserved


# --- the derived series -----------------------------------------------------------------


def test_no_exporter_series_is_ever_negative(chaos: Chaos) -> None:
    lowest: dict[str, float] = {}
    for series in chaos.samples('{job="glassbox", __name__=~"glassbox_.+"}'):
        name = series["metric"]["__name__"]
        low = min(float(v) for _, v in series["values"])
        lowest[name] = min(lowest.get(name, math.inf), low)
    # The cost series are absent without a price of a GPU hour: the stack's exporter has none.
    unpriced = {s.name for s in WINDOWED} - PRICED
    assert unpriced <= set(lowest), "windowed series missing from the run"
    negative = {name: low for name, low in lowest.items() if low < 0}
    print(f"{len(lowest)} exporter series over the run, none below 0: {not negative}")
    assert negative == {}


def _page(samples: dict[tuple[str, tuple[tuple[str, str], ...]], float]) -> str:
    """An exposition page from one scrape's samples, for the page parser."""

    def label(v: str) -> str:
        return v.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")

    lines = []
    for (name, labels), value in samples.items():
        text = ",".join(f'{k}="{label(v)}"' for k, v in labels)
        lines.append(f"{name}{{{text}}} {value!r}" if labels else f"{name} {value!r}")
    return "\n".join(lines) + "\n"


def _raw_snapshots(chaos: Chaos) -> list[tuple[float, Snapshot]]:
    """vLLM's page as Prometheus scraped it, one Snapshot per scrape, in time order."""
    by_scrape: dict[float, dict[tuple[str, tuple[tuple[str, str], ...]], float]] = {}
    for series in chaos.samples('{job="vllm", __name__=~"vllm:.+|process_start_time_seconds"}'):
        metric = series["metric"]
        name = metric["__name__"]
        labels = tuple(
            sorted((k, v) for k, v in metric.items() if k not in ("__name__", "job", "instance"))
        )
        for ts, value in series["values"]:
            by_scrape.setdefault(float(ts), {})[(name, labels)] = float(value)
    return [(ts, read_snapshot(_page(by_scrape[ts]))) for ts in sorted(by_scrape)]


def _reference_totals(
    snapshots: list[tuple[float, Snapshot]],
) -> list[tuple[float, dict[EngineKey, dict[str, float]]]]:
    """Running totals of every counter from the first scrape on, stepped from scrape to
    scrape by the derivation core's one counter rule (`derive.snapshot_increases`: a new
    process start time, or a _total/_count going down, starts every counter again)."""
    out: list[tuple[float, dict[EngineKey, dict[str, float]]]] = []
    totals: dict[EngineKey, dict[str, float]] = {}
    for (_, before), (at, after) in itertools.pairwise(snapshots):
        for key, step in snapshot_increases(before, after, 0.0).items():
            running = totals.setdefault(key, {})
            for name, value in step.counters.items():
                running[name] = running.get(name, 0.0) + value
        out.append((at, {k: dict(v) for k, v in totals.items()}))
    return out


def test_no_windowed_series_spikes_against_the_derivation_core_on_raw_counters(
    chaos: Chaos,
) -> None:
    key = EngineKey(MODEL, "0")
    totals = _reference_totals(_raw_snapshots(chaos))
    times = [ts for ts, _ in totals]
    weights = chaos.samples('glassbox_model_weights_bytes{job="glassbox"}')
    context = Context(float(weights[0]["values"][-1][1]), PEAK_BANDWIDTH)
    covered = {
        float(ts): float(v)
        for series in chaos.samples(
            f'glassbox_window_covered_seconds{{job="glassbox", model_name="{MODEL}"}}'
        )
        for ts, v in series["values"]
    }

    polled = {
        float(ts): float(v)
        for series in chaos.samples(
            'glassbox_last_scrape_success_timestamp_seconds{job="glassbox"}'
        )
        for ts, v in series["values"]
    }

    def reference(compute: Any, polled_at: float, span: float) -> list[float]:
        """The core's values for raw windows [a, b]: b the raw scrape of vLLM nearest the
        exporter's own poll that made the value (its last success, which ends its
        window; not Prometheus' scrape of the exporter, which may come seconds after a
        slow poll), b - a within ALIGN_SECONDS of the exporter's span."""
        values = []
        # Besides the scrapes within the slack, the nearest one on each side of the poll
        # and of the window's start, however far: under load vLLM's scrapes thin out, and
        # a burst of preemptions in one step between the poll and the nearest scrape
        # would then lie in no raw window (a 5.4x "spike" of preemptions per second).
        first_end = min(
            bisect.bisect_left(times, polled_at - POLL_SLACK_SECONDS),
            max(bisect.bisect_right(times, polled_at) - 1, 0),
        )
        last_end = max(
            bisect.bisect_right(times, polled_at + POLL_SLACK_SECONDS),
            min(bisect.bisect_left(times, polled_at) + 1, len(times)),
        )
        for j in range(first_end, last_end):
            b = times[j]
            end = totals[j][1].get(key)
            if end is None:
                continue
            first = min(
                bisect.bisect_left(times, b - span - ALIGN_SECONDS),
                max(bisect.bisect_right(times, polled_at - span) - 1, 0),
            )
            last = max(
                bisect.bisect_right(times, b - span + ALIGN_SECONDS),
                bisect.bisect_left(times, polled_at - span) + 1,
            )
            for i in range(first, min(last, j)):
                start = totals[i][1].get(key, {})
                d = Increase({n: v - start.get(n, 0.0) for n, v in end.items()}, b - times[i])
                value = compute(d, context)
                if value is not None:
                    values.append(value)
        return values

    compared = 0
    skipped: dict[str, int] = {}
    worst: dict[str, float] = {}
    spikes: list[str] = []
    for windowed in WINDOWED:
        selector = f'{windowed.name}{{job="glassbox", model_name="{MODEL}"}}'
        for series in chaos.samples(selector):
            for ts_text, v_text in series["values"]:
                at, value = float(ts_text), float(v_text)
                if at < chaos.times["start"]:
                    continue
                span = covered.get(at)
                if span is None or span < MIN_SPAN_SECONDS:
                    skipped["window under 10 s"] = skipped.get("window under 10 s", 0) + 1
                    continue
                polled_at = polled.get(at)
                if polled_at is None:
                    skipped["no poll time"] = skipped.get("no poll time", 0) + 1
                    continue
                envelope = reference(windowed.compute, polled_at, span)
                if not envelope:
                    skipped["no raw window"] = skipped.get("no raw window", 0) + 1
                    continue
                compared += 1
                high, low = max(envelope), min(envelope)
                ratio = value / high if high > 0 else (1.0 if value == 0 else math.inf)
                worst[windowed.name] = max(worst.get(windowed.name, 0.0), ratio)
                if value > high * SPIKE_FACTOR + 1e-12 or value < low / SPIKE_FACTOR - 1e-12:
                    spikes.append(
                        f"{windowed.name} = {value:.6g} at {at - chaos.times['kill']:+.0f}s "
                        f"from the kill (window {span:g}s, polled {at - polled_at:.1f}s "
                        f"before the scrape); the derivation core on raw counters: "
                        f"{low:.6g} .. {high:.6g}"
                    )
    print(
        f"{compared} exporter values compared with the derivation core on {len(times)} raw "
        f"scrapes of vLLM (skipped: {skipped}); highest value / reference: "
        + ", ".join(f"{n.removeprefix('glassbox_')} {r:.2f}" for n, r in sorted(worst.items()))
    )
    assert compared > 100, "too little to compare: the run made no derived data"
    assert skipped.get("no raw window", 0) < compared / 10, skipped
    assert spikes == [], spikes[:10]
