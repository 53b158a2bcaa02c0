"""vLLM's Rust front end as captured (tests/fixtures/metrics/rust-frontend-0.32/): its
OpenMetrics pages read as prometheus_client's OpenMetrics parser reads them, its counters
those of the requests sent, and its startup log's stages and total."""

from __future__ import annotations

import pytest
from prometheus_client.openmetrics.parser import text_string_to_metric_families as om_families
from vllm_glassbox.core.cold_start import latest_start
from vllm_glassbox.core.derive import startup_stages
from vllm_glassbox.core.snapshot import ITL_COUNT, WANTED_SAMPLES, EngineKey, read_snapshot
from vllm_glassbox.core.startup_log import read_facts
from vllm_glassbox.core.textformat import OPENMETRICS, read_page

from tests.fixtures import METRICS, headers, log, page

OM = "application/openmetrics-text; version=1.0.0; charset=utf-8"
RUST = sorted(str(p.relative_to(METRICS)) for p in (METRICS / "rust-frontend-0.32").glob("*.txt"))
Read = dict[str, dict[tuple[tuple[str, str], ...], float]]


def _oracle(text: str) -> Read:
    out: Read = {}
    for family in om_families(text):
        for sample in family.samples:
            if sample.name in WANTED_SAMPLES:
                labels = tuple(sorted(sample.labels.items()))
                out.setdefault(sample.name, {})[labels] = float(sample.value)
    return out


def test_the_rust_front_end_captures_are_openmetrics_pages_whatever_was_asked() -> None:
    assert len(RUST) == 7  # plain: idle, 1 and 3 requests, asked as text; spec: three
    for name in RUST:
        assert headers(name)["content-type"] == OM
    # Asked with `Accept: text/plain`, the same bytes and the same type.
    assert page("rust-frontend-0.32/plain-accept-text.txt") == page(
        "rust-frontend-0.32/plain-after-3x64.txt"
    )


@pytest.mark.parametrize("name", RUST)
def test_a_rust_front_end_page_reads_as_prometheus_clients_openmetrics_parser_reads_it(
    name: str,
) -> None:
    text = page(name)
    by_type = read_page(text, WANTED_SAMPLES, content_type=headers(name)["content-type"])
    by_content = read_page(text, WANTED_SAMPLES)
    assert by_type.format == by_content.format == OPENMETRICS
    assert by_type.samples == by_content.samples == _oracle(text)


def test_the_rust_front_ends_counters_are_vllms_own_after_three_requests() -> None:
    # By hand from the capture's requests: 3 × 64 tokens, 3 first tokens, 3 × 63 steps.
    name = "rust-frontend-0.32/plain-after-3x64.txt"
    snapshot = read_snapshot(page(name), content_type=headers(name)["content-type"])
    counters = snapshot.engines[EngineKey("tiny", "0")].counters
    assert counters["generation_tokens"] == 192.0
    assert counters["ttft_count"] == 3.0
    assert counters[ITL_COUNT] == 189.0
    assert counters["engine_steps"] == 192.0
    # What the Rust front end does not serve: vLLM's cache config, the process series.
    assert snapshot.cache == {} and snapshot.process_start_time is None


def test_the_rust_front_end_creates_request_series_at_the_first_request() -> None:
    # Its idle page has no TTFT, ITL or request histograms at all (the Python server shows
    # them at 0): a counter first seen at a later poll is unknown for that window.
    idle = read_snapshot(page("rust-frontend-0.32/plain-idle.txt"))
    counters = idle.engines[EngineKey("tiny", "0")].counters
    assert counters["generation_tokens"] == 0.0
    assert ITL_COUNT not in counters and "ttft_count" not in counters


def test_the_rust_front_ends_startup_log_gives_its_stages_and_its_total() -> None:
    # Ready at the Rust front end's "OpenAI server is ready to accept requests" (11:17:07),
    # 47 s after the banner (11:16:20); the KV pool and the version from the Python side.
    text = log("rust-frontend-0.32-plain-startup.log")
    facts = read_facts(text)
    assert facts.kv_cache_tokens == 16384 and facts.vllm_version == "0.32.0"
    assert facts.unrecognised() == {}
    start = latest_start(text)
    assert start is not None and start.ready_after_seconds == 47.0
    assert startup_stages(start).by_stage()["engine_init"] == 29.9
