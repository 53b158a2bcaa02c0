"""The running exporter: a background poller and an HTTP server that never calls vLLM.

The poller fetches vLLM's page on a fixed period, folds it into the window history and
publishes an immutable list of metric families; a scrape only encodes the latest
publication. Every failure of vLLM becomes data (`glassbox_target_up 0`, an error
counter by reason), never an exception on the serving path.
"""

from __future__ import annotations

import contextlib
import json
import logging
import socket
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import Metric
from prometheus_client.process_collector import ProcessCollector
from vllm_glassbox import __version__

from .collector import PollState, Weights, build_families
from .fetch import Fetcher
from .first_requests import FirstRequestsWatch
from .history import History
from .kv_trend import UsedTokensTrend, used_tokens
from .snapshot import Snapshot, read_snapshot
from .startup_log import LogFollower
from .textformat import Limits, PageError
from .weights import weights_from_config, weights_from_safetensors

log = logging.getLogger("glassbox.exporter")


@dataclass(frozen=True)
class ExporterConfig:
    target: str = "http://127.0.0.1:8000"
    listen_host: str = "0.0.0.0"
    listen_port: int = 9400
    interval_seconds: float = 5.0
    window_seconds: float = 60.0
    timeout_seconds: float = 3.0
    max_bytes: int = 8 * 1024 * 1024
    max_series_per_metric: int = 512
    weights_bytes: float | None = None
    vllm_log: str | None = None
    model_dir: str | None = None
    peak_bandwidth: float | None = None


def resolve_checkpoint_weights(model_dir: str) -> Weights:
    """Weights from safetensors headers, else estimated from config.json."""
    path = Path(model_dir)
    exact = weights_from_safetensors(path)
    if exact is not None:
        return Weights(float(exact), "safetensors")
    return Weights(float(weights_from_config(path)), "config")


class Poller:
    """Polls vLLM and publishes families. `poll_once` is the unit the tests drive."""

    def __init__(
        self,
        config: ExporterConfig,
        fetcher: Fetcher | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.config = config
        self.fetcher = fetcher or Fetcher(config.target, config.timeout_seconds, config.max_bytes)
        self.clock = clock
        self.limits = Limits(max_series_per_metric=config.max_series_per_metric)
        polls_per_window = int(config.window_seconds / config.interval_seconds) + 2
        self.history = History(config.window_seconds, max_entries=polls_per_window)
        self.used_tokens = UsedTokensTrend(config.window_seconds, max_entries=polls_per_window)
        self.first_requests = FirstRequestsWatch()
        self.polled_at: float | None = None  # the latest successful poll, monotonic
        self.errors: Counter[str] = Counter()
        self.log_follower = LogFollower(config.vllm_log) if config.vllm_log else None
        self.checkpoint_weights: Weights | None = None
        if config.weights_bytes is None and config.model_dir:
            # Read once at startup; a bad directory is a startup error, named by the CLI.
            self.checkpoint_weights = resolve_checkpoint_weights(config.model_dir)
        self.vllm_version: str | None = None
        self.last_success_unix: float | None = None
        self._failing: str | None = None  # reason of the failure in progress
        self._published: list[Metric] = []
        self._publish(up=False, duration=0.0, snapshot=None)

    @property
    def published(self) -> list[Metric]:
        return self._published

    def weights(self) -> Weights | None:
        if self.config.weights_bytes is not None:
            return Weights(self.config.weights_bytes, "flag")
        if self.log_follower is not None:
            logged = self.log_follower.facts.weights_bytes
            if logged is not None:
                return Weights(logged, "log")
        return self.checkpoint_weights

    def poll_once(self) -> bool:
        started = self.clock()
        deadline = time.monotonic() + self.config.timeout_seconds  # one per poll, all fetches
        snapshot: Snapshot | None = None
        try:
            snapshot = read_snapshot(self.fetcher.get_text("/metrics"), self.limits)
        except PageError as e:
            self.errors[e.reason] += 1
            # An error line when the failure starts or changes; the counter has the rest.
            level = logging.DEBUG if e.reason == self._failing else logging.ERROR
            target = self.config.target
            log.log(level, "poll failed target=%s reason=%s err=%s", target, e.reason, e)
            self._failing = e.reason
        if snapshot is not None and self._failing is not None:
            log.info("poll succeeded again target=%s", self.config.target)
            self._failing = None
        if snapshot is not None:
            restarted = self.history.add(snapshot, started)
            self.used_tokens.add(started, used_tokens(snapshot))
            self.first_requests.observe(snapshot, started, restarted)
            self.polled_at = started
            self.last_success_unix = time.time()
            if restarted or self.vllm_version is None:
                self.vllm_version = self._fetch_version(deadline - time.monotonic())
        if self.log_follower is not None:
            try:
                self.log_follower.poll()
            except OSError as e:
                log.warning("cannot read vLLM log path=%s err=%s", self.config.vllm_log, e)
        self._publish(up=snapshot is not None, duration=self.clock() - started, snapshot=snapshot)
        return snapshot is not None

    def _fetch_version(self, seconds_left: float) -> str | None:
        """vLLM's version, or None (asked again at the next poll)."""
        try:
            version = json.loads(self.fetcher.get_text("/version", seconds_left)).get("version")
            return str(version)[:64] if version else None
        except (PageError, ValueError, AttributeError):
            return None

    def _publish(self, up: bool, duration: float, snapshot: Snapshot | None) -> None:
        facts = self.log_follower.facts if self.log_follower else None
        state = PollState(
            up=up,
            window_seconds=self.config.window_seconds,
            scrape_duration_seconds=duration,
            errors=dict(self.errors),
            restarts=self.history.restarts,
            last_success_unix=self.last_success_unix,
            snapshot=snapshot,
            increases=self.history.increases() if up else {},
            weights=self.weights(),
            peak_bandwidth=self.config.peak_bandwidth,
            kv_cache_memory_bytes=facts.kv_cache_memory_bytes if facts else None,
            kv_cache_logged_tokens=facts.kv_cache_tokens if facts else None,
            cold_start=self.log_follower.cold_start if self.log_follower else None,
            first_requests=dict(self.first_requests.first),
            polled_at=self.polled_at,
            used_tokens_growth=self.used_tokens.growth() if up else {},
            vllm_version=self.vllm_version,
            build_version=__version__,
        )
        # One reference swap: a scrape sees the previous publication or this one, whole.
        self._published = [f for f in build_families(state) if f.samples]

    def run(self, stop: threading.Event) -> None:
        next_at = self.clock()
        while not stop.is_set():
            try:
                self.poll_once()
            except Exception:  # a bug must not kill the sidecar; it shows as target_up 0
                log.exception("unexpected error while polling")
                self.errors["parse"] += 1
                self._publish(up=False, duration=0.0, snapshot=None)
            next_at += self.config.interval_seconds
            now = self.clock()
            if next_at < now:  # fell behind: skip the missed ticks rather than burst
                next_at = now + self.config.interval_seconds
            stop.wait(max(0.0, next_at - now))


class _Published:
    """Adapter so prometheus_client encodes the poller's latest publication."""

    def __init__(self, poller: Poller) -> None:
        self._poller = poller

    def collect(self) -> Iterator[Metric]:
        yield from self._poller.published

    def describe(self) -> list[Metric]:
        return []


def make_registry(poller: Poller) -> CollectorRegistry:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Published(poller))
    registry.register(ProcessCollector(registry=None))
    return registry


