"""A fleet of vLLM pods on one loopback port, for a real Prometheus to scrape.

Each pod shows two pages, as the chart's sidecar pod does: vLLM's (`/pods/<i>/vllm`)
and its exporter's (`/pods/<i>/glassbox`). Prometheus gives each its `namespace`, `pod`
and `instance` as a ServiceMonitor would (`scrape_configs`), so every pod is a target of
its own although one process serves them all.

- vLLM's page is a real capture of the vLLM 0.32 CPU build (tests/fixtures/metrics/
  cpu-0.32/, grown to 8 data-parallel engines with `engines=8`) whose counters move on
  from the idle page at the pace the capture's busy page reached (every counter, its
  histogram buckets included, as (busy - idle) per CAPTURE_SECONDS × the pod's load),
  with the pod's model name and its running/waiting/KV-usage gauges.
- The exporter's page is what the real exporter (`Poller`) published after polling two
  pages of the same server, its model name and a few gauges set per pod: the bandwidth
  utilization, the KV headroom, the preemption rate.

A pod `under_pressure` has a nearly full pool, requests waiting, preempts and decodes far
below the peak bandwidth: the conditions of the capacity and bandwidth alerts. Pods are
spread round-robin over namespaces, and the models over pods so that every model is
served in several namespaces.
"""

from __future__ import annotations

import contextlib
import functools
import http.server
import itertools
import math
import random
import re
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from prometheus_client import generate_latest
from vllm_glassbox.exporter.service import ExporterConfig, Poller, make_registry

from tests.fixtures import LOGS, grow_engines, page
from tests.remote_write import Series
from tests.rules.test_rules import serve_pages

IDLE_PAGE = "cpu-0.32/spec-idle.txt"
BUSY_PAGE = "cpu-0.32/flood-after.txt"  # speculation, then a flood that preempted
EXPORTER_PAGES = ("cpu-0.32/spec-after-2x256.txt", "cpu-0.32/flood-mid.txt")
CAPTURE_MODEL = "tiny"
CAPTURE_SECONDS = 60.0  # the pace: the busy page's increases over a minute at load 1
COUNTER_SUFFIXES = ("_total", "_count", "_sum", "_bucket")
VLLM_JOB, EXPORTER_JOB = "vllm", "vllm-glassbox"  # the chart's job names
CONNECT_ERRORS = 'glassbox_scrape_errors_total{reason="connect"} '


@dataclass(frozen=True)
class Pod:
    index: int
    namespace: str
    model: str
    load: float  # 1.0: the capture's pace
    under_pressure: bool
    bandwidth_utilization: float
    # The exporter fails to read vLLM (glassbox_target_up 0, connect errors counting).
    target_down: bool = False
    # The exporter sees vLLM restart this many seconds into the fleet's life.
    restart_after: float | None = None

    @property
    def name(self) -> str:
        return f"vllm-{self.index}"


def plan_pods(
    pods: int, namespaces: int, models: int, pressure_every: int = 10, seed: int = 0
) -> list[Pod]:
    """`pods` pods over `namespaces` namespaces; the model of pod i cycles so that every
    model is served in several namespaces. One pod in `pressure_every` is under pressure
    and decodes at a quarter of the peak bandwidth; the others between 30 and 90 %."""
    rng = random.Random(seed)
    plan = []
    for i in range(pods):
        under_pressure = i % pressure_every == pressure_every - 1
        plan.append(
            Pod(
                index=i,
                namespace=f"team-{i % namespaces}",
                model=f"model-{(i // namespaces) % models}",
                load=rng.uniform(0.3, 2.0),
                under_pressure=under_pressure,
                bandwidth_utilization=0.25 if under_pressure else rng.uniform(0.3, 0.9),
            )
        )
    return plan


_SAMPLE = re.compile(r"^([^#\s][^ ]*(?:\{.*\})?) (\S+)$")


@dataclass(frozen=True)
class PageTemplate:
    """A page as text pieces around its sample values: piece i ends with the name and
    labels of sample i; the last piece follows the last value."""

    pieces: tuple[str, ...]
    start: tuple[float, ...]
    per_second: tuple[float, ...]  # at load 1; 0 for gauges
    names: tuple[str, ...]

    def render(self, values: Sequence[float]) -> str:
        out = []
        for piece, value in zip(self.pieces, values, strict=False):
            out.append(piece)
            out.append(repr(value))
        out.append(self.pieces[-1])
        return "".join(out)


