"""The speculative-decoding experiment: the same requests with speculation on and off.

The runs with speculation share one server started with `--speculative-config` (ngram
by default), the others one started without it; the first request after each start is
measured apart (it pays one-time costs). Each run's TPOT is the median of its requests;
its speed-up is the baseline's TPOT over its own, where the baseline must not have
drafted. Which runs speculated, and how the running vLLM treats a repetition penalty,
are said in words.

The phase's YAML, its run, its result (results.json: `runs[]`, `speedup`,
`first_request_prefill_seconds`), its section of report.md and its plot.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence, Set
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

from vllm_glassbox.exporter.derive import Increase
from vllm_glassbox.lab import findings
from vllm_glassbox.lab.analysis import request_stats
from vllm_glassbox.lab.backend import REMOVE, FlagOverrides
from vllm_glassbox.lab.experiments.base import Experiment
from vllm_glassbox.lab.plan_yaml import (
    MISSING,
    Node,
    Request,
    boolean,
    flag_value,
    positive_int,
    read_flags,
    read_request,
    request_fields,
    text,
    unique,
)
from vllm_glassbox.lab.progress import number_text
from vllm_glassbox.lab.report_format import (
    integer,
    ms,
    num,
    percent,
    plot_name,
    png,
    pyplot,
    server_facts,
    table,
)
from vllm_glassbox.lab.results import JSON, PhaseResult, RequestStats, Spread, Startup, startup_json

if TYPE_CHECKING:
    from vllm_glassbox.lab.runner import Lab, Served

KIND = "spec-decode"
# The article's run (SPEC §1).
SPEC_DECODE_PROMPT = " ".join(["1 2 3 4 5"] * 10)
SPECULATIVE_CONFIG = "--speculative-config"
NGRAM_CONFIG = {
    "method": "ngram",
    "num_speculative_tokens": 5,
    "prompt_lookup_max": 4,
    "prompt_lookup_min": 1,
}

# --- the phase ------------------------------------------------------------------------------


@dataclass(frozen=True)
class SpecRun:
    label: str
    extra: Mapping[str, Any]
    baseline: bool  # the run the others' speed-up is measured against
    speculation: bool = True  # False: on a server started without --speculative-config


@dataclass(frozen=True)
class SpecDecodePhase:
    name: str
    model: str | None
    flags: FlagOverrides
    request: Request
    runs: tuple[SpecRun, ...]
    requests: int  # measured requests per run (TPOT: their median)
    kind: str = KIND

    @property
    def baseline(self) -> SpecRun:
        return next(r for r in self.runs if r.baseline)

    @property
    def flags_without_speculation(self) -> FlagOverrides:
        """The phase's flags for the runs without speculation (a server of their own)."""
        return {**self.flags, SPECULATIVE_CONFIG: REMOVE}

    @property
    def server_starts(self) -> int:
        return len({r.speculation for r in self.runs})

    def models(self) -> list[tuple[str, str]]:
        return [("model", self.model)] if self.model is not None else []

    def without_models(self, models: Set[str]) -> tuple[SpecDecodePhase, list[str]]:
        return self, []  # one model for every run: no variants to leave out

    def describe(self) -> str:
        runs = ", ".join(
            r.label + (" (baseline)" if r.baseline else "") + ("" if r.speculation else " [off]")
            for r in self.runs
        )
        return f"{self.requests} request(s) per run: {runs}"


def _run_extra(value: object) -> dict[str, Any]:
    """A spec run's request fields: on top of the phase's, the temperature included."""
    return request_fields(value, {"model", "prompt", "max_tokens", "stream"})


def _run(node: Node) -> SpecRun:
    return SpecRun(
        label=node.get("label", text),
        extra=node.get("extra", _run_extra, {}),
        baseline=node.get("baseline", boolean, False),
        speculation=node.get("speculation", boolean, True),
    )


