"""The SLO rules (glassbox/slo_rules.yaml, rendered for alerts/slo/example.yaml): promtool's
lint and unit tests (alerts/slo/tests/), what those tests cover, the runbook, the series
the rules name, namespace and cluster kept in every aggregation, and the records against
the derivation core on captured vLLM pages."""

from __future__ import annotations

import functools
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from vllm_glassbox import rules
from vllm_glassbox.core import derive, slo
from vllm_glassbox.core.textformat import parse_samples

from tests.dashboards.test_dashboards import BOARDS
from tests.fixtures import page as fixture_page
from tests.rules.test_rules import (
    RUNBOOK_BASE,
    SEVERITIES,
    Check,
    _close_to,
    github_anchor,
    groupings,
    promtool,
    runbook_sections,
    seconds,
    selector_names,
    with_labels,
)
from tests.vllm_metric_names import IN_EVERY_SUPPORTED_VERSION, sample_names_shown_in

pytestmark = pytest.mark.prometheus

REPO = Path(__file__).resolve().parents[2]
SLO_DIR = REPO / "alerts" / "slo"
EXAMPLE = SLO_DIR / "example.yaml"
EXAMPLE_RULES = SLO_DIR / "example.rules.yaml"
UNIT_TEST_FILES = sorted((SLO_DIR / "tests").glob("*.yaml"))


@functools.cache
def example_rules() -> list[dict[str, Any]]:
    return [r for g in yaml.safe_load(EXAMPLE_RULES.read_text())["groups"] for r in g["rules"]]


@functools.cache
def template_rules() -> dict[str, dict[str, Any]]:
    """Every rule the template can render, by record or alert name, for an errors objective
    and then a latency one (the latency kind has every rule)."""
    both = slo.parse(
        {
            "objectives": [
                {"name": "e", "sli": "errors", "target": 0.99},
                {"name": "x", "sli": "ttft", "threshold": 1, "target": 0.99},
            ]
        },
        "x",
    )
    return {r.get("record") or r["alert"]: r for g in slo.rule_groups(both) for r in g["rules"]}


def every_rule() -> Iterator[tuple[str, dict[str, Any]]]:
    """(name, rule) of every rule of both kinds (the same names come twice)."""
    for group in slo.rule_groups(slo.read_slo_file(EXAMPLE)):
        for rule in group["rules"]:
            yield rule.get("record") or rule["alert"], rule


SLO_ALERTS = sorted(name for name in template_rules() if name[0].isupper())
SLO_RECORDS = sorted(name for name in template_rules() if ":" in name)


def test_the_template_has_the_alerts_and_records_the_docs_name() -> None:
    assert SLO_ALERTS == [
        "VLLMSLOBoundaryMissing",
        "VLLMSLOFastBurn",
        "VLLMSLOSlowBurn",
        "VLLMSLOTicketBurn",
    ]
    windows = {r.rpartition(":")[2] for r in SLO_RECORDS if "glassbox_slo_error_ratio" in r}
    assert windows == {
        "rate5m",
        "rate30m",
        "rate1h",
        "rate2h",
        "rate6h",
        "rate1d",
        "rate3d",
        "period",
    }


def test_promtool_check_rules_finds_every_rule_and_no_lint() -> None:
    result = promtool("check", "rules", "--lint=all", "--lint-fatal", str(EXAMPLE_RULES))
    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    assert f"SUCCESS: {len(example_rules())} rules found" in output


@pytest.mark.parametrize("path", UNIT_TEST_FILES, ids=lambda p: p.name)
def test_promtool_unit_tests_pass(path: Path) -> None:
    result = promtool("test", "rules", str(path))
    assert result.returncode == 0, (
        f"promtool test rules {path.name}:\n{result.stdout}{result.stderr}"
    )


# --- what the promtool tests cover ------------------------------------------------------


def unit_test_groups() -> Iterator[tuple[Path, float, dict[str, Any]]]:
    """(file, its evaluation interval in seconds, test group) of every SLO unit test."""
    for path in UNIT_TEST_FILES:
        document = yaml.safe_load(path.read_text())
        for group in document["tests"]:
            yield path, seconds(document["evaluation_interval"]), group


