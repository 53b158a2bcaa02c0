"""speculation: speculative decoding configured but bypassed, accepting too little to pay
for itself, or paying: tokens per forward pass, and the speed-up where a plain step is
known."""

from __future__ import annotations

from dataclasses import dataclass

from vllm_glassbox.core import derive
from vllm_glassbox.core import snapshot as s
from vllm_glassbox.explain.diagnoses.common import (
    MIN_DECODE_STEPS,
    RUNBOOK,
    decode_steps,
    lab_reading,
    window,
)
from vllm_glassbox.explain.findings import Figure, Finding, core, counted, read, say
from vllm_glassbox.explain.scene import Reading, Scene

#: VLLMSpecDecodeBypassed: under this share of decode steps drafted.
BYPASSED_COVERAGE = 0.1
#: VLLMSpecDecodeAcceptanceLow: under this share of draft tokens accepted.
LOW_ACCEPTANCE = 0.3
#: Under this many tokens a forward pass, speculation cannot pay for its drafting and
#: verifying (at most a tenth faster, before they cost anything).
CANNOT_PAY_PER_PASS = 1.1
#: Shapes of vLLM's output glassbox does not read (glassbox_input_unrecognised) that leave
#: the speculation counters untrustworthy: with one flagged it says so, and advises nothing.
UNTRUSTED = ("v0_spec_counters", "several_servers_behind_the_target")


@dataclass(frozen=True)
class _Drafts:
    """The figures speculation is judged on: the counters' ratios, the decode step, and
    the lab's plain step where --lab gives one."""

    steps: Figure
    coverage: Figure
    per_pass: Figure
    acceptance: Figure | None
    length: Figure | None
    step: Figure | None
    tpot: Figure | None
    drafts: Figure | None
    plain: Reading | None
    speedup: Figure | None


def _skips_penalized(version: str | None) -> bool:
    """vLLM up to 0.11 skips speculation for requests with penalties, min_p or logprobs."""
    try:
        major, minor = (int(p) for p in (version or "").split(".")[:2])
    except ValueError:
        return False
    return (major, minor) <= (0, 11)


def speculation(scene: Scene) -> list[Finding]:
    """Speculation configured but bypassed, accepting too little to pay for itself, or
    paying: tokens per forward pass, and the speed-up where a plain step is known."""
    steps = decode_steps(scene)
    if not scene.spec_configured or steps is None or steps.value < MIN_DECODE_STEPS:
        return []
    d = _figures(scene, steps)
    if d is None:
        return []
    if d.coverage.value < BYPASSED_COVERAGE:
        return _bypassed(scene, d)
    if d.acceptance is not None and d.acceptance.value < LOW_ACCEPTANCE:
        return _low_acceptance(d, d.acceptance)
    return _working(d)


def _figures(scene: Scene, steps: Figure) -> _Drafts | None:
    """Speculation's figures, from the derivation core; None without its coverage or its
    tokens per forward pass."""
    coverage = core(derive.spec_draft_coverage, scene.decode, unit="ratio")
    per_pass = core(derive.tokens_per_forward_pass, scene.decode, unit="factor")
    if coverage is None or per_pass is None:
        return None
    step = core(derive.inter_token_latency, scene.decode, unit="seconds")
    plain = lab_reading(
        scene,
        scene.lab.plain_step_seconds if scene.lab else None,
        "spec-decode's run without speculation, its decode step",
    )
    return _Drafts(
        steps=steps,
        coverage=coverage,
        per_pass=per_pass,
        acceptance=core(derive.spec_acceptance_ratio, scene.decode, unit="ratio"),
        length=core(derive.spec_mean_acceptance_length, scene.decode, unit="factor"),
        step=step,
        tpot=core(derive.time_per_output_token, scene.decode, unit="seconds"),
        drafts=counted(scene.decode, s.SPEC_DRAFTS),
        plain=plain,
        speedup=core(derive.spec_speedup, step, per_pass, plain, unit="times"),
    )


