"""SLO files: read and checked (every problem named by file and key), the bucket each latency
objective counts, the rules `glassbox rules --slo` writes, and the lab's goodput by the
same objectives. promtool runs the rules in tests/rules/test_slo.py."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client import CollectorRegistry, Histogram, generate_latest
from vllm_glassbox import rules
from vllm_glassbox.core import derive, slo
from vllm_glassbox.core.slo import rules as slo_rules

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "alerts" / "slo" / "example.yaml"
EXAMPLE_RULES = REPO / "alerts" / "slo" / "example.rules.yaml"


def parse(text: str, source: str = "slo.yaml") -> slo.SloFile:
    return slo.parse(yaml.safe_load(text), source)


def problems(text: str) -> list[str]:
    with pytest.raises(slo.SloError) as raised:
        parse(text)
    assert raised.value.source == "slo.yaml"
    assert str(raised.value).startswith(f"slo.yaml: {len(raised.value.problems)} problem(s):")
    return raised.value.problems


# --- reading -----------------------------------------------------------------------------


def test_the_example_file_reads_as_written() -> None:
    example = slo.read_slo_file(EXAMPLE)
    ttft, tpot, errors, fleet = example.objectives
    assert (ttft.name, ttft.sli, ttft.namespace, ttft.model) == (
        "chat-ttft",
        "ttft",
        "team-a",
        "qwen",
    )
    assert (ttft.threshold_seconds, ttft.target, ttft.window_days) == (0.5, 0.99, 28)
    assert (tpot.threshold_seconds, tpot.window_days) == (0.075, 28)  # the default window
    assert (errors.sli, errors.threshold_seconds) == ("errors", None)
    assert errors.target == pytest.approx(0.999)
    assert errors.budget == pytest.approx(0.001)
    assert (fleet.namespace, fleet.model, fleet.window_days, fleet.target) == (None, None, 30, 0.95)


@pytest.mark.parametrize(
    ("value", "seconds"), [("500ms", 0.5), ("2s", 2.0), ("1m", 60.0), (0.25, 0.25), (3, 3.0)]
)
def test_thresholds_are_durations_or_seconds(value: object, seconds: float) -> None:
    assert slo.threshold_seconds(value) == seconds


@pytest.mark.parametrize(("value", "share"), [("99%", 0.99), ("99.9%", 0.999), (0.95, 0.95)])
def test_targets_are_percentages_or_shares(value: object, share: float) -> None:
    assert slo.target_share(value) == pytest.approx(share)


# A good latency objective; each refused change of it (None: leaves the key out), the key
# named and what the message says. The chart refuses the same (tests/chart/test_slo.py).
GOOD = {"name": "a", "sli": "ttft", "threshold": "1s", "target": "99%"}
REFUSED: list[tuple[dict[str, object], str, str]] = [
    ({"threshold": None}, "threshold", "required for a latency objective (ttft)"),
    ({"threshold": "5 s"}, "threshold", "must be a duration such as 500ms"),
    ({"threshold": 0}, "threshold", "must be more than 0 seconds"),
    ({"threshold": "0.5ms"}, "threshold", "below vLLM's smallest time_to_first_token"),
    ({"sli": "errors"}, "threshold", "an errors objective has no threshold"),
    ({"target": "100%"}, "target", "must be above 0 and below 100 %"),
    ({"target": 99}, "target", "must be above 0 and below 100 %"),
    ({"target": "high"}, "target", "must be a share such as 99% or 0.99"),
    ({"window": "4w"}, "window", "must be whole days such as 28d"),
    ({"window": "400d"}, "window", "(at most 365d)"),
    ({"name": "Chat_TTFT"}, "name", "lower case letters, digits and dashes"),
    ({"name": None}, "name", "required"),
    ({"sli": "itl"}, "sli", "one of ttft, tpot, e2e, errors"),
    ({"model": 'qwen"'}, "model", "a served model name"),
    ({"namespace": "Team_A"}, "namespace", "a Kubernetes namespace name"),
    ({"team": "x"}, "team", "unknown key"),
]


def changed(change: dict[str, object]) -> dict[str, object]:
    return {k: v for k, v in {**GOOD, **change}.items() if v is not None}


@pytest.mark.parametrize(("change", "key", "message"), REFUSED)
def test_each_problem_is_named_by_its_key(
    change: dict[str, object], key: str, message: str
) -> None:
    found = problems(yaml.safe_dump({"objectives": [changed(change)]}))
    assert len(found) == 1, found
    assert found[0].startswith(f"objectives[0].{key}: "), found
    assert message in found[0], found


def test_every_problem_of_a_file_is_listed_at_once() -> None:
    found = problems(
        """
