"""Several API servers: each observes vllm:iteration_tokens_total once per engine step that
had one of its own requests, and the page (multiprocess mode) sums them, so a step two
API servers took part in counts twice. Captured on the vLLM CPU build
(tests/capture_fixtures.py, "several API servers"): a 1,536-token request and, inside its
steps, four 64-token requests one after another, on one API server and on two. The
engine steps equal the long request's tokens on one API server; on two they count 64 more
for each short request the other API server took. Values by hand from the pages
(prometheus_client's parser), never from the derivation core."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families
from vllm_glassbox.core import derive
from vllm_glassbox.core.startup_log import read_facts
from vllm_glassbox.exporter.service import Poller

from tests.exporter.test_edges import _published
from tests.exporter.test_exposition_golden import Clock, PageSequence, config
from tests.fixtures import LOGS, page

LONG = 1536


def _raw(name: str, sample: str) -> float:
    return sum(
        s.value
        for family in text_string_to_metric_families(page(name))
        for s in family.samples
        if s.name == sample
    )


def _grown(count: int, sample: str) -> float:
    before, after = (f"cpu-0.32/api{count}-{when}-trial.txt" for when in ("before", "after"))
    return _raw(after, sample) - _raw(before, sample)


def _other_api_server_took(count: int) -> int:
    """How many short requests another API server than the long one's took (the page's
    note, from vLLM's request log)."""
    lines = page(f"cpu-0.32/api{count}-after-trial.txt").splitlines()
    note = next(line for line in lines if line.startswith("# this page:"))
    m = re.search(r"(\d+) short request\(s\) on the other", note)
    assert m is not None, note
    return int(m[1])


def test_one_api_server_counts_each_engine_step_once_two_count_a_shared_step_twice() -> None:
    steps = "vllm:iteration_tokens_total_count"
    assert _grown(1, steps) == LONG
    other = _other_api_server_took(2)
    assert other > 0, "the capture's trial put every short request on the long one's server"
    assert _grown(2, steps) == LONG + 64 * other
    # The tokens are counted once either way: the long request and four short ones.
    assert _grown(1, "vllm:generation_tokens_total") == _grown(2, "vllm:generation_tokens_total")
    assert _grown(2, "vllm:generation_tokens_total") == LONG + 4 * 64


def _poller(count: int, log: Path | None = None) -> Poller:
    pages = [page(f"cpu-0.32/api{count}-{when}-trial.txt") for when in ("before", "after")]
    clock = Clock()
    poller = Poller(
        config(vllm_log=str(log) if log else None, weights_bytes=6955520.0),
        fetcher=PageSequence(pages, "0.32.0"),
        clock=clock,
    )
    for _ in pages:
        poller.poll_once()
        clock.now += 10.0
    return poller


def _flags(poller: Poller) -> set[tuple[str, str]]:
    return {
        (s.labels["source"], s.labels["shape"])
        for f in poller.published
        for s in f.samples
        if s.name == "glassbox_input_unrecognised"
    }


def test_on_one_api_server_the_steps_are_published_as_counted() -> None:
    poller = _poller(1, LOGS / "cpu-0.32-api1-startup.log")
    generated = _grown(1, "vllm:generation_tokens_total")
    assert _published(poller, "glassbox_engine_steps_per_second") == LONG / 10.0
    assert _published(poller, "glassbox_tokens_per_engine_step") == pytest.approx(generated / LONG)
    assert not {shape for _, shape in _flags(poller)} & {"steps_counted_per_api_server"}


@pytest.mark.parametrize("with_log", [False, True], ids=["page-alone", "with-log"])
def test_on_two_api_servers_the_step_series_are_absent_and_flagged(
    with_log: bool, tmp_path: Path
) -> None:
    poller = _poller(2, LOGS / "cpu-0.32-api2-startup.log" if with_log else None)
    for name in (
        "glassbox_engine_steps_per_second",
        "glassbox_tokens_per_engine_step",
        "glassbox_weight_bytes_per_output_token",
    ):
        assert _published(poller, name) is None, name
    # The page has no process_* series (multiprocess mode); the log names the count.
    assert _flags(poller) == {("log" if with_log else "page", "steps_counted_per_api_server")}
    # What does not count steps is published: decode tokens per decode step by hand.
    decode = _grown(2, "vllm:generation_tokens_total") - _grown(
        2, "vllm:time_to_first_token_seconds_count"
    )
    per_pass = decode / _grown(2, "vllm:inter_token_latency_seconds_count")
    assert _published(poller, "glassbox_tokens_per_forward_pass") == pytest.approx(per_pass)


def test_the_log_says_how_many_api_servers_a_start_runs() -> None:
    assert read_facts((LOGS / "cpu-0.32-api2-startup.log").read_text()).api_servers == 2
    assert read_facts((LOGS / "cpu-0.32-api1-startup.log").read_text()).api_servers == 1
    # `python -m vllm.entrypoints.openai.api_server` runs one, whatever it is asked.
    assert read_facts((LOGS / "cpu-0.32-plain-startup.log").read_text()).api_servers == 1
    lines = {
        "(MainProcess pid=1) INFO 12-02 04:56:55 [utils.py:261] Started 4 API server processes": 4,
        "(APIServer pid=1) INFO 01-01 00:00:00 [serve.py:120] Defaulting api_server_count to "
        "data_parallel_size (8).": 8,
        "(ApiServer_2 pid=9) INFO 01-01 00:00:00 [model.py:733] Resolved architecture": 3,
        "INFO 01-01 00:00:00 [x.py:1] serving": None,  # the log does not say
    }
    for line, count in lines.items():
        assert read_facts(line).api_servers == count, line


def test_a_step_counts_once_where_one_api_server_runs_or_the_page_has_its_process() -> None:
    assert derive.steps_counted_once(1.7e9, None)  # one process answers, with its series
    assert not derive.steps_counted_once(None, None)  # multiprocess mode: maybe several
    assert derive.steps_counted_once(None, 1)  # the log says one
    assert not derive.steps_counted_once(1.7e9, 2)  # the log says two
