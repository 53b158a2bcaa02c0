"""`glassbox explain` on bad input: each answered by a message naming what was asked and
what was found, a status of its own, and nothing on stdout (no half-written output)."""

from __future__ import annotations

import contextlib
import http.server
import json
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from vllm_glassbox.explain import cli
from vllm_glassbox.lab.backends.server_process import free_port

from tests.explain.run import Ran, explain
from tests.prometheus_replay import load, serve_recording


def _refused(ran: Ran, status: int, *words: str) -> None:
    assert ran.status == status, ran
    assert ran.out == ""
    for word in words:
        assert word in ran.err, ran.err


@contextlib.contextmanager
def answering(status: int, body: bytes, content_type: str = "text/plain") -> Iterator[str]:
    """A loopback server giving every request the same answer."""

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def test_prometheus_out_of_reach_is_status_3_naming_it() -> None:
    url = f"http://127.0.0.1:{free_port()}"
    _refused(explain(["--prometheus", url]), cli.EXIT_PROMETHEUS, url, "cannot reach")


def test_prometheus_answering_errors_is_status_3_with_its_error() -> None:
    with answering(
        400,
        json.dumps({"status": "error", "errorType": "bad_data", "error": "parse error"}).encode(),
        "application/json",
    ) as url:
        _refused(explain(["--prometheus", url]), cli.EXIT_PROMETHEUS, "bad_data", "parse error")


def test_something_that_is_not_prometheus_is_status_3() -> None:
    with answering(500, b"upstream gone\n") as url:
        _refused(explain(["--prometheus", url]), cli.EXIT_PROMETHEUS, "not Prometheus' JSON API")


def _replayed(name: str, *args: str) -> Ran:
    recording = load(name)
    with serve_recording(recording) as url:
        more = ["--at", repr(recording["at"]), "--since", f"{recording['since']:g}s"]
        if recording.get("namespace"):
            more += ["--namespace", recording["namespace"]]
        if recording.get("model"):
            more += ["--model", recording["model"]]
        return explain(["--prometheus", url, *more, *args])


def test_no_vllm_series_at_all_is_status_4() -> None:
    # The fleet's Prometheus, an hour before the fleet started.
    _refused(_replayed("fleet-before"), cli.EXIT_NOTHING, "no vLLM series", "180 s before")


def test_a_namespace_that_does_not_exist_is_status_5_listing_what_does() -> None:
    ran = _replayed("fleet-unknown")
    _refused(ran, cli.EXIT_NOT_FOUND, "namespace 'team-x' and model 'model-0'", "it has:")
    assert "model-0 in team-0" in ran.err and "model-3 in team-1" in ran.err


def test_an_exporter_out_of_reach_is_status_6() -> None:
    url = f"http://127.0.0.1:{free_port()}"
    _refused(explain(["--exporter", url]), cli.EXIT_EXPORTER, url)


def test_something_that_is_not_an_exporter_is_status_6() -> None:
    with answering(200, b"<html>hello</html>", "text/html") as url:
        _refused(explain(["--exporter", url]), cli.EXIT_EXPORTER, "not a glassbox exporter")


@pytest.mark.parametrize(
    ("content", "words"),
    [
        (None, ["cannot read"]),
        ("{not json", ["is not JSON"]),
        ('{"plan": "x"}', ["no phases[]"]),
        ('{"phases": [{"kind": "kv-pressure"}]}', ["neither a quantization phase"]),
    ],
)
def test_a_bad_lab_file_is_status_7(tmp_path: Path, content: str | None, words: list[str]) -> None:
    path = tmp_path / "results.json"
    if content is not None:
        path.write_text(content)
    url = f"http://127.0.0.1:{free_port()}"
    _refused(explain(["--prometheus", url, "--lab", str(path)]), cli.EXIT_LAB, *words)


@pytest.mark.parametrize(
    ("content", "words"),
    [
        (None, ["cannot be read"]),
        ("objectives: [{name: x, sli: ttft, target: 99%}]", ["objectives[0].threshold"]),
        ("objectives: [{name: x, sli: latency, target: 2}]", ["objectives[0].sli", "target"]),
    ],
)
def test_a_bad_slo_file_is_status_8_naming_each_problem(
    tmp_path: Path, content: str | None, words: list[str]
) -> None:
    path = tmp_path / "slo.yaml"
    if content is not None:
        path.write_text(content)
    url = f"http://127.0.0.1:{free_port()}"
    _refused(explain(["--prometheus", url, "--slo", str(path)]), cli.EXIT_SLO, str(path), *words)


@pytest.mark.parametrize(
    "args",
    [
        [],
        ["--prometheus", "http://a", "--exporter", "http://b"],
        ["--prometheus", "ftp://a"],
        ["--prometheus", "http://a", "--since", "soon"],
        ["--prometheus", "http://a", "--at", "tomorrow"],
        ["--exporter", "http://a", "--namespace", "x"],
        ["--exporter", "http://a", "--slo", "slo.yaml"],
        ["--prometheus", "http://a", "--format", "yaml"],
        ["--prometheus", "http://a", "--gpu-memory", "-1"],
    ],
)
def test_a_wrong_command_line_is_status_2(args: list[str]) -> None:
    ran = explain(args)
    assert (ran.status, ran.out) == (2, "")
    assert "usage:" in ran.err


def test_times_read_as_unix_seconds_or_iso_8601() -> None:
    assert cli.parse_time("1796185634.5") == 1796185634.5
    assert cli.parse_time("2026-12-01T10:00:00Z") == 1796119200.0
    assert cli.parse_time("2026-12-01T11:00:00+01:00") == 1796119200.0
    assert cli.parse_time("2026-12-01 10:00:00") == 1796119200.0
