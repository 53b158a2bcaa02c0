"""vLLM behind the launchers of 2026, each over real HTTP on loopback: a Dynamo worker's
page (vLLM's families beside Dynamo's, no /version, no filtered path), a Ray Serve node's
(`ray_vllm_` names, a replica label), and llm-d's routing sidecar (a proxy that answers
/health itself). The pages are built from the real captured vLLM page by what each
launcher's source does to it (tests/fixtures/launchers/README.md); every number is
checked against the captured page's own counters."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families
from vllm_glassbox.core.errors import ScrapeError
from vllm_glassbox.core.snapshot import EngineKey, read_snapshot
from vllm_glassbox.exporter.service import ExporterConfig, Poller, make_registry

from tests.fixtures import page
from tests.fixtures.launchers import dynamo_worker_page, ray_node_page
from tests.misbehaving import Behaviour, Misbehaving

FIRST, LATER = "cpu-0.32/plain-after-1x64.txt", "cpu-0.32/plain-after-3x64.txt"
TINY = EngineKey("tiny", "0")
Scrape = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def _tpot_by_hand() -> float:
    a, b = (read_snapshot(page(p)).engines[TINY].counters for p in (FIRST, LATER))
    decode = (b["generation_tokens"] - a["generation_tokens"]) - (b["ttft_count"] - a["ttft_count"])
    return (b["itl_sum"] - a["itl_sum"]) / decode


def _answer(h: Any, status: int, body: bytes, content_type: str) -> None:
    h.send_response(status)
    h.send_header("Content-Type", content_type)
    h.send_header("Content-Length", str(len(body)))
    h.send_header("Connection", "close")
    h.end_headers()
    h.wfile.write(body)


def _scrape(poller: Poller) -> Scrape:
    text = generate_latest(make_registry(poller)).decode()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def _value(scrape: Scrape, name: str, **labels: str) -> float | None:
    return scrape.get((name, tuple(sorted(labels.items()))))


def _polled(target: Misbehaving, pages: list[Behaviour], **config: Any) -> tuple[Poller, Scrape]:
    poller = Poller(ExporterConfig(target=target.url, timeout_seconds=30.0, **config))
    try:
        for behaviour in pages:
            target.behave(behaviour)
            assert poller.poll_once(), poller.failing
        return poller, _scrape(poller)
    finally:
        poller.fetcher.close()


@pytest.fixture
def target() -> Iterator[Misbehaving]:
    with Misbehaving() as t:
        yield t


# --- Dynamo: vLLM's families beside Dynamo's, on the worker's system port ----------------


def _dynamo(vllm_page: str) -> Behaviour:
    """Dynamo's system status server: /metrics as a plain String, every other path its
    fallback's 404."""
    body = dynamo_worker_page(vllm_page).encode()

    def run(h: Any) -> None:
        if h.path == "/metrics":
            _answer(h, 200, body, "text/plain; charset=utf-8")
        else:
            _answer(h, 404, b"Route not found", "text/plain; charset=utf-8")

    return run


def test_a_dynamo_page_reads_vllms_families_only_as_the_captured_page_has_them() -> None:
    captured = read_snapshot(page(LATER))
    dynamo = read_snapshot(dynamo_worker_page(page(LATER)))
    assert dynamo.engines == captured.engines  # Dynamo's families count for nothing
    assert dynamo.cache == captured.cache
    assert "dynamo_component_requests_total 42" not in str(dynamo)
    # What Dynamo's filter leaves out of vLLM's page: its process_* series.
    assert captured.process_start_time is not None and dynamo.process_start_time is None


@pytest.mark.slow
def test_the_exporter_beside_a_dynamo_worker_publishes_tpot_and_no_version(
    target: Misbehaving,
) -> None:
    poller, scrape = _polled(target, [_dynamo(page(FIRST)), _dynamo(page(LATER))])
    assert poller.filtered_page is False  # its 404: the whole page from then on
    assert _value(scrape, "glassbox_target_up") == 1.0
    tiny = {"model_name": "tiny", "engine": "0"}
    tpot = _value(scrape, "glassbox_time_per_output_token_seconds", **tiny)
    assert tpot == pytest.approx(_tpot_by_hand())
    assert _value(scrape, "glassbox_kv_cache_capacity_tokens", **tiny) == 16384.0
    # No /version on the system port: no version published, nothing made up.
    assert not [n for n, _ in scrape if n == "glassbox_vllm_info"]
    # No process_* (Dynamo filters them out): glassbox cannot tell how many API servers
    # counted the engine steps, and says so rather than publish steps it may count twice.
    flag = {"source": "page", "shape": "steps_counted_per_api_server"}
    assert _value(scrape, "glassbox_input_unrecognised", **flag) == 1.0
    assert _value(scrape, "glassbox_engine_steps_per_second", **tiny) is None


# --- Ray Serve LLM: vLLM's names under ray_vllm_, a replica label -----------------------


