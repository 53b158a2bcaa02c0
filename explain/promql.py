"""The PromQL of a reading from Prometheus: the selection (namespace, model, window), every
query one reading takes for all its models at once, and their answers by model.

The counters are `sum by (namespace, model_name) (increase(COUNTER{…}[W]))`: rate first
(increase handles counter resets), then the sum over engines and replicas. The
exporter-wide series carry no `model_name`: each is joined to the models its exporter
serves through the exporter's own per-engine series (same namespace, job and instance).
"""

from __future__ import annotations

import concurrent.futures
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from vllm_glassbox.core import series
from vllm_glassbox.core import snapshot as s
from vllm_glassbox.core.prometheus import Prometheus
from vllm_glassbox.explain.scene import Reading

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
#: One engine's pool: the alerts' labels (alerts/glassbox-alerts.yaml), and `pod`, which
#: vLLM's target shares with its exporter's in Kubernetes (the pair's job and instance
#: differ: two targets) and is empty elsewhere.
ENGINE_BY = "namespace, job, instance, pod, model_name, engine"
#: An exporter's engine: what its forecasts share with the vLLM target of that engine.
FORECAST_BY = "namespace, pod, model_name, engine"
#: The most steps of the subquery that finds the first and last preemption of a window.
PREEMPTION_STEPS = 600
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
            matchers.append(f'namespace="{escaped(self.namespace)}"')
        if model and self.model is not None:
            matchers.append(f'model_name="{escaped(self.model)}"')
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


def escaped(value: str) -> str:
    """`value` as a PromQL string literal's inside."""
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
    q |= pool_queries(sel)
    q |= gpu_queries(sel)
    for counter in COUNTERS:
        q[f"increase/{counter}"] = " or ".join(
            f"sum by ({BY}) (increase({name}{m}{w}))" for name in s.exposed_names(counter)
        )
    return q


#: A GPU's labels in dcgm-exporter's series that tell one GPU from another.
GPU_BY = "namespace, pod, model_name, Hostname, gpu, UUID"


def _pods_join(sel: Selection) -> str:
    """Multiplying one of dcgm-exporter's series by this gives each GPU the model_name of
    the vLLM pod using it, as the rules join them: on (namespace, pod) (dcgm-exporter's
    Kubernetes mapping labels a GPU with the pod and namespace using it)."""
    running = f"vllm:num_requests_running{sel.selector()}{sel.range}"
    return (
        " * on (namespace, pod) group_left (model_name) "
        f"group by (namespace, pod, model_name) (last_over_time({running}))"
    )


def gpu_queries(sel: Selection) -> dict[str, str]:
    """The GPU beside vLLM and its price, for every selected model at once: each GPU's
    framebuffer used and free at the window's end (one GPU's pair, by its labels), DRAM
    activity over the window (the model's GPUs' mean), and the engines' hourly cost
    summed (glassbox_engine_hourly_cost, with --gpu-hour-price). Absent where Prometheus
    has no dcgm-exporter, or no price."""
    ns, m, w = sel.selector(model=False), sel.selector(), sel.range
    join = _pods_join(sel)

    def per_gpu(name: str, function: str) -> str:
        return f"max by ({GPU_BY}) ({function}({name}{ns}{w}){join})"

    return {
        "dcgm_fb_used": per_gpu("DCGM_FI_DEV_FB_USED", "last_over_time"),
        "dcgm_fb_free": per_gpu("DCGM_FI_DEV_FB_FREE", "last_over_time"),
        "dcgm_dram_active": (
            f"avg by ({BY}) (avg_over_time(DCGM_FI_PROF_DRAM_ACTIVE{ns}{w}){join})"
        ),
        "hourly_cost": (f"sum by ({BY}) (last_over_time({series.ENGINE_HOURLY_COST.name}{m}{w}))"),
    }


