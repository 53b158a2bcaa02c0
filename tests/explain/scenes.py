"""Scenes written by hand for the diagnoses' tests, from the project's own measurements:
the tiny CPU model's pools (2,048 KV bytes a token, 128-token blocks), the captured
speculative requests (tests/fixtures/README.md) and the H200's BF16 run
(docs/results/h200/run-1)."""

from __future__ import annotations

from dataclasses import replace

from vllm_glassbox.core import snapshot as s
from vllm_glassbox.core.derive import Increase
from vllm_glassbox.explain.scene import ObjectiveState, Reading, Scene, Scope, Window

MIB = 1024**2


def scope(window: float = 60.0, engines: int = 1) -> Scope:
    return Scope("prometheus", "http://prometheus.invalid", "team-a", "tiny", engines, window)


def r(value: float, source: str = "by hand") -> Reading:
    return Reading(value, source)


def window(**counters: float) -> Window:
    names = {
        "generated": s.GENERATION_TOKENS,
        "first": s.TTFT_COUNT,
        "steps": s.ITL_COUNT,
        "step_seconds": s.ITL_SUM,
        "engine_steps": s.ENGINE_STEPS,
        "preemptions": s.PREEMPTIONS,
        "drafts": s.SPEC_DRAFTS,
        "draft_tokens": s.SPEC_DRAFT_TOKENS,
        "accepted": s.SPEC_ACCEPTED,
    }
    return Window(Increase({names[k]: v for k, v in counters.items()}, 60.0), "increase(<counter>)")


def storm() -> Scene:
    """The stack's flood, in round numbers: a 4,096-token pool (8 MiB, fixed by
    --kv-cache-memory-bytes) full, 58 preemptions, up to 11 running and 5 waiting, 10
    running and 3,500 tokens used on average (350 tokens a request)."""
    return Scene(
        scope(),
        decode=window(
            generated=9600,
            first=16,
            steps=9000,
            step_seconds=180.0,
            engine_steps=1200,
            preemptions=58,
        ),
        kv_capacity=r(4096),
        kv_block_size=r(128),
        kv_memory=r(8 * MIB),
        kv_memory_fixed=True,
        kv_usage_peak=r(1.0),
        kv_used_mean=r(3500),
        running_mean=r(10),
        running_peak=r(11),
        waiting_peak=r(5),
    )


def bypassed(version: str = "0.11.0") -> Scene:
    """The article's run on vLLM 0.11 under the model's default repetition penalty:
    256 tokens, 255 decode steps, no draft."""
    return Scene(
        scope(),
        decode=window(
            generated=256,
            first=1,
            steps=255,
            step_seconds=3.57,
            engine_steps=256,
            drafts=0,
            draft_tokens=0,
            accepted=0,
        ),
        spec_configured=True,
        vllm_version=version,
    )


def speculating() -> Scene:
    """Two speculative requests on the CPU build (spec-after-2x256 less idle): 512 tokens,
    2 first tokens, 104 decode steps (0.6 s), 96 drafts of 446 tokens, 414 accepted."""
    return Scene(
        scope(),
        decode=window(
            generated=512,
            first=2,
            steps=104,
            step_seconds=0.6,
            engine_steps=106,
            drafts=96,
            draft_tokens=446,
            accepted=414,
        ),
        spec_configured=True,
    )


def bf16() -> Scene:
    """The H200's BF16 variant: 14.29 GiB read in 381 decode steps of 4.7132 ms."""
    return Scene(
        scope(),
        decode=window(
            generated=384, first=3, steps=381, step_seconds=1.7957383069999935, engine_steps=384
        ),
        weights=r(15343770664.96),
        peak_bandwidth=r(4.8e12),
    )


def idle() -> Scene:
    return Scene(
        scope(600.0),
        decode=window(generated=0, first=0, steps=0, step_seconds=0.0, preemptions=0),
        kv_capacity=r(4096),
        kv_usage_peak=r(0.0),
        waiting_peak=r(0),
    )


def with_startup(scene: Scene, **stages: float) -> Scene:
    return replace(scene, startup={k: r(v) for k, v in stages.items()})