_LANDING = b"""<html><head><title>glassbox exporter</title></head><body>
<h1>vllm-glassbox exporter</h1><p><a href="/metrics">/metrics</a> &middot;
<a href="/healthz">/healthz</a></p></body></html>"""


def make_server(poller: Poller, host: str, port: int) -> ThreadingHTTPServer:
    registry = make_registry(poller)

    class Handler(BaseHTTPRequestHandler):
        server_version = f"glassbox/{__version__}"
        timeout = 10  # a client that connects and says nothing must not hold a thread

        def do_GET(self) -> None:
            path = self.path.split("?", 1)[0]
            if path == "/metrics":
                self._send(
                    200, generate_latest(registry), "text/plain; version=0.0.4; charset=utf-8"
                )
            elif path == "/healthz":
                # Liveness of the sidecar only: vLLM being down must not restart us.
                self._send(200, b"ok\n", "text/plain")
            elif path == "/":
                self._send(200, _LANDING, "text/html")
            else:
                self._send(404, b"not found\n", "text/plain")

        def _send(self, code: int, body: bytes, content_type: str) -> None:
            # A scraper that gave up (Prometheus' scrape timeout) is not our error.
            with contextlib.suppress(BrokenPipeError, ConnectionResetError):
                self.send_response(code)
                self.send_header("Content-Type", content_type)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:
            log.debug("http %s", format % args)

    server_class = _HTTPServer6 if ":" in host else ThreadingHTTPServer
    server = server_class((host, port), Handler)
    server.daemon_threads = True
    return server


class _HTTPServer6(ThreadingHTTPServer):
    address_family = socket.AF_INET6


def serve(config: ExporterConfig, stop: threading.Event | None = None) -> None:
    """Run until `stop` is set (or forever): poller thread plus HTTP server."""
    stop = stop or threading.Event()
    poller = Poller(config)
    server = make_server(poller, config.listen_host, config.listen_port)
    poll_thread = threading.Thread(target=poller.run, args=(stop,), name="poller", daemon=True)
    serve_thread = threading.Thread(target=server.serve_forever, name="http", daemon=True)
    poll_thread.start()
    serve_thread.start()
    host = config.listen_host
    shown = f"[{host}]" if ":" in host else host
    port = server.server_address[1]
    log.info("serving on http://%s:%s/metrics target=%s", shown, port, config.target)
    try:
        stop.wait()
    finally:
        server.shutdown()
        server.server_close()
        poll_thread.join(timeout=config.timeout_seconds + 1)
        poller.fetcher.close()
