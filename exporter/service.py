"""The running exporter: a background poller and an HTTP server that never calls vLLM.

The poller fetches vLLM's page on a fixed period, folds it into the window history and
publishes an immutable list of metric families; a scrape only encodes the latest
publication. Every failure of vLLM becomes data (`glassbox_target_up 0`, an error
counter by reason), never an exception on the serving path.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from prometheus_client import CollectorRegistry
from prometheus_client.core import Metric
from prometheus_client.process_collector import ProcessCollector
from vllm_glassbox import __version__
from vllm_glassbox.core import derive
from vllm_glassbox.core.build import this_build
from vllm_glassbox.core.errors import ScrapeError
from vllm_glassbox.core.fetch import DEFAULT_MAX_BYTES, Fetched, Fetcher, TargetCredentials
from vllm_glassbox.core.kv_trend import KvPool, UsedTokensTrend, kv_pools, used_tokens
from vllm_glassbox.core.layout import ParallelLayout, resolve_layout
from vllm_glassbox.core.snapshot import (
    ENGINE_STEPS,
    FILTERED_PAGE_PATH,
    KV_USAGE,
    RUNNING,
    EngineKey,
    Snapshot,
    first_cache,
    lost_since,
    read_snapshot,
)
from vllm_glassbox.core.startup_log import LogFollower, StartupFacts
from vllm_glassbox.core.textformat import Limits
from vllm_glassbox.core.ticker import ticks
from vllm_glassbox.core.weights import Weights, read_checkpoint
from vllm_glassbox.exporter.endpoints import findings_answer, landing_page, metrics_answer
from vllm_glassbox.exporter.exposition import (
    PollState,
    finding_families,
    poll_families,
    unrecognised_inputs,
)
from vllm_glassbox.exporter.first_requests import FirstRequestsWatch
from vllm_glassbox.exporter.history import History
from vllm_glassbox.exporter.model_watch import ModelWatch
from vllm_glassbox.exporter.server import Answer, MetricsServer
from vllm_glassbox.exporter.server_trail import SEVERAL_SERVERS, SEVERAL_SERVERS_SHOWN, ServerTrail
from vllm_glassbox.exporter.state_log import StateLog
from vllm_glassbox.exporter.webconfig import WebConfigSource

log = logging.getLogger("glassbox.exporter")


@dataclass(frozen=True)
class ExporterConfig:
    target: str = "http://127.0.0.1:8000"
    listen_host: str = "0.0.0.0"
    listen_port: int = 9400
    interval_seconds: float = 5.0
    window_seconds: float = 60.0
    # How far back the KV pool's growth is measured for its exhaustion forecast; None: the
    # window. Shorter than a long window, the forecast follows the pool's recent growth.
    forecast_window_seconds: float | None = None
    # The hard deadline of one poll, on purpose longer than the interval: a busy vLLM
    # that answers late is read (and counted as `slow`), only a silent one is `timeout`.
    timeout_seconds: float = 10.0
    max_bytes: int = DEFAULT_MAX_BYTES
    max_series_per_metric: int = 512
    weights_bytes: float | None = None
    vllm_log: str | None = None
    model_dir: str | None = None
    peak_bandwidth: float | None = None
    kv_link_bandwidth: float | None = None  # of the link a KV consumer receives on, bytes/s
    web_config_file: str | None = None  # TLS and basic auth of our own endpoint
    target_credentials: TargetCredentials = field(default_factory=TargetCredentials)
    tensor_parallel: int | None = None  # flags; else vLLM's log says, else 1
    pipeline_parallel: int | None = None
    # What vLLM's names start with on the page: "auto" (the one known prefix it shows),
    # or one given (`ray_vllm_` behind Ray Serve LLM).
    metric_prefix: str = "auto"
    gpu_hour_price: float | None = None  # of one GPU, for --gpu or --node-pool


def _steps_per_api_server(
    snapshot: Snapshot | None, api_servers: int | None
) -> tuple[str, str] | None:
    """(source, what shows it) where vLLM counts an engine step once per API server that
    took part (derive.steps_counted_once); None where each step counts once."""
    if snapshot is None or derive.steps_counted_once(snapshot.process_start_time, api_servers):
        return None
    if api_servers is not None:
        return "log", (
            f"the log's start runs {api_servers} API servers, each counting an engine step "
            "it took part in (steps/s, tokens per step and weight bytes per token absent)"
        )
    return "page", (
        "a page in multiprocess mode (no process_* series): several API servers, each "
        "counting an engine step it took part in (steps/s, tokens per step and weight "
        "bytes per token absent; --vllm-log tells how many)"
    )


class Poller:
    """Polls vLLM and publishes families. `poll_once` is the unit the tests drive."""

    def __init__(
        self,
        config: ExporterConfig,
        fetcher: Fetcher | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.config = config
        self.fetcher = fetcher or Fetcher(
            config.target, config.timeout_seconds, config.max_bytes, config.target_credentials
        )
        self.clock = clock
        self.limits = Limits(max_series_per_metric=config.max_series_per_metric)
        polls_per_window = int(config.window_seconds / config.interval_seconds) + 2
        self.history = History(config.window_seconds, max_entries=polls_per_window)
        forecast_window = config.forecast_window_seconds or config.window_seconds
        self.used_tokens = UsedTokensTrend(
            forecast_window, max_entries=int(forecast_window / config.interval_seconds) + 2
        )
        self.first_requests = FirstRequestsWatch()
        self.polled_at: float | None = None  # the latest successful poll, monotonic
        self.errors: Counter[str] = Counter()
        self.log_follower = LogFollower(config.vllm_log) if config.vllm_log else None
        # Read once at startup; a bad directory is a startup error, named by the CLI.
        checkpoint = read_checkpoint(Path(config.model_dir)) if config.model_dir else None
        self.models = ModelWatch(config.weights_bytes, checkpoint)  # whose weights
        self.engines: int | None = None  # on the latest good page
        # Whether vLLM serves the page of the samples glassbox reads; None: not known yet.
        self.filtered_page: bool | None = None
        self.vllm_version: str | None = None
        self.last_success_unix: float | None = None
        self.last_restart_unix: float | None = None
        self._failed_since = False  # a poll failed since the last one that succeeded
        self._refused_since = False  # ... with a refused connection: the process was gone
        self.trail = ServerTrail()
        self.several_servers = False  # pages of several vLLM processes in turn
        self._latest_page: Snapshot | None = None  # the latest page read, even if refused
        self.up: bool | None = None  # the latest poll's outcome; None before the first
        self.failing: str | None = None  # what the latest failed poll said
        self._stopping = False
        self._published: list[Metric] = []
        self.state: PollState | None = None  # what the latest publication was built from
        self.told = StateLog(config.target)  # each change of state logged once
        # Before the first poll ends vLLM is neither up nor down: no glassbox_target_up
        # yet, so a restarted exporter never shows a target down that is not.
        self._publish(up=None, duration=0.0, snapshot=None)

    @property
    def published(self) -> list[Metric]:
        return self._published

    def _facts(self) -> StartupFacts | None:
        return self.log_follower.facts if self.log_follower else None

    def layout(self) -> ParallelLayout:
        return resolve_layout(
            self._facts(), self.config.tensor_parallel, self.config.pipeline_parallel, self.engines
        )

    def weights(self) -> Weights | None:
        """The weights of the model the page serves (of whichever before the first page)."""
        return self.models.served_weights(self._facts(), self.layout())[0]

    def poll_once(self) -> bool:
        started = self.clock()
        deadline = time.monotonic() + self.config.timeout_seconds  # one per poll, all fetches
        snapshot: Snapshot | None = None
        try:
            page = self._read_page(deadline)
            self._check_nothing_lost(page)
            snapshot = page
        except ScrapeError as e:
            if self._stopping:  # cut by stop(): not vLLM's failure
                return False
            self._failed_since = True
            self._refused_since = self._refused_since or e.refused
            self.errors[e.reason] += 1
            self.told.failed(e)  # when the failure starts or changes; the counter counts
            self.failing = f"{e.reason}: {e}"
        if snapshot is not None:
            self.told.succeeded()
        # The page is stamped when it came, not when it was asked for: a busy API server
        # renders it after its queue (the counters are of that moment), so a slow answer
        # stamped at its start would overstate every rate by the delay over the window.
        received = self.clock()
        if snapshot is not None:
            restarted = self.history.add(snapshot, received, gone_since=self._refused_since)
            start = snapshot.process_start_time
            self.several_servers = self.trail.observe(start, restarted, self._failed_since)
            if self.several_servers:
                # Pages of several servers in turn: no switch is a restart, and no window
                # spans two of them, so no rate is published (the flag says why).
                if restarted:
                    self.history.restarts -= 1  # counted by this poll, not yet published
                    restarted = False
                self.history.forget()
                self.history.add(snapshot, received)
            self._failed_since = self._refused_since = False
            self.engines = len(snapshot.engines)
            self.first_requests.observe(snapshot, received, restarted)
            self.polled_at = received
            self.last_success_unix = time.time()
            if restarted:
                self.last_restart_unix = self.last_success_unix
                self.told.restarted(self.history.restarts, start)
            if restarted or self.vllm_version is None:
                self.vllm_version = self._fetch_version(deadline - time.monotonic())
        if self.log_follower is not None:
            error: OSError | None = None
            try:
                self.log_follower.poll()
            except OSError as e:
                error = e
            self.told.vllm_log(self.config.vllm_log, error)
        if snapshot is not None:
            self.models.follow(snapshot, restarted, self._facts(), self.history.restarts)
        pools = self._kv_pools(snapshot) if snapshot is not None else {}
        if snapshot is not None:
            self.used_tokens.add(received, used_tokens(pools))
        duration = received - started  # the fetch and the parse: what vLLM's answer cost
        if snapshot is not None:
            self._note_lateness(duration)
        self.up = snapshot is not None
        self._publish(up=self.up, duration=duration, snapshot=snapshot, pools=pools)
        return self.up

    def _check_nothing_lost(self, page: Snapshot) -> None:
        """Refuse (`truncated`) a page that lacks an engine or a family the page read before
        it had, in the same vLLM process (`snapshot.lost_since`). The page refused becomes
        the one the next is compared with, so a change that stays (an engine gone for
        good) costs one poll, never every poll."""
        before, self._latest_page = self._latest_page, page
        lost = lost_since(before, page) if before is not None else None
        if lost is not None:
            raise ScrapeError("truncated", f"{lost} (a page cut short?)")

    def _kv_pools(self, snapshot: Snapshot) -> dict[EngineKey, KvPool]:
        """Each engine's KV pool, once per poll for the page and the trend, with the log as
        this poll left it."""
        facts = self._facts()
        logged = facts.kv_cache_tokens if facts else None
        return kv_pools(snapshot, logged, facts.hybrid_kv if facts else False)

    def _read_page(self, deadline: float) -> Snapshot:
        """vLLM's page, asked for only the samples glassbox reads where vLLM serves them
        (FILTERED_PAGE_PATH), else the whole /metrics. Which one is decided by the first
        poll at which one of them reads: a filtered page without vLLM's samples (an older
        prometheus_client in multiprocess mode), an HTTP error or no exposition text on
        its path (a proxy passing /metrics only), while the whole page reads, means the
        whole page from then on."""
        snapshot: Snapshot | None = None
        if self.filtered_page is not False:
            try:
                page = self.fetcher.get_page(FILTERED_PAGE_PATH, deadline - time.monotonic())
                snapshot = self._read(page)
            except ScrapeError as e:
                if e.reason not in ("http_status", "parse", "no_vllm_metrics"):
                    raise  # vLLM slow or gone: nothing to learn about the path
                self.filtered_page = None  # (again) to be decided by the whole page
            if snapshot is not None:
                self.filtered_page = True
                return snapshot
        page = self.fetcher.get_page("/metrics", deadline - time.monotonic())
        snapshot = self._read(page)
        if self.filtered_page is None:
            self.filtered_page = False
            log.info(
                "reading the whole page target=%s (%s gives no engines' samples)",
                self.config.target,
                FILTERED_PAGE_PATH.split("?")[0],
            )
        return snapshot

    def _read(self, page: Fetched) -> Snapshot:
        """A page read by its content type, vLLM's names under the configured prefix."""
        return read_snapshot(page.text, self.limits, page.content_type, self.config.metric_prefix)

    def _note_lateness(self, seconds: float) -> None:
        """A poll that answered after the interval is `slow`: vLLM is busy, not down. Its
        values are used and the target stays up; the counter shows how often it happens."""
        if seconds > self.config.interval_seconds:
            self.errors["slow"] += 1
        self.told.lateness(seconds, self.config.interval_seconds)

    def stop(self) -> None:
        """Cut the poll in flight (shutdown), so that stopping never waits for vLLM."""
        self._stopping = True
        self.fetcher.abort()

    def _fetch_version(self, seconds_left: float) -> str | None:
        """vLLM's version, or None (asked again at the next poll)."""
        try:
            version = json.loads(self.fetcher.get_text("/version", seconds_left)).get("version")
            return str(version)[:64] if version else None
        except (ScrapeError, ValueError, AttributeError):
            return None

    def _publish(
        self,
        up: bool | None,
        duration: float,
        snapshot: Snapshot | None,
        pools: Mapping[EngineKey, KvPool] | None = None,
    ) -> None:
        facts = self._facts()
        layout = self.layout()
        weights, other_model = self.models.served_weights(facts, layout)
        increases = self.history.increases() if up else {}
        steps_shape = _steps_per_api_server(snapshot, facts.api_servers if facts else None)
        if steps_shape is not None:
            increases = {key: d.unknown(ENGINE_STEPS) for key, d in increases.items()}
        state = PollState(
            up=up,
            window_seconds=self.config.window_seconds,
            scrape_duration_seconds=duration,
            errors=dict(self.errors),
            restarts=self.history.restarts,
            last_success_unix=self.last_success_unix,
            last_restart_unix=self.last_restart_unix,
            snapshot=snapshot,
            increases=increases,
            steps_per_api_server=steps_shape,
            weights=weights,
            weights_model=self.models.model.served if self.models.model else None,
            weights_of_another_model=other_model,
            # The latest start's load rate: the weights of the model that start loaded.
            start_weights=self.models.start_weights(facts, layout),
            peak_bandwidth=self.config.peak_bandwidth,
            kv_cache_memory_bytes=derive.kv_cache_memory_bytes(
                first_cache(snapshot), facts.kv_cache_memory_bytes if facts else None
            ),
            kv_cache_logged_tokens=facts.kv_cache_tokens if facts else None,
            cold_start=self.log_follower.cold_start if self.log_follower else None,
            first_requests=dict(self.first_requests.first),
            polled_at=self.polled_at,
            used_tokens_growth=self.used_tokens.growth() if up else {},
            pool_window=self.history.pool_window() if up else None,
            kv_pools=pools or {},
            vllm_version=self.vllm_version,
            build=this_build(),
            layout=layout,
            log_unrecognised=facts.unrecognised() if facts else {},
            target_shapes={SEVERAL_SERVERS: SEVERAL_SERVERS_SHOWN} if self.several_servers else {},
            kv_hybrid_in_log=facts.hybrid_kv if facts else False,
            kv_role_in_log=facts.kv_role if facts else None,
            kv_link_bandwidth=self.config.kv_link_bandwidth,
            gpu_hour_price=self.config.gpu_hour_price,
            running_readings=self.history.gauge_readings(RUNNING) if up else {},
            kv_usage_readings=self.history.gauge_readings(KV_USAGE) if up else {},
        )
        self.told.shapes(unrecognised_inputs(state))
        # One reference swap: a scrape sees the previous publication or this one, whole.
        self._published = [f for f in poll_families(state) if f.samples]
        self.state = state

    def run(self, stop: threading.Event) -> None:
        # A poll that overran the interval (vLLM busy) is followed by a whole interval
        # of rest, not by a burst of the missed polls.
        interval = self.config.interval_seconds
        for _ in ticks(interval, stop, after_overrun="a period later", clock=self.clock):
            try:
                self.poll_once()
            except Exception:  # a bug must not kill the sidecar; it shows as target_up 0
                log.exception("unexpected error while polling")
                self.errors["internal"] += 1
                self.up, self.failing = False, "internal: an unexpected error (see the log)"
                self._publish(up=False, duration=0.0, snapshot=None)


