"""The rule files in alerts/: promtool's lint and unit tests, the recording rules against
the derivation core, every series they name against vLLM's inventory and the exporter's
output, and every runbook link against the runbook.

promtool is Debian's 2.42 (scripts/setup.sh installs it): the unit-test files stay
strictly 2.42-shaped, and every test group sets `interval` (without it 2.42 loads
nothing and "no alert" expectations pass vacuously).
"""

from __future__ import annotations

import functools
import http.server
import itertools
import re
import shutil
import subprocess
import threading
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import promql_parser
import pytest
import yaml
from vllm_glassbox import rules
from vllm_glassbox.core import derive
from vllm_glassbox.core.derive import Increase, engines_together, increase_between
from vllm_glassbox.core.snapshot import EngineKey, read_snapshot
from vllm_glassbox.core.textformat import parse_samples
from vllm_glassbox.exporter.service import ExporterConfig, Poller

from tests.fixtures import LOGS
from tests.fixtures import page as fixture_page
from tests.vllm_metric_names import (
    BY_SAMPLE_NAME,
    IN_EVERY_SUPPORTED_VERSION,
    IN_SOME_SUPPORTED_VERSION,
    sample_names_shown_in,
)

pytestmark = pytest.mark.prometheus

REPO = Path(__file__).resolve().parents[2]
ALERTS_DIR = REPO / "alerts"
RULES_FILE = ALERTS_DIR / "glassbox-rules.yaml"
ALERTS_FILE = ALERTS_DIR / "glassbox-alerts.yaml"
RULE_FILES = (RULES_FILE, ALERTS_FILE)
UNIT_TEST_FILES = sorted((ALERTS_DIR / "tests").glob("*.yaml"))
RUNBOOK = ALERTS_DIR / "runbook.md"
RUNBOOK_BASE = "https://github.com/vllm-glassbox/vllm-glassbox/blob/main/alerts/runbook.md"
SEVERITIES = {"critical", "warning", "info"}
EVALUATION_INTERVAL_SECONDS = 60.0  # of every file under alerts/tests
# Series that are neither vLLM's nor the exporter's: Prometheus' scrape health, and the
# start time every Python server (vLLM included) exposes.
OTHER_SERIES = {"up", "process_start_time_seconds"}
# Series of the exporters a cluster runs beside vLLM, read where Prometheus has them
# (docs/cost.md): OpenCost's node prices, kube-state-metrics' pods, nodes and requests,
# dcgm-exporter's GPUs.
BESIDE_SERIES = {
    "node_gpu_hourly_cost",
    "node_total_hourly_cost",
    "kube_pod_info",
    "kube_pod_container_resource_requests",
    "kube_node_status_capacity",
    "DCGM_FI_DEV_FB_USED",
    "DCGM_FI_DEV_FB_FREE",
    "DCGM_FI_DEV_POWER_USAGE",
    "DCGM_FI_PROF_DRAM_ACTIVE",
    "DCGM_FI_PROF_SM_ACTIVE",
}
# A node's price has no team namespace: the rules match it on the node alone.
NODE_SCOPED = ("node",)


# --- reading the rule files ---------------------------------------------------------------


def _rules(path: Path) -> list[dict[str, Any]]:
    return [rule for group in yaml.safe_load(path.read_text())["groups"] for rule in group["rules"]]


ALERT_RULES = {rule["alert"]: rule for rule in _rules(ALERTS_FILE)}
RECORD_RULES = {rule["record"]: rule for rule in _rules(RULES_FILE)}


def seconds(duration: str) -> float:
    return float(promql_parser.parse_duration(duration).total_seconds())


def promtool(*args: str) -> subprocess.CompletedProcess[str]:
    exe = shutil.which("promtool")
    if exe is None:
        pytest.fail("promtool is missing: scripts/setup.sh installs Debian's prometheus package")
    return subprocess.run([exe, *args], capture_output=True, text=True, timeout=300, cwd=REPO)


def test_alerts_folder_holds_exactly_the_rule_files_prometheus_loads() -> None:
    # The test stack and the chart load every alerts/*.yaml as a rule file.
    assert sorted(ALERTS_DIR.glob("*.yaml")) == sorted(RULE_FILES)


def test_promtool_check_rules_finds_every_rule_and_no_lint() -> None:
    result = promtool("check", "rules", "--lint=all", "--lint-fatal", *map(str, RULE_FILES))
    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    found = [int(n) for n in re.findall(r"SUCCESS: (\d+) rules found", output)]
    assert found == [len(RECORD_RULES), len(ALERT_RULES)], output


@pytest.mark.parametrize("path", UNIT_TEST_FILES, ids=lambda p: p.name)
def test_promtool_unit_tests_pass(path: Path) -> None:
    result = promtool("test", "rules", str(path))
    assert result.returncode == 0, (
        f"promtool test rules {path.name}:\n{result.stdout}{result.stderr}"
    )


# --- what the promtool tests cover ------------------------------------------------------


def unit_test_groups() -> Iterator[tuple[Path, dict[str, Any]]]:
    for path in UNIT_TEST_FILES:
        for group in yaml.safe_load(path.read_text())["tests"]:
            yield path, group


