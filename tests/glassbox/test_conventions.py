"""The exporter behaves as the exporters people know: content negotiation and gzip as
prometheus_client does them, over real HTTP on loopback; a landing page; build info with
the revision; logfmt that a logfmt parser reads (logfmtkv, go-logfmt's rules) and JSON;
`glassbox probe` checking its URLs; YAML errors naming their file; `--from -15m`; an
example in every `--help`."""

from __future__ import annotations

import contextlib
import gzip
import json
import logging
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import httpx
import logfmtkv
import pytest
from prometheus_client.openmetrics.parser import (
    text_string_to_metric_families as openmetrics_families,
)
from prometheus_client.parser import text_string_to_metric_families
from vllm_glassbox import __version__
from vllm_glassbox.cli import main as glassbox_main
from vllm_glassbox.core.build import REVISION_ENV, UNKNOWN, git_revision, revision, this_build
from vllm_glassbox.core.logs import JsonFormatter, LogfmtFormatter, set_up_logging
from vllm_glassbox.core.snapshot import WANTED_SAMPLES
from vllm_glassbox.dashboards.cli import join_relative_times
from vllm_glassbox.dashboards.cli import main as dashboards_main
from vllm_glassbox.exporter.service import ExporterConfig, Poller, make_server
from vllm_glassbox.lab.plan import PlanError, load_plan
from vllm_glassbox.probe import main as probe_main

from tests.k8s_double import wait_until
from tests.misbehaving import FakeVllm, Misbehaving

REPO = Path(__file__).resolve().parents[2]


@contextlib.contextmanager
def exporter(target: str) -> Iterator[tuple[str, Poller]]:
    """A real exporter on loopback (make_server + Poller.run, as `serve` wires them)."""
    poller = Poller(
        ExporterConfig(target=target, interval_seconds=0.2, window_seconds=2, timeout_seconds=2)
    )
    server = make_server(poller, "127.0.0.1", 0)
    stop = threading.Event()
    polling = threading.Thread(target=poller.run, args=(stop,), daemon=True)
    polling.start()
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", poller
    finally:
        stop.set()
        server.shutdown()
        server.server_close()
        poller.stop()
        polling.join(timeout=30)
        poller.fetcher.close()


def raw_get(url: str, headers: dict[str, str]) -> tuple[httpx.Response, bytes]:
    """GET with exactly these header fields, and the body as sent (not decoded)."""
    with (
        httpx.Client(timeout=10) as client,
        client.stream("GET", url, headers={"Accept-Encoding": "identity", **headers}) as r,
    ):
        return r, b"".join(r.iter_raw())


@pytest.fixture
def vllm() -> Iterator[Misbehaving]:
    with Misbehaving(FakeVllm()) as fake:
        yield fake


@pytest.fixture
def running(vllm: Misbehaving) -> Iterator[tuple[str, Poller]]:
    with exporter(vllm.url) as (url, poller):
        wait_until(lambda: bool(poller.up), 10)
        yield url, poller


# -- /metrics: format and compression --------------------------------------------------------


def test_metrics_is_the_classic_text_format_uncompressed_by_default(
    running: tuple[str, Poller],
) -> None:
    url, _ = running
    answer, body = raw_get(url + "/metrics", {})
    assert answer.headers["Content-Type"] == "text/plain; version=0.0.4; charset=utf-8"
    assert "Content-Encoding" not in answer.headers
    names = {f.name for f in text_string_to_metric_families(body.decode())}
    assert {"glassbox_target_up", "glassbox_vllm_info"} <= names


