"""The speculative-decoding phase against the servers: the runs with speculation on one
server started with `--speculative-config`, the others on one started without it; the
first request after each start measured apart (it pays one-time costs)."""

from __future__ import annotations

from vllm_glassbox.core.derive import Increase
from vllm_glassbox.lab import findings
from vllm_glassbox.lab.analysis import request_stats
from vllm_glassbox.lab.experiments.base import Served, Services
from vllm_glassbox.lab.experiments.spec_decode.judge import penalty_finding, spec_runs
from vllm_glassbox.lab.experiments.spec_decode.phase import SpecDecodePhase, SpecRun
from vllm_glassbox.lab.experiments.spec_decode.result import SpecDecodeResult
from vllm_glassbox.lab.plan_yaml import Request
from vllm_glassbox.lab.progress import number_text
from vllm_glassbox.lab.results import RequestStats, Spread, Startup


def run(lab: Services, phase: SpecDecodePhase) -> SpecDecodeResult:
    """The runs with speculation on one server, the others on one without it."""
    model_flag = {"--model": phase.model} if phase.model else {}
    measured: dict[str, tuple[RequestStats, Spread | None, Increase]] = {}
    startups: dict[bool, Startup] = {}
    cold_stats: RequestStats | None = None
    # Runs with speculation on one server, the others on a server without it.
    for speculation in (True, False):
        runs = [r for r in phase.runs if r.speculation == speculation]
        if not runs:
            continue
        flags = phase.flags if speculation else phase.flags_without_speculation
        label = "speculation on" if speculation else "speculation off"
        with lab.segment(phase, label, {**flags, **model_flag}) as served:
            startups[speculation] = served.startup
            model = served.deployed.served_model_name
            # The first request after startup pays one-time costs (the ngram
            # proposer's JIT compilation): measured alone, reported apart.
            lab.progress.status("cold first request")
            cold = served.client.measure([with_extra(phase.request, model, dict(runs[0].extra))])
            if cold_stats is None or speculation:
                cold_stats = request_stats(cold.completions, cold.increase)
            for r in runs:
                measured[r.label] = _spec_run(lab, served, phase, r)
    ordered = [
        (r.label, dict(r.extra), r.baseline, r.speculation, *measured[r.label][:2])
        for r in phase.runs
    ]
    runs_result, speedup, problem = spec_runs(ordered)
    warm = Increase({}, 0.0)
    for _, _, d in measured.values():
        warm = warm.then(d)  # the runs one after another
    with_spec = startups.get(True)
    return SpecDecodeResult(
        startup=with_spec or startups.get(False),
        runs=tuple(runs_result),
        speedup=speedup,
        first_request_prefill_seconds=cold_stats.prefill_seconds if cold_stats else None,
        first_request_ttft_seconds=cold_stats.ttft_seconds if cold_stats else None,
        warm_prefill_seconds=request_stats([], warm).prefill_seconds,
        startup_without_speculation=startups.get(False),
        baseline_problem=problem,
        penalty_finding=penalty_finding(
            runs_result,
            with_spec.default_repetition_penalty if with_spec else None,
            with_spec.vllm_version if with_spec else None,
        ),
    )


def _spec_run(
    lab: Services, served: Served, phase: SpecDecodePhase, run: SpecRun
) -> tuple[RequestStats, Spread | None, Increase]:
    lab.progress.begin(phase.name, run.label)
    body = with_extra(phase.request, served.deployed.served_model_name, dict(run.extra))
    each = lab.measure_each(served, [body] * phase.requests)
    total = Increase({}, 0.0)
    for m in each:
        total = total.then(m.increase)
    stats = request_stats([c for m in each for c in m.completions], total)
    tpot = findings.spread([request_stats(m.completions, m.increase).tpot_seconds for m in each])
    lab.progress.note(f"  {run.label}: {_stats_line(stats)}")
    return stats, tpot, total


def with_extra(request: Request, model: str, extra: dict[str, object]) -> dict[str, object]:
    return {**request.body(model), **extra}


def _stats_line(st: RequestStats) -> str:
    line = (
        f"{st.generated_tokens:g} tokens, TTFT {number_text(st.ttft_seconds, ' ms', 1000)}, "
        f"TPOT {number_text(st.tpot_seconds, ' ms', 1000)}, "
        f"{number_text(st.tokens_per_forward_pass)} tokens/forward pass"
    )
    if st.drafts:
        line += f", {st.drafts:g} drafts, {st.accepted_tokens:g}/{st.draft_tokens:g} accepted"
    return line