def test_every_promtool_test_group_is_named_and_sets_its_interval() -> None:
    for path, group in unit_test_groups():
        where = f"{path.name}: {group.get('name', '(unnamed group)')}"
        assert group.get("name"), f"{where}: give the group a name that states the behaviour"
        assert group.get("interval") == "1m", f"{where}: promtool 2.42 needs `interval: 1m`"
    for path in UNIT_TEST_FILES:
        assert yaml.safe_load(path.read_text()).get("evaluation_interval") == "1m", path.name


@dataclass(frozen=True)
class Check:
    group: str
    at: float  # seconds
    fires: bool


def alert_checks() -> dict[str, list[Check]]:
    checks: dict[str, list[Check]] = {}
    for path, group in unit_test_groups():
        for case in group.get("alert_rule_test", []):
            checks.setdefault(case["alertname"], []).append(
                Check(
                    f"{path.name}: {group['name']}",
                    seconds(case["eval_time"]),
                    bool(case.get("exp_alerts")),
                )
            )
    return checks


def test_promtool_tests_only_name_alerts_that_exist() -> None:
    assert set(alert_checks()) <= set(ALERT_RULES)


@pytest.mark.parametrize("alert", sorted(ALERT_RULES))
def test_alert_is_tested_firing_one_evaluation_after_a_silent_check_and_on_a_near_miss(
    alert: str,
) -> None:
    checks = alert_checks().get(alert, [])
    firing_groups = {c.group for c in checks if c.fires}
    assert firing_groups, f"{alert}: no promtool test where it fires"
    near_misses = {c.group for c in checks} - firing_groups
    assert near_misses, f"{alert}: no near-miss test (a group where it never fires)"
    # The `for:` boundary: silent at one evaluation, firing at the next, in the same group.
    boundaries = [
        group
        for group in firing_groups
        for first in [min(c.at for c in checks if c.group == group and c.fires)]
        if Check(group, first - EVALUATION_INTERVAL_SECONDS, False) in checks
    ]
    assert boundaries, f"{alert}: no test checks it silent one evaluation before it fires"


def test_every_recording_rule_is_checked_by_promtool() -> None:
    checked = set(RATIO_RULES) | {POSITION_RULE}
    for _, group in unit_test_groups():
        for case in group.get("promql_expr_test", []):
            checked |= selector_names(case["expr"])
    assert set(RECORD_RULES) <= checked, sorted(set(RECORD_RULES) - checked)


# --- annotations and the runbook --------------------------------------------------------


