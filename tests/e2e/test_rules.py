"""The rules on real data. The session stack's Prometheus loads alerts/*.yaml and scrapes a
real vLLM (CPU build, ngram speculation, a 4,096-token pool) and the exporter every second,
after a speculative phase, a quiet gap and a flood that preempts (tests/realstack.py).

Prometheus evaluates the rules every second, but `for:` durations are minutes and the
flood lasts under a minute: alerts are checked pending (the `ALERTS` series), and their
expressions directly, never firing.
"""

from __future__ import annotations

import itertools
import math
from typing import Any

import pytest
import yaml

from tests.realstack import RealStack, failed_scrapes
from tests.rules.test_rules import ALERTS_FILE, rule_expressions, selector_names

pytestmark = pytest.mark.vllm

# Recording rule (fleet level, from vLLM's counters) -> the exporter's series (per engine).
# Only ratios: both are ratios of increases over windows that hold the whole spec phase
# (5 minutes for the rules, the exporter's 60 s), so they must agree. Rates per second
# would not: the windows differ in length.
SAME_RATIOS = {
    "namespace_job_model_name:vllm_time_per_output_token_seconds:rate5m": (
        "glassbox_time_per_output_token_seconds"
    ),
    "namespace_job_model_name:vllm_inter_token_latency_seconds:rate5m": (
        "glassbox_inter_token_latency_seconds"
    ),
    "namespace_job_model_name:vllm_tokens_per_forward_pass:rate5m": (
        "glassbox_tokens_per_forward_pass"
    ),
    "namespace_job_model_name:vllm_tokens_per_engine_step:rate5m": (
        "glassbox_tokens_per_engine_step"
    ),
    "namespace_job_model_name:vllm_spec_decode_acceptance_ratio:rate5m": (
        "glassbox_spec_decode_acceptance_ratio"
    ),
    "namespace_job_model_name:vllm_spec_decode_mean_acceptance_length:rate5m": (
        "glassbox_spec_decode_mean_acceptance_length"
    ),
    "namespace_job_model_name:vllm_spec_decode_draft_coverage_ratio:rate5m": (
        "glassbox_spec_decode_draft_coverage_ratio"
    ),
}
STORM_BY = "job, instance, model_name, engine"


def one_value(stack: RealStack, expr: str, at: float) -> float:
    result = stack.query(expr, at=at)
    assert len(result) == 1, f"{expr} at {at}: expected one series, got {result}"
    return float(result[0]["value"][1])


def alerts_active(stack: RealStack, start: float, end: float, state: str) -> set[str]:
    """Names of alerts whose ALERTS series had state `state` (a regex) in [start, end]."""
    seconds = math.ceil(end - start)
    result = stack.query(f'max_over_time(ALERTS{{alertstate=~"{state}"}}[{seconds}s])', at=end)
    return {r["metric"]["alertname"] for r in result}


def present_at(stack: RealStack, expr: str, start: float, end: float) -> dict[float, float]:
    """Evaluation time -> value, at every second of [start, end] where `expr` has a sample
    (the stack's single vLLM engine gives at most one series)."""
    result: list[dict[str, Any]] = stack.query_range(expr, start, end, 1.0)
    assert len(result) <= 1, f"{expr}: several series {result}"
    return {float(t): float(v) for t, v in result[0]["values"]} if result else {}


def alert_expr(name: str) -> str:
    groups = yaml.safe_load(ALERTS_FILE.read_text())["groups"]
    return next(str(r["expr"]) for g in groups for r in g["rules"] if r.get("alert") == name)


# --- recording rules against the exporter ------------------------------------------------


def test_spec_phase_really_speculated(stack: RealStack) -> None:
    """The comparison below is only worth it if drafts were made and accepted."""
    model = f'model_name="{stack.served_model_name}"'
    at = stack.spec_compare_at
    assert one_value(stack, f"glassbox_tokens_per_forward_pass{{{model}}}", at) > 2.0
    assert one_value(stack, f"glassbox_spec_decode_acceptance_ratio{{{model}}}", at) > 0.5


@pytest.mark.parametrize("record", sorted(SAME_RATIOS))
def test_recording_rule_equals_the_exporter_after_the_spec_phase(
    stack: RealStack, record: str
) -> None:
    model = f'model_name="{stack.served_model_name}"'
    at = stack.spec_compare_at
    from_rule = one_value(stack, f"{record}{{{model}}}", at)
    from_exporter = one_value(stack, f"{SAME_RATIOS[record]}{{{model}}}", at)
    assert from_rule == pytest.approx(from_exporter, rel=0.02), (record, from_rule, from_exporter)