def parse(node: Node, name: str) -> SpecDecodePhase:
    """The phase from its YAML, the article's run as defaults."""
    request = read_request(node, SPEC_DECODE_PROMPT, 256, 0.0)
    runs = node.each("runs", _run)
    if node.raw("runs") is MISSING:
        # The article's two requests with speculation on, and the baseline: the same
        # request on a server without speculation (a run that drafts is no baseline).
        runs = [
            SpecRun("repetition_penalty 1.0", {"repetition_penalty": 1.0}, False),
            SpecRun("model defaults", {}, False),
            SpecRun("no speculation", {"repetition_penalty": 1.0}, True, speculation=False),
        ]
    elif len(runs) < 2:
        node.problem("runs", "needs at least two runs to compare")
    unique(node, "runs", [r.label for r in runs])
    baselines = [r.label for r in runs if r.baseline]
    if len(baselines) > 1:
        node.problem("runs", f"only one run can be the baseline, not {baselines}")
    elif runs and not baselines:  # compare against the last run
        runs[-1] = SpecRun(runs[-1].label, runs[-1].extra, True, runs[-1].speculation)
    flags = read_flags(node, "flags", {SPECULATIVE_CONFIG: flag_value(NGRAM_CONFIG)})
    if flags.get(SPECULATIVE_CONFIG, REMOVE) is REMOVE and any(r.speculation for r in runs):
        node.problem("flags", f"{SPECULATIVE_CONFIG} is needed by the runs with speculation")
    return SpecDecodePhase(
        name=name,
        model=node.get("model", text, None),
        flags=flags,
        request=request,
        runs=tuple(runs),
        requests=node.get("requests", positive_int, 3),
    )


# --- what it found -------------------------------------------------------------------------


@dataclass(frozen=True)
class SpecRunResult:
    label: str
    extra: dict[str, Any]
    baseline: bool
    stats: RequestStats
    speedup: float | None  # baseline TPOT / this run's TPOT; None for the baseline
    speculation: bool = True  # the server speculated (--speculative-config)
    tpot: Spread | None = None  # over its requests
    finding: str | None = None  # speculated, bypassed, or off, in words

    @property
    def tpot_seconds(self) -> float | None:
        return self.tpot.median if self.tpot else self.stats.tpot_seconds

    def to_json(self) -> JSON:
        return {
            "label": self.label,
            "extra": self.extra,
            "baseline": self.baseline,
            "speculation": self.speculation,
            "speedup": self.speedup,
            "finding": self.finding,
            **asdict(self.stats),
            "tpot_seconds": self.tpot_seconds,
            "tpot_seconds_min": self.tpot.low if self.tpot else None,
            "tpot_seconds_max": self.tpot.high if self.tpot else None,
        }


@dataclass(frozen=True)
class SpecDecodeResult:
    startup: Startup | None  # the server with speculation
    runs: tuple[SpecRunResult, ...]
    speedup: float | None  # of the first run that is not the baseline
    first_request_prefill_seconds: float | None  # the cold request right after startup
    first_request_ttft_seconds: float | None
    warm_prefill_seconds: float | None  # mean prefill of the measured requests
    startup_without_speculation: Startup | None = None
    baseline_problem: str | None = None  # why the baseline is refused (it drafted)
    penalty_finding: str | None = None  # how the running vLLM treats a repetition penalty

    def to_json(self) -> JSON:
        return {
            **startup_json(self.startup),
            "runs": [r.to_json() for r in self.runs],
            "speedup": self.speedup,
            "baseline_problem": self.baseline_problem,
            "penalty_finding": self.penalty_finding,
            "first_request_prefill_seconds": self.first_request_prefill_seconds,
            "first_request_ttft_seconds": self.first_request_ttft_seconds,
            "warm_prefill_seconds": self.warm_prefill_seconds,
            "startup_without_speculation": (
                self.startup_without_speculation.to_json()
                if self.startup_without_speculation
                else None
            ),
        }


# --- what the numbers mean -----------------------------------------------------------------


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


# --- the run -------------------------------------------------------------------------------


def run(lab: Lab, phase: SpecDecodePhase) -> SpecDecodeResult:
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
    lab: Lab, served: Served, phase: SpecDecodePhase, run: SpecRun
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


# --- the report ----------------------------------------------------------------------------


def summary(sd: SpecDecodeResult) -> str:
    """Each run's passes and drafts, the speed-ups, and the cold first request."""
    parts = [
        f"{r.label}: {r.stats.forward_passes:g} forward passes for "
        f"{r.stats.generated_tokens:g} tokens ({r.stats.requests} request(s)), "
        f"{r.stats.drafts:g} drafts"
        for r in sd.runs
    ]
    text = "; ".join(parts)
    if sd.baseline_problem:
        text += f". **No speed-up**: {sd.baseline_problem}"
    else:
        baseline = next((r for r in sd.runs if r.baseline), None)
        speedups = [f"{r.label} {r.speedup:.2f}×" for r in sd.runs if r.speedup is not None]
        if baseline and speedups:
            text += f". Decode per token against {baseline.label}: {', '.join(speedups)}"
    if sd.penalty_finding:
        text += f". {sd.penalty_finding}"
    return (
        text + f". The cold first request's prefill took "
        f"{num(sd.first_request_prefill_seconds)} s (warm: {num(sd.warm_prefill_seconds)} s)."
    )


