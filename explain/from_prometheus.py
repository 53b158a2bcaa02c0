"""Scenes from Prometheus: one per model and namespace in the selection, over a window.

Every number is one PromQL query's answer for all the selected models at once (so a
fleet costs the same few queries as one model), run side by side:

- vLLM's counters: `sum by (namespace, model_name) (increase(COUNTER{…}[W]))` — rate
  first (increase handles counter resets), then the sum over engines and replicas, never
  an average of ratios; the ratios are the derivation core's, over these sums;
- vLLM's gauges over the window: the fullest pool, the longest queue, the mean running
  requests and used tokens;
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

import concurrent.futures
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any

from vllm_glassbox.core import derive, series
from vllm_glassbox.core import snapshot as s
from vllm_glassbox.core.prometheus import Prometheus
from vllm_glassbox.core.slo import SloFile
from vllm_glassbox.explain.scene import Blind, ObjectiveState, Reading, Scene, Scope, Window

Key = tuple[str, str]  # (namespace, model_name); "" where a label is absent

#: vLLM's counters read over the window (their canonical names: core/snapshot.py).
COUNTERS = (
    s.GENERATION_TOKENS,
    s.PROMPT_TOKENS,
    s.TTFT_SUM,
    s.TTFT_COUNT,
    s.ITL_SUM,
    s.ITL_COUNT,
    s.ENGINE_STEPS,
    s.PREEMPTIONS,
    s.SPEC_DRAFTS,
    s.SPEC_DRAFT_TOKENS,
    s.SPEC_ACCEPTED,
)
BY = "namespace, model_name"
#: The SLO rules' records (glassbox/slo_rules.yaml) an objective is read from.
SLO_RECORD = "namespace_job_model_name_slo:glassbox_slo_"
SLO_RECORDS = (
    "target:ratio",
    "error_ratio:",
    "error_budget_remaining:ratio",
    "boundary_missing:count",
)
#: The labels of an SLO record that say which objective of which model it is; the others
#: (job, and aggregation labels such as cluster) tell its series apart.
SLO_IDENTITY = ("__name__", "namespace", "model_name", "slo", "sli", "threshold")


class NothingHere(LookupError):
    """Prometheus has no vLLM series at all over the window."""


class NotFound(LookupError):
    """No vLLM series for the namespace or model asked; the message names those there are."""


@dataclass(frozen=True)
class Selection:
    prometheus_url: str
    namespace: str | None
    model: str | None
    window_seconds: float
    at: float  # unix seconds the window ends

    def selector(self, model: bool = True, extra: str = "") -> str:
        """The label matchers of the selection (`model`: with its model_name)."""
        matchers = []
        if self.namespace is not None:
            matchers.append(f'namespace="{_escaped(self.namespace)}"')
        if model and self.model is not None:
            matchers.append(f'model_name="{_escaped(self.model)}"')
        if extra:
            matchers.append(extra)
        return "{" + ",".join(matchers) + "}"

    @property
    def range(self) -> str:
        return f"[{self.window_seconds:g}s]"

    def asked(self) -> str:
        parts = [f"namespace {self.namespace!r}" if self.namespace is not None else None]
        parts.append(f"model {self.model!r}" if self.model is not None else None)
        named = " and ".join(p for p in parts if p)
        return named or "any model"


def _escaped(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"')


def _models_join(sel: Selection) -> str:
    """Multiplying an exporter-wide series by this gives it the model_name of every model
    its exporter served over the window (the per-engine series carry it)."""
    covered = f"{series.WINDOW_COVERED.name}{sel.selector()}"
    return (
        " * on (namespace, job, instance) group_left (model_name) "
        f"group by (namespace, job, instance, model_name) (last_over_time({covered}{sel.range}))"
    )


def queries(sel: Selection) -> dict[str, str]:
    """Every query one reading takes, by name."""
    m, ns, w = sel.selector(), sel.selector(model=False), sel.range
    join = _models_join(sel)

    def exporter_wide(name: str, aggregate: str = "max", labels: str = "") -> str:
        by = f"{BY}, {labels}" if labels else BY
        return f"{aggregate} by ({by}) (last_over_time({name}{ns}{w}){join})"

    q = {
        "engines": (
            f"count by ({BY}) (group by (namespace, job, instance, model_name, engine) "
            f"(last_over_time(vllm:num_requests_running{m}{w})))"
        ),
        "spec": f"count by ({BY}) (last_over_time(vllm:spec_decode_num_drafts_total{m}{w}))",
        "kv_usage_peak": f"max by ({BY}) (max_over_time(vllm:kv_cache_usage_perc{m}{w}))",
        "running_mean": f"sum by ({BY}) (avg_over_time(vllm:num_requests_running{m}{w}))",
        "running_peak": f"max by ({BY}) (max_over_time(vllm:num_requests_running{m}{w}))",
        "waiting_peak": f"max by ({BY}) (max_over_time(vllm:num_requests_waiting{m}{w}))",
        "waiting_by_reason": (
            f"max by ({BY}, reason) (max_over_time(vllm:num_requests_waiting_by_reason{m}{w}))"
        ),
        # cache_config_info has no model_name: joined through the engine's other series.
        "cache_config": (
            f"group by ({BY}, gpu_memory_utilization, kv_cache_memory_bytes) "
            f"(last_over_time(vllm:cache_config_info{ns}{w}) * on (namespace, job, instance, "
            "engine) group_left (model_name) group by (namespace, job, instance, engine, "
            f"model_name) (last_over_time(vllm:num_requests_running{m}{w})))"
        ),
        "kv_used_mean": f"sum by ({BY}) (avg_over_time({series.KV_USED.name}{m}{w}))",
        "kv_capacity": f"max by ({BY}) (last_over_time({series.KV_CAPACITY.name}{m}{w}))",
        "kv_block_size": f"max by ({BY}) (last_over_time({series.KV_BLOCK_SIZE.name}{m}{w}))",
        # Now, not over the window: a forecast of the pool as it is at the window's end.
        "kv_exhaustion": f"min by ({BY}) ({series.KV_EXHAUSTION.name}{m})",
        "kv_memory": exporter_wide(series.KV_MEMORY.name),
        "weights": exporter_wide(series.WEIGHTS_BYTES.name),
        "active_weights": exporter_wide(series.ACTIVE_WEIGHTS_BYTES.name),
        "peak_bandwidth": exporter_wide(series.PEAK_BANDWIDTH.name),
        "layout": exporter_wide(
            series.PARALLEL_INFO.name, "group", "tensor_parallel, pipeline_parallel"
        ),
        "version": exporter_wide(series.VLLM_INFO.name, "group", "version"),
        "target_down": (f"count by ({BY}) (({series.TARGET_UP.name}{ns} == 0){join})"),
        "failed_polls": (
            f"sum by ({BY}, reason) (increase({series.SCRAPE_ERRORS.name}"
            f"{sel.selector(model=False, extra='reason!=' + chr(34) + 'slow' + chr(34))}{w})"
            f"{join}) > 0"
        ),
        "unrecognised": exporter_wide(series.INPUT_UNRECOGNISED.name, "group", "source, shape"),
        "exporters": f"count by ({BY}) (group by (namespace, job, instance, model_name) "
        f"(last_over_time({series.WINDOW_COVERED.name}{m}{w})))",
        "scrape_failed": f"count by (namespace, job) (up{ns} == 0)",
        "startup": f"last_over_time({series.STARTUP.name}{m}{w})",
        "startup_stages": f"last_over_time({series.STARTUP_STAGE.name}{m}{w})",
        # Now, as the alerts see them: each record is over windows of its own.
        "slo": sel.selector(extra=f'__name__=~"{SLO_RECORD}({"|".join(SLO_RECORDS)}).*"'),
        "slo_alerts": "ALERTS" + sel.selector(extra='alertname=~"VLLMSLO.+", alertstate="firing"'),
    }
    for counter in COUNTERS:
        q[f"increase/{counter}"] = " or ".join(
            f"sum by ({BY}) (increase({name}{m}{w}))" for name in s.exposed_names(counter)
        )
    return q


def _key(metric: Mapping[str, str]) -> Key:
    return metric.get("namespace", ""), metric.get("model_name", "")


def _value(result: Mapping[str, Any]) -> float:
    return float(result["value"][1])


class Answers:
    """Every query's answer, by name; each query's PromQL for the evidence."""

    def __init__(self, asked: Mapping[str, str], answered: Mapping[str, list[dict[str, Any]]]):
        self.asked = asked
        self.answered = answered
        self._by_key: dict[str, dict[Key, list[dict[str, Any]]]] = {}

    def by_key(self, name: str) -> dict[Key, list[dict[str, Any]]]:
        """A query's results by model and namespace (indexed once: a fleet has hundreds)."""
        if name not in self._by_key:
            out: dict[Key, list[dict[str, Any]]] = {}
            for result in self.answered.get(name, []):
                out.setdefault(_key(result["metric"]), []).append(result)
            self._by_key[name] = out
        return self._by_key[name]

    def reading(self, name: str, key: Key) -> Reading | None:
        results = self.by_key(name).get(key, [])
        if not results:
            return None
        value = _value(results[0])
        return Reading(value, self.asked[name]) if math.isfinite(value) else None