def test_every_group_is_named_and_sets_the_files_interval() -> None:
    for path, interval, group in unit_test_groups():
        where = f"{path.name}: {group.get('name', '(unnamed group)')}"
        assert group.get("name"), f"{where}: give the group a name that states the behaviour"
        assert seconds(group["interval"]) == interval, f"{where}: promtool 2.42 needs `interval`"


def test_every_file_evaluates_the_budget_groups_after_the_objectives_groups() -> None:
    """promtool orders the groups of one timestamp at random unless told; the budget groups
    read the objectives' records of the same evaluation."""
    groups = [g["name"] for g in yaml.safe_load(EXAMPLE_RULES.read_text())["groups"]]
    budget = [g for g in groups if g.endswith(".budget")]
    expected = [g for g in groups if g not in budget] + budget
    for path in UNIT_TEST_FILES:
        assert yaml.safe_load(path.read_text()).get("group_eval_order") == expected, path.name


def alert_checks() -> dict[str, list[tuple[Check, float]]]:
    checks: dict[str, list[tuple[Check, float]]] = {}
    for path, interval, group in unit_test_groups():
        for case in group.get("alert_rule_test", []):
            check = Check(
                f"{path.name}: {group['name']}",
                seconds(case["eval_time"]),
                bool(case["exp_alerts"]),
            )
            checks.setdefault(case["alertname"], []).append((check, interval))
    return checks


@pytest.mark.parametrize("alert", SLO_ALERTS)
def test_alert_is_tested_firing_one_evaluation_after_a_silent_check_and_on_a_near_miss(
    alert: str,
) -> None:
    checks = alert_checks().get(alert, [])
    firing = {c.group for c, _ in checks if c.fires}
    assert firing, f"{alert}: no promtool test where it fires"
    assert {c.group for c, _ in checks} - firing, (
        f"{alert}: no near miss (a group where it never fires)"
    )
    boundaries = [
        group
        for group in firing
        for first, interval in [min((c.at, i) for c, i in checks if c.group == group and c.fires)]
        if (Check(group, first - interval, False), interval) in checks
    ]
    assert boundaries, f"{alert}: no test checks it silent one evaluation before it fires"


def test_the_burn_alerts_fire_where_the_hand_counts_say() -> None:
    """The first firing minute of each burn, as each file's header derives it by hand."""
    fires = {
        (alert, check.group.split(":")[0], check.at / 60)
        for alert, checks in alert_checks().items()
        for check, _ in checks
        if check.fires
    }
    assert ("VLLMSLOFastBurn", "fast_burn_test.yaml", 71) in fires  # 11 minutes, all bad
    assert ("VLLMSLOSlowBurn", "slow_burn_test.yaml", 579) in fires  # 219 minutes at 10 %
    assert ("VLLMSLOTicketBurn", "ticket_burn_test.yaml", 5435) in fires  # 1,115 at 4 %
    assert ("VLLMSLOBoundaryMissing", "objectives_test.yaml", 15) in fires


# --- annotations and the runbook --------------------------------------------------------


@pytest.mark.parametrize("alert", SLO_ALERTS)
def test_alert_has_severity_summary_description_and_a_runbook_section(alert: str) -> None:
    rule = template_rules()[alert]
    assert rule["labels"]["severity"] in SEVERITIES
    annotations = rule["annotations"]
    assert set(annotations) == {"summary", "description", "runbook_url"}
    assert "{{" not in annotations["summary"]
    assert re.search(r"\{\{.*\$(value|labels)", annotations["description"])
    assert annotations["runbook_url"] == f"{RUNBOOK_BASE}#{github_anchor(alert)}"
    section = runbook_sections()[github_anchor(alert)]
    duration = rule.get("for")
    assert f"`for: {duration}`" in section if duration else "at once" in section, alert
    for part in ("Meaning", "Confirm", "Change", "Escalate"):
        assert f"**{part}" in section, f"runbook.md#{github_anchor(alert)} lacks **{part}**"
    assert "```promql" in section