def _bypassed(scene: Scene, d: _Drafts) -> list[Finding]:
    """Few decode steps drafted: why this vLLM skips speculation, and how to stop it."""
    why = (
        f"vLLM {scene.vllm_version} skips speculation for every request with a "
        "repetition, frequency or presence penalty, min_p or logprobs — and a model's "
        "generation_config.json can set a penalty by default (Qwen2.5: "
        "repetition_penalty 1.05), which applies to every request that sets none"
        if _skips_penalized(scene.vllm_version)
        else "the proposer found nothing to draft (ngram: no match of the latest tokens "
        "in the context), or this vLLM skips speculation for the requests' sampling "
        "parameters"
    )
    change = [
        say(
            'send "repetition_penalty": 1.0 (no min_p, no logprobs) where the output '
            "allows it, or start vLLM with --generation-config vllm to drop the model's "
            "defaults"
        )
    ]
    lab_speedup = read(
        lab_reading(
            scene,
            scene.lab.speculative_speedup if scene.lab else None,
            "spec-decode speedup",
        ),
        "times",
    )
    if lab_speedup is not None:
        change.append(
            say(
                "the lab measured decode {speedup} faster with drafts on its prompt",
                speedup=lab_speedup,
            )
        )
    return [
        Finding(
            "speculation",
            "bypassed",
            "warning",
            "Speculation is configured but bypassed",
            say(
                "speculation is configured, but only {coverage} of {steps} decode steps "
                "drafted in {window}: {per_pass} tokens per forward pass",
                coverage=d.coverage,
                steps=d.steps,
                window=window(scene),
                per_pass=d.per_pass,
            ),
            tuple(change),
            (f"why: {why}",),
            (
                "the requests' sampling parameters (no series shows them): the cause is "
                "inferred from the version and the counters",
            ),
            f"{RUNBOOK}#vllmspecdecodebypassed",
        )
    ]


def _low_acceptance(d: _Drafts, acceptance: Figure) -> list[Finding]:
    """Few drafts accepted: whether speculation can pay for itself at all, and what to
    draft instead."""
    change = []
    needed = core(derive.spec_break_even_tokens_per_pass, d.step, d.plain, unit="factor")
    if needed is not None:
        change.append(
            say(
                "a step with speculation costs {needed} plain steps: it pays from {needed} "
                "tokens per forward pass",
                needed=needed,
            )
        )
    change.append(
        say(
            "draft fewer tokens (num_speculative_tokens), or a proposer that predicts "
            "this traffic better (a draft model, EAGLE); sampled requests (a temperature "
            "above zero) reject more drafts: speculation off for them"
        )
    )
    cannot_pay = d.per_pass.value < CANNOT_PAY_PER_PASS or (
        needed is not None and d.per_pass.value < needed.value
    )
    return [
        Finding(
            "speculation",
            "not_paying" if cannot_pay else "low_acceptance",
            "warning",
            "Speculation cannot pay for itself"
            if cannot_pay
            else "Speculation accepts few of its drafts",
            say(
                "{coverage} of decode steps drafted, but only {acceptance} of draft tokens "
                "were accepted: {per_pass} tokens per forward pass, so decoding is at most "
                "{per_pass} times as fast as without speculation, before what drafting "
                "and verifying cost",
                coverage=d.coverage,
                acceptance=acceptance,
                per_pass=d.per_pass,
            ),
            tuple(change),
            (
                "the speed-up is at most the tokens per forward pass: a step with "
                "speculation costs at least a plain one",
            ),
            () if d.plain is not None else ("a decode step without speculation (--lab gives one)",),
            f"{RUNBOOK}#vllmspecdecodeacceptancelow",
        )
    ]


def _working(d: _Drafts) -> list[Finding]:
    """Speculation drafting and accepted: what it pays, and down to which coverage."""
    if d.speedup is not None:
        what = say(
            "speculation pays: {per_pass} tokens per forward pass ({acceptance} of draft "
            "tokens accepted, on {coverage} of decode steps), a token every {tpot}: "
            "{speedup} as fast as a plain step",
            per_pass=d.per_pass,
            acceptance=d.acceptance,
            coverage=d.coverage,
            tpot=d.tpot,
            speedup=d.speedup,
        )
        unseen: tuple[str, ...] = ()
    else:
        what = say(
            "speculation works: {per_pass} tokens per forward pass ({acceptance} of draft "
            "tokens accepted, on {coverage} of decode steps, {drafts} drafts), a token every "
            "{tpot}",
            per_pass=d.per_pass,
            acceptance=d.acceptance,
            coverage=d.coverage,
            drafts=d.drafts,
            tpot=d.tpot,
        )
        unseen = (
            "the speed-up: it needs a decode step without speculation (--lab with a "
            "spec-decode phase); at most the tokens per forward pass",
        )
    change = []
    needed = core(derive.spec_break_even_tokens_per_pass, d.step, d.plain, unit="factor")
    cover = core(derive.spec_coverage_needed, needed, d.length, unit="ratio")
    if needed is not None and cover is not None:
        change.append(
            say(
                "it pays while at least {cover} of decode steps draft at this acceptance "
                "({needed} tokens per forward pass break even)",
                cover=cover,
                needed=needed,
            )
        )
    return [
        Finding(
            "speculation",
            "working",
            "ok",
            "Speculation works",
            what,
            tuple(change),
            unseen=unseen,
        )
    ]
