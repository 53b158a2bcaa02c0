"""Prometheus' answers, recorded from a real Prometheus and served again.

`RecordingPrometheus` is the real client (`vllm_glassbox.core.prometheus.Prometheus`) that
keeps every instant query it made and what the real Prometheus answered;
`tests/capture_prometheus.py` saves them as a recording (tests/fixtures/prometheus/).
`serve_recording` answers those same queries over loopback HTTP, as Prometheus' API does,
so that `glassbox explain` runs unchanged on captured data. It is the narrowest double:
a query that was not recorded (a changed query, another time) is answered with
Prometheus' own error shape, so the test fails loudly rather than reading nothing; only
a query of series the recorded stacks never had (`NEWER_THAN_RECORDINGS`) reads "no
series".
"""

from __future__ import annotations

import contextlib
import http.server
import json
import threading
import urllib.parse
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from vllm_glassbox.core.prometheus import Prometheus

RECORDINGS = Path(__file__).resolve().parent / "fixtures" / "prometheus"


def _key(expr: str, at: float | None) -> str:
    return f"{at!r} {expr}"


class RecordingPrometheus(Prometheus):
    """The real client, keeping each instant query and its answer."""

    def __init__(self, url: str, timeout_seconds: float = 30.0) -> None:
        super().__init__(url, timeout_seconds)
        self.answers: dict[str, dict[str, Any]] = {}
        self._lock = threading.Lock()

    def query(self, expr: str, at: float | None = None) -> list[dict[str, Any]]:
        result = super().query(expr, at)
        with self._lock:
            self.answers[_key(expr, at)] = {"query": expr, "time": at, "result": result}
        return result


def save(path: Path, about: dict[str, Any], prometheus: RecordingPrometheus) -> None:
    body = {**about, "answers": sorted(prometheus.answers.values(), key=lambda a: a["query"])}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(body, indent=1, sort_keys=True) + "\n")


def load(name: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((RECORDINGS / f"{name}.json").read_text())
    return data


#: Series the recorded stacks had none of (a CPU stack: no dcgm-exporter; no
#: --gpu-hour-price), read by queries newer than the recordings: a query of one of them
#: that was not recorded is answered "no series", so the recordings need no new capture.
#: Any other unrecorded query still fails loudly.
NEWER_THAN_RECORDINGS = ("DCGM_FI_", "glassbox_engine_hourly_cost", "glassbox_gpu_hour_price")


def _newer_than_recordings(expr: str) -> bool:
    return any(name in expr for name in NEWER_THAN_RECORDINGS)


class _Server(http.server.ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 64  # explain asks its queries side by side: none may wait a SYN retry


@contextlib.contextmanager
def serve_recording(recording: dict[str, Any]) -> Iterator[str]:
    """Prometheus' query API on 127.0.0.1 answering the recorded queries; its base URL."""
    answers = {_key(a["query"], a["time"]): a["result"] for a in recording["answers"]}

    class Handler(http.server.BaseHTTPRequestHandler):
        disable_nagle_algorithm = True  # headers and body are two writes: no 40 ms wait

        def do_GET(self) -> None:
            url = urllib.parse.urlsplit(self.path)
            params = dict(urllib.parse.parse_qsl(url.query))
            if url.path == "/-/ready":
                self._send(200, {"status": "success"})
                return
            if url.path != "/api/v1/query":
                self._send(404, {"status": "error", "errorType": "not_found", "error": url.path})
                return
            at = float(params["time"]) if "time" in params else None
            key = _key(params.get("query", ""), at)
            if key not in answers and _newer_than_recordings(params.get("query", "")):
                # A query of series the recorded stacks never had (no dcgm-exporter, no
                # price) and that came after them: "no series", as Prometheus would answer.
                self._send(
                    200, {"status": "success", "data": {"resultType": "vector", "result": []}}
                )
                return
            if key not in answers:
                self._send(
                    400,
                    {
                        "status": "error",
                        "errorType": "bad_data",
                        "error": f"not recorded: {key}",
                    },
                )
                return
            self._send(
                200, {"status": "success", "data": {"resultType": "vector", "result": answers[key]}}
            )

        def _send(self, status: int, body: dict[str, Any]) -> None:
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, format: str, *args: object) -> None:
            pass

    server = _Server(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
