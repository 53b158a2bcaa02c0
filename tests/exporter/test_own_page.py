"""Reading an exporter's own page back (core/own_page.py): one meaning of "polled
since t" for the lab's sidecar, `glassbox probe` and the tests."""

from __future__ import annotations

import time

import pytest
from prometheus_client import generate_latest
from vllm_glassbox.core.errors import ScrapeError
from vllm_glassbox.core.own_page import ExporterPage
from vllm_glassbox.exporter.service import ExporterConfig, Poller, make_registry

from tests.exporter.test_exposition_golden import PageSequence
from tests.fixtures import page


def _page(up: float, ended: float, took: float) -> ExporterPage:
    return ExporterPage.parse(
        f"glassbox_target_up {up}\n"
        f"glassbox_scrape_duration_seconds {took}\n"
        f"glassbox_last_scrape_success_timestamp_seconds {ended}\n"
    )


def test_a_poll_that_started_after_t_is_a_poll_since_t() -> None:
    page = _page(1, ended=1000.0, took=2.0)  # started at 998
    assert page.poll_started_at == 998.0
    assert page.polled_since(997.5)


def test_a_poll_that_only_finished_after_t_is_not() -> None:
    page = _page(1, ended=1000.0, took=2.0)  # it may have read vLLM's page before 999
    assert not page.polled_since(999.0)
    assert not page.polled_since(998.0)


def test_after_a_failed_poll_no_poll_is_since_anything() -> None:
    # The success timestamp is of an older poll, the duration of the failed one.
    page = _page(0, ended=1000.0, took=0.01)
    assert page.poll_started_at is None
    assert not page.polled_since(0.0)


def test_a_page_without_the_timestamps_has_not_polled() -> None:
    assert not ExporterPage.parse("glassbox_target_up 1\n").polled_since(0.0)
    assert not ExporterPage({}).polled_since(0.0)
    assert ExporterPage({}).target_up is None


def test_totals_sum_each_series_over_engines_and_leave_out_what_is_absent() -> None:
    page = ExporterPage.parse(
        'glassbox_kv_cache_capacity_tokens{engine="0",model_name="m"} 4096\n'
        'glassbox_kv_cache_capacity_tokens{engine="1",model_name="m"} 2048\n'
    )
    names = ["glassbox_kv_cache_capacity_tokens", "glassbox_target_up"]
    assert page.totals(names) == {"glassbox_kv_cache_capacity_tokens": 6144.0}
    assert page.value("glassbox_kv_cache_capacity_tokens", engine="1") == 2048.0


def test_not_exposition_text_is_a_value_error() -> None:
    with pytest.raises(ValueError):
        ExporterPage.parse("<html>not a metrics page</html>\n")


def test_the_exporters_own_page_says_when_its_latest_poll_started() -> None:
    poller = Poller(
        ExporterConfig(target="http://vllm.invalid"),
        fetcher=PageSequence(
            [page("cpu-0.32/plain-idle.txt"), ScrapeError("connect", "refused")], "0.32.0"
        ),
    )
    before = time.time()
    poller.poll_once()
    after = time.time()
    read_back = ExporterPage.parse(generate_latest(make_registry(poller)).decode())
    assert read_back.target_up is True
    # Its start as the page tells it errs early (the duration runs past the timestamp).
    assert read_back.polled_since(before - 0.5)
    assert not read_back.polled_since(after)
    poller.poll_once()  # vLLM gone: the latest poll did not succeed
    read_back = ExporterPage.parse(generate_latest(make_registry(poller)).decode())
    assert read_back.target_up is False
    assert not read_back.polled_since(before - 0.5)