def test_acceptance_by_position_rule_equals_the_exporter(stack: RealStack) -> None:
    model = f'model_name="{stack.served_model_name}"'
    at = stack.spec_compare_at

    def by_position(expr: str) -> dict[str, float]:
        return {r["metric"]["position"]: float(r["value"][1]) for r in stack.query(expr, at=at)}

    from_rule = by_position(
        f"namespace_job_model_name_position:vllm_spec_decode_acceptance_ratio:rate5m{{{model}}}"
    )
    from_exporter = by_position(f"glassbox_spec_decode_position_acceptance_ratio{{{model}}}")
    assert sorted(from_rule) == ["0", "1", "2", "3", "4"]  # num_speculative_tokens 5
    assert from_rule == pytest.approx(from_exporter, rel=0.02)


def test_glassbox_series_named_by_the_rules_are_scraped_from_the_real_exporter(
    stack: RealStack,
) -> None:
    # Anywhere in the run: some series exist only while requests run (KV headroom) or
    # while the pool fills (its exhaustion forecast).
    t = stack.times
    run = f"{math.ceil(t['flood_end'] - t['spec_start']) + 5}s"
    result = stack.query(
        f'count by (__name__) (last_over_time({{__name__=~"glassbox_.+"}}[{run}]))',
        at=t["flood_end"] + 2,
    )
    scraped = {r["metric"]["__name__"] for r in result}
    named = {
        n for _, e in rule_expressions() for n in selector_names(e) if n.startswith("glassbox_")
    }
    # Published only while an input is flagged (vLLM 0.32's log and page are read whole),
    # and once the exporter saw vLLM restart (the chaos test restarts it).
    named -= {"glassbox_input_unrecognised", "glassbox_target_last_restart_timestamp_seconds"}
    # Published only with a price of a GPU hour (--gpu-hour-price): the stack's has none.
    named -= {"glassbox_engine_hourly_cost"}
    assert named <= scraped, sorted(named - scraped)


# --- the flood --------------------------------------------------------------------------


def test_flood_preemptions_are_recorded_and_the_spec_phase_had_none(stack: RealStack) -> None:
    t = stack.times
    model = f'model_name="{stack.served_model_name}"'
    rule = f"namespace_job_model_name:vllm_num_preemptions:rate5m{{{model}}}"
    assert one_value(stack, rule, t["flood_start"]) == 0.0
    end = t["flood_end"] + 2
    preempted = one_value(stack, "sum(vllm:num_preemptions_total)", end)
    assert preempted >= 3, "the flood is meant to overflow the pool and preempt"
    # The 5-minute window holds the whole run, so rate × 300 s is every preemption vLLM
    # counted (Prometheus extrapolates the last second or so: a few percent at most).
    assert one_value(stack, f"{rule} * 300", end) == pytest.approx(preempted, rel=0.05)


def test_flood_makes_the_capacity_alerts_pending_and_nothing_breaks(stack: RealStack) -> None:
    t = stack.times
    flood = alerts_active(stack, t["flood_start"], t["flood_end"] + 2, "pending|firing")
    print("alerts active during the flood:", sorted(flood))
    # The pool fills, requests queue and vLLM preempts (see the storm test for numbers).
    assert {"VLLMPreemptionStorm", "VLLMKVCacheSaturated", "VLLMRequestQueueGrowing"} <= flood
    # The exporter answers every scrape in time, the exporter reads vLLM (busy is slow,
    # not down), vLLM does not restart.
    start, end = t["spec_start"] - 30, t["flood_end"] + 2
    why = restart_evidence(stack, start, end)
    assert not {"GlassboxTargetDown", "VLLMTargetRestarted"} & flood, why
    whole_run = alerts_active(stack, t["spec_start"], end, "pending|firing")
    assert not {"GlassboxTargetDown", "VLLMTargetRestarted"} & whole_run, why
    # GlassboxExporterAbsent goes pending at a failed scrape (its `for: 5m` is for those):
    # a stalled machine or Prometheus may have failed one, never the exporter.
    stalls = stack.machine_stalls()
    missed = failed_scrapes(stack.prometheus_url, "glassbox", start, end)
    assert not [f for f in missed if f.the_targets_fault(stalls)], why
    if "GlassboxExporterAbsent" in flood:
        assert missed, "pending with no failed scrape: the exporter's `up` went absent"