RECORD = "namespace_job_model_name_slo:glassbox_slo_"
ALERTS = 'ALERTS{alertname=~"VLLMSLO.+", alertstate="firing"}'


def objective(
    name: str,
    sli: str,
    target: float,
    threshold: float | None = None,
    budget: float | None = None,
    missing: float | None = None,
    firing: tuple[str, ...] = (),
    **ratios: float,
) -> ObjectiveState:
    """An objective as its records would show it: the error ratio over each window
    (rate5m=…, rate1h=…, period=…), the target, the budget left."""
    where = f'{{job="vllm", model_name="tiny", slo="{name}"}}'
    return ObjectiveState(
        name,
        sli,
        {"job": "vllm"},
        threshold=None if threshold is None else r(threshold, f"{RECORD}target:ratio{where}"),
        target=r(target, f"{RECORD}target:ratio{where}"),
        error_ratios={w: r(v, f"{RECORD}error_ratio:{w}{where}") for w, v in ratios.items()},
        budget_remaining=(
            None if budget is None else r(budget, f"{RECORD}error_budget_remaining:ratio{where}")
        ),
        boundary_missing=(
            None if missing is None else r(missing, f"{RECORD}boundary_missing:count{where}")
        ),
        firing=firing,
        alerts_source=ALERTS,
    )


def fast_e2e() -> ObjectiveState:
    """Whole requests within 20 s for 95 %: 80 % missed over the hour, 90 % over the last
    five minutes (burns of 16 and 18, both above 14.4), 40 % over six hours and 90 % over
    thirty minutes (8 and 18, above 6): both pages fire. 4 % missed over the period: a
    fifth of the budget is left."""
    return objective(
        "chat-e2e",
        "e2e",
        0.95,
        threshold=20.0,
        budget=0.2,
        firing=("VLLMSLOFastBurn", "VLLMSLOSlowBurn"),
        rate5m=0.9,
        rate30m=0.9,
        rate1h=0.8,
        rate2h=0.5,
        rate6h=0.4,
        rate1d=0.1,
        rate3d=0.04,
        period=0.04,
    )


def slow_ttft() -> ObjectiveState:
    """First tokens within 500 ms for 99 %: 10 % missed over the hour (a burn of 10, under
    14.4), 7 % over six hours and 8 % over thirty minutes (7 and 8, above 6): a slow burn.
    3 % missed over the period: three times the budget spent."""
    return objective(
        "chat-ttft",
        "ttft",
        0.99,
        threshold=0.5,
        budget=-2.0,
        firing=("VLLMSLOSlowBurn",),
        rate5m=0.2,
        rate30m=0.08,
        rate1h=0.1,
        rate2h=0.05,
        rate6h=0.07,
        rate1d=0.02,
        rate3d=0.03,
        period=0.03,
    )


def ticket_tpot() -> ObjectiveState:
    """Each request's time per output token within 75 ms for 99 %: 1.5 % missed over three
    days and 2 % over six hours (1.5 and 2, above 1), 1.5 % over a day (under 3): a ticket.
    Prometheus shows no alert firing."""
    return objective(
        "chat-tpot",
        "tpot",
        0.99,
        threshold=0.075,
        budget=0.5,
        rate5m=0.02,
        rate30m=0.02,
        rate1h=0.02,
        rate2h=0.02,
        rate6h=0.02,
        rate1d=0.015,
        rate3d=0.015,
        period=0.005,
    )


def kept_errors() -> ObjectiveState:
    """No request aborted, failed or refused beyond 0.05 % of them for 99.9 %: a burn of
    0.5 over the hour; nine tenths of the budget left."""
    return objective(
        "chat-errors", "errors", 0.999, budget=0.9, rate5m=0.0, rate1h=0.0005, period=0.0001
    )


def missing_tpot() -> ObjectiveState:
    """A TPOT objective at 60 ms on a vLLM without that bucket (its default buckets have
    none at 0.06): 8 series without it, no error ratio recorded."""
    return objective(
        "chat-tpot-custom",
        "tpot",
        0.99,
        threshold=0.06,
        missing=8.0,
        firing=("VLLMSLOBoundaryMissing",),
    )


def with_objectives(scene: Scene, *objectives: ObjectiveState) -> Scene:
    return replace(scene, objectives=objectives)