def preemption_step(window_seconds: float) -> float:
    """The subquery step of the preemptions' times: 1 s, coarser over a long window so
    that one engine costs at most PREEMPTION_STEPS steps."""
    return float(max(1, math.ceil(window_seconds / PREEMPTION_STEPS)))


def pool_queries(sel: Selection) -> dict[str, str]:
    """Each engine's pool over the window, as the alerts judge it (one query each, every
    selected model's engines at once): the peaks and the last values of its gauges, its
    preemptions counted, when the first and the last came, and its two forecasts."""
    m, w = sel.selector(), sel.range
    step = f"{preemption_step(sel.window_seconds):g}s"

    def over(function: str, name: str, by: str = "") -> str:
        return f"max by ({ENGINE_BY}{by}) ({function}({name}{m}{w}))"

    preempted = f"{s.exposed_names(s.PREEMPTIONS)[0]}{m}"
    # A rise of the counter, at the sample that showed it. Prometheus 2.42 has no function
    # giving the time of a sample within a range, so a subquery steps through the window:
    # at each step the latest sample is compared with the one `step` before, and
    # timestamp() of a plain selector is that sample's own time (not the step's). A
    # subquery's steps are multiples of its step, so each interval of one step holds one:
    # with scrapes at least a step apart every rise is seen once, at its sample's time;
    # closer scrapes are seen within a step. A restart's first sample is no rise; the
    # window's first sample is compared with the one before the window.
    rose = f"(timestamp({preempted}) and ({preempted} > {preempted} offset {step}))"
    return {
        "pool_usage_peak": over("max_over_time", "vllm:kv_cache_usage_perc"),
        "pool_usage_now": over("last_over_time", "vllm:kv_cache_usage_perc"),
        "pool_running_peak": over("max_over_time", "vllm:num_requests_running"),
        "pool_waiting_peak": over("max_over_time", "vllm:num_requests_waiting"),
        "pool_waiting_by_reason": over(
            "max_over_time", "vllm:num_requests_waiting_by_reason", ", reason"
        ),
        # increase, as VLLMPreemptionStorm counts them (extrapolated to the window's ends).
        "pool_preemptions": f"sum by ({ENGINE_BY}) (increase({preempted}{w}))",
        "pool_first_preemption": f"min by ({ENGINE_BY}) (min_over_time({rose}{w[:-1]}:{step}]))",
        "pool_last_preemption": f"max by ({ENGINE_BY}) (max_over_time({rose}{w[:-1]}:{step}]))",
        # Now, as VLLMKVCacheExhaustionForecast reads them: the exporter's, per engine.
        "pool_exhaustion": f"min by ({FORECAST_BY}) ({series.KV_EXHAUSTION.name}{m})",
        "pool_at_completion": (
            f"min by ({FORECAST_BY}) ({series.KV_HEADROOM_AT_COMPLETION.name}{m})"
        ),
    }


def key_of(metric: Mapping[str, str]) -> Key:
    """The model (and namespace) a series is of."""
    return metric.get("namespace", ""), metric.get("model_name", "")


def value_of(result: Mapping[str, Any]) -> float:
    """An instant query result's value."""
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
                out.setdefault(key_of(result["metric"]), []).append(result)
            self._by_key[name] = out
        return self._by_key[name]

    def reading(self, name: str, key: Key) -> Reading | None:
        results = self.by_key(name).get(key, [])
        if not results:
            return None
        value = value_of(results[0])
        return Reading(value, self.asked[name]) if math.isfinite(value) else None


def ask(client: Prometheus, sel: Selection, workers: int = 8) -> Answers:
    """Every query at the window's end, side by side."""
    asked = queries(sel)
    with concurrent.futures.ThreadPoolExecutor(max_workers=workers) as pool:
        futures = {name: pool.submit(client.query, expr, sel.at) for name, expr in asked.items()}
        answered = {name: future.result() for name, future in futures.items()}
    return Answers(asked, answered)