def ask(client: Prometheus, sel: Selection, workers: int = 8) -> Answers:
    """Every query at the window's end, side by side."""
    asked = queries(sel)
    with concurrent.futures.ThreadPoolExecutor(max_workers=workers) as pool:
        futures = {name: pool.submit(client.query, expr, sel.at) for name, expr in asked.items()}
        answered = {name: future.result() for name, future in futures.items()}
    return Answers(asked, answered)


def keys(client: Prometheus, sel: Selection) -> list[Key]:
    """The models (and namespaces) the selection names, with vLLM series over the window;
    NothingHere or NotFound when there is none."""
    found = client.query(
        f"count by ({BY}) (last_over_time(vllm:num_requests_running{sel.selector()}{sel.range}))",
        sel.at,
    )
    if found:
        return sorted({_key(r["metric"]) for r in found})
    anywhere = client.query(
        f"count by ({BY}) (last_over_time(vllm:num_requests_running{sel.range}))", sel.at
    )
    if not anywhere:
        exporters = client.query(
            f"count(last_over_time({series.BUILD_INFO.name}{sel.range}))", sel.at
        )
        also = (
            f"; it has {int(_value(exporters[0]))} glassbox exporters' series, so it scrapes the "
            "exporters but not vLLM itself (vLLM's /metrics must be a target too)"
            if exporters
            else ""
        )
        raise NothingHere(
            f"Prometheus at {sel.prometheus_url} has no vLLM series "
            f"(vllm:num_requests_running) in the {sel.window_seconds:g} s before "
            f"{_when(sel.at)}{also}"
        )
    there = sorted({_key(r["metric"]) for r in anywhere})
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
        result["metric"].get("reason", ""): _value(result)
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
        spec_configured=bool(answers.by_key("spec").get(key)),
        startup=_startup(answers, key),
        objectives=_objectives(answers, key),
        blind=blind,
    )


