"""The exporter's cold-start and KV-headroom series, end to end through a real Poller:
pages captured from the vLLM CPU build served on loopback, logs of several versions, a
test clock (one poll every 10 s)."""

from __future__ import annotations

import functools
import itertools
import re
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from vllm_glassbox.exporter.service import ExporterConfig, Poller

from tests.fixtures import log as fixture_log
from tests.fixtures import page as fixture_page
from tests.misbehaving import Misbehaving, body, status

pytestmark = pytest.mark.slow  # starts servers or processes and waits for them

TINY = {"model_name": "tiny", "engine": "0"}


@contextmanager
def polling(**config: Any) -> Iterator[tuple[Misbehaving, Poller]]:
    with Misbehaving() as target:
        clock = functools.partial(next, itertools.count(0.0, 5.0))  # two reads a poll
        settings: dict[str, Any] = {"interval_seconds": 10.0, "window_seconds": 60.0} | config
        poller = Poller(ExporterConfig(target=target.url, **settings), clock=clock)
        try:
            yield target, poller
        finally:
            poller.fetcher.close()


def poll(target: Misbehaving, poller: Poller, pages: Sequence[str]) -> None:
    for text in pages:
        target.behave(body(text))
        assert poller.poll_once()


def values(poller: Poller, name: str) -> dict[frozenset[tuple[str, str]], float]:
    return {
        frozenset(sample.labels.items()): sample.value
        for family in poller.published
        for sample in family.samples
        if sample.name == name
    }


def value(poller: Poller, name: str, **labels: str) -> float | None:
    return values(poller, name).get(frozenset(labels.items()))


def with_kv(text: str, usage: float, running: int) -> str:
    """A captured page with another KV usage and number of running requests."""
    text = re.sub(r"(vllm:kv_cache_usage_perc\{[^}]*\}) \S+", rf"\g<1> {usage}", text)
    return re.sub(r"(vllm:num_requests_running\{[^}]*\}) \S+", rf"\g<1> {running}", text)


SPEC = [fixture_page(f"cpu-0.32/{p}") for p in ("spec-idle.txt", "spec-after-1x256.txt")]


# --- the first request after a start ----------------------------------------------------


def test_first_request_after_start_and_the_warm_mean_beside_it() -> None:
    with polling() as (target, poller):
        poll(target, poller, SPEC)
        first = value(poller, "glassbox_first_request_prefill_seconds", **TINY)
        assert first == pytest.approx(1.947, abs=1e-3)  # the ngram proposer compiling
        assert value(poller, "glassbox_warm_request_prefill_seconds", **TINY) is None  # no other
        poll(target, poller, [fixture_page("cpu-0.32/spec-after-2x256.txt")])
        warm = value(poller, "glassbox_warm_request_prefill_seconds", **TINY)
        assert warm == pytest.approx(0.0801, abs=1e-4)
        assert value(poller, "glassbox_first_request_prefill_seconds", **TINY) == first


def test_a_restart_starts_a_new_first_request() -> None:
    with polling() as (target, poller):
        poll(target, poller, [*SPEC, fixture_page("cpu-0.32/plain-idle.txt")])
        assert poller.history.restarts == 1
        assert value(poller, "glassbox_first_request_prefill_seconds", **TINY) is None
        poll(target, poller, [fixture_page("cpu-0.32/plain-after-1x64.txt")])
        first = value(poller, "glassbox_first_request_prefill_seconds", **TINY)
        assert first == pytest.approx(0.0206, abs=1e-4)


def test_an_exporter_joining_a_busy_vllm_does_not_guess_its_first_request() -> None:
    with polling() as (target, poller):
        later = ("spec-after-1x256.txt", "spec-after-2x256.txt")
        poll(target, poller, [fixture_page(f"cpu-0.32/{p}") for p in later])
        assert values(poller, "glassbox_first_request_prefill_seconds") == {}
        # The warm mean needs no start: the window's requests.
        assert value(poller, "glassbox_warm_request_prefill_seconds", **TINY) == pytest.approx(
            0.0801, abs=1e-4
        )


# --- KV headroom ----------------------------------------------------------------------------