buckets:
  time_to_first_token: [0.5, 0.25]
  ttft: [1]
objectives:
  - {name: a, sli: ttft, threshold: 1s, target: 99%}
  - {name: a, sli: errors, target: 1.5}
  - not a mapping
owner: me
"""
    )
    assert [p.split(": ", 1)[0] for p in found] == [
        "owner",
        "buckets.time_to_first_token",
        "buckets.ttft",
        "objectives[1].target",
        "objectives[2]",
    ]
    assert "must rise, each boundary once" in found[1] and "unknown family" in found[2]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("[]", "must be a mapping with `objectives`, not a list"),
        ("objectives: []", "objectives: required: a list of at least one objective"),
        ("{}", "objectives: required"),
    ],
)
def test_a_file_without_objectives_is_refused(text: str, message: str) -> None:
    with pytest.raises(slo.SloError) as raised:
        parse(text)
    assert message in str(raised.value)


def test_an_unreadable_or_broken_file_names_itself(tmp_path: Path) -> None:
    with pytest.raises(slo.SloError, match=r"missing\.yaml: 1 problem\(s\):\n  cannot be read"):
        slo.read_slo_file(tmp_path / "missing.yaml")
    broken = tmp_path / "broken.yaml"
    broken.write_text("objectives: [\n")
    with pytest.raises(slo.SloError, match=r"broken\.yaml: 1 problem\(s\):\n  not YAML"):
        slo.read_slo_file(broken)


def test_two_objectives_of_one_name_are_refused() -> None:
    found = problems(
        "objectives:\n  - {name: a, sli: errors, target: 99%}\n"
        "  - {name: a, sli: e2e, threshold: 1s, target: 99%}\n"
    )
    assert found == ["objectives[1].name: 'a' is the name of an earlier objective"]


# --- the bucket each latency objective counts ----------------------------------------------


def one(text: str) -> tuple[slo.SloFile, slo.Objective]:
    parsed = parse(text)
    return parsed, parsed.objectives[0]


def test_a_threshold_on_a_boundary_is_counted_in_its_bucket() -> None:
    parsed, objective = one("objectives: [{name: a, sli: ttft, threshold: 250ms, target: 99%}]")
    assert parsed.boundary(objective) == slo.Boundary(0.25, exact=True)
    assert slo.warnings(parsed) == []


def test_a_threshold_between_boundaries_counts_the_nearest_below_and_says_so() -> None:
    parsed, objective = one("objectives: [{name: a, sli: e2e, threshold: 25s, target: 99%}]")
    boundary = parsed.boundary(objective)
    assert boundary == slo.Boundary(20.0, exact=False) and boundary.le == "20.0"
    (warning,) = slo.warnings(parsed)
    assert warning.startswith("slo.yaml: objectives[0] (a): threshold 25 s is not a boundary")
    assert 'the rules count requests ≤ 20 s (le="20.0"), the nearest boundary below' in warning
    assert "--custom-histogram-buckets" in warning and "request_latency" in warning


def test_buckets_given_as_vllm_was_given_them_decide_the_boundary() -> None:
    parsed, objective = one(
        """
buckets:
  time_to_first_token: [0.1, 0.3, 0.6, 1.2]
  request_latency: [1, 2]  # another family: no effect on TTFT