def test_the_burn_alerts_runbook_points_to_the_mechanism_panels() -> None:
    """A latency breach is usually a full pool, preemptions or a slow decode: each burn
    alert's section links to the section that says where to look, and that one names the
    mechanisms' alerts and the dashboards' panels."""
    sections = runbook_sections()
    for alert in ("VLLMSLOFastBurn", "VLLMSLOSlowBurn", "VLLMSLOTicketBurn"):
        assert "(#what-usually-explains-a-breach)" in sections[github_anchor(alert)], alert
    mechanisms = " ".join(sections["what-usually-explains-a-breach"].split("```")[0].split())
    for alert in ("VLLMKVCacheSaturated", "VLLMPreemptionStorm", "VLLMDecodeBandwidthLow"):
        assert f"(#{github_anchor(alert)})" in mechanisms and github_anchor(alert) in sections
    panels = {p["title"] for board in BOARDS for p in board["panels"]}
    quoted = set(re.findall(r'"([^"]+)"', mechanisms))
    assert {
        "KV cache usage",
        "Preemptions per second",
        "Decode step (ITL) vs the decode floor",
    } <= quoted
    assert quoted <= panels | {"At a glance"}, sorted(quoted - panels)


# --- the series the rules name ------------------------------------------------------------

#: vLLM families of some releases only that the rules read, and how they cope elsewhere.
NEWER = {
    # The TPOT objective needs it: vLLM 0.11+ (docs/slo.md says so).
    "vllm:request_time_per_output_token_seconds_count": (0, 11, 0),
    "vllm:request_time_per_output_token_seconds_bucket": (0, 11, 0),
    # Counted where shown; `or on (...) 0 * …` elsewhere (a test below).
    "vllm:admission_rejections_total": (0, 32, 0),
}


def test_vllm_series_the_rules_name_are_shown_by_every_supported_vllm_or_said_otherwise() -> None:
    named = {n for _, r in every_rule() for n in selector_names(r["expr"])}
    vllm = {n for n in named if n.startswith("vllm:")}
    assert set(NEWER) <= vllm
    assert vllm - set(NEWER) <= IN_EVERY_SUPPORTED_VERSION, sorted(
        vllm - IN_EVERY_SUPPORTED_VERSION
    )
    for name, first in NEWER.items():
        assert name in sample_names_shown_in(first)
        assert name not in sample_names_shown_in((first[0], first[1] - 1, 0))


def test_admission_rejections_are_summed_with_finished_requests_where_an_engine_shows_them() -> (
    None
):
    """vLLM 0.32's refusals are one more term of the same sum (`or`: their labels differ
    from the finished requests'), so an older engine counts its finished requests alone
    (objectives_test.yaml runs both)."""
    errors = slo.parse({"objectives": [{"name": "e", "sli": "errors", "target": 0.99}]}, "e")
    (group, _) = slo.rule_groups(errors)
    using = [r for r in group["rules"] if "vllm:admission_rejections_total" in r["expr"]]
    assert [r["record"].split(":")[1] for r in using] == [
        "glassbox_slo_requests",
        "glassbox_slo_errors",
    ]
    for rule in using:
        assert "or rate(vllm:admission_rejections_total{" in " ".join(rule["expr"].split())


def test_the_rules_read_only_vllms_series_and_their_own_records() -> None:
    for name, rule in every_rule():
        for series in selector_names(rule["expr"]):
            assert series.startswith("vllm:") or series in SLO_RECORDS, (name, series)


def test_every_aggregation_and_match_keeps_namespace() -> None:
    counted = 0
    for name, rule in every_rule():
        for kind, labels in groupings(rule["expr"]):
            assert "namespace" in labels, f"{name}: {kind} ({', '.join(labels)}) drops namespace"
            counted += 1
    assert counted >= 8


# --- two clusters with the aggregation label -----------------------------------------------