def github_anchor(heading: str) -> str:
    """The anchor GitHub gives a Markdown heading."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def runbook_sections() -> dict[str, str]:
    """Anchor -> text of the section, for every heading of the runbook."""
    sections: dict[str, str] = {}
    anchor = ""
    in_code = False
    for line in RUNBOOK.read_text().splitlines():
        in_code ^= line.startswith("```")
        m = None if in_code else re.match(r"#{1,6}\s+(.*)", line)
        if m:
            anchor = github_anchor(m.group(1))
            assert anchor not in sections, f"runbook.md: heading {m.group(1)!r} appears twice"
            sections[anchor] = ""
        elif anchor:
            sections[anchor] += line + "\n"
    return sections


@pytest.mark.parametrize("alert", sorted(ALERT_RULES))
def test_alert_has_severity_static_summary_templated_description_and_runbook_url(
    alert: str,
) -> None:
    rule = ALERT_RULES[alert]
    assert rule["labels"]["severity"] in SEVERITIES
    annotations = rule["annotations"]
    assert set(annotations) == {"summary", "description", "runbook_url"}
    assert "{{" not in annotations["summary"], "the summary stays static (it groups alerts)"
    assert re.search(r"\{\{.*\$(value|labels)", annotations["description"]), (
        "the description says which instance and how much"
    )
    assert annotations["runbook_url"] == f"{RUNBOOK_BASE}#{github_anchor(alert)}"


def test_every_runbook_url_follows_the_one_pattern_the_runbook_states() -> None:
    """The rules, the promtool tests' expectations and the runbook's own words agree."""
    assert f"`{RUNBOOK_BASE}#<alert name in lower case>`" in RUNBOOK.read_text()
    expected = 0
    for path, group in unit_test_groups():
        for case in group.get("alert_rule_test", []):
            for alert in case.get("exp_alerts") or []:
                url = alert.get("exp_annotations", {}).get("runbook_url")
                where = f"{path.name}: {case['alertname']}"
                assert url == f"{RUNBOOK_BASE}#{github_anchor(case['alertname'])}", where
                expected += 1
    assert expected >= len(ALERT_RULES)


@pytest.mark.parametrize("alert", sorted(ALERT_RULES))
def test_runbook_url_points_to_a_section_that_explains_threshold_and_duration(
    alert: str,
) -> None:
    anchor = ALERT_RULES[alert]["annotations"]["runbook_url"].partition("#")[2]
    sections = runbook_sections()
    assert anchor in sections, f"runbook.md has no heading whose anchor is #{anchor}"
    section = sections[anchor]
    duration = ALERT_RULES[alert].get("for")
    assert f"`for: {duration}`" in section if duration else "at once" in section, (
        f"runbook.md#{anchor} must state how long the condition has to hold"
    )
    for part in ("Meaning", "Confirm", "Change", "Escalate"):
        assert f"**{part}" in section, f"runbook.md#{anchor} lacks its **{part}** part"
    assert "```promql" in section, f"runbook.md#{anchor} gives no PromQL to confirm it"


# --- every series named exists ----------------------------------------------------------


def selector_names(expr: str) -> set[str]:
    """Metric names of every selector in a PromQL expression (a real parser, not a regex)."""
    names: set[str] = set()

    def visit(node: object) -> bool:
        if isinstance(node, promql_parser.VectorSelector):
            if node.name:
                names.add(node.name)
            for m in node.matchers.matchers:
                if m.name == "__name__":
                    assert m.op == promql_parser.MatchOp.Equal, f"{expr}: name by regex"
                    names.add(m.value)
        return True

    promql_parser.walk(promql_parser.parse(expr), visit)
    return names


_TEMPLATE_QUERY = re.compile(r'printf\s+"((?:[^"\\]|\\.)*)"[^}]*\|\s*query')


def rule_expressions() -> Iterator[tuple[str, str]]:
    """(rule name, PromQL) for every expr, and every query an annotation template runs."""
    for name, rule in [*RECORD_RULES.items(), *ALERT_RULES.items()]:
        yield name, rule["expr"]
        for text in rule.get("annotations", {}).values():
            for query in _TEMPLATE_QUERY.findall(text):
                # The template fills %q with quoted label values.
                yield name, query.replace('\\"', '"').replace("%q", '"x"')


def test_template_queries_are_found_and_parse() -> None:
    queries = [q for name, q in rule_expressions() if q != _expr_of(name)]
    assert queries, "GlassboxTargetDown's description runs a query; the extraction found none"
    for query in queries:
        promql_parser.parse(query)


def _expr_of(name: str) -> str:
    rule = RECORD_RULES.get(name) or ALERT_RULES[name]
    return str(rule["expr"])


def test_vllm_name_list_knows_the_renames_the_rules_depend_on() -> None:
    assert "vllm:inter_token_latency_seconds_sum" in IN_EVERY_SUPPORTED_VERSION
    assert "vllm:kv_cache_usage_perc" in IN_EVERY_SUPPORTED_VERSION
    for gone, last_shown, first_gone in [
        ("vllm:time_per_output_token_seconds_sum", (0, 11, 2), (0, 12, 0)),  # hidden, then removed
        ("vllm:gpu_cache_usage_perc", (0, 10, 2), (0, 11, 0)),  # hidden in 0.11, gone in 0.12
    ]:
        assert gone not in IN_EVERY_SUPPORTED_VERSION
        assert gone in sample_names_shown_in(last_shown)
        assert gone not in sample_names_shown_in(first_gone)


#: vLLM series of some releases only that the rules read, each with the series of every
#: release it falls back to (`X or on (…engine) fallback`), and the first release showing it.
WITH_FALLBACK = {"vllm:num_requests_waiting_by_reason": ("vllm:num_requests_waiting", (0, 20, 0))}


#: The groups of disaggregated serving: they read what only a KV consumer, a connector
#: or a release with prompt tokens by source (0.16+) shows, where a server without them is
#: no pair to judge (no sample, no alert), so no fallback is needed.
DISAGGREGATION_GROUPS = {"glassbox.vllm.disaggregation", "glassbox.vllm.disaggregation.alerts"}


def _rules_of_groups(groups: set[str]) -> set[str]:
    return {
        rule.get("record") or rule["alert"]
        for path in RULE_FILES
        for group in yaml.safe_load(path.read_text())["groups"]
        if group["name"] in groups
        for rule in group["rules"]
    }


def test_vllm_series_named_by_the_rules_are_shown_by_every_supported_vllm() -> None:
    disaggregation = _rules_of_groups(DISAGGREGATION_GROUPS)
    named = {
        n for name, expr in rule_expressions() if name not in disaggregation
        for n in selector_names(expr)
    }  # fmt: skip
    vllm = {n for n in named if n.startswith("vllm:")} - set(WITH_FALLBACK)
    assert vllm, "the rules name no vLLM series?"
    assert vllm <= IN_EVERY_SUPPORTED_VERSION, sorted(vllm - IN_EVERY_SUPPORTED_VERSION)


def test_the_disaggregation_rules_name_series_some_vllm_shows_with_a_connector() -> None:
    disaggregation = _rules_of_groups(DISAGGREGATION_GROUPS)
    assert len(disaggregation) == 12
    named = {
        n for name, expr in rule_expressions() if name in disaggregation
        for n in selector_names(expr)
    }  # fmt: skip
    vllm = {n for n in named if n.startswith("vllm:")}
    assert vllm <= IN_SOME_SUPPORTED_VERSION, sorted(vllm - IN_SOME_SUPPORTED_VERSION)
    connectors = {n for n in vllm if BY_SAMPLE_NAME[n].only_when}
    assert {n.split("_")[0] for n in connectors} == {"vllm:nixl", "vllm:mooncake", "vllm:num"}


@pytest.mark.parametrize("newer", sorted(WITH_FALLBACK))
def test_a_vllm_series_of_newer_releases_is_read_with_a_fallback_on_every_engine(
    newer: str,
) -> None:
    fallback, first = WITH_FALLBACK[newer]
    assert newer not in sample_names_shown_in((first[0], first[1] - 1, 0))
    assert newer in sample_names_shown_in(first) and fallback in IN_EVERY_SUPPORTED_VERSION
    using = [(name, expr) for name, expr in rule_expressions() if newer in selector_names(expr)]
    assert using
    for name, expr in using:
        flat = " ".join(expr.split())
        # Each use is followed by the fallback for the engines that do not show it.
        uses = flat.count(newer)
        fallbacks = flat.count(f"or on (namespace, job, instance, model_name, engine) {fallback}")
        fallbacks += flat.count(
            f"or on (namespace, job, instance, model_name, engine) max_over_time({fallback}["
        )
        fallbacks += flat.count(
            f"or on (namespace, job, instance, model_name, engine) deriv({fallback}["
        )
        assert fallbacks == uses, name


def test_glassbox_series_named_by_the_rules_are_emitted_by_the_exporter(
    exporter_series_names: frozenset[str],
) -> None:
    named = {n for _, expr in rule_expressions() for n in selector_names(expr)}
    glassbox = {n for n in named if n.startswith("glassbox_")}
    assert glassbox
    assert glassbox <= exporter_series_names, sorted(glassbox - exporter_series_names)


def test_rules_name_no_other_series() -> None:
    for name, expr in rule_expressions():
        for series in selector_names(expr):
            known = (
                series.startswith(("vllm:", "glassbox_"))
                or series in RECORD_RULES
                or series in OTHER_SERIES
                or series in BESIDE_SERIES
            )
            assert known, f"{name} names {series}, which nothing here produces"


# --- the recording rules agree with the derivation core ---------------------------------
# For pairs of vLLM pages (a synthetic fleet, pages captured from vLLM 0.32, pages in
# v0.11.0's formats): the core reads both pages and derives every value from the counter
# increases; promtool evaluates every ratio rule on the same counters, fed as series that
# grow from one page to the other over the rules' 5-minute window; they must agree.

RATIO_RULES: dict[str, Callable[[Increase], float | None]] = {
    "namespace_job_model_name:vllm_time_per_output_token_seconds:rate5m": (
        derive.time_per_output_token
    ),
    "namespace_job_model_name:vllm_inter_token_latency_seconds:rate5m": derive.inter_token_latency,
    "namespace_job_model_name:vllm_tokens_per_forward_pass:rate5m": derive.tokens_per_forward_pass,
    "namespace_job_model_name:vllm_tokens_per_engine_step:rate5m": derive.tokens_per_engine_step,
    "namespace_job_model_name:vllm_engine_steps:rate5m": derive.engine_steps_per_second,
    "namespace_job_model_name:vllm_generation_tokens:rate5m": derive.generation_tokens_per_second,
    "namespace_job_model_name:vllm_num_preemptions:rate5m": derive.preemptions_per_second,
    "namespace_job_model_name:vllm_spec_decode_acceptance_ratio:rate5m": (
        derive.spec_acceptance_ratio
    ),
    "namespace_job_model_name:vllm_spec_decode_mean_acceptance_length:rate5m": (
        derive.spec_mean_acceptance_length
    ),
    "namespace_job_model_name:vllm_spec_decode_draft_coverage_ratio:rate5m": (
        derive.spec_draft_coverage
    ),
}
POSITION_RULE = "namespace_job_model_name_position:vllm_spec_decode_acceptance_ratio:rate5m"
RATE_WINDOW_SECONDS = 300.0  # the rules' [5m]

_SPEC = "vllm:spec_decode_num_accepted_tokens_per_pos_total"
# How much each series vLLM shows grew over 5 minutes, per (namespace, model_name, engine),
# every page scraped under the same job: two teams serve qwen, each record must keep them
# apart. The two engines of qwen in team-a differ on purpose (pooled ≠ averaged ratios);
# llama runs without speculation (no spec series at all); idle decoded nothing.
FLEET: dict[tuple[str, str, str], dict[str, float]] = {
    ("team-a", "qwen", "0"): {
        "vllm:generation_tokens_total": 2560,
        "vllm:time_to_first_token_seconds_count": 10,
        "vllm:inter_token_latency_seconds_sum": 12.75,
        "vllm:inter_token_latency_seconds_count": 600,
        "vllm:iteration_tokens_total_count": 420,
        "vllm:num_preemptions_total": 7,
        "vllm:spec_decode_num_drafts_total": 500,
        "vllm:spec_decode_num_draft_tokens_total": 2500,
        "vllm:spec_decode_num_accepted_tokens_total": 1950,
        f'{_SPEC}{{position="0"}}': 480,
        f'{_SPEC}{{position="1"}}': 440,
        f'{_SPEC}{{position="2"}}': 400,
        f'{_SPEC}{{position="3"}}': 340,
        f'{_SPEC}{{position="4"}}': 290,
    },
    ("team-a", "qwen", "1"): {
        "vllm:generation_tokens_total": 1200,
        "vllm:time_to_first_token_seconds_count": 8,
        "vllm:inter_token_latency_seconds_sum": 9.5,
        "vllm:inter_token_latency_seconds_count": 1100,
        "vllm:iteration_tokens_total_count": 500,
        "vllm:num_preemptions_total": 0,
        "vllm:spec_decode_num_drafts_total": 30,
        "vllm:spec_decode_num_draft_tokens_total": 150,
        "vllm:spec_decode_num_accepted_tokens_total": 20,
        f'{_SPEC}{{position="0"}}': 12,
        f'{_SPEC}{{position="1"}}': 5,
        f'{_SPEC}{{position="2"}}': 2,
        f'{_SPEC}{{position="3"}}': 1,
        f'{_SPEC}{{position="4"}}': 0,
    },
    ("team-a", "llama", "0"): {
        "vllm:generation_tokens_total": 900,
        "vllm:time_to_first_token_seconds_count": 3,
        "vllm:inter_token_latency_seconds_sum": 4.2,
        "vllm:inter_token_latency_seconds_count": 897,
        "vllm:iteration_tokens_total_count": 897,
        "vllm:num_preemptions_total": 2,
    },
    ("team-b", "qwen", "0"): {
        "vllm:generation_tokens_total": 640,
        "vllm:time_to_first_token_seconds_count": 2,
        "vllm:inter_token_latency_seconds_sum": 3.1,
        "vllm:inter_token_latency_seconds_count": 200,
        "vllm:iteration_tokens_total_count": 190,
        "vllm:num_preemptions_total": 0,
        "vllm:spec_decode_num_drafts_total": 150,
        "vllm:spec_decode_num_draft_tokens_total": 750,
        "vllm:spec_decode_num_accepted_tokens_total": 438,
        f'{_SPEC}{{position="0"}}': 140,
        f'{_SPEC}{{position="1"}}': 110,
        f'{_SPEC}{{position="2"}}': 90,
        f'{_SPEC}{{position="3"}}': 60,
        f'{_SPEC}{{position="4"}}': 38,
    },
    ("team-b", "idle", "0"): {
        "vllm:generation_tokens_total": 0,
        "vllm:time_to_first_token_seconds_count": 0,
        "vllm:inter_token_latency_seconds_sum": 0,
        "vllm:inter_token_latency_seconds_count": 0,
        "vllm:iteration_tokens_total_count": 0,
        "vllm:num_preemptions_total": 0,
        "vllm:spec_decode_num_drafts_total": 0,
        "vllm:spec_decode_num_draft_tokens_total": 0,
        "vllm:spec_decode_num_accepted_tokens_total": 0,
    },
}


def _before(increase: float) -> float:
    """A counter that has been running for a while before the window starts."""
    return 1000.0 + 7 * increase


def _split(series: str) -> tuple[str, str]:
    """'name{a="b"}' -> ('name', 'a="b"'); 'name' -> ('name', '')."""
    name, _, rest = series.partition("{")
    return name, rest.rstrip("}")


def fleet_page(namespace: str, at_end: bool) -> str:
    """The /metrics page the vLLM in `namespace` in FLEET shows at the window's start or end."""
    lines = []
    for (page_namespace, model, engine), increases in FLEET.items():
        if page_namespace != namespace:
            continue
        for series, increase in increases.items():
            name, labels = _split(series)
            value = _before(increase) + (increase if at_end else 0.0)
            all_labels = ",".join(
                filter(None, [f'engine="{engine}"', f'model_name="{model}"', labels])
            )
            lines.append(f"{name}{{{all_labels}}} {value!r}")
    return "\n".join(lines) + "\n"


