"""The poller's latest state as explain's scene (pure: `PollState` in, `Scene` out): what
`/findings`, `glassbox_finding_info` and `glassbox explain --exporter` diagnose.

The exporter sees one server: its numbers are over the exporter's window (`--window`):
the counters' increases, and each engine's pool as the alerts judge it (the peaks of its
usage and queue, its preemptions and when they came: `pool_window.py`); the mean request
size is of the latest poll, the failed polls are since it started.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from vllm_glassbox.core import derive, series, series_disagg
from vllm_glassbox.core import snapshot as s
from vllm_glassbox.core.kv_trend import KvPool
from vllm_glassbox.core.snapshot import EngineKey, EngineSample, Snapshot, first_cache
from vllm_glassbox.explain.scene import Blind, EnginePool, Reading, Scene, Scope, Window
from vllm_glassbox.exporter.disaggregation import role_of
from vllm_glassbox.exporter.pool_window import CAPACITY, DEFERRED, PEAKED, PoolFacts

if TYPE_CHECKING:  # exposition builds its findings from here
    from vllm_glassbox.exporter.exposition import PollState

#: Polls that failed for these reasons are failures; "slow" polls were read, late.
_NOT_FAILED = ("slow",)
_BY_REASON = "vllm:num_requests_waiting_by_reason"
_PREEMPTIONS = "vllm:num_preemptions_total"


def _values(reading: Mapping[Any, float], source: str, pick: str) -> Reading | None:
    if not reading:
        return None
    values = list(reading.values())
    value = max(values) if pick == "max" else min(values) if pick == "min" else sum(values)
    return Reading(float(value), source)


def scene_from_state(
    state: PollState, unrecognised: Mapping[tuple[str, str], str], where: str = "the exporter"
) -> Scene:
    """The scene of the exporter's latest publication; `unrecognised`: the shapes of its
    inputs it does not read (`exposition.unrecognised_inputs`)."""
    snapshot = state.snapshot if state.up else None
    engines = snapshot.engines if snapshot is not None else {}
    models = sorted({key.model_name for key in engines})
    window = max((d.seconds for d in state.increases.values()), default=state.window_seconds)
    scope = Scope(
        source="exporter",
        where=where,
        namespace=None,
        model=", ".join(models) or None,
        engines=len(engines),
        window_seconds=window,
        at=state.last_success_unix,
    )
    blind = _blind(state, unrecognised)
    if snapshot is None:
        return Scene(scope, blind=blind, vllm_version=state.vllm_version)
    decode = Window(
        derive.engines_together(state.increases.values(), window),
        f"Δ of vLLM's counters over the exporter's {window:g} s window, engines summed",
    )
    context = series.derivation_context(state.weights, state.peak_bandwidth, state.layout.tensor)
    pools = state.kv_pools
    capacity = {k: p.capacity_tokens for k, p in pools.items() if p.capacity_tokens is not None}
    used = {k: p.used_tokens for k, p in pools.items() if p.used_tokens is not None}
    gauge = _gauges(engines)
    exhaustion = _exhaustion_seconds(state)
    facts = state.pool_window.facts if state.pool_window is not None else {}
    peak = _peaks(facts)
    over = f"the most over the exporter's {window:g} s window"
    cache = first_cache(snapshot)
    block_size = None if cache is None or cache.block_size is None else float(cache.block_size)
    spec = any(s.SPEC_DRAFTS in e.counters for e in engines.values())
    return Scene(
        scope,
        decode=decode,
        weights=_reading(context.weights_bytes, _weights_series(state)),
        mixture_of_experts=state.weights is not None and state.weights.active_bytes is not None,
        peak_bandwidth=_reading(state.peak_bandwidth, series.PEAK_BANDWIDTH.name),
        tensor_parallel=state.layout.tensor,
        pipeline_parallel=state.layout.pipeline,
        vllm_version=state.vllm_version,
        kv_capacity=_values(capacity, series.KV_CAPACITY.name, "max"),
        kv_block_size=_reading(block_size, series.KV_BLOCK_SIZE.name),
        kv_memory=_reading(state.kv_cache_memory_bytes, series.KV_MEMORY.name),
        kv_memory_fixed=cache is not None and cache.kv_cache_memory_bytes is not None,
        gpu_memory_utilization=_reading(
            None if cache is None else cache.gpu_memory_utilization,
            "vllm:cache_config_info{gpu_memory_utilization}",
        ),
        kv_usage_peak=_values(peak[s.KV_USAGE], f"vllm:kv_cache_usage_perc ({over})", "max"),
        kv_used_mean=_values(used, f"{series.KV_USED.name} (now, engines summed)", "sum"),
        running_mean=_values(
            gauge[s.RUNNING], "vllm:num_requests_running (now, engines summed)", "sum"
        ),
        running_peak=_values(peak[s.RUNNING], f"vllm:num_requests_running ({over})", "max"),
        waiting_peak=_values(peak[s.WAITING], f"vllm:num_requests_waiting ({over})", "max"),
        kv_exhaustion=_values(exhaustion, series.KV_EXHAUSTION.name, "min"),
        hourly_cost=_values(
            {}
            if (hourly := state.engine_hourly_cost()) is None
            else dict.fromkeys(engines, hourly),
            f"{series.ENGINE_HOURLY_COST.name} (engines summed)",
            "sum",
        ),
        pools=_pools(state, facts, exhaustion, window),
        spec_configured=spec,
        startup=_startup(state),
        blind=blind,
        **_disaggregated(state, snapshot, peak, over),
    )


def _reading(value: float | None, source: str) -> Reading | None:
    return None if value is None else Reading(value, source)


def _gauges(engines: Mapping[EngineKey, EngineSample]) -> dict[str, dict[EngineKey, float]]:
    """The gauges of the queue and the pool, as of the latest poll, by engine."""
    return {
        name: {k: e.gauges[name] for k, e in engines.items() if name in e.gauges}
        for name in (s.KV_USAGE, s.RUNNING, s.WAITING)
    }


def _pools(
    state: PollState,
    facts: Mapping[EngineKey, PoolFacts],
    exhaustion: Mapping[EngineKey, float],
    window: float,
) -> tuple[EnginePool, ...]:
    """Each engine's pool over the window, as the alerts judge it."""
    out = []
    for key, f in sorted(facts.items()):
        name = f"{key.model_name}/{key.engine}"
        over = f"the most over the exporter's {window:g} s window, engine {name}"

        def peak(gauge: str, family: str, f: PoolFacts = f, over: str = over) -> Reading | None:
            return _reading(f.peak(gauge), f"{family} ({over})")

        first = derive.moment_before(state.last_success_unix, f.first_preemption_ago)
        last = derive.moment_before(state.last_success_unix, f.last_preemption_ago)
        rose = f"the poll whose {_PREEMPTIONS} rose, {{}} of the window, engine {name}"
        pool = state.kv_pools.get(key)
        out.append(
            EnginePool(
                engine=name,
                peak_usage=peak(s.KV_USAGE, "vllm:kv_cache_usage_perc"),
                usage_now=_reading(
                    f.now.get(s.KV_USAGE), f"vllm:kv_cache_usage_perc (now, engine {name})"
                ),
                peak_running=peak(s.RUNNING, "vllm:num_requests_running"),
                peak_waiting=peak(s.WAITING, "vllm:num_requests_waiting"),
                peak_waiting_capacity=peak(CAPACITY, f'{_BY_REASON}{{reason="capacity"}}'),
                peak_waiting_deferred=peak(DEFERRED, f'{_BY_REASON}{{reason="deferred"}}'),
                preemptions=_reading(
                    f.preemptions,
                    f"Δ {_PREEMPTIONS} over the exporter's {f.seconds:g} s window, engine {name}",
                ),
                first_preemption_at=_reading(first, rose.format("the first")),
                last_preemption_at=_reading(last, rose.format("the last")),
                exhaustion_seconds=_reading(
                    exhaustion.get(key), f'{series.KV_EXHAUSTION.name}{{engine="{key.engine}"}}'
                ),
                headroom_at_completion=_reading(
                    _at_completion(state, key, pool),
                    f'{series.KV_HEADROOM_AT_COMPLETION.name}{{engine="{key.engine}"}}',
                ),
            )
        )
    return tuple(out)


