"""One poll of vLLM's /metrics, reduced to version-independent numbers.

vLLM renamed and hid metrics between v0.11 and today (see docs/vllm-metrics.md); this
module is the only place that knows the exposed names. Everything downstream speaks of
canonical counters (`GENERATION_TOKENS`, `ITL_SUM`, ...) per engine.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import NamedTuple
from urllib.parse import quote

from vllm_glassbox.core import disagg_page as kv
from vllm_glassbox.core import launchers
from vllm_glassbox.core.errors import ScrapeError
from vllm_glassbox.core.textformat import (
    DEFAULT_LIMITS,
    FORMAT_NAMES,
    Labels,
    Limits,
    Page,
    Samples,
    read_page,
)

# Canonical counter names. Values are cumulative, per (model_name, engine).
GENERATION_TOKENS = "generation_tokens"
PROMPT_TOKENS = "prompt_tokens"
TTFT_SUM = "ttft_sum"
TTFT_COUNT = "ttft_count"
ITL_SUM = "itl_sum"
ITL_COUNT = "itl_count"
ENGINE_STEPS = "engine_steps"
PREEMPTIONS = "preemptions"
REQUESTS_FINISHED = "requests_finished"
PREFILL_SUM = "request_prefill_sum"
PREFILL_COUNT = "request_prefill_count"
SPEC_DRAFTS = "spec_drafts"
SPEC_DRAFT_TOKENS = "spec_draft_tokens"
SPEC_ACCEPTED = "spec_accepted"
SPEC_ACCEPTED_AT = "spec_accepted_at/"  # + position: "spec_accepted_at/0", ...
# The sizes requests reached when they finished (vLLM's request-size histograms, observed
# at completion): prompt tokens and generated tokens, summed and counted.
REQUEST_PROMPT_SUM = "request_prompt_tokens_sum"
REQUEST_PROMPT_COUNT = "request_prompt_tokens_count"
REQUEST_OUTPUT_SUM = "request_generation_tokens_sum"
REQUEST_OUTPUT_COUNT = "request_generation_tokens_count"

# How long requests waited in the queue before they were first scheduled.
QUEUE_SUM = "request_queue_sum"
QUEUE_COUNT = "request_queue_count"

#: The `_sum` series among them. Only these may go down without a restart: a histogram can
#: observe a negative value (TTFT is measured on the wall clock, which can step back).
SUMS = frozenset(
    {TTFT_SUM, ITL_SUM, PREFILL_SUM, QUEUE_SUM, kv.KV_TRANSFER_SECONDS, kv.KV_TRANSFER_BYTES}
)

# Gauges, per engine.
RUNNING = "running"
WAITING = "waiting"
KV_USAGE = "kv_cache_usage"
#: vLLM 0.11.1+: `engine_sleep_state{sleep_state="awake"}`, 1 while the engine is awake, 0
#: while it sleeps (sleep mode, levels 0–2: its KV pool discarded). Absent on older pages.
AWAKE = "awake"

# Exposed counter sample name -> canonical name. Where vLLM has two names for the same
# observations, the first present wins (ITL: current name, then the one v0.11 still shows).
_COUNTERS: dict[str, tuple[str, ...]] = {
    GENERATION_TOKENS: ("vllm:generation_tokens_total",),
    PROMPT_TOKENS: ("vllm:prompt_tokens_total",),
    TTFT_SUM: ("vllm:time_to_first_token_seconds_sum",),
    TTFT_COUNT: ("vllm:time_to_first_token_seconds_count",),
    ITL_SUM: (
        "vllm:inter_token_latency_seconds_sum",
        "vllm:time_per_output_token_seconds_sum",
    ),
    ITL_COUNT: (
        "vllm:inter_token_latency_seconds_count",
        "vllm:time_per_output_token_seconds_count",
    ),
    ENGINE_STEPS: ("vllm:iteration_tokens_total_count",),
    PREEMPTIONS: ("vllm:num_preemptions_total",),
    REQUESTS_FINISHED: ("vllm:e2e_request_latency_seconds_count",),
    PREFILL_SUM: ("vllm:request_prefill_time_seconds_sum",),
    PREFILL_COUNT: ("vllm:request_prefill_time_seconds_count",),
    SPEC_DRAFTS: ("vllm:spec_decode_num_drafts_total",),
    SPEC_DRAFT_TOKENS: ("vllm:spec_decode_num_draft_tokens_total",),
    SPEC_ACCEPTED: ("vllm:spec_decode_num_accepted_tokens_total",),
    REQUEST_PROMPT_SUM: ("vllm:request_prompt_tokens_sum",),
    REQUEST_PROMPT_COUNT: ("vllm:request_prompt_tokens_count",),
    REQUEST_OUTPUT_SUM: ("vllm:request_generation_tokens_sum",),
    REQUEST_OUTPUT_COUNT: ("vllm:request_generation_tokens_count",),
    QUEUE_SUM: ("vllm:request_queue_time_seconds_sum",),
    QUEUE_COUNT: ("vllm:request_queue_time_seconds_count",),
}
_ACCEPTED_PER_POS = "vllm:spec_decode_num_accepted_tokens_per_pos_total"


def exposed_names(canonical: str) -> tuple[str, ...]:
    """vLLM's sample names of a canonical counter, the current one first (PromQL over
    vLLM's own series names them: `glassbox explain`)."""
    return _COUNTERS[canonical]