def template(text: str, later: str | None = None) -> PageTemplate:
    """`text` split around its values; with `later` (the same server's later page), each
    counter's increase per second at the capture's pace."""
    later_values: dict[str, float] = {}
    if later is not None:
        for line in later.splitlines():
            if m := _SAMPLE.match(line):
                later_values[m.group(1)] = float(m.group(2))
    pieces, start, per_second, names = [], [], [], []
    pending = ""
    for line in text.splitlines(keepends=True):
        m = _SAMPLE.match(line.rstrip("\n"))
        if not m:
            pending += line
            continue
        series, value = m.group(1), float(m.group(2))
        name = series.split("{", 1)[0]
        pieces.append(pending + series + " ")
        pending = "\n"
        start.append(value)
        counter = name.endswith(COUNTER_SUFFIXES)
        grew = later_values.get(series, value) - value if counter else 0.0
        per_second.append(max(grew, 0.0) / CAPTURE_SECONDS)
        names.append(name)
    pieces.append(pending)
    return PageTemplate(tuple(pieces), tuple(start), tuple(per_second), tuple(names))


def _with_model(text: str, model: str) -> str:
    return text.replace(f'model_name="{CAPTURE_MODEL}"', f'model_name="{model}"')


@functools.cache
def exporter_page(engines: int) -> str:
    """The real exporter's page (its own registry's encoding) after two polls of a busy
    server (weights and the peak bandwidth known, its start-up log read), `engines`
    data-parallel engines."""
    pages = [grow_engines(page(name), engines) for name in EXPORTER_PAGES]
    with serve_pages(pages) as url:
        clock = functools.partial(next, itertools.count(0.0, 15.0))
        poller = Poller(
            ExporterConfig(
                target=url,
                interval_seconds=30.0,
                window_seconds=60.0,
                timeout_seconds=5.0,
                weights_bytes=2e9,
                peak_bandwidth=1e12,
                vllm_log=str(LOGS / "cpu-0.32-spec-startup.log"),
            ),
            clock=clock,
        )
        try:
            if not (poller.poll_once() and poller.poll_once()):
                raise RuntimeError("the exporter could not poll the captured pages")
        finally:
            poller.fetcher.close()
    return generate_latest(make_registry(poller)).decode()


class Fleet:
    """The pods' pages, rendered at the time of each request."""

    def __init__(self, pods: Sequence[Pod], engines: int = 1, started: float | None = None) -> None:
        self.pods = list(pods)
        self.engines = engines
        self.started = time.time() if started is None else started
        idle, busy = (grow_engines(page(p), engines) for p in (IDLE_PAGE, BUSY_PAGE))
        exporter = exporter_page(engines)
        models = sorted({p.model for p in pods})
        self.vllm = {m: template(_with_model(idle, m), _with_model(busy, m)) for m in models}
        self.exporter = {m: template(_with_model(exporter, m)) for m in models}

    def page(self, index: int, kind: str, elapsed: float | None = None) -> str:
        """Pod `index`'s page of `kind` now, or `elapsed` seconds into the fleet's life."""
        pod = self.pods[index]
        elapsed = time.time() - self.started if elapsed is None else elapsed
        if kind == "vllm":
            return self._vllm_page(pod, elapsed)
        if kind == "glassbox":
            return self._exporter_page(pod, elapsed)
        raise KeyError(kind)

    def _vllm_page(self, pod: Pod, elapsed: float) -> str:
        t = self.vllm[pod.model]
        running = max(1.0, round(8 * pod.load))
        gauges = {
            "vllm:num_requests_running": running,
            "vllm:num_requests_waiting": 3.0 if pod.under_pressure else 0.0,
            "vllm:kv_cache_usage_perc": 0.97
            if pod.under_pressure
            else 0.2 + 0.15 * pod.load * (1 + math.sin(elapsed / 60 + pod.index)),
        }
        # vLLM 0.20+ splits the queue by reason (the sum is num_requests_waiting): the
        # pressured pods' requests wait for capacity, none is deferred.
        by_reason = {"capacity": gauges["vllm:num_requests_waiting"], "deferred": 0.0}
        preemptions = 0.2 if pod.under_pressure else 0.0
        values = []
        for piece, name, start, rate in zip(t.pieces, t.names, t.start, t.per_second, strict=False):
            if name == "vllm:num_requests_waiting_by_reason":
                reason = piece.rsplit('reason="', 1)[1].split('"', 1)[0]
                values.append(by_reason[reason])
            elif name in gauges:
                values.append(gauges[name])
            elif name == "vllm:num_preemptions_total":
                values.append(start + preemptions * elapsed)
            else:
                values.append(start + rate * pod.load * elapsed)
        return t.render(values)

    def _exporter_page(self, pod: Pod, elapsed: float) -> str:
        t = self.exporter[pod.model]
        restarted = pod.restart_after is not None and elapsed >= pod.restart_after
        values = {
            "glassbox_memory_bandwidth_utilization_ratio": pod.bandwidth_utilization,
            "glassbox_kv_cache_headroom_requests": 0.0 if pod.under_pressure else 6.0,
            "glassbox_preemptions_per_second": 0.2 if pod.under_pressure else 0.0,
            "glassbox_target_up": 0.0 if pod.target_down else 1.0,
            "glassbox_target_restarts_total": 1.0 if restarted else 0.0,
        }
        out = []
        for piece, name, start in zip(t.pieces, t.names, t.start, strict=False):
            if pod.target_down and piece.endswith(
                'glassbox_scrape_errors_total{reason="connect"} '
            ):
                out.append(start + 0.2 * elapsed)  # a failed poll every 5 s
            else:
                out.append(values.get(name, start))
        text = t.render(out)
        if restarted and pod.restart_after is not None:
            # Absent from the captured page (it saw no restart): the poll that saw this one.
            name = "glassbox_target_last_restart_timestamp_seconds"
            text += f"# TYPE {name} gauge\n{name} {self.started + pod.restart_after!r}\n"
        return text