def _ray(vllm_page: str, replicas: list[tuple[str, str]] | None = None) -> str:
    return ray_node_page(vllm_page, replicas or [("a1b2c3", "0f9e8d")])


def test_a_ray_page_is_read_under_its_prefix_by_the_flag_or_by_what_it_shows() -> None:
    captured = read_snapshot(page(LATER)).engines[TINY].counters
    text = _ray(page(LATER))
    for prefix in ("auto", "ray_vllm_"):
        snapshot = read_snapshot(text, prefix=prefix)
        assert snapshot.prefix == "ray_vllm_"
        counters = snapshot.engines[TINY].counters
        # Counters Ray never saw grow (inc(0) skipped: preemptions) are absent, not 0.
        assert counters == {n: v for n, v in captured.items() if v != 0.0}
    older = text.replace("ray_vllm_", "ray_vllm:")  # vLLM ≤ 0.10 kept the colon
    assert read_snapshot(older, prefix="auto").prefix == "ray_vllm:"


def test_a_ray_page_read_as_vllms_own_names_has_nothing_of_vllm() -> None:
    with pytest.raises(ScrapeError) as info:
        read_snapshot(_ray(page(LATER)), prefix="vllm:")
    assert info.value.reason == "no_vllm_metrics"


def test_a_page_with_vllms_names_under_two_prefixes_is_refused_not_guessed() -> None:
    both = page(LATER) + _ray(page(LATER))
    with pytest.raises(ScrapeError) as info:
        read_snapshot(both, prefix="auto")
    assert info.value.reason == "no_vllm_metrics"
    assert "ray_vllm_, vllm:" in str(info.value) and "--metric-prefix" in str(info.value)
    assert read_snapshot(both, prefix="ray_vllm_").prefix == "ray_vllm_"  # said: read


def test_a_ray_node_page_of_two_replicas_is_refused_not_summed_as_one_server() -> None:
    two = _ray(page(LATER), [("a1b2c3", "0f9e8d"), ("d4e5f6", "7c6b5a")])
    with pytest.raises(ScrapeError) as info:
        read_snapshot(two, prefix="auto")
    assert info.value.reason == "duplicate_series"
    assert "2 replicas' series for engine '0'" in str(info.value)


def _serving(text: str) -> Behaviour:
    def run(h: Any) -> None:
        _answer(h, 200, text.encode(), "text/plain; version=0.0.4; charset=utf-8")

    return run


@pytest.mark.slow
def test_the_exporter_beside_a_ray_replica_reads_its_prefix_and_publishes_tpot(
    target: Misbehaving,
) -> None:
    pages = [_serving(_ray(page(FIRST))), _serving(_ray(page(LATER)))]
    _, scrape = _polled(target, pages)
    tiny = {"model_name": "tiny", "engine": "0"}
    tpot = _value(scrape, "glassbox_time_per_output_token_seconds", **tiny)
    assert tpot == pytest.approx(_tpot_by_hand())


# --- llm-d's routing sidecar: vLLM's page through a proxy that answers /health itself ----


def _sidecar(upstream: Callable[[], str]) -> Behaviour:
    """llm-d-routing-sidecar's routes: GET /health answered here, every other path passed
    to vLLM (httputil.ReverseProxy), 502 when vLLM does not answer."""

    def run(h: Any) -> None:
        if h.path == "/health":
            _answer(h, 200, b"", "text/plain")
            return
        try:
            r = httpx.get(upstream() + h.path, timeout=10)
        except httpx.TransportError:
            _answer(h, 502, b"", "text/plain")
            return
        _answer(h, r.status_code, r.content, r.headers.get("content-type", "text/plain"))

    return run


@pytest.mark.slow
def test_through_the_llm_d_sidecar_the_page_is_vllms_and_a_gone_vllm_is_a_502(
    target: Misbehaving,
) -> None:
    with Misbehaving() as vllm:
        poller = Poller(ExporterConfig(target=target.url, timeout_seconds=30.0))
        target.behave(_sidecar(lambda: vllm.url))
        try:
            for name in (FIRST, LATER):
                vllm.behave(_serving(page(name)))
                assert poller.poll_once(), poller.failing
            up = _scrape(poller)
            vllm.refuse()
            assert not poller.poll_once()
            down = _scrape(poller)
        finally:
            poller.fetcher.close()
    tiny = {"model_name": "tiny", "engine": "0"}
    tpot = _value(up, "glassbox_time_per_output_token_seconds", **tiny)
    assert tpot == pytest.approx(_tpot_by_hand())
    # vLLM gone behind the sidecar: an HTTP 502, not a refused connection.
    assert poller.failing is not None and poller.failing.startswith("http_status")
    assert _value(down, "glassbox_scrape_errors_total", reason="http_status") == 1.0
    assert _value(down, "glassbox_target_up") == 0.0