class _Published:
    """Adapter so prometheus_client encodes the poller's latest publication."""

    def __init__(self, poller: Poller) -> None:
        self._poller = poller
        self._cached: tuple[PollState, list[Metric]] | None = None

    def collect(self) -> Iterator[Metric]:
        yield from self._poller.published
        yield from self._findings()

    def _findings(self) -> list[Metric]:
        """The findings of the latest poll, built by the first scrape that asks (a scrape
        may run beside a poll: each reads one state, whole)."""
        state = self._poller.state
        if state is None:
            return []
        cached = self._cached
        if cached is not None and cached[0] is state:
            return cached[1]
        families = [f for f in finding_families(state) if f.samples]
        self._cached = (state, families)
        labels = [s.labels for f in families for s in f.samples]
        model = next((lab["model_name"] for lab in labels), "")
        found = [(lab["diagnosis"], lab["finding"], lab["severity"]) for lab in labels]
        self._poller.told.findings(model, found, up=state.up is True)
        return families

    def describe(self) -> list[Metric]:
        return []


def make_registry(poller: Poller) -> CollectorRegistry:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Published(poller))
    registry.register(ProcessCollector(registry=None))
    return registry


def make_server(
    poller: Poller, host: str, port: int, web: WebConfigSource | None = None
) -> MetricsServer:
    """The HTTP server of `/metrics`, `/healthz` and `/`, bound now (`server.py`)."""
    registry = make_registry(poller)
    if web is not None:
        registry.register(web)  # whether the last change of the web config loaded

    def route(path: str, headers: Mapping[str, str]) -> Answer:
        if path == "/metrics":
            return metrics_answer(registry, headers)
        if path == "/findings":
            return findings_answer(poller.state)
        if path == "/healthz":
            # Liveness of the sidecar only: vLLM being down must not restart us.
            return Answer(200, b"ok\n", "text/plain")
        if path == "/":
            page = landing_page(
                this_build(),
                poller.config.target,
                poller.up,
                poller.failing,
                poller.last_success_unix,
            )
            return Answer(200, page, "text/html; charset=utf-8")
        return Answer(404, b"not found\n", "text/plain")

    return MetricsServer(host, port, route, web, server_name=f"glassbox/{__version__}")


def serve(config: ExporterConfig, stop: threading.Event | None = None) -> None:
    """Run until `stop` is set (or forever): poller thread plus HTTP server."""
    stop = stop or threading.Event()
    web = WebConfigSource(config.web_config_file) if config.web_config_file else None
    poller = Poller(config)
    server = make_server(poller, config.listen_host, config.listen_port, web)
    poll_thread = threading.Thread(target=poller.run, args=(stop,), name="poller", daemon=True)
    serve_thread = threading.Thread(target=server.serve_forever, name="http", daemon=True)
    poll_thread.start()
    serve_thread.start()
    host = config.listen_host
    shown = f"[{host}]" if ":" in host else host
    port = server.server_address[1]
    scheme = "https" if web is not None and web.tls else "http"
    log.info("serving on %s://%s:%s/metrics target=%s", scheme, shown, port, config.target)
    try:
        stop.wait()
    finally:
        server.shutdown()
        server.server_close()
        poller.stop()
        poll_thread.join(timeout=5.0)
        poller.fetcher.close()