def _series_text(labels: Mapping[str, str]) -> str:
    """A record's series as a selector to run again: its name, its objective's labels and
    the ones that tell its series apart."""
    order = ("namespace", "job", "model_name", "slo")
    keys = [k for k in order if k in labels]
    keys += sorted(k for k in labels if k not in SLO_IDENTITY and k not in order)
    matchers = ", ".join(f'{k}="{_escaped(labels[k])}"' for k in keys)
    return f"{labels['__name__']}{{{matchers}}}"


def _label_number(labels: Mapping[str, str], label: str) -> float | None:
    try:
        value = float(labels.get(label, ""))
    except ValueError:
        return None  # absent, or no number: unknown
    return value if math.isfinite(value) else None


def _objectives(answers: Answers, key: Key) -> tuple[ObjectiveState, ...]:
    """Each objective of the model (and job…) its records show, with its alerts firing."""
    found: dict[tuple[str, tuple[tuple[str, str], ...]], dict[str, Any]] = {}
    for result in answers.by_key("slo").get(key, []):
        labels = result["metric"]
        value = _value(result)
        if "slo" not in labels or not math.isfinite(value):
            continue
        others = tuple(sorted((k, v) for k, v in labels.items() if k not in SLO_IDENTITY))
        state = found.setdefault(
            (labels["slo"], others), {"sli": labels.get("sli", ""), "error_ratios": {}}
        )
        record = labels["__name__"].removeprefix(SLO_RECORD)
        reading = Reading(value, _series_text(labels))
        if record.startswith("error_ratio:"):
            state["error_ratios"][record.removeprefix("error_ratio:")] = reading
        else:
            state[record.partition(":")[0]] = reading
        threshold = _label_number(labels, "threshold")
        if threshold is not None and "threshold" not in state:
            target = _series_text({**labels, "__name__": f"{SLO_RECORD}target:ratio"})
            state["threshold"] = Reading(threshold, f"{target}: label threshold")
    alerts = answers.by_key("slo_alerts").get(key, [])
    out = []
    for (name, others), state in sorted(found.items()):
        firing = sorted(
            {
                a["metric"].get("alertname", "")
                for a in alerts
                if a["metric"].get("slo") == name
                and all(a["metric"].get(k) == v for k, v in others)
            }
        )
        out.append(
            ObjectiveState(
                name,
                state["sli"],
                dict(others),
                threshold=state.get("threshold"),
                target=state.get("target"),
                error_ratios=state["error_ratios"],
                budget_remaining=state.get("error_budget_remaining"),
                boundary_missing=state.get("boundary_missing"),
                firing=tuple(firing),
                alerts_source=answers.asked["slo_alerts"],
            )
        )
    return tuple(out)


