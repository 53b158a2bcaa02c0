"""`glassbox exporter` beside each server the lab starts: the sidecar's live view of the
same workload the lab measures, for the report (and for a Prometheus, in the demo).

It runs in the lab's process (`exporter/service.py`), on one fixed port across
restarts, pointed at the server's log and checkpoint and given the run's peak memory
bandwidth. It starts when the server is ready and waits for its first poll of the idle
server; at the end of the segment the runner asks for its page as of a poll begun after
the workload ended (`page_since`, `ExporterPage.polled_since`), and is told when the
deadline passed before one came (the page is then stale); the exporter stops when the
segment ends.

Its window is as long as a segment can be, so that at the end of a segment its windowed
series cover exactly the requests of that segment — the span of the lab's own numbers
(`analysis.segment_values`): the two must agree. (A production sidecar uses the default
60 s window; the rate series here read as averages over the segment.)
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence

from vllm_glassbox.core.errors import ScrapeError
from vllm_glassbox.core.fetch import TargetCredentials
from vllm_glassbox.core.own_page import ExporterPage, read_exporter_page
from vllm_glassbox.exporter.service import ExporterConfig, serve
from vllm_glassbox.lab.backends.backend import Deployed
from vllm_glassbox.lab.compared import KEPT
from vllm_glassbox.lab.experiments.pool_forecasts import FORECAST_WINDOW_SECONDS
from vllm_glassbox.lab.telemetry import Observer, Segment

LOOPBACK = "127.0.0.1"
INTERVAL_SECONDS = 2.0  # as often as the lab's own timeline: vLLM's API server is shared
# As the exporter's default: a saturated API server stalls /metrics for seconds, and a
# late page (stamped when it came) is better than none (benchmarks/bench_saturation.py:
# deadlines of 1.5 s and 3 s lost 5 % of the polls where 10 s read them all).
POLL_TIMEOUT_SECONDS = 10.0
WINDOW_SECONDS = 3600.0

#: How long the end of a segment waits for a poll begun after it: one that may take the
#: whole poll timeout, and the period before it.
END_DEADLINE_SECONDS = POLL_TIMEOUT_SECONDS + 2 * INTERVAL_SECONDS


class ExporterBeside(Observer):
    def __init__(
        self,
        port: int,
        peak_bandwidth: float | None = None,
        window_seconds: float = WINDOW_SECONDS,
        bearer_token_file: str | None = None,
    ) -> None:
        self.port = port
        # A vLLM started with --api-key: the exporter's --target-bearer-token-file.
        self.bearer_token_file = bearer_token_file
        self.peak_bandwidth = peak_bandwidth
        self.window_seconds = window_seconds
        self._stop: threading.Event | None = None
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        return f"http://{LOOPBACK}:{self.port}"

    def server_ready(self, segment: Segment, deployed: Deployed) -> None:
        self.close()
        config = ExporterConfig(
            target=deployed.url,
            listen_host=LOOPBACK,
            listen_port=self.port,
            interval_seconds=INTERVAL_SECONDS,
            window_seconds=self.window_seconds,
            # The pool's growth of the moment, for its forecast: not the segment's.
            forecast_window_seconds=FORECAST_WINDOW_SECONDS,
            # A loaded server may take over a second to answer /metrics; a late poll is
            # better than a failed one (the next is skipped, not doubled).
            timeout_seconds=POLL_TIMEOUT_SECONDS,
            model_dir=deployed.model_dir,
            vllm_log=deployed.log_path,
            peak_bandwidth=self.peak_bandwidth,
            target_credentials=TargetCredentials(bearer_token_file=self.bearer_token_file),
        )
        self._stop = threading.Event()
        self._thread = threading.Thread(
            target=serve, args=(config, self._stop), name="exporter", daemon=True
        )
        self._thread.start()
        # Let it see the idle server first, so its window holds the whole workload.
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline and not self.page().target_up:
            time.sleep(0.2)

    def page_since(self, unix_time: float) -> tuple[ExporterPage, bool]:
        """Its page as of a poll that succeeded and began after `unix_time`, and whether it
        was (the last page read when END_DEADLINE_SECONDS passed first: stale)."""
        page = ExporterPage({})
        deadline = time.monotonic() + END_DEADLINE_SECONDS
        while self._thread is not None and time.monotonic() < deadline:
            page = self.page()
            if page.polled_since(unix_time):
                return page, True
            time.sleep(0.2)
        return page, False

    def segment_ended(self, segment: Segment, ended_at: float, error: str | None) -> None:
        self.close()

    def read(self, names: Sequence[str] = KEPT) -> dict[str, float]:
        """The exporter's derived series now, summed over engines (one engine here)."""
        return self.page().totals(names)

    def page(self) -> ExporterPage:
        """The exporter's page now; an empty one when it cannot be read."""
        try:
            return read_exporter_page(self.url, timeout_seconds=5.0)
        except ScrapeError:
            return ExporterPage({})

    def close(self) -> None:
        if self._stop is not None and self._thread is not None:
            self._stop.set()
            self._thread.join(timeout=10)
        self._stop = self._thread = None
