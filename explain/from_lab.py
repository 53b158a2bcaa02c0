"""A lab run as explain reads it: the baseline a live server cannot show (`--lab
results.json`: other precisions measured, the fitted line, a decode step without
speculation), and the run's own scenes, diagnosed for its report's closing section.

A lab scene is one server of the run — a quantization variant, the KV-pressure flood, a
speculative run — with its counters' increases over its measured requests (the lab
stores them: generated tokens, decode steps and their seconds, engine steps, drafts), its
start and its pool. The same diagnoses as for a live server read it.
"""

from __future__ import annotations

import contextlib
import json
import math
import statistics
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from vllm_glassbox.core import derive
from vllm_glassbox.core import snapshot as s
from vllm_glassbox.core.derive import Increase
from vllm_glassbox.explain.diagnoses import explain
from vllm_glassbox.explain.findings import Explained
from vllm_glassbox.explain.render import closing_section
from vllm_glassbox.explain.scene import (
    EnginePool,
    LabBaseline,
    LabVariant,
    Reading,
    Scene,
    Scope,
    Window,
)


class LabFileError(ValueError):
    """A --lab file that cannot be read as a lab run's results.json."""


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value) if math.isfinite(value) else None


def load_results(path: str) -> dict[str, Any]:
    try:
        data = json.loads(Path(path).read_text())
    except OSError as e:
        raise LabFileError(f"cannot read {path}: {e.strerror or e}") from None
    except ValueError as e:
        raise LabFileError(f"{path} is not JSON: {e}") from None
    if not isinstance(data, dict) or not isinstance(data.get("phases"), list):
        raise LabFileError(f"{path} is not a lab run's results.json (no phases[])")
    return data


def baseline(results: Mapping[str, Any], source: str) -> LabBaseline:
    """What a lab run measured that explain sets beside a live server."""
    variants: list[LabVariant] = []
    slope = intercept = plain = speedup = None
    for phase in results["phases"]:
        if not isinstance(phase, dict):
            continue
        if phase.get("kind") == "quantization":
            fit = phase.get("fit") or {}
            fitted = set(fit.get("fitted") or [])
            for v in phase.get("variants") or []:
                weights = _number(v.get("weights_bytes"))
                if weights is None or not v.get("name"):
                    continue
                tokens = _number(v.get("kv_cache_tokens"))
                variants.append(
                    LabVariant(
                        str(v["name"]),
                        weights,
                        _number(v.get("tpot_seconds")),
                        None if tokens is None else int(tokens),
                        str(v["name"]) in fitted,
                    )
                )
            slope = _number(fit.get("slope_seconds_per_gib"))
            intercept = _number(fit.get("intercept_seconds"))
        elif phase.get("kind") == "spec-decode":
            for run in phase.get("runs") or []:
                if run.get("baseline") and not _number(run.get("drafts")):
                    plain = _number(run.get("inter_token_latency_seconds"))
            speedup = _number(phase.get("speedup"))
    if not variants and plain is None:
        raise LabFileError(
            f"{source} has neither a quantization phase with measured variants nor a "
            "spec-decode phase with a baseline: nothing to set beside a live server"
        )
    return LabBaseline(source, tuple(variants), slope, intercept, plain, speedup)


# --- the run's own scenes (its report's closing section) ------------------------------------


def _increase(stats: Mapping[str, Any], speculation: bool) -> Increase:
    """The counters' increases over a run's measured requests, as the lab stored them
    (lab/results.py RequestStats: each is the increase of one counter)."""
    counters: dict[str, float] = {}
    for counter, key in (
        (s.GENERATION_TOKENS, "generated_tokens"),
        (s.TTFT_COUNT, "requests"),
        (s.ITL_COUNT, "forward_passes"),
        (s.ITL_SUM, "decode_seconds"),
        (s.ENGINE_STEPS, "engine_steps"),
    ):
        value = _number(stats.get(key))
        if value is not None:
            counters[counter] = value
    if speculation:
        for counter, key in (
            (s.SPEC_DRAFTS, "drafts"),
            (s.SPEC_DRAFT_TOKENS, "draft_tokens"),
            (s.SPEC_ACCEPTED, "accepted_tokens"),
        ):
            value = _number(stats.get(key))
            if value is not None:
                counters[counter] = value
    return Increase(counters, _number(stats.get("wall_seconds")) or 0.0)


def _server(body: Mapping[str, Any], where: str, what: str, peak: Reading | None) -> dict[str, Any]:
    """The scene's facts of one server start (lab/results.py Startup)."""

    def reading(key: str) -> Reading | None:
        value = _number(body.get(key))
        return None if value is None else Reading(value, f"{where}: {what} {key}")

    weights = reading("active_weights_bytes") or reading("weights_bytes")
    memory = reading("kv_cache_memory_bytes")
    startup = {
        stage: Reading(value, f"{where}: {what} stages.{stage}")
        for stage, raw in (body.get("stages") or {}).items()
        if (value := _number(raw)) is not None
    }
    total = _number(body.get("startup_seconds"))
    if startup and total is not None:
        startup["total"] = Reading(total, f"{where}: {what} startup_seconds")
    return {
        "weights": weights,
        "mixture_of_experts": _number(body.get("active_weights_bytes")) is not None,
        "peak_bandwidth": peak,
        "tensor_parallel": int(_number(body.get("tensor_parallel")) or 1),
        "vllm_version": body.get("vllm_version"),
        "kv_capacity": reading("kv_cache_tokens"),
        "kv_block_size": reading("block_size"),
        "kv_memory": memory,
        "startup": startup,
    }


