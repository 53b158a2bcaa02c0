"""Scenes from Prometheus: one per model and namespace in the selection, over a window.

Every number is one PromQL query's answer for all the selected models at once (so a
fleet costs the same few queries as one model), run side by side:

- vLLM's counters: `sum by (namespace, model_name) (increase(COUNTER{…}[W]))` — rate
  first (increase handles counter resets), then the sum over engines and replicas, never
  an average of ratios; the ratios are the derivation core's, over these sums;
- vLLM's gauges over the window: the fullest pool, the longest queue, the mean running
  requests and used tokens;
- each engine's pool as the alerts judge it (`pool_queries`, by namespace, job, instance,
  pod, model_name and engine): the peaks and last values of its gauges, its preemptions'
  `increase` and times, and its exporter's two forecasts, joined to the engine by what
  the two targets share (namespace, pod, model_name, engine);
- the exporters' series (weights, peak bandwidth, the pool in tokens and bytes, the time
  to exhaustion, cold starts, failed polls, unrecognised inputs). The exporter-wide ones
  carry no `model_name`: each is joined to the models its exporter serves through the
  exporter's own per-engine series (same namespace, job and instance);
- the SLO rules' records at the window's end (docs/slo.md: error ratios over their own
  windows, target, budget left, series without the objective's bucket) and their burn
  alerts firing, where the rules are loaded (nothing, where they are not).

A query Prometheus refuses, or Prometheus out of reach, is a `PrometheusError`;
a selection with nothing in it is `NothingHere` (no vLLM series at all) or `NotFound`
(none for the namespace or model asked, with the ones there are).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from vllm_glassbox.core import derive, series
from vllm_glassbox.core import snapshot as s
from vllm_glassbox.core.prometheus import Prometheus
from vllm_glassbox.explain.promql import (
    BY,
    COUNTERS,
    ENGINE_BY,
    FORECAST_BY,
    GPU_BY,
    Answers,
    Key,
    Selection,
    ask,
    key_of,
    queries,
    value_of,
)
from vllm_glassbox.explain.scene import Blind, EnginePool, Reading, Scene, Scope, Window
from vllm_glassbox.explain.slo_records import objectives, with_slo_file


class NothingHere(LookupError):
    """Prometheus has no vLLM series at all over the window."""


class NotFound(LookupError):
    """No vLLM series for the namespace or model asked; the message names those there are."""


def keys(client: Prometheus, sel: Selection) -> list[Key]:
    """The models (and namespaces) the selection names, with vLLM series over the window;
    NothingHere or NotFound when there is none."""
    found = client.query(
        f"count by ({BY}) (last_over_time(vllm:num_requests_running{sel.selector()}{sel.range}))",
        sel.at,
    )
    if found:
        return sorted({key_of(r["metric"]) for r in found})
    anywhere = client.query(
        f"count by ({BY}) (last_over_time(vllm:num_requests_running{sel.range}))", sel.at
    )
    if not anywhere:
        exporters = client.query(
            f"count(last_over_time({series.BUILD_INFO.name}{sel.range}))", sel.at
        )
        also = (
            f"; it has {int(value_of(exporters[0]))} glassbox exporters' series, so it scrapes the "
            "exporters but not vLLM itself (vLLM's /metrics must be a target too)"
            if exporters
            else ""
        )
        raise NothingHere(
            f"Prometheus at {sel.prometheus_url} has no vLLM series "
            f"(vllm:num_requests_running) in the {sel.window_seconds:g} s before "
            f"{_when(sel.at)}{also}"
        )
    there = sorted({key_of(r["metric"]) for r in anywhere})
    listed = ", ".join(
        f"{model or '(no model_name)'}" + (f" in {namespace}" if namespace else "")
        for namespace, model in there[:20]
    )
    more = f" and {len(there) - 20} more" if len(there) > 20 else ""
    raise NotFound(
        f"Prometheus at {sel.prometheus_url} has no vLLM series for {sel.asked()} in the "
        f"{sel.window_seconds:g} s before {_when(sel.at)}; it has: {listed}{more}"
    )


def _when(unix: float) -> str:
    import datetime

    return datetime.datetime.fromtimestamp(unix, datetime.UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def read_scenes(
    client: Prometheus, sel: Selection, gpu_memory: Reading | None = None
) -> list[Scene]:
    """One scene per model and namespace of the selection."""
    wanted = keys(client, sel)
    answers = ask(client, sel)
    return [scene_of(answers, key, sel, gpu_memory) for key in wanted]


def _label_reading(
    answers: Answers, name: str, key: Key, label: str, parse: Callable[[str], float]
) -> Reading | None:
    for result in answers.by_key(name).get(key, []):
        raw = result["metric"].get(label)
        try:
            value = parse(raw) if raw not in (None, "", "None") else None
        except ValueError:
            value = None
        if value is not None and math.isfinite(value):
            return Reading(value, f"{answers.asked[name]}: label {label}")
    return None


def scene_of(answers: Answers, key: Key, sel: Selection, gpu_memory: Reading | None) -> Scene:
    namespace, model = key
    r = answers.reading
    engines = r("engines", key)
    counters = {}
    for counter in COUNTERS:
        reading = r(f"increase/{counter}", key)
        if reading is not None:
            counters[counter] = reading.value
    template = answers.asked[f"increase/{s.GENERATION_TOKENS}"].replace(
        s.exposed_names(s.GENERATION_TOKENS)[0], "vllm:<counter>"
    )
    decode = Window(derive.Increase(counters, sel.window_seconds), template)
    waiting = {
        result["metric"].get("reason", ""): value_of(result)
        for result in answers.by_key("waiting_by_reason").get(key, [])
    }
    fixed = _label_reading(answers, "cache_config", key, "kv_cache_memory_bytes", float)
    layout = answers.by_key("layout").get(key, [])
    tp = pp = 1
    if layout:
        tp = int(layout[0]["metric"].get("tensor_parallel", "1") or 1)
        pp = int(layout[0]["metric"].get("pipeline_parallel", "1") or 1)
    versions = answers.by_key("version").get(key, [])
    active = r("active_weights", key)
    blind = _blind(answers, key, sel)
    framebuffer = _framebuffer(answers, key)
    return Scene(
        Scope(
            source="prometheus",
            where=sel.prometheus_url,
            namespace=namespace or None,
            model=model or None,
            engines=int(engines.value) if engines else 0,
            window_seconds=sel.window_seconds,
            at=sel.at,
        ),
        decode=decode,
        weights=active or r("weights", key),
        mixture_of_experts=active is not None,
        peak_bandwidth=r("peak_bandwidth", key),
        tensor_parallel=tp,
        pipeline_parallel=pp,
        gpu_memory=gpu_memory,
        vllm_version=versions[0]["metric"].get("version") if versions else None,
        kv_capacity=r("kv_capacity", key),
        kv_block_size=r("kv_block_size", key),
        kv_memory=r("kv_memory", key),
        kv_memory_fixed=fixed is not None,
        gpu_memory_utilization=_label_reading(
            answers, "cache_config", key, "gpu_memory_utilization", float
        ),
        kv_usage_peak=r("kv_usage_peak", key),
        kv_used_mean=r("kv_used_mean", key),
        running_mean=r("running_mean", key),
        running_peak=r("running_peak", key),
        waiting_peak=r("waiting_peak", key),
        waiting_capacity_peak=(
            Reading(waiting["capacity"], answers.asked["waiting_by_reason"])
            if "capacity" in waiting
            else None
        ),
        waiting_deferred_peak=(
            Reading(waiting["deferred"], answers.asked["waiting_by_reason"])
            if "deferred" in waiting
            else None
        ),
        kv_exhaustion=r("kv_exhaustion", key),
        dcgm_fb_used=framebuffer[0],
        dcgm_fb_free=framebuffer[1],
        dcgm_dram_active=r("dcgm_dram_active", key),
        hourly_cost=r("hourly_cost", key),
        pools=pools_of(answers, key),
        spec_configured=bool(answers.by_key("spec").get(key)),
        startup=_startup(answers, key),
        objectives=objectives(answers, key),
        blind=blind,
    )


Engine = tuple[str, ...]  # the values of ENGINE_BY's labels, in its order
_ENGINE = tuple(label.strip() for label in ENGINE_BY.split(","))
_FORECAST = tuple(label.strip() for label in FORECAST_BY.split(","))
_GPU = tuple(label.strip() for label in GPU_BY.split(","))


def _labels(result: dict[str, Any], names: tuple[str, ...]) -> Engine:
    return tuple(result["metric"].get(n, "") for n in names)


def pools_of(answers: Answers, key: Key) -> tuple[EnginePool, ...]:
    """Each engine of the model with its usage over the window, as the alerts judge it.
    An exporter's forecasts join the engine of the vLLM target they share namespace, pod,
    model and engine with; where several share them (replicas with no `pod`), none."""

    def by_engine(name: str, labels: tuple[str, ...] = _ENGINE) -> dict[Engine, Reading]:
        out = {}
        for result in answers.by_key(name).get(key, []):
            value = value_of(result)
            if math.isfinite(value):
                out[_labels(result, labels)] = Reading(value, answers.asked[name])
        return out

    peak = by_engine("pool_usage_peak")
    readings = {
        field: by_engine(name)
        for field, name in (
            ("usage_now", "pool_usage_now"),
            ("peak_running", "pool_running_peak"),
            ("peak_waiting", "pool_waiting_peak"),
            ("preemptions", "pool_preemptions"),
            ("first_preemption_at", "pool_first_preemption"),
            ("last_preemption_at", "pool_last_preemption"),
        )
    }
    reasons: dict[str, dict[Engine, Reading]] = {"capacity": {}, "deferred": {}}
    for result in answers.by_key("pool_waiting_by_reason").get(key, []):
        reason = result["metric"].get("reason", "")
        if reason in reasons and math.isfinite(value_of(result)):
            reasons[reason][_labels(result, _ENGINE)] = Reading(
                value_of(result), answers.asked["pool_waiting_by_reason"]
            )
    exhaustion = by_engine("pool_exhaustion", _FORECAST)
    at_completion = by_engine("pool_at_completion", _FORECAST)
    shared: dict[Engine, int] = {}
    for engine in peak:
        shared[_forecast_key(engine)] = shared.get(_forecast_key(engine), 0) + 1
    alike = {(e[-2], e[-1]) for e in peak}
    out = []
    for engine in sorted(peak):
        joined = _forecast_key(engine)
        unique = shared[joined] == 1
        out.append(
            EnginePool(
                engine=_engine_name(engine, several=len(alike) < len(peak)),
                peak_usage=peak[engine],
                peak_waiting_capacity=reasons["capacity"].get(engine),
                peak_waiting_deferred=reasons["deferred"].get(engine),
                exhaustion_seconds=exhaustion.get(joined) if unique else None,
                headroom_at_completion=at_completion.get(joined) if unique else None,
                **{field: values.get(engine) for field, values in readings.items()},
            )
        )
    return tuple(out)


def _forecast_key(engine: Engine) -> Engine:
    labels = dict(zip(_ENGINE, engine, strict=True))
    return tuple(labels[n] for n in _FORECAST)


def _engine_name(engine: Engine, several: bool) -> str:
    """model/engine, as the exporter names it; with the target where replicas share it."""
    labels = dict(zip(_ENGINE, engine, strict=True))
    name = f"{labels['model_name']}/{labels['engine']}"
    if not several:
        return name
    where = labels["pod"] or labels["instance"]
    return f"{name} of {where}" if where else name


def _framebuffer(answers: Answers, key: Key) -> tuple[Reading | None, Reading | None]:
    """dcgm-exporter's framebuffer used and free (MiB) of one GPU of the model's pods: the
    first, by its labels, showing both."""
    used = {_labels(r, _GPU): r for r in answers.by_key("dcgm_fb_used").get(key, [])}
    free = {_labels(r, _GPU): r for r in answers.by_key("dcgm_fb_free").get(key, [])}
    for gpu in sorted(used.keys() & free.keys()):
        pair = value_of(used[gpu]), value_of(free[gpu])
        if all(math.isfinite(v) for v in pair):
            return (
                Reading(pair[0], answers.asked["dcgm_fb_used"]),
                Reading(pair[1], answers.asked["dcgm_fb_free"]),
            )
    return None, None


def _startup(answers: Answers, key: Key) -> dict[str, Reading]:
    """The stages of the slowest latest start among the model's exporters."""
    starts = answers.by_key("startup").get(key, [])
    if not starts:
        return {}
    slowest = max(starts, key=value_of)
    where = {k: slowest["metric"].get(k) for k in ("job", "instance", "start")}
    out = {"total": Reading(value_of(slowest), answers.asked["startup"])}
    for result in answers.by_key("startup_stages").get(key, []):
        labels = result["metric"]
        if all(labels.get(k) == v for k, v in where.items()):
            out[labels.get("stage", "")] = Reading(
                value_of(result), answers.asked["startup_stages"]
            )
    return out


