"""The quantization phase against the servers: each variant on a server of its own,
warmed up and measured request by request, round after round with the order reversed
each round."""

from __future__ import annotations

from dataclasses import replace

from vllm_glassbox.core.derive import Increase
from vllm_glassbox.lab import findings
from vllm_glassbox.lab.experiments.base import STOPPED, PhaseFailed, Services, describe_error
from vllm_glassbox.lab.experiments.quantization.judge import (
    fit_tpot,
    full_size_variants,
    sample,
    variant_result,
)
from vllm_glassbox.lab.experiments.quantization.phase import QuantizationPhase
from vllm_glassbox.lab.experiments.quantization.result import QuantizationResult, VariantResult
from vllm_glassbox.lab.results import Spread, Startup
from vllm_glassbox.lab.vllm.client import Completion


def run(lab: Services, phase: QuantizationPhase) -> QuantizationResult:
    """Every variant on a server of its own, round after round; a variant that fails
    is recorded and the others still run."""
    measured: dict[str, list[tuple[int, Completion, Increase]]] = {
        v.name: [] for v in phase.variants
    }
    startups: dict[str, Startup] = {}
    errors: dict[str, list[str]] = {v.name: [] for v in phase.variants}
    for round_index, v in phase.order():
        overrides = {**phase.flags, "--model": v.model, **v.flags}
        label = v.name if phase.rounds == 1 else f"{v.name} (round {round_index + 1})"
        try:
            with lab.segment(phase, label, overrides) as served:
                body = phase.request.body(served.deployed.served_model_name)
                lab.warm_up(served, body, phase.warmup)
                this_round = [
                    (round_index, m.completions[0], m.increase)
                    for m in lab.measure_each(served, [body] * phase.requests)
                ]
                measured[v.name] += this_round
                startups.setdefault(v.name, served.startup)
                tpot = findings.spread([sample(*m).tpot_seconds for m in this_round])
                lab.progress.note(f"  {label}: TPOT {_spread_line(tpot)}")
        except STOPPED:
            raise
        except Exception as e:  # the other variants still run
            lab.progress.note(f"✗ {phase.name} › {label}: {describe_error(e)}")
            prefix = f"round {round_index + 1}: " if phase.rounds > 1 else ""
            errors[v.name].append(prefix + describe_error(e))
    variants: list[VariantResult] = []
    for v in phase.variants:
        error = "\n".join(errors[v.name]) or None
        if measured[v.name]:
            done = variant_result(v, startups[v.name], measured[v.name], lab.peak_bandwidth)
            variants.append(replace(done, error=error))
        else:
            variants.append(VariantResult(v.name, v.model, v.fit, error=error))
    fit, problem = fit_tpot(variants, phase.tolerance, lab.peak_bandwidth)
    result = QuantizationResult(
        tuple(variants), fit, problem, full_size_variants(variants), phase.rounds
    )
    if all(not measured[v.name] for v in phase.variants):
        raise PhaseFailed("every variant failed", result)
    return result


def _spread_line(sp: Spread | None) -> str:
    if sp is None:
        return "–"
    return f"{sp.median * 1000:.3g} ms (median of {sp.n}, {sp.low * 1000:.3g}–{sp.high * 1000:.3g})"