def scenes(results: Mapping[str, Any], where: str = "results.json") -> list[Scene]:
    """Each server of the run whose requests were measured: the quantization variants,
    the speculative runs, the KV-pressure flood."""
    peak_value = _number((results.get("peak_bandwidth") or {}).get("bytes_per_second"))
    peak = None if peak_value is None else Reading(peak_value, f"{where}: peak_bandwidth")
    lab = None
    with contextlib.suppress(LabFileError):  # a run without those phases has no baseline
        lab = baseline(results, where)
    out: list[Scene] = []
    for phase in results.get("phases", []):
        kind = phase.get("kind")
        name = phase.get("name", kind)
        if kind == "quantization":
            for v in phase.get("variants") or []:
                what = f"phase {name} variant {v.get('name')}"
                out.append(_measured_scene(v, v, where, what, peak, lab, speculation=False))
        elif kind == "spec-decode":
            for run in phase.get("runs") or []:
                what = f"phase {name} run {run.get('label')}"
                speculation = bool(run.get("speculation", True))
                out.append(_measured_scene(phase, run, where, what, peak, lab, speculation))
        elif kind == "kv-pressure":
            out.append(_flood_scene(phase, where, f"phase {name}", peak))
    return out


def _measured_scene(
    server: Mapping[str, Any],
    stats: Mapping[str, Any],
    where: str,
    what: str,
    peak: Reading | None,
    lab: LabBaseline | None,
    speculation: bool,
) -> Scene:
    increase = _increase(stats, speculation)
    facts = _server(server, where, what, peak)
    scope = Scope("lab", where, None, what, 1, increase.seconds)
    return Scene(
        scope,
        decode=Window(increase, f"{where}: {what}, its measured requests"),
        spec_configured=speculation,
        lab=lab,
        **facts,
    )


def _flood_scene(phase: Mapping[str, Any], where: str, what: str, peak: Reading | None) -> Scene:
    """The flood: its pool's fill, queue and preemptions over the phase (the lab's polls)."""

    def reading(key: str) -> Reading | None:
        value = _number(phase.get(key))
        return None if value is None else Reading(value, f"{where}: {what} {key}")

    preemptions = _number(phase.get("preemptions_total"))
    seconds = _number(phase.get("flood_seconds")) or 0.0
    counters = {} if preemptions is None else {s.PREEMPTIONS: preemptions}
    facts = _server(phase, where, what, peak)
    facts["startup"] = {}  # its start is told once, with the variant of the same flags
    # The timeline's polls, as Prometheus' avg_over_time and max_over_time would see them.
    capacity = _number(phase.get("kv_cache_tokens"))
    points = [p for p in phase.get("timeline") or [] if isinstance(p, dict)]
    used = [
        derive.kv_cache_used_tokens(_number(p.get("kv_cache_usage")), int(capacity))
        for p in points
        if capacity is not None
    ]
    running = [r for p in points if (r := _number(p.get("running"))) is not None]
    timeline = f"{where}: {what} timeline[]"
    present = [u for u in used if u is not None]
    last = _number(points[-1].get("kv_cache_usage")) if points else None
    pool = EnginePool(
        engine=str(phase.get("served_model_name") or what),
        peak_usage=reading("peak_kv_cache_usage"),
        usage_now=None if last is None else Reading(last, f"{timeline}: the last poll"),
        peak_running=Reading(max(running), timeline) if running else None,
        peak_waiting=reading("peak_waiting"),
        preemptions=reading("preemptions_total"),
    )
    return Scene(
        Scope("lab", where, None, what, 1, seconds),
        decode=Window(Increase(counters, seconds), f"{where}: {what} preemptions_total"),
        kv_usage_peak=reading("peak_kv_cache_usage"),
        waiting_peak=reading("peak_waiting"),
        kv_used_mean=Reading(statistics.fmean(present), timeline) if present else None,
        running_mean=Reading(statistics.fmean(running), timeline) if running else None,
        running_peak=Reading(max(running), timeline) if running else None,
        pools=(pool,),
        **facts,
    )


def explain_run(results: Mapping[str, Any], where: str = "results.json") -> Sequence[Explained]:
    """The findings of every server of a lab run."""
    return [explain(scene) for scene in scenes(results, where)]


def report_section(results: Mapping[str, Any]) -> list[str]:
    """The lab report's closing "What this run says" (results.json's shape in)."""
    section = closing_section(explain_run(results))
    return section.split("\n") if section else []