def _at_completion(state: PollState, key: EngineKey, pool: KvPool | None) -> float | None:
    """The engine's headroom once its running requests reach the size requests finish at
    (the forecast alert's second condition), as the page publishes it."""
    increase = state.increases.get(key)
    snapshot = state.snapshot
    if pool is None or increase is None or snapshot is None or key not in snapshot.engines:
        return None
    size = derive.request_tokens_at_completion(increase)
    running = snapshot.engines[key].gauges.get(s.RUNNING)
    return derive.kv_cache_headroom_requests_at_completion(pool.capacity_tokens, running, size)


def _peaks(facts: Mapping[EngineKey, PoolFacts]) -> dict[str, dict[EngineKey, float]]:
    """Each gauge's peak over the window, by engine (where its polls showed it)."""
    return {
        name: {k: v for k, f in facts.items() if (v := f.peak(name)) is not None} for name in PEAKED
    }


def _disaggregated(
    state: PollState, snapshot: Snapshot, peak: Mapping[str, Mapping[EngineKey, float]], over: str
) -> dict[str, Any]:
    """What the disaggregation and adapters diagnoses read: the waits by reason, the KV
    role (the log's, else the page's), the link's peak, the adapters."""
    role = role_of(snapshot, state.kv_role_in_log, state.vllm_version)
    adapters = snapshot.adapters
    return {
        "waiting_capacity_peak": _values(
            peak[CAPACITY], f'{_BY_REASON}{{reason="capacity"}} ({over})', "max"
        ),
        "waiting_deferred_peak": _values(
            peak[DEFERRED], f'{_BY_REASON}{{reason="deferred"}} ({over})', "max"
        ),
        "kv_role": role.role,
        "kv_connector": role.connector or None,
        "kv_role_source": f'{series_disagg.ROLE_INFO.name}{{source="{role.source}"}}',
        "kv_link_bandwidth": _reading(state.kv_link_bandwidth, "--kv-link-bandwidth"),
        "adapters_active": _reading(
            None if adapters is None else float(len(adapters.active)), series_disagg.ADAPTERS.name
        ),
        "adapter_budget": _reading(
            None if adapters is None or adapters.max_loras is None else float(adapters.max_loras),
            series_disagg.ADAPTER_BUDGET.name,
        ),
    }


