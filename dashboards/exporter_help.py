"""The HELP text of every series the exporter publishes, taken from the exporter itself.

Panel descriptions quote these rather than restating formulas: the exporter's collector
is rendered once over a made-up poll in which every family has a sample, and its
documentation strings are read back. When a formula changes there, the dashboards'
descriptions follow on the next `glassbox dashboards generate`.
"""

from __future__ import annotations

from functools import cache

from vllm_glassbox.exporter import snapshot as s
from vllm_glassbox.exporter.collector import PollState, build_families
from vllm_glassbox.exporter.derive import FirstRequests, Increase
from vllm_glassbox.exporter.kv_trend import Growth
from vllm_glassbox.exporter.model import Weights
from vllm_glassbox.exporter.snapshot import CacheConfig, EngineKey, EngineSample, Snapshot
from vllm_glassbox.exporter.startup_log import ColdStart, LogTime


def _everything_present() -> PollState:
    """A poll in which every family the exporter knows has at least one sample."""
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
    }
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
    return PollState(
        up=True,
        window_seconds=60.0,
        scrape_duration_seconds=0.01,
        errors={},
        restarts=0,
        last_success_unix=1.0,
        snapshot=Snapshot(
            engines={key: EngineSample(counters, {s.KV_USAGE: 0.5, s.RUNNING: 2.0})},
            cache={"0": CacheConfig(16, 8, 1, None, None, None)},
        ),
        increases={key: Increase(counters, 60.0)},
        weights=Weights(1.0, "flag", active_bytes=0.5),  # mixture of experts: every family
        peak_bandwidth=1.0,
        kv_cache_memory_bytes=1.0,
        vllm_version="0",
        build_version="0",
        cold_start=start,
        first_requests={key: FirstRequests(1.0, 1.0, at=30.0)},
        polled_at=60.0,
        used_tokens_growth={key: Growth(10.0, 60.0)},
    )


@cache
def exporter_help() -> dict[str, str]:
    """Exported series name (as Prometheus stores it) -> HELP text."""
    helps: dict[str, str] = {}
    for family in build_families(_everything_present()):
        for sample in family.samples:
            helps.setdefault(sample.name, family.documentation)
    return helps


def help_of(name: str) -> str:
    """HELP text of one exported series; a name the exporter does not publish is a bug."""
    helps = exporter_help()
    if name not in helps:
        raise KeyError(f"the exporter publishes no series named {name!r}")
    # The collector appends the window length ("Window: 60s.") which depends on a flag.
    return helps[name].split(" Window: ")[0]


def per_engine(name: str) -> str:
    """Description of an exporter series shown per engine."""
    return f"Per engine, over the exporter's window (--window, default 60 s). {help_of(name)}"


def fleet(record: str) -> str:
    """Description of a fleet recording rule that mirrors an exporter ratio."""
    return (
        f"Fleet line: recording rule {record}, the same formula from 5-minute rates of "
        "vLLM's counters, summed over the engines of a job and model before dividing."
    )
