"""What the lab tells the monitoring while it runs: which phase is on.

- `glassbox_lab_phase_info{phase, kind, variant} 1` on an HTTP /metrics endpoint
  (`--metrics-listen`), so dashboards can shade the phases from Prometheus alone;
- a Grafana region annotation per segment (one server start and its workload), posted
  to Grafana's HTTP API (`POST /api/annotations`) when a URL and a token are configured.

Both are observers of the run: they see a segment start, its server become ready, and
the segment end. Neither may stop the lab: a failure is a warning.
"""

from __future__ import annotations

import logging
import sys
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from http.server import ThreadingHTTPServer

import httpx
from prometheus_client import CollectorRegistry
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.exposition import MetricsHandler
from vllm_glassbox.lab.backends.backend import Deployed

log = logging.getLogger("glassbox.lab")


@dataclass(frozen=True)
class Segment:
    """One server start and the workload run against it."""

    phase: str
    kind: str
    variant: str  # the quantization variant, or "" for the other kinds
    started_at: float  # unix seconds

    @property
    def title(self) -> str:
        return self.phase + (f" › {self.variant}" if self.variant else "")


class Observer:
    """Hooks of a run; the default does nothing."""

    def segment_started(self, segment: Segment) -> None:
        pass

    def server_ready(self, segment: Segment, deployed: Deployed) -> None:
        pass

    def segment_ended(self, segment: Segment, ended_at: float, error: str | None) -> None:
        pass


class PhaseInfo(Observer):
    """`glassbox_lab_phase_info{phase, kind, variant} 1` while a segment runs."""

    def __init__(self) -> None:
        self._current: Segment | None = None
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(self)

    def segment_started(self, segment: Segment) -> None:
        self._current = segment

    def segment_ended(self, segment: Segment, ended_at: float, error: str | None) -> None:
        self._current = None

    def collect(self) -> Iterator[Metric]:
        info = GaugeMetricFamily(
            "glassbox_lab_phase_info",
            "The lab's phase running now (absent between phases).",
            labels=["phase", "kind", "variant"],
        )
        current = self._current
        if current is not None:
            info.add_metric([current.phase, current.kind, current.variant], 1)
        yield info

    def describe(self) -> list[Metric]:
        return []

    def serve(self, host: str, port: int) -> ThreadingHTTPServer:
        server = _QuietServer((host, port), MetricsHandler.factory(self.registry))
        server.daemon_threads = True
        threading.Thread(target=server.serve_forever, name="lab-metrics", daemon=True).start()
        return server


class _QuietServer(ThreadingHTTPServer):
    """A scraper that gave up (Prometheus' scrape timeout on a loaded machine) is not an
    error of ours: no traceback on stderr for it."""

    def handle_error(self, request: object, client_address: object) -> None:
        if not isinstance(sys.exc_info()[1], BrokenPipeError | ConnectionResetError):
            super().handle_error(request, client_address)  # type: ignore[arg-type]


class GrafanaAnnotations(Observer):
    """A region annotation per segment, tagged `glassbox-lab`, the kind and the phase.

    No Grafana can run where glassbox is tested; the one endpoint used is tested against
    a loopback double of `POST /api/annotations`.
    """

    def __init__(
        self,
        url: str,
        token: str,
        dashboard_uid: str | None = None,
        post: Callable[..., httpx.Response] | None = None,
    ) -> None:
        self.url = url.rstrip("/")
        self.token = token
        self.dashboard_uid = dashboard_uid
        self._post = post or httpx.post
        self.posted = 0
        self.failed = 0

    def body(self, segment: Segment, ended_at: float, error: str | None) -> dict[str, object]:
        tags = ["glassbox-lab", segment.kind, segment.phase]
        if segment.variant:
            tags.append(segment.variant)
        text = f"glassbox lab: {segment.title}"
        if error:
            text += f" (failed: {error[:200]})"
        body: dict[str, object] = {
            "time": int(segment.started_at * 1000),
            "timeEnd": int(ended_at * 1000),
            "tags": tags,
            "text": text,
        }
        if self.dashboard_uid:
            body["dashboardUID"] = self.dashboard_uid
        return body

    def segment_ended(self, segment: Segment, ended_at: float, error: str | None) -> None:
        try:
            r = self._post(
                self.url + "/api/annotations",
                json=self.body(segment, ended_at, error),
                headers={"Authorization": f"Bearer {self.token}"},
                timeout=5.0,
            )
        except httpx.HTTPError as e:
            self._failed(f"{type(e).__name__}: {e}")
            return
        if r.status_code >= 300:
            self._failed(f"HTTP {r.status_code}: {r.text[:200]}")
        else:
            self.posted += 1

    def _failed(self, reason: str) -> None:
        self.failed += 1
        log.warning("grafana annotation not posted url=%s err=%s", self.url, reason)