def test_headroom_and_exhaustion_while_the_pool_fills_then_drains() -> None:
    mid = fixture_page("cpu-0.32/flood-mid.txt")  # a 4,096-token pool
    with polling() as (target, poller):
        poll(target, poller, [with_kv(mid, 0.25, 8)])
        assert value(poller, "glassbox_kv_cache_free_tokens", **TINY) == 3072
        assert value(poller, "glassbox_kv_cache_headroom_requests", **TINY) == 24  # 3072 / 128
        assert value(poller, "glassbox_kv_cache_exhaustion_seconds", **TINY) is None  # one poll
        poll(target, poller, [with_kv(mid, 0.5, 8), with_kv(mid, 0.75, 8)])
        # 1,024 → 3,072 used tokens in 20 s: 102.4 tokens/s, 1,024 free.
        assert value(poller, "glassbox_kv_cache_exhaustion_seconds", **TINY) == pytest.approx(10)
        assert value(poller, "glassbox_kv_cache_headroom_requests", **TINY) == 2  # 1024 / 384
        poll(target, poller, [with_kv(mid, 1.0, 11)])
        assert value(poller, "glassbox_kv_cache_free_tokens", **TINY) == 0
        assert value(poller, "glassbox_kv_cache_headroom_requests", **TINY) == 0
        assert value(poller, "glassbox_kv_cache_exhaustion_seconds", **TINY) == 0
        poll(target, poller, [with_kv(mid, 0.0, 0)] * 2)
        assert value(poller, "glassbox_kv_cache_free_tokens", **TINY) == 4096
        assert value(poller, "glassbox_kv_cache_headroom_requests", **TINY) is None  # idle
        assert value(poller, "glassbox_kv_cache_exhaustion_seconds", **TINY) is None  # drained


def test_growth_is_measured_over_the_window_only() -> None:
    mid = fixture_page("cpu-0.32/flood-mid.txt")
    with polling(window_seconds=20.0) as (target, poller):
        # An old rise, then 30 s flat, then a slow rise: only the last 20 s count.
        usages = [0.0, 0.5, 0.5, 0.5, 0.5, 0.55]
        poll(target, poller, [with_kv(mid, u, 4) for u in usages])
        growth = (0.55 - 0.5) * 4096 / 20  # tokens/s over the window
        expected = (1 - 0.55) * 4096 / growth
        assert value(poller, "glassbox_kv_cache_exhaustion_seconds", **TINY) == pytest.approx(
            expected
        )


# --- cold start ---------------------------------------------------------------------------


def test_stages_of_the_latest_start_with_its_model_and_start_time(tmp_path: Path) -> None:
    log = tmp_path / "vllm.log"
    log.write_text(fixture_log("v0.11.0-coldstart.log"))
    with polling(vllm_log=str(log), weights_bytes=5.59e9) as (target, poller):
        poll(target, poller, SPEC[:1])
        start = {"model_name": "qwen-awq", "start": "10-05 12:00:04"}
        stages = {
            dict(labels)["stage"]: v
            for labels, v in values(poller, "glassbox_startup_stage_seconds").items()
        }
        assert stages == pytest.approx(
            {
                "weights_load": 4.118342,
                "compile": 24.31,
                "cuda_graphs": 9.0,
                "engine_init": 39.86 - 24.31 - 9.0,
                "other": 75 - 4.118342 - 39.86,
            }
        )
        assert value(poller, "glassbox_startup_seconds", **start) == 75.0
        rate = value(poller, "glassbox_model_load_bytes_per_second", **start)
        assert rate == pytest.approx(5.59e9 / 4.118342)

        # vLLM starts again: the new start replaces the old one, stage by stage.
        with open(log, "a") as f:
            f.write(fixture_log("v0.11.0-coldstart.log").splitlines()[1] + "\n")
        poll(target, poller, SPEC[1:])
        assert values(poller, "glassbox_startup_stage_seconds") == {}
        assert values(poller, "glassbox_startup_seconds") == {}


def test_startup_series_stay_while_vllm_is_down_and_the_pool_series_go(tmp_path: Path) -> None:
    log = tmp_path / "vllm.log"
    log.write_text(fixture_log("cpu-0.32-spec-startup.log"))
    with polling(vllm_log=str(log), weights_bytes=6955520) as (target, poller):
        poll(target, poller, SPEC)
        assert value(poller, "glassbox_kv_cache_free_tokens", **TINY) == 4096
        target.behave(status(503))
        assert not poller.poll_once()
        start = {"model_name": "tiny", "start": "11-29 16:19:12"}
        assert value(poller, "glassbox_startup_seconds", **start) == 186.0
        assert value(poller, "glassbox_model_load_bytes_per_second", **start) == pytest.approx(
            6955520 / 0.04
        )
        for gone in (
            "glassbox_kv_cache_free_tokens",
            "glassbox_first_request_prefill_seconds",
            "glassbox_warm_request_prefill_seconds",
        ):
            assert values(poller, gone) == {}, gone


def test_without_a_log_there_are_no_startup_series() -> None:
    with polling(weights_bytes=1e9) as (target, poller):
        poll(target, poller, SPEC)
        names = {s.name for f in poller.published for s in f.samples}
        assert not {n for n in names if n.startswith(("glassbox_startup", "glassbox_model_load"))}
