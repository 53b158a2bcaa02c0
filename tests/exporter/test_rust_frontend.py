"""The exporter beside vLLM's Rust front end: the captured answers served again over real
HTTP on loopback (each page byte for byte with its captured headers, the filtered path's
404, `/version`), and pages whose OpenMetrics framing lies.

The Rust front end answers OpenMetrics whatever is asked; the exporter reads it by its
content type, falls back from the filtered path to the whole page, publishes the derived
series by hand from the captured counters, and flags the pool it cannot read.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families
from vllm_glassbox.core.snapshot import EngineKey, read_snapshot
from vllm_glassbox.exporter.service import ExporterConfig, Poller, make_registry

from tests.fixtures import METRICS, headers, page
from tests.fixtures import log as fixture_log
from tests.misbehaving import Behaviour, Misbehaving

DIR = "rust-frontend-0.32"
Scrape = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def _answer(h: Any, status: int, body: bytes, answer_headers: dict[str, str]) -> None:
    h.send_response(status)
    for name, value in answer_headers.items():
        if name != "content-length":
            h.send_header(name, value)
    h.send_header("Content-Length", str(len(body)))
    h.send_header("Connection", "close")
    h.end_headers()
    h.wfile.write(body)


def _rust_front_end(metrics: str, text: str | None = None) -> Behaviour:
    """The captured Rust front end: `metrics` (a captured page's name) at /metrics with its
    headers, or `text` in its place with the same headers; 404 at the filtered path."""
    version = (METRICS / DIR / "version.json").read_bytes()

    def run(h: Any) -> None:
        if h.path.startswith("/version"):
            _answer(h, 200, version, {"content-type": "application/json"})
        elif h.path.startswith("/metrics/"):
            _answer(h, 404, b"", {})
        else:
            body = (page(metrics) if text is None else text).encode()
            _answer(h, 200, body, headers(metrics))

    return run


@pytest.fixture
def target() -> Iterator[Misbehaving]:
    with Misbehaving() as t:
        yield t


def _scrape(poller: Poller) -> Scrape:
    text = generate_latest(make_registry(poller)).decode()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def _value(scrape: Scrape, name: str, **labels: str) -> float | None:
    return scrape.get((name, tuple(sorted(labels.items()))))


TINY = {"model_name": "tiny", "engine": "0"}


@pytest.mark.slow
def test_the_exporter_reads_the_rust_front_end_and_publishes_tpot_by_hand(
    target: Misbehaving,
) -> None:
    first, later = f"{DIR}/plain-after-1x64.txt", f"{DIR}/plain-after-3x64.txt"
    a, b = (read_snapshot(page(p)).engines[EngineKey("tiny", "0")].counters for p in (first, later))
    # By hand from the two captured pages: two requests of 64 tokens between them.
    assert b["generation_tokens"] - a["generation_tokens"] == 128.0
    tpot = (b["itl_sum"] - a["itl_sum"]) / (128.0 - (b["ttft_count"] - a["ttft_count"]))
    poller = Poller(ExporterConfig(target=target.url, timeout_seconds=30.0))
    try:
        for name in (first, later):
            target.behave(_rust_front_end(name))
            assert poller.poll_once()
        scrape = _scrape(poller)
    finally:
        poller.fetcher.close()
    assert poller.filtered_page is False  # its 404: the whole page from then on
    assert _value(scrape, "glassbox_target_up") == 1.0
    assert _value(scrape, "glassbox_time_per_output_token_seconds", **TINY) == pytest.approx(tpot)
    assert _value(scrape, "glassbox_tokens_per_forward_pass", **TINY) == pytest.approx(1.0)
    assert _value(scrape, "glassbox_vllm_info", version="0.32.0") == 1.0
    # No cache config on its page and none in a log: the pool is flagged, not guessed.
    flag = {"source": "page", "shape": "no_cache_config_info"}
    assert _value(scrape, "glassbox_input_unrecognised", **flag) == 1.0
    assert _value(scrape, "glassbox_kv_cache_capacity_tokens", **TINY) is None
    errors = [v for (n, _), v in scrape.items() if n == "glassbox_scrape_errors_total"]
    assert set(errors) == {0.0}


@pytest.mark.slow
def test_with_its_log_the_rust_front_ends_pool_is_the_logs(
    target: Misbehaving, tmp_path: Path
) -> None:
    log = tmp_path / "vllm.log"
    log.write_text(fixture_log("rust-frontend-0.32-plain-startup.log"))
    config = ExporterConfig(target=target.url, timeout_seconds=30.0, vllm_log=str(log))
    poller = Poller(config)
    try:
        target.behave(_rust_front_end(f"{DIR}/plain-after-3x64.txt"))
        assert poller.poll_once()
        scrape = _scrape(poller)
    finally:
        poller.fetcher.close()
    assert _value(scrape, "glassbox_kv_cache_capacity_tokens", **TINY) == 16384.0
    flag = {"source": "page", "shape": "no_cache_config_info"}
    assert _value(scrape, "glassbox_input_unrecognised", **flag) is None


def _lying(whole: str) -> dict[str, tuple[str, str]]:
    """Pages of the Rust front end whose framing lies, by what is wrong, with the reason
    the poll must fail with."""
    return {
        "no EOF": (whole[: whole.rindex("# EOF")], "truncated"),
        "EOF mid-page": (whole + whole, "parse"),
    }


@pytest.mark.slow
@pytest.mark.parametrize("lie", ["no EOF", "EOF mid-page"])
def test_an_openmetrics_page_whose_framing_lies_fails_the_poll_and_publishes_nothing_of_it(
    target: Misbehaving, lie: str
) -> None:
    name = f"{DIR}/plain-after-3x64.txt"
    text, reason = _lying(page(name))[lie]
    poller = Poller(ExporterConfig(target=target.url, timeout_seconds=30.0))
    try:
        target.behave(_rust_front_end(name))
        assert poller.poll_once()
        target.behave(_rust_front_end(name, text))
        assert not poller.poll_once()
        scrape = _scrape(poller)
    finally:
        poller.fetcher.close()
    assert poller.failing is not None and poller.failing.startswith(f"{reason}: ")
    assert _value(scrape, "glassbox_target_up") == 0.0
    assert _value(scrape, "glassbox_scrape_errors_total", reason=reason) == 1.0
    assert not any("engine" in dict(labels) for _, labels in scrape), "series of a refused page"
    assert json.loads((METRICS / DIR / "version.json").read_text())["rust_frontend_version"]