_GAUGES: dict[str, tuple[str, ...]] = {
    RUNNING: ("vllm:num_requests_running",),
    WAITING: ("vllm:num_requests_waiting",),
    KV_USAGE: ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"),
}
_CACHE_CONFIG = "vllm:cache_config_info"
# One series per engine and `sleep_state` (awake, weights_offloaded, discard_all), 0 or 1
# (vllm/v1/metrics/loggers.py `record_sleep_state`); glassbox reads the awake one.
_SLEEP_STATE = "vllm:engine_sleep_state"
_PROCESS_START = "process_start_time_seconds"
# CPU seconds of the process that answered: vLLM's API server (one API server: no
# multiprocess mode). The lab reads it to show how busy the API server was.
_PROCESS_CPU = "process_cpu_seconds_total"
# Numbers in cache_config_info for hybrid (attention + mamba) models only (0.11+; other
# models show "None", or "False" on some builds).
_MAMBA_LABELS = ("mamba_page_size_padded", "mamba_block_size")
# Series only the V0 engine shows (its swap-based scheduler).
_V0_ONLY = ("vllm:num_requests_swapped", "vllm:cpu_cache_usage_perc")

WANTED_SAMPLES: frozenset[str] = frozenset(
    [n for names in (*_COUNTERS.values(), *_GAUGES.values()) for n in names]
    + [_ACCEPTED_PER_POS, _CACHE_CONFIG, _SLEEP_STATE, _PROCESS_START, _PROCESS_CPU, *_V0_ONLY]
    + sorted(kv.WANTED)
)

#: vLLM's page with only the samples read here. vLLM answers /metrics itself (through
#: prometheus-fastapi-instrumentator: the whole page, whatever is asked), and mounts
#: prometheus_client's own app beneath it, which /metrics/ reaches and which renders only
#: the samples named by `name[]` (so in v0.11, 0.14, 0.24 and 0.32): about a third of
#: the API server's CPU per poll (benchmarks/bench_vllm_cost.py).
FILTERED_PAGE_PATH = "/metrics/?" + "&".join(
    f"name[]={quote(n, safe='')}" for n in sorted(WANTED_SAMPLES)
)


class EngineKey(NamedTuple):
    """One engine: its `model_name` and `engine` labels. A named tuple, not a dataclass: it
    keys every per-engine map, and a tuple hashes and compares in C (a poll does so
    hundreds of times)."""

    model_name: str
    engine: str


@dataclass(frozen=True)
class CacheConfig:
    """`vllm:cache_config_info` of one engine."""

    block_size: int | None
    num_gpu_blocks_total: int | None  # summed over data-parallel engines by vLLM
    engines: int  # how many engines report a cache config
    kv_cache_size_tokens: int | None  # v0.24+, per engine
    kv_cache_memory_bytes: int | None  # only when the user set it
    gpu_memory_utilization: float | None
    hybrid: bool = False  # mamba labels set: KV blocks shared by layer groups


@dataclass(frozen=True)
class EngineSample:
    counters: Mapping[str, float]
    gauges: Mapping[str, float]


