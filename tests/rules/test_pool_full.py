""" "The pool is full" is one number: the derivation core's KV_POOL_FULL, which the lab's
acts, the dashboards' KV threshold and the VLLMKVCacheSaturated alert all use; "it is
about to be" another, KV_EXHAUSTION_WARNING_SECONDS, of VLLMKVCacheExhaustionForecast and
the lab's judgement of the forecasts. The alerts are plain YAML, so their thresholds are
read back from their expressions here."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import promql_parser
import yaml
from vllm_glassbox.core.derive import KV_EXHAUSTION_WARNING_SECONDS, KV_POOL_FULL
from vllm_glassbox.lab.experiments import experiment
from vllm_glassbox.lab.plan_yaml import Node

REPO = Path(__file__).resolve().parents[2]
USAGE = "vllm:kv_cache_usage_perc"


def _nodes(expr: Any) -> Iterator[Any]:
    yield expr
    for child in ("expr", "lhs", "rhs"):
        if hasattr(expr, child):
            yield from _nodes(getattr(expr, child))
    for arg in getattr(expr, "args", None) or []:
        yield from _nodes(arg)


def usage_thresholds(promql: str, metric: str = USAGE, op: str = ">=") -> list[float]:
    """The numbers `metric` (under any aggregation) is compared with by `op` in `promql`."""
    found = []
    for node in _nodes(promql_parser.parse(promql)):
        if type(node).__name__ != "BinaryExpr" or str(node.op) != op:
            continue
        selectors = [n.name for n in _nodes(node.lhs) if type(n).__name__ == "VectorSelector"]
        if selectors == [metric] and type(node.rhs).__name__ == "NumberLiteral":
            found.append(node.rhs.val)
    return found


def _alerts() -> dict[str, dict[str, Any]]:
    groups = yaml.safe_load((REPO / "alerts" / "glassbox-alerts.yaml").read_text())["groups"]
    return {r["alert"]: r for g in groups for r in g["rules"] if "alert" in r}


def test_the_saturation_alert_fires_at_the_cores_full_pool() -> None:
    assert usage_thresholds(_alerts()["VLLMKVCacheSaturated"]["expr"]) == [KV_POOL_FULL]


def test_the_forecast_alert_warns_where_the_lab_judges_the_forecasts() -> None:
    expr = _alerts()["VLLMKVCacheExhaustionForecast"]["expr"]
    soon = usage_thresholds(expr, "glassbox_kv_cache_exhaustion_seconds", "<")
    promised = usage_thresholds(expr, "glassbox_kv_cache_headroom_requests_at_completion", "<")
    assert (soon, promised) == ([KV_EXHAUSTION_WARNING_SECONDS], [0.0])


def test_the_reader_finds_a_threshold_only_where_usage_is_compared() -> None:
    assert usage_thresholds(f"max by (engine) ({USAGE}) >= 0.9 and on () up > 0") == [0.9]
    assert usage_thresholds(f"{USAGE} > 0.9") == []  # not >=
    assert usage_thresholds("vllm:num_requests_waiting >= 0.9") == []


def test_the_kv_dashboard_marks_the_full_pool() -> None:
    board = json.loads((REPO / "dashboards" / "generated" / "glassbox-kv-cache.json").read_text())
    panels = [p for p in board["panels"] if p.get("title") == "KV cache usage"]
    steps = panels[0]["fieldConfig"]["defaults"]["thresholds"]["steps"]
    assert [s["value"] for s in steps] == [None, KV_POOL_FULL]


def test_both_pool_kinds_count_the_pool_full_there_by_default() -> None:
    for kind, data in (("kv-pressure", {}), ("rate-sweep", {"rates": [1]})):
        problems: list[str] = []
        found = experiment(kind)
        assert found is not None
        phase = found.parse(Node({"kind": kind, **data}, "phases[0]", problems), "p")
        assert (problems, phase.saturation) == ([], KV_POOL_FULL)