def test_metrics_answers_openmetrics_when_asked_and_both_formats_carry_the_same_series(
    running: tuple[str, Poller],
) -> None:
    url, _ = running
    # Once the window holds two polls, every series the fake vLLM feeds is there.
    wait_until(lambda: "glassbox_tokens_per_engine_step{" in httpx.get(url + "/metrics").text)
    answer, body = raw_get(url + "/metrics", {"Accept": "application/openmetrics-text"})
    assert answer.headers["Content-Type"].startswith(
        "application/openmetrics-text; version=1.0.0; charset=utf-8"
    )
    text = body.decode()
    assert text.endswith("# EOF\n")
    families = {f.name: f for f in openmetrics_families(text)}  # strict: raises if invalid
    assert families["glassbox_target_up"].samples[0].value == 1.0
    # The counter family is named without _total in OpenMetrics, its sample with it.
    errors = families["glassbox_scrape_errors"]
    assert errors.type == "counter"
    assert {s.name for s in errors.samples} >= {"glassbox_scrape_errors_total"}
    _, classic = raw_get(url + "/metrics", {})
    classic_names = {
        s.name
        for f in text_string_to_metric_families(classic.decode())
        for s in f.samples
        if not s.name.endswith("_created")
    }
    om_names = {s.name for f in families.values() for s in f.samples}
    assert classic_names - om_names == set()


@pytest.mark.parametrize("accept_encoding", ["gzip", "gzip, deflate", "deflate;q=1, GZIP;q=0.5"])
def test_metrics_is_gzipped_when_the_client_accepts_gzip(
    running: tuple[str, Poller], accept_encoding: str
) -> None:
    url, _ = running
    answer, body = raw_get(url + "/metrics", {"Accept-Encoding": accept_encoding})
    assert answer.headers["Content-Encoding"] == "gzip"
    assert answer.headers["Vary"] == "Accept-Encoding"
    assert int(answer.headers["Content-Length"]) == len(body)
    page = gzip.decompress(body).decode()
    assert "glassbox_target_up 1.0" in page
    assert len(body) < len(page) / 3  # exposition text compresses well


def test_metrics_stays_uncompressed_for_a_client_that_does_not_accept_gzip(
    running: tuple[str, Poller],
) -> None:
    url, _ = running
    answer, body = raw_get(url + "/metrics", {"Accept-Encoding": "deflate, br"})
    assert "Content-Encoding" not in answer.headers
    assert b"glassbox_target_up 1.0" in body


def test_a_head_request_gets_the_negotiated_headers_without_a_body(
    running: tuple[str, Poller],
) -> None:
    url, _ = running
    with httpx.Client(timeout=10) as client:
        answer = client.head(url + "/metrics", headers={"Accept-Encoding": "gzip"})
    assert answer.headers["Content-Encoding"] == "gzip" and answer.content == b""


# -- the landing page and build info ---------------------------------------------------------


def test_the_landing_page_says_version_target_and_whether_the_last_poll_worked(
    vllm: Misbehaving,
) -> None:
    with exporter(vllm.url) as (url, poller):
        wait_until(lambda: bool(poller.up), 10)
        page = httpx.get(url + "/", timeout=10)
        assert page.headers["Content-Type"] == "text/html; charset=utf-8"
        assert f"<td>{__version__}</td>" in page.text
        assert f"<td>{vllm.url}</td>" in page.text
        assert "the last poll worked (last success 20" in page.text
        assert '<a href="/metrics">' in page.text and '<a href="/healthz">' in page.text
        vllm.refuse()
        wait_until(lambda: poller.up is False, 10)
        page = httpx.get(url + "/", timeout=10)
        # The filtered page's path, its query elided.
        wanted = len(WANTED_SAMPLES)
        assert f"the last poll failed: connect: /metrics/?… ({wanted} parameters): " in page.text


def test_the_landing_page_before_any_poll_and_escapes_the_target() -> None:
    target = "http://127.0.0.1:1/<b>"
    poller = Poller(ExporterConfig(target=target))
    server = make_server(poller, "127.0.0.1", 0)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        page = httpx.get(f"http://127.0.0.1:{server.server_address[1]}/", timeout=10).text
    finally:
        server.shutdown()
        server.server_close()
        poller.fetcher.close()
    assert "not polled yet (no successful poll yet)" in page
    assert "http://127.0.0.1:1/&lt;b&gt;" in page and "<b>" not in page


def test_build_info_carries_version_revision_and_python(running: tuple[str, Poller]) -> None:
    url, _ = running
    page = httpx.get(url + "/metrics", timeout=10).text
    (info,) = [
        s for f in text_string_to_metric_families(page) for s in f.samples
        if s.name == "glassbox_build_info"
    ]  # fmt: skip
    build = this_build()
    assert info.labels == {
        "version": __version__,
        "revision": build.revision,
        "python_version": f"{sys.version_info[0]}.{sys.version_info[1]}.{sys.version_info[2]}",
    }