def with_slo_file(scene: Scene, slo: SloFile) -> Scene:
    """The scene with what an SLO file says of its model: each objective's own threshold
    (the records have the bucket boundary counted), and the file's objectives of this model
    that Prometheus has no record of."""
    namespace, model = scene.scope.namespace, scene.scope.model or ""
    objectives = list(scene.objectives)
    for o in slo.objectives:
        if o.namespace not in (None, namespace) or not o.applies_to(model):
            continue
        asked = (
            Reading(o.threshold_seconds, f"{slo.source}: objective {o.name}, threshold")
            if o.threshold_seconds is not None
            else None
        )
        named = [i for i, state in enumerate(objectives) if state.name == o.name]
        for i in named:
            objectives[i] = replace(objectives[i], asked_in=slo.source, asked_threshold=asked)
        if not named:
            objectives.append(
                ObjectiveState(o.name, o.sli, asked_in=slo.source, asked_threshold=asked)
            )
    return replace(scene, objectives=tuple(objectives))


def _startup(answers: Answers, key: Key) -> dict[str, Reading]:
    """The stages of the slowest latest start among the model's exporters."""
    starts = answers.by_key("startup").get(key, [])
    if not starts:
        return {}
    slowest = max(starts, key=_value)
    where = {k: slowest["metric"].get(k) for k in ("job", "instance", "start")}
    out = {"total": Reading(_value(slowest), answers.asked["startup"])}
    for result in answers.by_key("startup_stages").get(key, []):
        labels = result["metric"]
        if all(labels.get(k) == v for k, v in where.items()):
            out[labels.get("stage", "")] = Reading(_value(result), answers.asked["startup_stages"])
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
                math.fsum(_value(r) for r in failed),
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
                _value(result),
                answers.asked["scrape_failed"],
            )
        )
    return tuple(out)
