"""The speculative-decoding phase in report.md: its summary line (passes, drafts,
speed-ups, the cold first request) and its section (the runs' table)."""

from __future__ import annotations

import json

from vllm_glassbox.lab.experiments.spec_decode.result import SpecDecodeResult, SpecRunResult
from vllm_glassbox.lab.report_format import (
    Column,
    integer,
    ms,
    num,
    percent,
    plot_name,
    server_facts,
    table_of,
)
from vllm_glassbox.lab.results import PhaseResult


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


RUN_COLUMNS: tuple[Column[SpecRunResult], ...] = (
    Column("run", lambda r: r.label + (" (baseline)" if r.baseline else "")),
    Column("speculation", lambda r: "on" if r.speculation else "off"),
    Column("request extras", lambda r: "`" + json.dumps(r.extra) + "`" if r.extra else "–"),
    Column("tokens", lambda r: integer(r.stats.generated_tokens)),
    Column("forward passes", lambda r: integer(r.stats.forward_passes)),
    Column("tokens/pass", lambda r: num(r.stats.tokens_per_forward_pass)),
    Column("drafts", lambda r: integer(r.stats.drafts)),
    Column("draft tokens", lambda r: integer(r.stats.draft_tokens)),
    Column("accepted", lambda r: integer(r.stats.accepted_tokens)),
    Column("acceptance", lambda r: percent(r.stats.acceptance_ratio)),
    Column("draft coverage", lambda r: percent(r.stats.draft_coverage)),
    Column("decode s", lambda r: num(r.stats.decode_seconds)),
    Column("TPOT ms", lambda r: ms(r.tpot)),
    Column("speed-up", lambda r: "–" if r.speedup is None else f"{r.speedup:.2f}×"),
    Column("what it did", lambda r: r.finding or ""),
)


def section(phase: PhaseResult, sd: SpecDecodeResult) -> list[str]:
    out = server_facts(sd.startup, "Server with speculation")
    out += server_facts(sd.startup_without_speculation, "Server without speculation")
    out += table_of(RUN_COLUMNS, sd.runs)
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