CLUSTERS = ({"cluster": "east"}, {"cluster": "west"})


def in_both_clusters(document: dict[str, Any], rule_file: str) -> dict[str, Any]:
    """A unit-test file whose every series, alert and sample is there once per cluster."""
    groups = []
    for group in document["tests"]:
        out = {**group, "name": f"{group['name']} (in two clusters)"}
        out["input_series"] = [
            {**s, "series": with_labels(s["series"], c)}
            for s in group["input_series"]
            for c in CLUSTERS
        ]
        out["alert_rule_test"] = [
            {
                **case,
                "exp_alerts": [
                    {**a, "exp_labels": {**a["exp_labels"], **c}}
                    for a in case["exp_alerts"]
                    for c in CLUSTERS
                ],
            }
            for case in group.get("alert_rule_test", [])
        ]
        out["promql_expr_test"] = [
            {
                **case,
                "exp_samples": [
                    {**s, "labels": with_labels(s["labels"], c)}
                    for s in case["exp_samples"]
                    for c in CLUSTERS
                ],
            }
            for case in group.get("promql_expr_test", [])
        ]
        groups.append(out)
    return {**document, "rule_files": [rule_file], "tests": groups}


@pytest.mark.parametrize(
    "path",
    [SLO_DIR / "tests" / "fast_burn_test.yaml", SLO_DIR / "tests" / "objectives_test.yaml"],
    ids=lambda p: p.name,
)
def test_rules_with_a_cluster_label_page_each_cluster_apart(path: Path, tmp_path: Path) -> None:
    """The same teams and models in two clusters behind one ruler: every record and every
    page once per cluster (a rule that summed the clusters would give one of twice the
    traffic)."""
    out = tmp_path / "rules"
    assert (
        rules.main(["--slo", str(EXAMPLE), "--aggregation-labels", "cluster", "--out", str(out)])
        == 0
    )
    document = in_both_clusters(yaml.safe_load(path.read_text()), str(out / EXAMPLE_RULES.name))
    test_file = tmp_path / path.name
    test_file.write_text(yaml.safe_dump(document, sort_keys=False, allow_unicode=True))
    result = promtool("test", "rules", str(test_file))
    assert result.returncode == 0, result.stdout + result.stderr


# --- the records against the derivation core, on captured pages -----------------------------

# Objectives of every model over the captured pages (model "tiny", vLLM 0.32 CPU build).
CORE_SLO = slo.parse(
    {
        "objectives": [
            {"name": "ttft", "sli": "ttft", "threshold": "100ms", "target": "99%"},
            {"name": "tpot", "sli": "tpot", "threshold": "75ms", "target": "99%"},
            {"name": "e2e", "sli": "e2e", "threshold": "60s", "target": "95%"},
            {"name": "errors", "sli": "errors", "target": "99.9%"},
        ]
    },
    "core",
)
PAGE_PAIRS = {
    "two speculative requests": ("cpu-0.32/spec-idle.txt", "cpu-0.32/spec-after-2x256.txt"),
    "a flood that preempts": ("cpu-0.32/spec-after-2x256.txt", "cpu-0.32/flood-after.txt"),
}
WINDOW_MINUTES = 5


def _increases(
    start: str, end: str, wanted: set[str]
) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """(name, labels) -> how much it grew from one page to the other."""
    before, after = parse_samples(start, wanted), parse_samples(end, wanted)
    return {
        (name, labels): value - before.get(name, {}).get(labels, 0.0)
        for name, series in after.items()
        for labels, value in series.items()
    }