@dataclass(frozen=True)
class Snapshot:
    """Everything glassbox reads from one page."""

    engines: Mapping[EngineKey, EngineSample]
    cache: Mapping[str, CacheConfig] = field(default_factory=dict)  # by engine label
    process_start_time: float | None = None
    process_cpu_seconds: float | None = None  # the API server's, where the page shows it
    # Shapes of the page glassbox does not read, with a sentence showing each
    # (`glassbox_input_unrecognised{source="page"}`).
    unrecognised: Mapping[str, str] = field(default_factory=dict)
    prefix: str = "vllm:"  # what vLLM's names started with on the page (read_snapshot)
    # The KV connectors whose transfer families the page shows ("nixl", "mooncake").
    kv_connectors: tuple[str, ...] = ()
    adapters: kv.Adapters | None = None  # with --enable-lora

    def cache_for(self, key: EngineKey) -> CacheConfig | None:
        return self.cache.get(key.engine)


def first_cache(snapshot: Snapshot | None) -> CacheConfig | None:
    """The cache config of the page's first engine: data-parallel engines are started
    with the same flags, so any one of them says what the pool was given."""
    if snapshot is None or not snapshot.engines:
        return None
    return snapshot.cache_for(next(iter(snapshot.engines)))


def _engine_key(labels: Labels) -> EngineKey:
    d = dict(labels)
    # V0 pages have no engine label: one engine, index 0.
    return EngineKey(d.get("model_name", ""), d.get("engine", "0"))


@functools.lru_cache(maxsize=4096)  # the same label sets poll after poll
def _engine_of(labels: Labels) -> EngineKey:
    """The engine of a series, its `pid` label (multiprocess mode) left out."""
    return _engine_key(_strip(labels, "pid"))


def _strip(labels: Labels, *names: str) -> Labels:
    return tuple((k, v) for k, v in labels if k not in names)


def _first_present(samples: Samples, names: tuple[str, ...]) -> dict[Labels, float] | None:
    for name in names:
        if name in samples:
            return samples[name]
    return None


def _float_label(d: Mapping[str, str], name: str) -> float | None:
    """A label's number; None when absent or not a finite, non-negative number."""
    raw = d.get(name)
    if raw is None or raw in ("None", ""):
        return None
    try:
        value = float(raw)
    except ValueError:
        return None
    return value if math.isfinite(value) and value >= 0 else None


def _int_label(d: Mapping[str, str], name: str) -> int | None:
    value = _float_label(d, name)
    return None if value is None else int(value)


def _cache_configs(series: Mapping[Labels, float] | None) -> dict[str, CacheConfig]:
    if not series:
        return {}
    by_engine = {dict(labels).get("engine", "0"): dict(labels) for labels in series}
    return {
        engine: CacheConfig(
            block_size=_int_label(d, "block_size"),
            num_gpu_blocks_total=_int_label(d, "num_gpu_blocks"),
            engines=len(by_engine),
            kv_cache_size_tokens=_int_label(d, "kv_cache_size_tokens"),
            kv_cache_memory_bytes=_int_label(d, "kv_cache_memory_bytes"),
            gpu_memory_utilization=_float_label(d, "gpu_memory_utilization"),
            hybrid=any((_int_label(d, name) or 0) > 0 for name in _MAMBA_LABELS),
        )
        for engine, d in by_engine.items()
    }