def test_the_revision_comes_from_the_environment_then_the_checkout_else_unknown(
    tmp_path: Path,
) -> None:
    assert revision({REVISION_ENV: " 0123abc \n"}, tmp_path) == "0123abc"
    assert revision({}, tmp_path) == UNKNOWN  # a wheel outside any checkout
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    assert git_revision(tmp_path) is None  # a checkout without a commit yet
    subprocess.run(
        ["git", "-C", str(tmp_path), "-c", "user.name=t", "-c", "user.email=t@t",
         "commit", "-q", "--allow-empty", "-m", "x"],
        check=True,
    )  # fmt: skip
    head = subprocess.run(
        ["git", "-C", str(tmp_path), "rev-parse", "HEAD"], capture_output=True, text=True
    ).stdout.strip()
    assert len(head) == 40
    assert revision({}, tmp_path) == head
    assert revision({REVISION_ENV: "from-the-image"}, tmp_path) == "from-the-image"


# -- logs --------------------------------------------------------------------------------


def _record(msg: str, *args: object, exc: bool = False) -> logging.LogRecord:
    exc_info = None
    if exc:
        try:
            raise ValueError('bad "value"\non two lines')
        except ValueError:
            exc_info = sys.exc_info()
    return logging.LogRecord("glassbox.exporter", logging.ERROR, __file__, 1, msg, args, exc_info)


TRICKY = [
    "plain",
    "two words",
    'with "quotes" and a \\ backslash',
    "key=value inside",
    "line one\nline two\ttabbed",
    "",
    "ünïcödé ✓",
    "bell \x07 and null \x00",
]


@pytest.mark.parametrize("message", TRICKY)
def test_logfmt_lines_parse_strictly_as_go_logfmt_with_the_message_intact(message: str) -> None:
    line = LogfmtFormatter().format(_record("%s", message))
    assert "\n" not in line
    fields = logfmtkv.parse(line, strict=True, duplicates="error")
    assert list(fields) == ["ts", "level", "logger", "msg"]
    assert fields["msg"] == message and fields["level"] == "error"
    assert fields["logger"] == "glassbox.exporter"
    assert str(fields["ts"]).endswith("Z") and "T" in str(fields["ts"])


def test_a_logged_exception_is_one_logfmt_field_and_one_json_key() -> None:
    record = _record("poll failed target=%s", "http://x:8000", exc=True)
    fields = logfmtkv.parse(LogfmtFormatter().format(record), strict=True)
    assert fields["msg"] == "poll failed target=http://x:8000"
    assert str(fields["exc"]).startswith("Traceback") and 'ValueError: bad "value"' in str(
        fields["exc"]
    )
    data = json.loads(JsonFormatter().format(record))
    assert data["msg"] == fields["msg"] and data["exc"] == fields["exc"]


@pytest.mark.parametrize("message", TRICKY)
def test_json_lines_are_one_object_each_with_the_message_intact(message: str) -> None:
    line = JsonFormatter().format(_record("%s", message))
    assert "\n" not in line
    assert json.loads(line)["msg"] == message


