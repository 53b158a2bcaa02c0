"""Objectives from Prometheus: the SLO rules' records at the window's end (docs/slo.md:
error ratios over their own windows, target, budget left, series without the objective's
bucket) and their burn alerts firing; and what an SLO file given with --slo adds to them."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from vllm_glassbox.core.slo import SloFile
from vllm_glassbox.explain.promql import SLO_IDENTITY, SLO_RECORD, Answers, Key, escaped, value_of
from vllm_glassbox.explain.scene import ObjectiveState, Reading, Scene


def _series_text(labels: Mapping[str, str]) -> str:
    """A record's series as a selector to run again: its name, its objective's labels and
    the ones that tell its series apart."""
    order = ("namespace", "job", "model_name", "slo")
    keys = [k for k in order if k in labels]
    keys += sorted(k for k in labels if k not in SLO_IDENTITY and k not in order)
    matchers = ", ".join(f'{k}="{escaped(labels[k])}"' for k in keys)
    return f"{labels['__name__']}{{{matchers}}}"


def _label_number(labels: Mapping[str, str], label: str) -> float | None:
    try:
        value = float(labels.get(label, ""))
    except ValueError:
        return None  # absent, or no number: unknown
    return value if math.isfinite(value) else None


def objectives(answers: Answers, key: Key) -> tuple[ObjectiveState, ...]:
    """Each objective of the model (and job…) its records show, with its alerts firing."""
    found: dict[tuple[str, tuple[tuple[str, str], ...]], dict[str, Any]] = {}
    for result in answers.by_key("slo").get(key, []):
        labels = result["metric"]
        value = value_of(result)
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