def snapshot_from_samples(samples: Samples, shapes: Mapping[str, str] | None = None) -> Snapshot:
    """Reduce the wanted samples of one page to per-engine numbers; `shapes`: what the
    page's reading named that glassbox does not read (`Snapshot.unrecognised`).

    Multi-API-server pages (vLLM's multiprocess mode) may carry a `pid` label: counters
    are summed over it, gauges take the max (v0.11.0's `kv_cache_usage_perc`).
    """
    counters: dict[EngineKey, dict[str, float]] = {}
    gauges: dict[EngineKey, dict[str, float]] = {}

    def add(
        target: dict[EngineKey, dict[str, float]],
        name: str,
        series: Mapping[Labels, float],
        combine: str,
    ) -> None:
        for labels, value in series.items():
            slot = target.setdefault(_engine_of(labels), {})
            if name in slot:
                slot[name] = slot[name] + value if combine == "sum" else max(slot[name], value)
            else:
                slot[name] = value

    for canonical, names in _COUNTERS.items():
        series = _first_present(samples, names)
        if series is not None:
            add(counters, canonical, series, "sum")
    for labels, value in samples.get(_ACCEPTED_PER_POS, {}).items():
        position = dict(labels).get("position", "")
        add(counters, SPEC_ACCEPTED_AT + position, {_strip(labels, "position"): value}, "sum")
    for canonical, names in _GAUGES.items():
        series = _first_present(samples, names)
        if series is not None:
            add(gauges, canonical, series, "max")
    for labels, value in samples.get(_SLEEP_STATE, {}).items():
        if dict(labels).get("sleep_state") == "awake":
            add(gauges, AWAKE, {_strip(labels, "sleep_state"): value}, "max")
    transfers, connectors = kv.connector_counters(samples)
    for canonical, series in transfers.items():
        add(counters, canonical, series, "sum")
    for canonical, labels, value in kv.labelled(samples, kv.LABELLED_COUNTERS):
        add(counters, canonical, {labels: value}, "sum")
    for canonical, labels, value in kv.labelled(samples, kv.LABELLED_GAUGES):
        add(gauges, canonical, {labels: value}, "max")

    keys = set(counters) | set(gauges)
    if not keys:
        raise ScrapeError(
            "no_vllm_metrics",
            "the page has no vllm: series (is vLLM started with --disable-log-stats?)",
        )
    start = samples.get(_PROCESS_START, {}).get((), None)
    unrecognised = dict(shapes or {})
    if _is_v0(samples):
        unrecognised |= _drop_untrusted_v0_counters(counters)
    unrecognised |= kv.transfer_shapes(samples, gauges, connectors)
    snapshot = Snapshot(
        engines={k: EngineSample(counters.get(k, {}), gauges.get(k, {})) for k in sorted(keys)},
        cache=_cache_configs(samples.get(_CACHE_CONFIG)),
        process_start_time=start,
        process_cpu_seconds=samples.get(_PROCESS_CPU, {}).get((), None),
        unrecognised=unrecognised,
        kv_connectors=tuple(connectors),
        adapters=kv.adapters_of(samples),
    )
    _check_engines_agree(snapshot)
    return snapshot


#: What `families_of` names the cache config by.
CACHE_CONFIG_FAMILY = "cache_config_info"


def families_of(snapshot: Snapshot, key: EngineKey) -> frozenset[str]:
    """The canonical names one engine has on the page: counters, gauges, cache config."""
    sample = snapshot.engines.get(key)
    names = set(sample.counters) | set(sample.gauges) if sample is not None else set()
    if key.engine in snapshot.cache:
        names.add(CACHE_CONFIG_FAMILY)
    return frozenset(names)


def _check_engines_agree(snapshot: Snapshot) -> None:
    """Every engine of a page has the same families, or the page is refused.

    vLLM gives each engine every family of the page (a data-parallel engine's metrics
    are made with its labels at startup), so engines that disagree mean a page cut
    between the engines' lines, which is valid text. Read as whole, cuts of vLLM 0.11's
    DP page gave engine 0 both engines' pool (engine 0's `cache_config_info` alone: the
    only engine holding the summed `num_gpu_blocks`) and 0.85 tokens per forward pass
    (the engines summed, one of them without its TTFT count).
    """
    engine_labels = {k.engine for k in snapshot.engines}
    unplaced = [EngineKey("", e) for e in sorted(snapshot.cache) if e not in engine_labels]
    models = sorted({k.model_name for k in snapshot.engines}) or [""]
    for model in models:  # the engines of one model (a page made of several is compared apart)
        keys = [k for k in snapshot.engines if k.model_name == model] + unplaced
        if len(keys) < 2:
            continue
        have = {key: families_of(snapshot, key) for key in keys}
        every = frozenset().union(*have.values())
        for key in keys:
            missing = every - have[key]
            if missing:
                raise ScrapeError(
                    "truncated",
                    f"engine {key.engine!r} lacks {_some(missing)} that another engine has "
                    "(a page cut between the engines' lines?)",
                )


def lost_since(before: Snapshot, after: Snapshot) -> str | None:
    """What a page lacks that the page before it, of the same vLLM process, had: an
    engine or one of an engine's families; None when nothing.

    vLLM keeps an engine's families for the life of its process, so a later page without
    one is cut short (at a family boundary, where every engine still agrees). Believing
    it would make the missing counters reappear at the next page as new ones, counted
    whole as one poll's increase. A new process may have other families: one seen by a
    changed `process_start_time_seconds`, or by a counter going down (multiprocess mode
    shows no `process_*`), which a page cut short never does."""
    if (
        before.process_start_time is not None
        and after.process_start_time is not None
        and before.process_start_time != after.process_start_time
    ):
        return None
    for key, sample in after.engines.items():
        old = before.engines[key].counters if key in before.engines else {}
        if any(n in old and v < old[n] for n, v in sample.counters.items() if n not in SUMS):
            return None
    for key in before.engines:
        if key not in after.engines:
            return f"engine {key.engine!r} of the previous page is missing"
        missing = families_of(before, key) - families_of(after, key)
        if missing:
            return f"engine {key.engine!r} lacks {_some(missing)} that the previous page had"
    return None