def test_the_exporter_logs_in_the_format_its_flag_chooses() -> None:
    """The real command: its first lines (serving, then a poll of a closed port failing)."""
    for log_format in ("logfmt", "json"):
        proc = subprocess.Popen(
            [sys.executable, "-m", "vllm_glassbox", "exporter", "--target", "http://127.0.0.1:1",
             "--listen", "127.0.0.1:0", "--interval", "0.2s", "--window", "1s",
             "--log-format", log_format],
            stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        assert proc.stderr is not None
        try:
            lines = [proc.stderr.readline(), proc.stderr.readline()]
        finally:
            proc.terminate()
            proc.wait(timeout=30)
            proc.stderr.close()
        parse = json.loads if log_format == "json" else lambda x: logfmtkv.parse(x, strict=True)
        # The poller starts first: its failure and the serving line come in either order.
        serving, failed = sorted((parse(line.rstrip("\n")) for line in lines),
                                 key=lambda f: f["level"] != "info")  # fmt: skip
        assert serving["level"] == "info" and serving["msg"].startswith("serving on http://")
        assert failed["level"] == "error" and "poll failed" in failed["msg"]
        assert "reason=connect" in failed["msg"]


def test_set_up_logging_replaces_the_handler_rather_than_adding_one() -> None:
    root = logging.getLogger()
    before = list(root.handlers)
    try:
        set_up_logging("info", "json")
        set_up_logging("info", "logfmt")
        (handler,) = root.handlers
        assert isinstance(handler.formatter, LogfmtFormatter)
    finally:
        root.handlers[:] = before


# -- the other commands ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--exporter", "localhost:9400"], "--exporter: 'localhost:9400' is not an http(s) URL"),
        (["--vllm", "ftp://x"], "--vllm: 'ftp://x' is not an http(s) URL"),
        (["--exporter", "http://"], "--exporter: 'http://' is not an http(s) URL"),
        (["--exporter", "http://u:hunter2@x:9400"], "--exporter: no credentials in the URL"),
        (["--exporter", "http://x:port"], "--exporter: 'http://x:port' is not an http(s) URL"),
        (["--exporter", "http://x:9400", "--timeout", "0"], "--timeout: must be a positive"),
    ],
)
def test_probe_checks_its_urls_as_the_exporter_does(
    capsys: pytest.CaptureFixture[str], argv: list[str], message: str
) -> None:
    with pytest.raises(SystemExit) as done:
        probe_main(argv)
    assert done.value.code == 2
    err = capsys.readouterr().err
    assert message in err and "hunter2" not in err


def test_probe_and_exporter_refuse_the_same_urls(capsys: pytest.CaptureFixture[str]) -> None:
    from vllm_glassbox.exporter.cli import main as exporter_main

    for url in ("localhost:8000", "http://", "file:///x"):
        assert exporter_main(["--target", url]) == 2
        exporter_err = capsys.readouterr().err
        with pytest.raises(SystemExit):
            probe_main(["--vllm", url])
        probe_err = capsys.readouterr().err
        assert f"{url!r} is not an http(s) URL" in exporter_err
        assert f"{url!r} is not an http(s) URL" in probe_err


def test_a_plan_with_broken_yaml_is_named_in_the_message(tmp_path: Path) -> None:
    path = tmp_path / "my-plan.yaml"
    path.write_text("name: x\nphases:\n  - kind: quantization\n   bad: indent\n")
    with pytest.raises(PlanError) as e:
        load_plan(path)
    text = str(e.value)
    assert f'in "{path}", line 4' in text and "<unicode string>" not in text


def test_dashboards_snapshot_takes_from_minus_15m_as_its_help_shows(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert join_relative_times(["--from", "-15m", "--to", "-1m", "--out", "x"]) == [
        "--from=-15m", "--to=-1m", "--out", "x",
    ]  # fmt: skip
    assert join_relative_times(["--from", "now"]) == ["--from", "now"]
    # Parsed and run: a Prometheus that is not there is the only problem left.
    code = dashboards_main(
        ["snapshot", "--prometheus", "http://127.0.0.1:1", "--out", "shots", "--from", "-15m"]
    )
    err = capsys.readouterr().err
    assert code == 2 and "expected one argument" not in err and "error:" in err


HELPS = [
    [],
    ["exporter"],
    ["probe"],
    ["lab"],
    ["lab", "run"],
    ["lab", "check"],
    ["lab", "restore"],
    ["demo"],
    ["dashboards"],
    ["dashboards", "generate"],
    ["dashboards", "snapshot"],
]


@pytest.mark.parametrize("command", HELPS, ids=lambda c: " ".join(c) or "glassbox")
def test_every_help_ends_with_an_example_of_its_own_command(
    command: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as done:
        glassbox_main([*command, "--help"])
    assert done.value.code == 0
    out = capsys.readouterr().out
    _, _, examples = out.partition("\nexamples:\n")
    lines = examples.splitlines()
    assert lines and all(line.startswith("  glassbox ") for line in lines)
    assert any(line.startswith("  " + " ".join(["glassbox", *command])) for line in lines)
    # The help's prose is still wrapped to the terminal.
    assert all(len(line) <= 100 for line in out.partition("\nexamples:\n")[0].splitlines())