def restart_evidence(stack: RealStack, start: float, end: float) -> str:
    """What Prometheus saw that could look like a restart, failed scrapes and polls: the
    message of a failing assertion, so that a spurious alert names its cause."""
    span = f"{math.ceil(end - start)}s"
    raw = stack.query(
        '{__name__=~"vllm:.+(_total|_count|_sum)|process_start_time_seconds", job="vllm"}'
        f"[{span}]",
        at=end,
    )
    went_down = []
    for series in raw:
        values = [(float(t), float(v)) for t, v in series["values"]]
        went_down += [
            f"{series['metric']['__name__']}{{{series['metric'].get('engine', '')}}} "
            f"{a:g} -> {b:g} at {t - start:.0f}s"
            for (_, a), (t, b) in itertools.pairwise(values)
            if b < a or (series["metric"]["__name__"] == "process_start_time_seconds" and b != a)
        ]
    stalls = stack.machine_stalls()
    failed = [
        f"{f.job} at {f.at - start:.1f}s took {f.seconds:.2f}s"
        + (" (the machine stalled)" if f.machine_stalled(stalls) else "")
        + (" (Prometheus late)" if f.prometheus_late else "")
        for job in ("vllm", "glassbox")
        for f in failed_scrapes(stack.prometheus_url, job, start, end)
    ]
    errors = stack.query(f"increase(glassbox_scrape_errors_total[{span}]) > 0", at=end)
    restarts = stack.query(f"max_over_time(glassbox_target_restarts_total[{span}])", at=end)
    return (
        f"vLLM series that went down or changed start: {went_down or 'none'}; "
        f"failed scrapes: {failed or 'none'} (the machine stalled {len(stalls)} times); "
        f"exporter errors: {[(r['metric']['reason'], r['value'][1]) for r in errors]}; "
        f"exporter restarts: {[r['value'][1] for r in restarts]}"
    )


def test_spec_phase_is_neither_bypassed_nor_low_acceptance(stack: RealStack) -> None:
    t = stack.times
    spec = alerts_active(stack, t["spec_start"], t["flood_start"], "pending|firing")
    print("alerts active during the spec phase and the quiet gap:", sorted(spec))
    # repetition_penalty 1.0 and a repetitive prompt: most decode steps draft and the
    # drafts are accepted.
    assert not {"VLLMSpecDecodeBypassed", "VLLMSpecDecodeAcceptanceLow"} & spec
    assert not {"VLLMPreemptionStorm", "VLLMKVCacheSaturated", "VLLMRequestQueueGrowing"} & spec


def test_decode_bandwidth_low_is_pending_while_decoding_far_below_the_configured_peak(
    stack: RealStack,
) -> None:
    # The stack tells the exporter the peak is 20 GB/s; a tiny model on CPU reads its
    # weights far slower, so the ratio is well under the alert's 0.4 while decoding.
    at = stack.spec_compare_at
    ratio = one_value(
        stack,
        f'glassbox_memory_bandwidth_utilization_ratio{{model_name="{stack.served_model_name}"}}',
        at,
    )
    print(f"weight-read bandwidth / peak after the spec phase: {ratio:.4f}")
    assert ratio < 0.4
    t = stack.times
    assert "VLLMDecodeBandwidthLow" in alerts_active(stack, t["spec_start"], at, "pending")


def test_preemption_storm_expression_is_its_three_conditions_and_never_fires_on_a_short_flood(
    stack: RealStack,
) -> None:
    t = stack.times
    start, end = t["spec_start"], t["flood_end"] + 2
    storm = present_at(stack, alert_expr("VLLMPreemptionStorm"), start, end)
    preemptions = present_at(
        stack, f"sum by ({STORM_BY}) (increase(vllm:num_preemptions_total[2m]))", start, end
    )
    full = present_at(
        stack,
        f"max by ({STORM_BY}) (max_over_time(vllm:kv_cache_usage_perc[2m])) >= 0.9",
        start,
        end,
    )
    waiting = present_at(
        stack,
        f"max by ({STORM_BY}) (max_over_time(vllm:num_requests_waiting[2m])) > 0",
        start,
        end,
    )
    print(
        f"flood: {max(preemptions.values()):.1f} preemptions in 2 minutes at most, "
        f"storm expression true for {len(storm)} s of a {end - t['flood_start']:.0f} s flood"
    )
    assert storm, "the flood preempted at a full pool with requests waiting"
    conditions = {ts for ts, n in preemptions.items() if n >= 3} & set(full) & set(waiting)
    assert set(storm) == conditions
    assert min(storm) > t["flood_start"]  # nothing of the kind in the spec phase
    # Its value is the preemptions in the window: at most what vLLM counted in all (plus
    # Prometheus' extrapolation of the last second).
    counted = one_value(stack, "sum(vllm:num_preemptions_total)", end)
    assert 3 <= max(storm.values()) <= counted * 1.05
    # The first preemptions, fewer than 3, are not a storm.
    first = min(ts for ts, n in preemptions.items() if n > 0)
    if preemptions[first] < 3:
        assert first not in storm
    # `for: 3m` outlasts the flood: the alert is pending, never firing.
    assert "VLLMPreemptionStorm" in alerts_active(stack, start, end, "pending")
    assert "VLLMPreemptionStorm" not in alerts_active(stack, start, end, "firing")
