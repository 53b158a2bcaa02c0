"""The catalogue of exported families (core/series.py) against what the exporter serves.

Every family the exporter can publish is declared there with the type, HELP and labels it
is served with, and nothing is declared that the exporter never publishes.
"""

from __future__ import annotations

import re
from pathlib import Path

from prometheus_client.core import Metric
from vllm_glassbox.core import disagg_page as kv
from vllm_glassbox.core import series
from vllm_glassbox.core import snapshot as s
from vllm_glassbox.core.build import Build
from vllm_glassbox.core.cold_start import ColdStart
from vllm_glassbox.core.derive import FirstRequests, Increase
from vllm_glassbox.core.kv_trend import Growth, kv_pools
from vllm_glassbox.core.log_patterns import LogTime
from vllm_glassbox.core.snapshot import CacheConfig, EngineKey, EngineSample, Snapshot
from vllm_glassbox.core.weights import Weights
from vllm_glassbox.exporter.exposition import PollState, build_families
from vllm_glassbox.exporter.webconfig import WebConfigSource

WINDOW_SECONDS = 42.0


def everything_known() -> PollState:
    """A poll in which every family of the page has at least one sample."""
    key = EngineKey("model", "0")
    counters = {
        s.GENERATION_TOKENS: 10.0,
        s.TTFT_SUM: 1.0,
        s.TTFT_COUNT: 1.0,
        s.ITL_SUM: 1.0,
        s.ITL_COUNT: 5.0,
        s.ENGINE_STEPS: 5.0,
        s.PREEMPTIONS: 1.0,
        s.SPEC_DRAFTS: 4.0,
        s.SPEC_DRAFT_TOKENS: 8.0,
        s.SPEC_ACCEPTED: 4.0,
        s.SPEC_ACCEPTED_AT + "0": 3.0,
        s.PREFILL_SUM: 2.0,
        s.PREFILL_COUNT: 4.0,
        s.REQUEST_PROMPT_SUM: 8.0,
        s.REQUEST_PROMPT_COUNT: 1.0,
        s.REQUEST_OUTPUT_SUM: 10.0,
        s.REQUEST_OUTPUT_COUNT: 1.0,
        s.PROMPT_TOKENS: 8.0,
        kv.PROMPT_FROM + "local_compute": 2.0,
        kv.PROMPT_FROM + "external_kv_transfer": 6.0,
        kv.KV_TRANSFER_SECONDS: 1.0,
        kv.KV_TRANSFERS: 2.0,
        kv.KV_TRANSFER_BYTES: 5.0,  # over a link of 10 bytes/s: a utilization of 0.5
        kv.KV_TRANSFER_FAILURES: 1.0,
        kv.KV_TRANSFER_EXPIRED: 1.0,
    }
    gauges = {s.KV_USAGE: 0.5, s.RUNNING: 2.0, s.AWAKE: 1.0, kv.KV_FETCH + "in_progress": 1.0}
    gauges |= {kv.WAITING_FOR + "capacity": 1.0, kv.WAITING_FOR + "deferred": 1.0}
    start = ColdStart(
        starts=1,
        started_at=LogTime(1, 1, 0),
        ready_at=LogTime(1, 1, 60),
        model_name="model",
        model_load_seconds={"main": 1.0},
        compile_seconds={"main": 1.0},
        cuda_graph_seconds={"main": 1.0},
        engine_init_seconds=10.0,
    )
    snapshot = Snapshot(
        engines={key: EngineSample(counters, gauges)},
        cache={"0": CacheConfig(16, 8, 1, None, None, None)},
        kv_connectors=("nixl",),
        adapters=kv.Adapters(1, ("alpha", "beta")),
    )
    return PollState(
        up=True,
        window_seconds=WINDOW_SECONDS,
        scrape_duration_seconds=0.01,
        errors={},
        restarts=0,
        last_success_unix=1.0,
        last_restart_unix=0.5,
        snapshot=snapshot,
        increases={key: Increase(counters, WINDOW_SECONDS)},
        weights=Weights(1.0, "flag", active_bytes=0.5),  # mixture of experts: every family
        peak_bandwidth=10.0,  # a utilization of 0.5: a physically possible one
        kv_cache_memory_bytes=1.0,
        kv_cache_logged_tokens=128,
        vllm_version="0",
        build=Build("0", "abc", "3.11.7"),
        cold_start=start,
        first_requests={key: FirstRequests(1.0, 1.0, at=30.0)},
        polled_at=WINDOW_SECONDS,
        used_tokens_growth={key: Growth(10.0, WINDOW_SECONDS)},
        kv_pools=kv_pools(snapshot, 128),
        log_unrecognised={"unknown_process_prefix": "(launcher job=1) INFO 01-01 00:00:00 …"},
        kv_link_bandwidth=10.0,
        gpu_hour_price=3.5,
        running_readings={key: (0.0, 2.0)},
        kv_usage_readings={key: (0.0, 0.5)},
    )


def published(tmp_path: Path) -> list[Metric]:
    """The page's families, and the one an endpoint with a web config adds."""
    web_config = tmp_path / "web.yml"
    web_config.write_text("{}\n")
    return [*build_families(everything_known()), *WebConfigSource(str(web_config)).collect()]


def test_every_published_family_is_served_as_the_catalogue_declares_it(tmp_path: Path) -> None:
    for family in published(tmp_path):
        assert family.samples, f"{family.name}: no sample, so the check below proves nothing"
        declared = series.BY_NAME[family.samples[0].name]
        assert family.type == declared.kind, declared.name
        assert family.documentation == declared.help_text(WINDOW_SECONDS), declared.name
        for sample in family.samples:
            assert tuple(sample.labels) == declared.labels, declared.name


def test_the_catalogue_declares_nothing_the_exporter_never_publishes(tmp_path: Path) -> None:
    names = [f.samples[0].name for f in published(tmp_path)]
    assert names == [f.name for f in series.ALL]  # in the page's order, each once


def test_names_follow_prometheus_conventions() -> None:
    for family in series.ALL:
        assert re.fullmatch(r"glassbox_[a-z0-9_]+", family.name), family.name
        assert family.name.endswith("_total") == (family.kind == "counter"), family.name
        assert family.help.endswith("."), family.name
        assert " Window: " not in family.help, family.name


def test_windowed_help_says_how_long_the_window_is() -> None:
    assert series.WINDOWED[0].help_text(60.0).endswith(". Window: 60s.")
    assert series.TARGET_UP.help_text(60.0) == series.TARGET_UP.help