objectives: [{name: a, sli: ttft, threshold: 600ms, target: 99%}]
"""
    )
    assert parsed.boundary(objective) == slo.Boundary(0.6, exact=True)
    assert slo.warnings(parsed) == []
    parsed, objective = one(
        "buckets: {time_to_first_token: [0.1, 0.3]}\n"
        "objectives: [{name: a, sli: ttft, threshold: 250ms, target: 99%}]"
    )
    assert parsed.boundary(objective) == slo.Boundary(0.1, exact=False)
    assert "is not a boundary of the SLO file's buckets" in slo.warnings(parsed)[0]


def test_the_tpot_objective_uses_the_inter_token_latency_family() -> None:
    parsed, objective = one(
        "buckets: {inter_token_latency: [0.02, 0.04]}\n"
        "objectives: [{name: a, sli: tpot, threshold: 40ms, target: 99%}]"
    )
    assert objective.histogram and objective.histogram.name == (
        "vllm:request_time_per_output_token_seconds"
    )
    assert parsed.boundary(objective) == slo.Boundary(0.04, exact=True)


def test_boundaries_are_written_as_vllms_exposition_writes_le() -> None:
    """prometheus_client (vLLM's exposition) writes each default boundary; le_text agrees."""
    for histogram in slo.HISTOGRAMS.values():
        registry = CollectorRegistry()
        Histogram("h", "h", registry=registry, buckets=histogram.default_buckets).observe(0)
        page = generate_latest(registry).decode()
        written = re.findall(r'h_bucket\{le="([^"]+)"\}', page)
        assert written[:-1] == [slo.le_text(b) for b in histogram.default_buckets]


def test_targets_too_loose_for_a_burn_alert_are_warned_about() -> None:
    parsed = parse("objectives: [{name: a, sli: errors, target: 90%}]")
    (fast,) = slo.warnings(parsed)  # 14.4 × 10 % > 1; 6 × 10 % < 1
    assert "VLLMSLOFastBurn can never fire" in fast


# --- the rules ------------------------------------------------------------------------------


def groups_of(text: str) -> list[dict[str, Any]]:
    return slo.rule_groups(parse(text))


def test_each_objective_has_its_groups_and_every_rule_names_it() -> None:
    groups = groups_of(EXAMPLE.read_text())
    names = [g["name"] for g in groups]
    assert names == [
        f"glassbox.slo.{n}{part}"
        for n in ("chat-ttft", "chat-tpot", "chat-errors", "fleet-e2e")
        for part in ("", ".budget")
    ]
    assert [g.get("interval") for g in groups] == [None, "5m"] * 4
    for group in groups:
        objective = group["name"].split(".")[2]
        for rule in group["rules"]:
            assert rule["labels"]["slo"] == objective
            assert "@" not in yaml.safe_dump(rule), rule  # every placeholder filled


def test_latency_objectives_read_their_bucket_and_errors_have_no_boundary_rules() -> None:
    ttft, _, errors = [
        g for g in groups_of(EXAMPLE.read_text()) if not g["name"].endswith(".budget")
    ][:3]
    ttft_rules = {r.get("record") or r["alert"]: r for r in ttft["rules"]}
    assert (
        'le="0.5"' in ttft_rules["namespace_job_model_name_slo:glassbox_slo_errors:rate5m"]["expr"]
    )
    selector = 'model_name="qwen", namespace="team-a"'
    assert (
        selector in ttft_rules["namespace_job_model_name_slo:glassbox_slo_requests:rate5m"]["expr"]
    )
    assert ttft_rules["namespace_job_model_name_slo:glassbox_slo_requests:rate5m"]["labels"] == {
        "slo": "chat-ttft",
        "sli": "ttft",
        "threshold": "0.5",
    }
    error_rules = {r.get("record") or r["alert"] for r in errors["rules"]}
    assert "VLLMSLOBoundaryMissing" in ttft_rules and "VLLMSLOBoundaryMissing" not in error_rules
    assert "namespace_job_model_name_slo:glassbox_slo_boundary_missing:count" not in error_rules


def test_an_objective_of_every_model_selects_any_model() -> None:
    (group, _) = groups_of("objectives: [{name: a, sli: e2e, threshold: 20s, target: 95%}]")
    requests = group["rules"][1]
    assert requests["record"] == "namespace_job_model_name_slo:glassbox_slo_requests:rate5m"
    assert '_count{model_name=~".+"}' in requests["expr"]


def test_budget_and_target_are_written_as_the_rules_compare_them() -> None:
    (fast,) = [
        r
        for g in groups_of("objectives: [{name: a, sli: errors, target: 99.9%, window: 30d}]")
        for r in g["rules"]
        if r.get("alert") == "VLLMSLOFastBurn"
    ]
    assert "/ 0.001 > 14.4" in fast["expr"]
    assert "for 0.999 of requests over 30d" in fast["annotations"]["description"]


# --- glassbox rules --slo ---------------------------------------------------------------------


def test_glassbox_rules_writes_an_slo_files_rules_and_warns_of_the_boundary(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert rules.main(["--slo", str(EXAMPLE), "--out", str(tmp_path)]) == 0
    out, err = capsys.readouterr()
    written = tmp_path / "example.rules.yaml"
    assert out.strip() == str(written)
    assert err.startswith(f"glassbox rules: warning: {EXAMPLE}: objectives[3] (fleet-e2e): ")
    text = written.read_text()
    assert text.startswith("# GENERATED by `glassbox rules --slo example.yaml`: do not edit.\n")
    assert (
        '# fleet-e2e: e2e ≤ 25 s, counted in the bucket le="20.0" (the nearest boundary below).'
        in text
    )
    assert yaml.safe_load(text)["groups"] == slo.rule_groups(slo.read_slo_file(EXAMPLE))


def test_the_checked_in_example_rules_are_the_example_files() -> None:
    """alerts/slo/example.rules.yaml is generated (`make generate`): it must not drift."""
    expected = rules.slo_rule_file_text(slo.read_slo_file(EXAMPLE), EXAMPLE.name, [])
    assert EXAMPLE_RULES.read_text() == expected, "run `make generate` and commit the result"


def test_glassbox_rules_adds_aggregation_labels_to_the_slo_rules(tmp_path: Path) -> None:
    args = ["--slo", str(EXAMPLE), "--aggregation-labels", "cluster", "--out", str(tmp_path)]
    assert rules.main(args) == 0
    written = yaml.safe_load((tmp_path / "example.rules.yaml").read_text())["groups"]
    source = slo.rule_groups(slo.read_slo_file(EXAMPLE))
    for mine, theirs in zip(written, source, strict=True):
        for a, b in zip(mine["rules"], theirs["rules"], strict=True):
            assert a["expr"] == rules.with_aggregation_labels(b["expr"], ["cluster"])
    assert "sum by (cluster, namespace, job, model_name)" in yaml.safe_dump(written)


def test_glassbox_rules_with_a_broken_slo_file_writes_nothing_and_names_each_problem(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("objectives:\n  - {name: a, sli: ttft, target: 99.9}\n")
    out_dir = tmp_path / "out"
    assert rules.main(["--slo", str(bad), "--out", str(out_dir)]) == 1
    err = capsys.readouterr().err
    assert f"glassbox rules: {bad}: 2 problem(s):" in err
    assert "objectives[0].target: must be above 0 and below 100 % (1), not 99.9" in err
    assert "objectives[0].threshold: required for a latency objective (ttft)" in err
    assert not out_dir.exists()


def test_glassbox_rules_needs_something_to_write(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit):
        rules.main(["--out", str(tmp_path)])
    assert "give rule files (with --aggregation-labels), --slo FILE, or both" in (
        capsys.readouterr().err
    )


# --- the lab's goodput: the same objectives, request by request ----------------------------

GOODPUT_SLO = """
objectives:
  - {name: ttft, sli: ttft, threshold: 600ms, target: 75%}   # counted at 0.5 s
  - {name: tpot, sli: tpot, threshold: 100ms, target: 50%, model: other}  # not this model's
  - {name: e2e, sli: e2e, threshold: 10s, target: 50%}
  - {name: errors, sli: errors, target: 90%}
"""


def outcome(ttft: float, e2e: float, tokens: int = 11, failed: bool = False) -> slo.RequestOutcome:
    return slo.RequestOutcome(failed, None if failed else ttft, None if failed else e2e, tokens)


def test_goodput_judges_each_request_by_every_objective_of_the_model() -> None:
    requests = [
        outcome(0.2, 5.0),  # good for all
        outcome(0.5, 9.0),  # TTFT exactly at the boundary counted: good
        outcome(0.55, 5.0),  # under the 600 ms asked, over the 0.5 s counted: bad TTFT
        outcome(0.1, 12.0),  # too slow end to end
        outcome(0.0, 0.0, failed=True),  # failed: an error, no latency to count
    ]
    result = slo.goodput(parse(GOODPUT_SLO), requests, seconds=10.0, model="qwen")
    by_name = {a.objective: a for a in result.attainments}
    assert set(by_name) == {"ttft", "e2e", "errors"}  # tpot is another model's
    # By hand: TTFT 3 of the 4 answered within 0.5 s; e2e 3 of 4 within 10 s; 4 of 5 did
    # not fail.
    assert (by_name["ttft"].good, by_name["ttft"].counted) == (3, 4)
    assert by_name["ttft"].threshold_seconds == 0.5
    assert (by_name["e2e"].good, by_name["e2e"].counted) == (3, 4)
    assert (by_name["errors"].good, by_name["errors"].counted) == (4, 5)
    assert by_name["ttft"].share == 0.75 and by_name["ttft"].met is True  # target 75 %
    assert by_name["ttft"].burn_rate == pytest.approx(0.25 / 0.25)
    assert by_name["e2e"].met is True and by_name["errors"].met is False  # 80 % < 90 %
    assert by_name["errors"].burn_rate == pytest.approx(0.2 / 0.1)
    assert (result.requests, result.good_requests) == (5, 2)
    assert result.per_second == pytest.approx(0.2)
    assert result.met is False


def test_goodput_of_no_request_is_unknown_not_met() -> None:
    result = slo.goodput(parse(GOODPUT_SLO), [], seconds=10.0, model="qwen")
    assert result.met is None and result.good_requests == 0
    assert all(a.share is None and a.met is None for a in result.attainments)


def test_a_requests_tpot_is_its_decode_time_over_its_tokens_after_the_first() -> None:
    assert outcome(1.0, 4.0, tokens=31).tpot_seconds == pytest.approx(0.1)
    assert outcome(1.0, 1.0, tokens=1).tpot_seconds == 0.0  # vLLM records 0 for one token
    assert derive.request_time_per_output_token(None, 1.0, 5) is None


def test_burn_rate_and_budget_remaining_by_hand() -> None:
    assert derive.burn_rate(0.02, 0.99) == pytest.approx(2.0)
    assert derive.error_budget_remaining(0.0025, 0.99) == pytest.approx(0.75)
    assert derive.error_budget_remaining(0.02, 0.99) == pytest.approx(-1.0)  # overspent
    assert derive.burn_rate(None, 0.99) is None
    assert derive.slo_error_ratio(derive.requests_over_threshold(60, 57), 60) == pytest.approx(0.05)


def test_the_burn_alerts_are_read_from_the_rule_template_as_the_workbook_has_them() -> None:
    """The SRE workbook's windows and factors, as the template's alert expressions say them:
    what glassbox explain judges a burn by (explain/diagnoses/slo.py)."""
    clauses = {
        alert: [(c.windows, c.factor) for c in found] for alert, found in slo.BURN_ALERTS.items()
    }
    assert clauses == {
        "VLLMSLOFastBurn": [(("rate1h", "rate5m"), 14.4)],
        "VLLMSLOSlowBurn": [(("rate6h", "rate30m"), 6.0)],
        "VLLMSLOTicketBurn": [(("rate1d", "rate2h"), 3.0), (("rate3d", "rate6h"), 1.0)],
    }
    assert clauses["VLLMSLOFastBurn"][0][1] == slo.FAST_BURN
    assert clauses["VLLMSLOSlowBurn"][0][1] == slo.SLOW_BURN


def test_the_template_is_read_as_pyyaml_s_own_parser_reads_it() -> None:
    assert slo.template_document() == yaml.safe_load(slo.template_text())
    assert slo.template_document() is slo.template_document()  # read once


def test_a_burn_clause_of_two_factors_is_refused() -> None:
    template = slo.template_text().replace("@BUDGET@ > 14.4\n", "@BUDGET@ > 14\n", 1)
    assert template != slo.template_text()
    with pytest.raises(ValueError, match="VLLMSLOFastBurn: one factor a clause"):
        slo_rules._burn_alerts(yaml.safe_load(template))


@pytest.mark.parametrize(
    ("days", "factor", "said"),
    [
        (28, 14.4, "under 2 days"),  # 1.94 days
        (30, 14.4, "under 2.1 days"),  # 2.08 days: not "under two days"
        (7, 14.4, "under 12 hours"),  # 11.7 hours
        (1, 14.4, "under 2 hours"),  # 1.67 hours
        (28, 6.0, "under 4.7 days"),  # 4.67 days
        (30, 6.0, "under 5 days"),  # exactly 5: the alert fires above 6×
        (31, 6.0, "under 5.2 days"),  # 5.17 days: not "under five days"
        (365, 6.0, "under 60.9 days"),  # 60.83 days
    ],
)
def test_a_burn_alert_says_how_long_the_budget_lasts_at_its_burn(
    days: int, factor: float, said: str
) -> None:
    assert slo.budget_lasts(days, factor) == said


@pytest.mark.parametrize("factor", [slo.FAST_BURN, slo.SLOW_BURN])
def test_the_budgets_time_said_is_never_less_than_it_lasts_for_any_window(factor: float) -> None:
    # A burn above the factor spends the window's budget in less than window / factor:
    # what the alert says must be at least that, and at most a tenth of a day (an hour)
    # more.
    for days in range(1, slo.MAX_WINDOW_DAYS + 1):
        said = slo.budget_lasts(days, factor)
        m = re.fullmatch(r"under ([0-9.]+) (days|hours)", said)
        assert m is not None, said
        lasts_hours = days * 24 / factor
        said_hours = float(m[1]) * (24 if m[2] == "days" else 1)
        slack = 2.4 if m[2] == "days" else 1.0
        assert lasts_hours - 1e-9 <= said_hours < lasts_hours + slack, (days, said)
        assert m[2] == "days" or lasts_hours < 48, (days, said)  # hours below two days only


def test_each_burn_alert_says_the_time_of_its_objectives_window() -> None:
    objectives = slo.parse(
        {
            "objectives": [
                {"name": "month", "sli": "errors", "target": "99%", "window": "30d"},
                {"name": "week", "sli": "errors", "target": "99%", "window": "7d"},
            ]
        },
        "t.yaml",
    )
    said = {
        (rule["labels"]["slo"], rule["alert"]): " ".join(rule["annotations"]["description"].split())
        for group in slo.rule_groups(objectives)
        for rule in group["rules"]
        if rule.get("alert") in ("VLLMSLOFastBurn", "VLLMSLOSlowBurn")
    }
    assert said[("month", "VLLMSLOFastBurn")].endswith("the budget is gone in under 2.1 days.")
    assert said[("month", "VLLMSLOSlowBurn")].endswith("the budget is gone in under 5 days.")
    assert said[("week", "VLLMSLOFastBurn")].endswith("the budget is gone in under 12 hours.")
    assert said[("week", "VLLMSLOSlowBurn")].endswith("the budget is gone in under 28 hours.")