# namespace -> (vLLM's page when the 5-minute window starts, its page when it ends); each
# page is scraped as job "vllm", instance "pod:8000".
Scenario = dict[str, tuple[str, str]]
JOB = "vllm"

SCENARIOS: dict[str, Scenario] = {
    "fleet": {
        namespace: (fleet_page(namespace, at_end=False), fleet_page(namespace, at_end=True))
        for namespace in sorted({namespace for namespace, _, _ in FLEET})
    },
    # Captured from the vLLM 0.32 CPU build (tests/fixtures/README.md).
    "0.32 two speculative requests": {
        "llm": (
            fixture_page("cpu-0.32/spec-idle.txt"),
            fixture_page("cpu-0.32/spec-after-2x256.txt"),
        )
    },
    "0.32 flood that preempts": {
        "llm": (
            fixture_page("cpu-0.32/spec-after-2x256.txt"),
            fixture_page("cpu-0.32/flood-after.txt"),
        )
    },
    # Synthesized in vLLM v0.11.0's formats.
    "0.11 speculation, then bypassed by a penalty": {
        "llm": (
            fixture_page("v0.11.0-single/idle.txt"),
            fixture_page("v0.11.0-single/after-penalty.txt"),
        )
    },
    "0.11 two data-parallel engines": {
        "llm": (fixture_page("v0.11.0-dp2/before.txt"), fixture_page("v0.11.0-dp2/after.txt"))
    },
}