def core_expectations(start: str, end: str) -> dict[str, float | None]:
    """Objective -> its 5-minute error ratio by the derivation core, from the raw counters
    of the two pages (summed over engines)."""
    wanted = {
        *(h.name + suffix for h in slo.HISTOGRAMS.values() for suffix in ("_count", "_bucket")),
        "vllm:request_success_total",
        "vllm:admission_rejections_total",
    }
    grew = _increases(start, end, wanted)

    def total(name: str, **match: str) -> float:
        return sum(
            v
            for (n, labels), v in grew.items()
            if n == name and all(dict(labels).get(k) == x for k, x in match.items())
        )

    out: dict[str, float | None] = {}
    for o in CORE_SLO.objectives:
        if o.histogram:
            boundary = CORE_SLO.boundary(o)
            assert boundary is not None
            counted = total(o.histogram.name + "_count")
            within = total(o.histogram.name + "_bucket", le=boundary.le)
            bad = derive.requests_over_threshold(counted, within)
        else:
            refused = total("vllm:admission_rejections_total")
            counted = total("vllm:request_success_total") + refused
            bad = (
                total("vllm:request_success_total", finished_reason="abort")
                + total("vllm:request_success_total", finished_reason="error")
                + refused
            )
        out[o.name] = derive.slo_error_ratio(bad, counted)
    return out


def promtool_series(start: str, end: str) -> list[dict[str, str]]:
    """Every vLLM series the objectives read, growing evenly from one page to the other over
    the 5-minute window, as promtool input."""
    wanted = {
        n for g in slo.rule_groups(CORE_SLO) for r in g["rules"] for n in selector_names(r["expr"])
    }
    steps = WINDOW_MINUTES
    before = parse_samples(start, wanted)
    out = []
    for name, series in sorted(parse_samples(end, wanted).items()):
        for labels, value in sorted(series.items()):
            first = before.get(name, {}).get(labels, 0.0)
            text = ",".join(
                [
                    'namespace="llm"',
                    'job="vllm"',
                    'instance="pod:8000"',
                    *(f'{k}="{v}"' for k, v in labels),
                ]
            )
            values = " ".join(repr(first + (value - first) * i / steps) for i in range(steps + 1))
            out.append({"series": f"{name}{{{text}}}", "values": values})
    return out


@pytest.mark.parametrize("pair", sorted(PAGE_PAIRS))
def test_error_ratios_and_burn_rates_equal_the_derivation_core(pair: str, tmp_path: Path) -> None:
    start, end = (fixture_page(p) for p in PAGE_PAIRS[pair])
    expected = core_expectations(start, end)
    assert any(v for v in expected.values()), f"{pair}: no objective missed: a weak check"
    rule_file = tmp_path / "core.rules.yaml"
    rule_file.write_text(rules.slo_rule_file_text(CORE_SLO, "core", []))
    cases: list[dict[str, Any]] = []
    for o in CORE_SLO.objectives:
        where = f'namespace="llm",job="vllm",model_name="tiny",slo="{o.name}"'
        ratio = f"namespace_job_model_name_slo:glassbox_slo_error_ratio:rate5m{{{where}}}"
        value = expected[o.name]
        if value is None:
            cases.append({"expr": ratio, "eval_time": f"{WINDOW_MINUTES}m", "exp_samples": []})
            continue
        labels = (
            "{"
            + where
            + f',sli="{o.sli}"'
            + (f',threshold="{CORE_SLO.boundary(o).le}"' if o.histogram else "")
            + "}"
        )  # type: ignore[union-attr]
        cases.append({**_close_to(ratio, labels, value), "eval_time": f"{WINDOW_MINUTES}m"})
        burn = derive.burn_rate(value, o.target)
        assert burn is not None
        cases.append(
            {
                **_close_to(f"{ratio} / {slo.number_text(o.budget)}", labels, burn),
                "eval_time": f"{WINDOW_MINUTES}m",
            }
        )
    document = {
        "rule_files": [str(rule_file)],
        "evaluation_interval": "1m",
        "tests": [
            {
                "name": f"SLO records equal derive.py: {pair}",
                "interval": "1m",
                "input_series": promtool_series(start, end),
                "promql_expr_test": cases,
            }
        ],
    }
    test_file = tmp_path / "compare.yaml"
    test_file.write_text(yaml.safe_dump(document, sort_keys=False))
    result = promtool("test", "rules", str(test_file))
    assert result.returncode == 0, f"expected {expected}:\n{result.stdout}{result.stderr}"