def _blind(answers: Answers, key: Key, sel: Selection) -> tuple[Blind, ...]:
    out = []
    down = answers.reading("target_down", key)
    if down is not None:
        out.append(Blind("target_down", "glassbox_target_up 0", down.value, down.source))
    failed = answers.by_key("failed_polls").get(key, [])
    if failed:
        reasons = sorted(r["metric"].get("reason", "?") for r in failed)
        out.append(
            Blind(
                "failed_polls",
                f"by reason: {', '.join(reasons)}",
                math.fsum(value_of(r) for r in failed),
                answers.asked["failed_polls"],
            )
        )
    for result in answers.by_key("unrecognised").get(key, []):
        labels = result["metric"]
        out.append(
            Blind(
                "input_unrecognised",
                f"vLLM's {labels.get('source', '?')} has a shape glassbox does not read, "
                f"{labels.get('shape', '?')}",
                None,
                answers.asked["unrecognised"],
                labels.get("shape"),
            )
        )
    if not answers.by_key("exporters").get(key):
        out.append(
            Blind(
                "no_exporter",
                "no glassbox exporter series for this model in the window "
                f"({series.WINDOW_COVERED.name})",
                None,
                answers.asked["exporters"],
            )
        )
    for result in answers.answered.get("scrape_failed", []):
        labels = result["metric"]
        if labels.get("namespace", "") != key[0]:
            continue
        out.append(
            Blind(
                "scrape_failed",
                f"job {labels.get('job', '?')}",
                value_of(result),
                answers.asked["scrape_failed"],
            )
        )
    return tuple(out)


__all__ = [
    "NotFound",
    "NothingHere",
    "Selection",
    "keys",
    "queries",
    "read_scenes",
    "scene_of",
    "with_slo_file",
]
