"""What the speculative-decoding numbers mean: whether each run speculated, its speed-up
against a baseline that must not have drafted, and how the running vLLM treats a
repetition penalty."""

from __future__ import annotations

from collections.abc import Sequence

from vllm_glassbox.lab.experiments.spec_decode.result import SpecRunResult
from vllm_glassbox.lab.results import RequestStats, Spread


def run_finding(stats: RequestStats, speculation: bool) -> str:
    """Whether a run speculated, in words."""
    if not speculation:
        return "no speculation (server without --speculative-config)"
    if stats.drafts <= 0:
        return f"speculation bypassed: no draft in {stats.forward_passes:g} decode steps"
    coverage = f"{stats.draft_coverage:.0%}" if stats.draft_coverage is not None else "–"
    accepted = f"{stats.acceptance_ratio:.0%}" if stats.acceptance_ratio is not None else "–"
    return f"speculated on {coverage} of decode steps, {accepted} of draft tokens accepted"


def baseline_problem(baseline: RequestStats) -> str | None:
    """A baseline that drafted is no baseline: its speed-ups would compare speculation
    with speculation."""
    if baseline.drafts <= 0:
        return None
    coverage = (
        f" ({baseline.draft_coverage:.0%} of its decode steps)"
        if baseline.draft_coverage is not None
        else ""
    )
    return (
        f"the baseline drafted {baseline.drafts:g} times{coverage}: it speculated, so it is "
        "no baseline; no speed-up is given"
    )


def spec_runs(
    runs: Sequence[tuple[str, dict[str, object], bool, bool, RequestStats, Spread | None]],
) -> tuple[list[SpecRunResult], float | None, str | None]:
    """Each run's decode speed-up per token against the baseline (when it is one): the
    runs, the headline speed-up, and why there is none."""
    baseline = next(((stats, tpot) for _, _, is_base, _, stats, tpot in runs if is_base), None)
    problem = baseline_problem(baseline[0]) if baseline else "no baseline run"
    base_tpot = None
    if baseline is not None and problem is None:
        base_tpot = baseline[1].median if baseline[1] else baseline[0].tpot_seconds
    results = []
    for label, extra, is_base, speculation, stats, tpot in runs:
        run_tpot = tpot.median if tpot else stats.tpot_seconds
        speedup = None
        if not is_base and base_tpot is not None and run_tpot:
            speedup = base_tpot / run_tpot
        results.append(
            SpecRunResult(
                label,
                dict(extra),
                is_base,
                stats,
                speedup,
                speculation,
                tpot,
                run_finding(stats, speculation),
            )
        )
    headline = next((r.speedup for r in results if not r.baseline and r.speculation), None)
    return results, headline, problem


def penalty_finding(
    runs: Sequence[SpecRunResult], default_penalty: float | None, version: str | None
) -> str | None:
    """How the running vLLM treats speculation for a request with a repetition penalty
    (v0.11 skipped speculation for such requests)."""
    for r in runs:
        penalty = r.extra.get("repetition_penalty", default_penalty)
        if not r.speculation or not isinstance(penalty, int | float) or penalty == 1.0:
            continue
        where = "the request's" if "repetition_penalty" in r.extra else "the model's default"
        vllm = f"vLLM {version}" if version else "this vLLM"
        if r.stats.drafts > 0:
            return (
                f"{vllm} speculates under a repetition penalty: run '{r.label}' "
                f"({where} {penalty:g}) drafted {r.stats.drafts:g} times in "
                f"{r.stats.forward_passes:g} decode steps (v0.11 skipped speculation for "
                "such requests)"
            )
        return (
            f"{vllm} skips speculation under a repetition penalty, as v0.11 did: run "
            f"'{r.label}' ({where} {penalty:g}) drafted nothing in "
            f"{r.stats.forward_passes:g} decode steps"
        )
    return None