def section(phase: PhaseResult, sd: SpecDecodeResult) -> list[str]:
    out = server_facts(sd.startup, "Server with speculation")
    out += server_facts(sd.startup_without_speculation, "Server without speculation")
    rows = [
        [
            r.label + (" (baseline)" if r.baseline else ""),
            "on" if r.speculation else "off",
            "`" + json.dumps(r.extra) + "`" if r.extra else "–",
            integer(r.stats.generated_tokens),
            integer(r.stats.forward_passes),
            num(r.stats.tokens_per_forward_pass),
            integer(r.stats.drafts),
            integer(r.stats.draft_tokens),
            integer(r.stats.accepted_tokens),
            percent(r.stats.acceptance_ratio),
            percent(r.stats.draft_coverage),
            num(r.stats.decode_seconds),
            ms(r.tpot),
            "–" if r.speedup is None else f"{r.speedup:.2f}×",
            r.finding or "",
        ]
        for r in sd.runs
    ]
    out += table(
        [
            "run",
            "speculation",
            "request extras",
            "tokens",
            "forward passes",
            "tokens/pass",
            "drafts",
            "draft tokens",
            "accepted",
            "acceptance",
            "draft coverage",
            "decode s",
            "TPOT ms",
            "speed-up",
            "what it did",
        ],
        rows,
    )
    requests = max((r.stats.requests for r in sd.runs), default=0)
    out += [
        f"Tokens, passes, drafts and decode seconds are summed over each run's {requests} "
        "request(s); TPOT is their median (extremes in brackets). Draft coverage is the "
        "share of decode steps that speculated at all: a request that bypasses speculation "
        "decodes one token per forward pass and drafts nothing. The speed-up is the "
        "baseline's TPOT over each run's; a baseline must not speculate.",
        "",
    ]
    if sd.baseline_problem:
        out += [f"**No speed-up:** {sd.baseline_problem}.", ""]
    if sd.penalty_finding:
        out += [f"**Repetition penalty:** {sd.penalty_finding}.", ""]
    out += [
        f"The cold first request after startup (not in the runs): prefill "
        f"{num(sd.first_request_prefill_seconds)} s, TTFT {num(sd.first_request_ttft_seconds)} s; "
        f"warm requests' prefill {num(sd.warm_prefill_seconds)} s.",
        "",
        f"![speculative decoding on and off]({plot_name(phase, 'spec')})",
        "",
    ]
    return out


# --- the plot ------------------------------------------------------------------------------


def plot_spec(sd: SpecDecodeResult, title: str) -> bytes:
    plt = pyplot()
    labels = [r.label for r in sd.runs]
    fig, (left, right) = plt.subplots(1, 2, figsize=(9, 3.8))
    colors = [
        "tab:gray" if r.baseline else "tab:green" if r.stats.drafts > 0 else "tab:orange"
        for r in sd.runs
    ]
    left.bar(labels, [r.stats.forward_passes for r in sd.runs], color=colors)
    left.set_title("forward passes (decode steps)")
    for i, r in enumerate(sd.runs):
        left.annotate(
            f"{r.stats.generated_tokens:g} tokens",
            (i, r.stats.forward_passes),
            ha="center",
            va="bottom",
            fontsize=8,
        )
    right.bar(labels, [(r.tpot_seconds or 0) * 1000 for r in sd.runs], color=colors)
    right.set_title("TPOT (ms, median)")
    for i, r in enumerate(sd.runs):
        if r.speedup is not None:
            right.annotate(
                f"{r.speedup:.2f}× faster" if r.speedup >= 1 else f"{1 / r.speedup:.2f}× slower",
                (i, (r.tpot_seconds or 0) * 1000),
                ha="center",
                va="bottom",
                fontsize=8,
            )
    for ax in (left, right):
        ax.tick_params(axis="x", labelsize=7, rotation=15)
        ax.grid(alpha=0.3, axis="y")
    fig.suptitle(f"{title}: speculation on and off")
    return png(fig)


def plots(phase: PhaseResult, sd: SpecDecodeResult) -> dict[str, bytes]:
    return {plot_name(phase, "spec"): plot_spec(sd, phase.name)} if sd.runs else {}


EXPERIMENT = Experiment(
    KIND, SpecDecodePhase, SpecDecodeResult, parse, run, summary, section, plots
)