def _exhaustion_seconds(state: PollState) -> dict[EngineKey, float]:
    """Each pool's seconds until full at its recent growth, where it grew."""
    exhaustion = {}
    for key, growth in state.used_tokens_growth.items():
        pool = state.kv_pools.get(key)
        if pool is None:
            continue
        free = derive.kv_cache_free_tokens(pool.used_tokens, pool.capacity_tokens)
        seconds = derive.kv_cache_exhaustion_seconds(free, growth.tokens, growth.seconds)
        if seconds is not None:
            exhaustion[key] = seconds
    return exhaustion


def _startup(state: PollState) -> dict[str, Reading]:
    """The latest start's stages, and its total, as the page publishes them."""
    stages = derive.startup_stages(state.cold_start) if state.cold_start else None
    if stages is None:
        return {}
    startup = {
        name: Reading(value, f'{series.STARTUP_STAGE.name}{{stage="{name}"}}')
        for name, value in stages.by_stage().items()
    }
    if stages.total is not None:
        startup["total"] = Reading(stages.total, series.STARTUP.name)
    return startup


def _weights_series(state: PollState) -> str:
    if state.weights is not None and state.weights.active_bytes is not None:
        return series.ACTIVE_WEIGHTS_BYTES.name
    return series.WEIGHTS_BYTES.name


def _blind(state: PollState, unrecognised: Mapping[tuple[str, str], str]) -> tuple[Blind, ...]:
    out = []
    if state.up is False:
        reasons = ", ".join(
            sorted(r for r, n in state.errors.items() if n and r not in _NOT_FAILED)
        )
        out.append(
            Blind(
                "target_down",
                f"the reasons of its failed polls so far: {reasons or 'none counted'}",
                None,
                f"{series.TARGET_UP.name} 0",
            )
        )
    for (source, shape), shown in sorted(unrecognised.items()):
        out.append(
            Blind(
                "input_unrecognised",
                f"vLLM's {source} has a shape glassbox does not read, {shape} ({shown})",
                None,
                f'{series.INPUT_UNRECOGNISED.name}{{source="{source}",shape="{shape}"}}',
                shape,
            )
        )
    return tuple(out)
