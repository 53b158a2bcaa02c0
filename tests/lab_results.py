"""Lab results made by hand, for the tests of the experiments and the report: a request's
stats, a server's startup facts, a quantization variant measured through the lab's own
arithmetic, a point of the KV timeline, a speculative run, and results around phase bodies.
"""

from __future__ import annotations

from typing import Any

from vllm_glassbox.core.derive import Increase
from vllm_glassbox.core.units import GIB
from vllm_glassbox.lab.experiments.kv_pressure import TimelinePoint
from vllm_glassbox.lab.experiments.quantization import Variant, VariantResult, variant_result
from vllm_glassbox.lab.findings import spread
from vllm_glassbox.lab.results import LabResults, PhaseResult, RequestStats, Startup
from vllm_glassbox.lab.vllm.client import Completion

PNG = b"\x89PNG\r\n\x1a\n"  # how every PNG file begins


def stats(tpot: float | None, **kw: Any) -> RequestStats:
    values: dict[str, Any] = {
        "requests": 1,
        "prompt_tokens": 3,
        "generated_tokens": 128.0,
        "wall_seconds": 1.0,
        "ttft_seconds": 0.03,
        "tpot_seconds": tpot,
        "inter_token_latency_seconds": tpot,
        "forward_passes": 127.0,
        "tokens_per_forward_pass": 1.0,
        "decode_seconds": (tpot or 0) * 127,
        "prefill_seconds": 0.02,
        "engine_steps": 128.0,
        "drafts": 0.0,
        "draft_tokens": 0.0,
        "accepted_tokens": 0.0,
        "acceptance_ratio": None,
        "draft_coverage": None,
    }
    return RequestStats(**{**values, **kw})


def startup(weights_gib: float, kv_tokens: int, **kw: Any) -> Startup:
    values: dict[str, Any] = {
        "served_model_name": "m",
        "startup_seconds": 60.0,
        "weights_bytes": weights_gib * GIB,
        "weights_source": "log",
        "load_seconds": 5.0,
        "kv_cache_memory_bytes": 26.05 * GIB,
        "kv_cache_tokens": kv_tokens,
        "kv_cache_blocks": kv_tokens // 16,
        "block_size": 16,
        "vllm_version": "0.11.0",
        "log_path": None,
    }
    return Startup(**{**values, **kw})


def _request(tpot: float) -> tuple[Completion, Increase]:
    """One 128-token request whose decode steps took `tpot` each."""
    d = Increase(
        {
            "generation_tokens": 128.0,
            "ttft_count": 1.0,
            "ttft_sum": 0.03,
            "itl_count": 127.0,
            "itl_sum": 127 * tpot,
            "engine_steps": 128.0,
        },
        1.0,
    )
    return Completion(3, 128, 127 * tpot + 0.03, ""), d


def variant(
    name: str,
    gib: float,
    tpot: float | None,
    fit: bool,
    kv: int = 100000,
    tpots: tuple[float, ...] | None = None,
    peak: float | None = None,
    **facts: Any,
) -> VariantResult:
    """A measured variant: its requests' TPOTs (three alike by default), through the lab's
    own arithmetic; `facts` override its startup facts."""
    if tpot is None:
        return VariantResult(name, f"org/{name}", fit, startup(gib, kv, **facts), stats(None))
    measured = [(0, *_request(t)) for t in (tpots or (tpot, tpot, tpot))]
    return variant_result(
        Variant(name, f"org/{name}", {}, fit), startup(gib, kv, **facts), measured, peak
    )


def point_at(
    t: float, running: float, waiting: float, usage: float, preempted: float
) -> TimelinePoint:
    """The KV timeline at `t` s: 100 tokens generated a second, each poll answered in 10 ms."""
    return TimelinePoint(t, running, waiting, usage, preempted, t * 100, 0.01)


def spec_run(label: str, extra: dict[str, Any], base: bool, spec: bool, st: RequestStats) -> Any:
    """A run as spec_runs takes it: label, extras, baseline?, speculation?, stats, spread."""
    return (label, extra, base, spec, st, spread([st.tpot_seconds]))


def results_with(*bodies: Any, kind: str = "quantization") -> LabResults:
    """A finished run with one phase of `kind` a body."""
    results = LabResults("gpu", "local", 1_764_400_000.0, version="0.1.0")
    results.phases = [
        PhaseResult(f"p{i}", kind, "ok", 1_764_400_000.0, 1_764_400_100.0, body)
        for i, body in enumerate(bodies)
    ]
    results.status, results.ended_at = "ok", 1_764_400_100.0
    return results


def no_nan(name: str) -> None:
    """json's parse_constant: results.json holds no NaN or Infinity."""
    raise AssertionError(f"results.json must not contain {name}")