def _some(names: Iterable[str]) -> str:
    shown = sorted(names)
    more = f" and {len(shown) - 3} more" if len(shown) > 3 else ""
    return ", ".join(shown[:3]) + more


def _is_spec(name: str) -> bool:
    return name in (SPEC_DRAFTS, SPEC_DRAFT_TOKENS, SPEC_ACCEPTED) or name.startswith(
        SPEC_ACCEPTED_AT
    )


# Counters of a V0 page that count something else than their V1 namesakes, by the shape
# glassbox_input_unrecognised names (vllm-metrics.md §7).
_V0_UNTRUSTED: dict[str, tuple[Callable[[str], bool], str]] = {
    # Observed at every periodic stats log too, with 0 tokens: no count of engine steps.
    "v0_engine_steps": (
        lambda name: name == ENGINE_STEPS,
        "V0 page: vllm:iteration_tokens_total also observes 0-token steps",
    ),
    # The sampler's running totals added at every stats log: they grow quadratically.
    "v0_spec_counters": (
        _is_spec,
        "V0 page: vllm:spec_decode_* counters add running totals at every stats log",
    ),
}


def _drop_untrusted_v0_counters(counters: Mapping[EngineKey, dict[str, float]]) -> dict[str, str]:
    """Remove (in place) the counters of a V0 page that no derived value may use, and name
    each shape found."""
    shapes: dict[str, str] = {}
    for shape, (untrusted, why) in _V0_UNTRUSTED.items():
        for engine_counters in counters.values():
            for name in [n for n in engine_counters if untrusted(n)]:
                del engine_counters[name]
                shapes[shape] = why
    return shapes


def _is_v0(samples: Samples) -> bool:
    """A page of the V0 engine: its own series, or counters without V1's engine label."""
    if any(name in samples for name in _V0_ONLY):
        return True
    counted = [
        labels for names in _COUNTERS.values() for n in names for labels in samples.get(n, {})
    ]
    return bool(counted) and not any("engine" in dict(labels) for labels in counted)


#: The shape glassbox_input_unrecognised names for OpenMetrics 2.0's composite histograms.
COMPOSITE_SHAPE = "openmetrics2_composite_histograms"


def page_shapes(page: Page) -> dict[str, str]:
    """What a page's reading found that glassbox does not read, by shape."""
    if not page.composite:
        return {}
    return {
        COMPOSITE_SHAPE: f"{FORMAT_NAMES[page.format]} page with composite histograms (not "
        f"read: their _sum and _count absent): {_some(page.composite)}"
    }


def read_snapshot(
    text: str,
    limits: Limits = DEFAULT_LIMITS,
    content_type: str | None = None,
    prefix: str = launchers.VLLM_PREFIX,
) -> Snapshot:
    """Parse a /metrics page into a Snapshot (raises ScrapeError); its grammar by
    `content_type` (the HTTP header), else by what the page shows. `prefix`: what vLLM's
    names start with on this page (`vllm:`, or `ray_vllm_` behind Ray Serve), or
    AUTO_PREFIX: whichever one known prefix the page shows."""
    if prefix == launchers.VLLM_PREFIX or (
        prefix == launchers.AUTO_PREFIX and "ray_vllm" not in text
    ):
        page = read_page(text, WANTED_SAMPLES, limits, content_type)
        return snapshot_from_samples(page.samples, page_shapes(page))
    names = launchers.prefixed(WANTED_SAMPLES, prefix)
    page = read_page(text, names, limits, content_type)
    shown, samples = launchers.under_one_prefix(page.samples, names)
    launchers.check_one_replica(samples)
    snapshot = snapshot_from_samples(samples, page_shapes(page))
    return replace(snapshot, prefix=shown)


def spec_positions(counters: Iterable[str]) -> list[str]:
    """Draft positions present among counter names, in numeric order."""
    positions = [c[len(SPEC_ACCEPTED_AT) :] for c in counters if c.startswith(SPEC_ACCEPTED_AT)]
    return sorted(positions, key=lambda p: (len(p), p))