_PATH = re.compile(r"^/pods/(\d+)/(vllm|glassbox)$")


def _handler(fleet: Fleet) -> type[http.server.BaseHTTPRequestHandler]:
    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"  # keep-alive, as Prometheus scrapes

        def do_GET(self) -> None:
            m = _PATH.match(self.path)
            if not m or int(m.group(1)) >= len(fleet.pods):
                self.send_error(404)
                return
            body = fleet.page(int(m.group(1)), m.group(2)).encode()
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:
            pass

    return Handler


class _Server(http.server.ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 256


@dataclass
class Serving:
    fleet: Fleet
    hostport: str

    def scrape_configs(self, interval: str, timeout: str) -> list[dict[str, Any]]:
        """Two jobs, vLLM's and the exporter's, one target per pod with the labels a
        ServiceMonitor gives (namespace, pod, an instance of its own)."""

        def job(name: str, kind: str, port: int) -> dict[str, Any]:
            return {
                "job_name": name,
                "scrape_interval": interval,
                "scrape_timeout": timeout,
                "static_configs": [
                    {
                        "targets": [self.hostport],
                        "labels": {
                            "__metrics_path__": f"/pods/{pod.index}/{kind}",
                            **{
                                k: v
                                for k, v in self.target_labels(pod, name, port).items()
                                if k != "job"
                            },
                        },
                    }
                    for pod in self.fleet.pods
                ],
            }

        return [job(name, kind, port) for name, kind, port in TARGETS]

    def history(self, until: float, step: float, pods: Sequence[Pod] | None = None) -> list[Series]:
        """What a scraper with `scrape_configs` would have read from `pods` (all) from the
        fleet's start to `until` seconds into its life, every `step`: each page's samples
        with the labels the scrape gives them (`up` 1 beside each), as remote-write series."""
        series: dict[tuple[tuple[str, str], ...], list[tuple[float, float]]] = {}
        elapsed = 0.0
        while elapsed < until:
            at = self.fleet.started + elapsed
            for job, kind, port in TARGETS:
                for pod in self.fleet.pods if pods is None else pods:
                    target = self.target_labels(pod, job, port)
                    samples = [("up", 1.0)]
                    text = self.fleet.page(pod.index, kind, elapsed)
                    samples += [(m.group(1), float(m.group(2))) for m in _LINES.finditer(text)]
                    for name_and_labels, value in samples:
                        key = tuple(sorted({**_labels_of(name_and_labels), **target}.items()))
                        series.setdefault(key, []).append((at, value))
            elapsed += step
        return [(dict(key), samples) for key, samples in series.items()]

    @staticmethod
    def target_labels(pod: Pod, job: str, port: int) -> dict[str, str]:
        return {
            "job": job,
            "namespace": pod.namespace,
            "pod": pod.name,
            "instance": f"10.0.{pod.index // 250}.{pod.index % 250}:{port}",
        }


# (job, page, port) of each pod's two targets: vLLM's, the exporter's.
TARGETS = ((VLLM_JOB, "vllm", 8000), (EXPORTER_JOB, "glassbox", 9400))
_LINES = re.compile(r"^([^#\s][^ ]*) (\S+)$", re.MULTILINE)
_LABEL_PAIR = re.compile(r'([a-zA-Z_]\w*)="((?:[^"\\]|\\.)*)"')


@functools.cache
def _labels_of(series: str) -> dict[str, str]:
    name, _, rest = series.partition("{")
    return {"__name__": name, **dict(_LABEL_PAIR.findall(rest))}


@contextlib.contextmanager
def serve(fleet: Fleet, port: int = 0) -> Iterator[Serving]:
    """Serve `fleet` on 127.0.0.1:`port` (0: a free one) while the generator is open."""
    server = _Server(("127.0.0.1", port), _handler(fleet))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield Serving(fleet, f"127.0.0.1:{server.server_address[1]}")
    finally:
        server.shutdown()
        server.server_close()