def core_engine_increases(scenario: Scenario) -> dict[tuple[str, EngineKey], Increase]:
    """What the derivation core makes of the pages: increases per namespace and engine."""
    out: dict[tuple[str, EngineKey], Increase] = {}
    for namespace, (start, end) in scenario.items():
        before, after = read_snapshot(start), read_snapshot(end)
        for key, sample in after.engines.items():
            out[(namespace, key)] = increase_between(
                before.engines[key].counters, sample.counters, RATE_WINDOW_SECONDS
            )
    return out


def core_increases(scenario: Scenario) -> dict[tuple[str, str], Increase]:
    """Per (namespace, model_name): the engines' increases summed, as the core aggregates."""
    by_model: dict[tuple[str, str], list[Increase]] = {}
    for (namespace, key), increase in core_engine_increases(scenario).items():
        by_model.setdefault((namespace, key.model_name), []).append(increase)
    return {k: engines_together(v, RATE_WINDOW_SECONDS) for k, v in by_model.items()}


def promtool_series(scenario: Scenario) -> list[dict[str, str]]:
    """What the ratio rules read from the same pages, as promtool input: one sample a
    minute, growing evenly from the start page's value to the end page's over 5 minutes
    (a series the start page lacks starts from 0, as vLLM creates some lazily)."""
    wanted = set().union(*(selector_names(_expr_of(r)) for r in [*RATIO_RULES, POSITION_RULE]))
    steps = int(RATE_WINDOW_SECONDS // 60)
    out = []
    for namespace, (start, end) in scenario.items():
        before = parse_samples(start, wanted)
        for name, series in sorted(parse_samples(end, wanted).items()):
            for labels, value in sorted(series.items()):
                first = before.get(name, {}).get(labels, 0.0)
                text = ",".join(
                    [
                        f'namespace="{namespace}"',
                        f'job="{JOB}"',
                        'instance="pod:8000"',
                        *(f'{k}="{v}"' for k, v in labels),
                    ]
                )
                values = " ".join(
                    repr(first + (value - first) * i / steps) for i in range(steps + 1)
                )
                out.append({"series": f"{name}{{{text}}}", "values": values})
    return out


def _close_to(selector: str, labels: str, expected: float) -> dict[str, Any]:
    tolerance = 1e-9 * max(abs(expected), 1.0)
    return {
        "expr": f"abs({selector} - ({expected!r})) <= bool {tolerance!r}",
        "eval_time": "5m",
        "exp_samples": [{"labels": labels, "value": 1}],
    }


def comparison_cases(
    increases: Mapping[tuple[str, str], Increase], diagnose: bool = False
) -> list[dict[str, Any]]:
    """promql_expr_test cases: each recording rule equals its derive.py function.

    With `diagnose`, each case asks for the exact expected value instead, so promtool's
    failure output shows the value the rule did compute.
    """
    cases: list[dict[str, Any]] = []
    for (namespace, model), increase in sorted(increases.items()):
        where = f'namespace="{namespace}",job="{JOB}",model_name="{model}"'
        expected_by_selector: dict[tuple[str, str], float | None] = {
            (f"{record}{{{where}}}", f"{{{where}}}"): compute(increase)
            for record, compute in RATIO_RULES.items()
        }
        positions = derive.spec_position_acceptance(increase)
        for position, value in positions.items():
            labels = f'{where},position="{position}"'
            expected_by_selector[(f"{POSITION_RULE}{{{labels}}}", f"{{{labels}}}")] = value
        if not positions:
            expected_by_selector[(f"{POSITION_RULE}{{{where}}}", "")] = None
        for (selector, labels), expected in expected_by_selector.items():
            if expected is None:  # the core says absent: the rule must have no sample
                cases.append({"expr": selector, "eval_time": "5m", "exp_samples": []})
            elif diagnose:
                sample = {"labels": selector.split("{", 1)[0] + labels, "value": expected}
                cases.append({"expr": selector, "eval_time": "5m", "exp_samples": [sample]})
            else:
                cases.append(_close_to(selector, labels, expected))
    return cases


def test_the_fleet_covers_present_absent_pooled_and_positional_values() -> None:
    increases = core_increases(SCENARIOS["fleet"])
    assert set(increases) == {(j, m) for j, m, _ in FLEET}
    values = [compute(d) for d in increases.values() for compute in RATIO_RULES.values()]
    assert any(v is None for v in values) and any(v not in (None, 0.0) for v in values)
    # Both namespaces serve qwen under the same job, with different counters.
    assert increases[("team-a", "qwen")] != increases[("team-b", "qwen")]
    # Pooling the two qwen engines of team-a differs from averaging their ratios, so a rule
    # that averaged would fail the comparison.
    engines = core_engine_increases(SCENARIOS["fleet"])
    per_engine = [
        derive.tokens_per_forward_pass(engines[("team-a", EngineKey("qwen", e))]) or 0.0
        for e in ("0", "1")
    ]
    pooled = increases[("team-a", "qwen")]
    assert derive.tokens_per_forward_pass(pooled) != pytest.approx(sum(per_engine) / 2, rel=0.01)
    assert derive.spec_position_acceptance(pooled)


@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
def test_recording_rules_equal_the_derivation_core_on_the_same_counter_increases(
    scenario: str, tmp_path: Path
) -> None:
    increases = core_increases(SCENARIOS[scenario])
    series = promtool_series(SCENARIOS[scenario])

    def run(diagnose: bool) -> subprocess.CompletedProcess[str]:
        test_file = tmp_path / ("diagnose.yaml" if diagnose else "compare.yaml")
        group = {
            "name": f"recording rules equal derive.py: {scenario}",
            "interval": "1m",
            "input_series": series,
            "promql_expr_test": comparison_cases(increases, diagnose),
        }
        document = {
            "rule_files": [str(RULES_FILE)],
            "evaluation_interval": "1m",
            "tests": [group],
        }
        test_file.write_text(yaml.safe_dump(document, sort_keys=False))
        return promtool("test", "rules", str(test_file))

    result = run(diagnose=False)
    if result.returncode != 0:
        shown = run(diagnose=True)
        pytest.fail(
            "recording rules disagree with core/derive/:\n"
            + result.stdout
            + result.stderr
            + "\nvalues the rules computed (got) against derive.py (exp):\n"
            + shown.stdout
            + shown.stderr
        )


# --- the exporter's output over captured pages ------------------------------------------


@contextmanager
def serve_pages(pages: list[str]) -> Iterator[str]:
    """A loopback HTTP server whose /metrics gives the next page on each request."""
    queue = iter(pages)
    current = [""]

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            if self.path != "/metrics":
                self.send_error(404)
                return
            current[0] = next(queue, current[0])
            body = current[0].encode()
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture(scope="module")
def exporter_series_names(tmp_path_factory: pytest.TempPathFactory) -> frozenset[str]:
    """Every sample name the exporter publishes after polling two pages captured from the
    real vLLM (idle, then mid-flood after two speculative requests finished: requests
    waiting, preemptions), with weights and
    peak bandwidth known, following the same server's startup log (and one line of a
    launcher's prefix glassbox does not read, for glassbox_input_unrecognised)."""
    pages = [fixture_page("cpu-0.32/spec-idle.txt"), fixture_page("cpu-0.32/flood-mid.txt")]
    vllm_log = tmp_path_factory.mktemp("log") / "vllm.log"
    vllm_log.write_text(
        (LOGS / "cpu-0.32-spec-startup.log").read_text()
        + "(launcher job=1) INFO 11-29 12:00:00 [x.py:1] serving\n"
    )
    with serve_pages(pages) as url:
        clock = functools.partial(next, itertools.count(0.0, 15.0))  # polls 30 s apart
        poller = Poller(
            ExporterConfig(
                target=url,
                interval_seconds=30.0,
                window_seconds=60.0,
                timeout_seconds=5.0,
                weights_bytes=2e9,
                peak_bandwidth=1e12,
                vllm_log=str(vllm_log),
                gpu_hour_price=3.5,
            ),
            clock=clock,
        )
        try:
            assert poller.poll_once() and poller.poll_once()
        finally:
            poller.fetcher.close()
    assert [d.seconds for d in poller.history.increases().values()] == [30.0]
    names = {s.name for family in poller.published for s in family.samples}
    # What only a restart publishes: another server's page after the first.
    restart = [fixture_page("cpu-0.32/spec-idle.txt"), fixture_page("cpu-0.32/plain-idle.txt")]
    with serve_pages(restart) as url:
        restarted = Poller(ExporterConfig(target=url, interval_seconds=30.0))
        try:
            assert restarted.poll_once() and restarted.poll_once()
        finally:
            restarted.fetcher.close()
    assert restarted.history.restarts == 1
    names |= {s.name for family in restarted.published for s in family.samples}
    return frozenset(names)


# --- teams apart: two namespaces, and more aggregation labels -----------------------------

TEAMS = ({"namespace": "team-a"}, {"namespace": "team-b"})
# Two clusters, each with both teams: the rules with `cluster` added (glassbox rules).
CLUSTERS_AND_TEAMS = tuple(
    {"cluster": cluster, **team} for cluster in ("east", "west") for team in TEAMS
)
_LABEL_PAIR = re.compile(r'(\w+)\s*=\s*"((?:[^"\\]|\\.)*)"')
_BARE_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")


def with_labels(series: str, place: Mapping[str, str]) -> str:
    """'name{a="b"}' with the labels of `place` set (replacing any of the same name)."""
    name, labels = _split(series)
    pairs = {**dict(_LABEL_PAIR.findall(labels)), **place}
    return name + "{" + ",".join(f'{k}="{v}"' for k, v in pairs.items()) + "}"


def alert_in(alert: dict[str, Any], place: Mapping[str, str]) -> dict[str, Any]:
    """An expected alert as it fires in `place`: its labels, and its description naming the
    namespace after the job (as every description does)."""
    labels = {**alert["exp_labels"], **place}
    annotations = dict(alert.get("exp_annotations", {}))
    if "description" in annotations:
        job = re.escape(str(labels["job"]))
        described, found = re.subn(
            rf"(job {job})(, namespace [^)]*)?\)",
            rf"\1, namespace {place['namespace']})",
            annotations["description"],
        )
        assert found == 1, f"the description names job {labels['job']} once: {described}"
        annotations["description"] = described
    return {**alert, "exp_labels": labels, "exp_annotations": annotations}


def scope_of(record: str, place: Mapping[str, str]) -> dict[str, str]:
    """The labels of `place` a record keeps: a node's record (a node's price, OpenCost's)
    has no namespace, so the teams' copies of it are one."""
    if record.strip().startswith(f"{NODE_SCOPED[0]}:"):
        return {k: v for k, v in place.items() if k != "namespace"}
    return dict(place)


def in_every_place(
    document: dict[str, Any], places: tuple[Mapping[str, str], ...], rule_files: list[str]
) -> dict[str, Any]:
    """A promtool test file whose every input series is served in each place (the same
    job, instance and model in each), each expected alert and record once per place.

    An alert without a job (absent(): nothing scraped anywhere) stays one alert; a
    promql_expr_test of anything but one record's name (an aggregate) is left out: the
    file itself runs it on one place.
    """
    groups = []
    for group in document["tests"]:
        out = {
            **group,
            "name": f"{group['name']} (in {len(places)} places)",
            "input_series": [
                {**series, "series": with_labels(series["series"], place)}
                for series in group["input_series"]
                for place in places
            ],
        }
        out["alert_rule_test"] = [
            {
                **case,
                "exp_alerts": [
                    alert_in(alert, place) if "job" in alert["exp_labels"] else alert
                    for alert in case.get("exp_alerts") or []
                    for place in (places if "job" in alert["exp_labels"] else places[:1])
                ],
            }
            for case in group.get("alert_rule_test", [])
        ]
        out["promql_expr_test"] = [
            {
                **case,
                "exp_samples": list(
                    {
                        sample["labels"]: {**sample, "labels": sample["labels"]}
                        for sample in (
                            {**sample, "labels": with_labels(sample["labels"], where)}
                            for sample in case.get("exp_samples") or []
                            for where in (scope_of(case["expr"], place) for place in places)
                        )
                    }.values()
                ),
            }
            for case in group.get("promql_expr_test", [])
            if _BARE_NAME.fullmatch(case["expr"].strip())
        ]
        groups.append(out)
    return {**document, "rule_files": rule_files, "tests": groups}


def run_in_every_place(
    path: Path, places: tuple[Mapping[str, str], ...], rule_files: list[str], tmp_path: Path
) -> None:
    document = in_every_place(yaml.safe_load(path.read_text()), places, rule_files)
    expected = sum(
        len(case.get("exp_alerts", [])) + len(case.get("exp_samples", []))
        for group in document["tests"]
        for case in [*group["alert_rule_test"], *group["promql_expr_test"]]
    )
    assert expected, f"{path.name}: nothing is expected in any place"
    test_file = tmp_path / path.name
    test_file.write_text(yaml.safe_dump(document, sort_keys=False))
    result = promtool("test", "rules", str(test_file))
    assert result.returncode == 0, f"{path.name} in {places}:\n{result.stdout}{result.stderr}"


@pytest.mark.parametrize("path", UNIT_TEST_FILES, ids=lambda p: p.name)
def test_every_promtool_test_holds_in_two_namespaces_serving_the_same_model_under_one_job(
    path: Path, tmp_path: Path
) -> None:
    """Every record comes out once per namespace, every alert names its namespace: a rule
    that aggregated `namespace` away would give one series of both teams' sums."""
    run_in_every_place(path, TEAMS, [str(p) for p in RULE_FILES], tmp_path)


@pytest.mark.parametrize("path", UNIT_TEST_FILES, ids=lambda p: p.name)
def test_rules_with_a_cluster_label_keep_both_clusters_and_both_namespaces_apart(
    path: Path, tmp_path: Path
) -> None:
    generated = tmp_path / "rules"
    assert rules_cli(["--aggregation-labels", "cluster", "--out", str(generated)]) == 0
    files = [str(generated / p.name) for p in RULE_FILES]
    run_in_every_place(path, CLUSTERS_AND_TEAMS, files, tmp_path)


def rules_cli(args: list[str]) -> int:
    return rules.main([*args, *map(str, RULE_FILES)])


def groupings(expr: str) -> list[tuple[str, list[str]]]:
    """Every `by (...)` of an aggregation and `on (...)` of a vector match, with its
    labels, from promql_parser's tree."""
    found: list[tuple[str, list[str]]] = []

    def visit(node: object) -> bool:
        if isinstance(node, promql_parser.AggregateExpr) and node.modifier is not None:
            assert node.modifier.type == promql_parser.AggModifierType.By, expr
            found.append(("by", list(node.modifier.labels)))
        if isinstance(node, promql_parser.BinaryExpr) and node.modifier is not None:
            matching = node.modifier.matching
            if matching is not None:
                assert matching.type == promql_parser.LabelModifierType.Include, expr
                found.append(("on", list(matching.labels)))
        return True

    promql_parser.walk(promql_parser.parse(expr), visit)
    return found


def test_every_aggregation_and_match_of_the_rules_keeps_namespace() -> None:
    counted = 0
    for name, expr in rule_expressions():
        for kind, labels in groupings(expr):
            if tuple(labels) == NODE_SCOPED:
                continue  # a node's price, before it meets a namespaced pod
            assert "namespace" in labels, f"{name}: {kind} ({', '.join(labels)}) drops namespace"
            counted += 1
    assert counted > 60


def test_glassbox_rules_puts_the_labels_first_in_every_by_and_on(tmp_path: Path) -> None:
    assert rules_cli(["--aggregation-labels", "cluster, region", "--out", str(tmp_path)]) == 0
    for path in RULE_FILES:
        source = _rules(path)
        generated = _rules(tmp_path / path.name)
        assert [r.get("record") or r["alert"] for r in generated] == [
            r.get("record") or r["alert"] for r in source
        ]
        for mine, theirs in zip(generated, source, strict=True):
            assert {k: v for k, v in mine.items() if k != "expr"} == {
                k: v for k, v in theirs.items() if k != "expr"
            }
            want = [(k, ["cluster", "region", *labels]) for k, labels in groupings(theirs["expr"])]
            assert groupings(mine["expr"]) == want
    result = promtool("check", "rules", *map(str, sorted(tmp_path.glob("*.yaml"))))
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize(
    ("labels", "message"),
    [
        ("job", "'job': the rules keep it already"),
        ("cluster,cluster", "'cluster' is given twice"),
        ("k8s-cluster", "'k8s-cluster' is not a label name"),
        ("", "'' is not a label name"),
    ],
)
def test_glassbox_rules_refuses_labels_it_cannot_add(
    labels: str, message: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit):
        rules_cli(["--aggregation-labels", labels, "--out", str(tmp_path)])
    assert message in capsys.readouterr().err
    assert not list(tmp_path.iterdir())
