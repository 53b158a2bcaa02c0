"""The native-histogram rules give the classic rules' records and alert times on the same
traffic, checked two ways with promtool 3 on the rules of `glassbox rules --histograms
native` (tests/rules/native_cases.py feeds each test's vLLM histograms as native ones):

- each promtool test of alerts/tests/ and alerts/slo/tests/ checks, on native histograms,
  what it checks on classic ones (its hand-worked values), where those values hold on
  Prometheus 3 for the classic rules themselves: its range selectors leave out the sample
  at the window's start, which moves the SLO burn tests' 5-minute windows by a minute;
- side by side: the classic and the native rules loaded together on each test's series in
  both forms, every record equal to its native counterpart and every alert in the same
  state, at every minute of every test.

Debian bookworm's promtool (2.42) cannot feed native histograms to a test (no `{{…}}`
notation for input series; custom buckets came with Prometheus 3): scripts/setup.sh
unpacks Debian unstable's promtool and prometheus 3 into .tools/prometheus-3/.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest
import yaml
from vllm_glassbox.core import slo
from vllm_glassbox.rules import rule_file_text, slo_rule_file_text

from tests.rules.native_cases import (
    differences_query,
    lacks_a_boundary,
    native_test_file,
    side_by_side_rules,
    side_by_side_test,
)
from tests.rules.promtool_cases import seconds

REPO = Path(__file__).resolve().parents[2]
PROMTOOL_3 = REPO / ".tools" / "prometheus-3" / "usr" / "bin" / "promtool"
RULE_FILES = ("glassbox-rules.yaml", "glassbox-alerts.yaml")
TEST_FILES = sorted((REPO / "alerts" / "tests").glob("*.yaml")) + sorted(
    (REPO / "alerts" / "slo" / "tests").glob("*.yaml")
)
# The classic tests whose hand-worked values the classic rules do not give on Prometheus 3
# (the 5-minute windows one sample shorter): compared side by side only.
WINDOWS_MOVED = {"fast_burn_test.yaml", "slow_burn_test.yaml", "ticket_burn_test.yaml"}
# The classic checks with no native form: the missing-boundary record and alert.
LEFT_OUT = {
    "objectives_test.yaml": [
        "a boundary vLLM does not have makes the objective's numbers absent and alerts: "
        "the whole test (its histogram lacks the boundary)",
        "a boundary lost mid-stream leaves the blind requests out, never counted as good: "
        "the whole test (its histogram lacks the boundary)",
        "a boundary every series has raises nothing: VLLMSLOBoundaryMissing",
    ]
}

pytestmark = pytest.mark.prometheus


def promtool_3(*args: str) -> subprocess.CompletedProcess[str]:
    if not PROMTOOL_3.exists():
        pytest.fail(f"{PROMTOOL_3} is missing: scripts/setup.sh unpacks Debian's promtool 3")
    return subprocess.run(
        [str(PROMTOOL_3), *args], capture_output=True, text=True, timeout=300, check=False
    )


def test_promtool_3_is_a_release_that_feeds_native_histograms() -> None:
    version = promtool_3("--version").stdout
    m = re.search(r"version (\d+)\.(\d+)", version)
    assert m is not None and (int(m[1]), int(m[2])) >= (3, 0), version


@pytest.fixture(scope="module")
def native_tree(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """alerts/ as the native rules and their tests: the same layout, so the test files'
    `rule_files` paths stay as they are."""
    root = tmp_path_factory.mktemp("native") / "alerts"
    (root / "tests").mkdir(parents=True)
    (root / "slo" / "tests").mkdir(parents=True)
    for name in RULE_FILES:
        text = rule_file_text((REPO / "alerts" / name).read_text(), name, [], "native")
        (root / name).write_text(text)
    objectives = slo.read_slo_file(REPO / "alerts" / "slo" / "example.yaml")
    text = slo_rule_file_text(objectives, "example.yaml", [], "native")
    (root / "slo" / "example.rules.yaml").write_text(text)
    return root


def test_the_native_rules_read_no_classic_histogram_series(native_tree: Path) -> None:
    result = promtool_3("check", "rules", *map(str, sorted(native_tree.rglob("*.rules.yaml"))))
    assert result.returncode == 0, result.stdout + result.stderr
    for path in [
        *(native_tree / n for n in RULE_FILES),
        native_tree / "slo" / "example.rules.yaml",
    ]:
        text = path.read_text()
        assert not re.search(r"vllm:[a-z0-9_:]+_(bucket|count|sum)\b", text), path.name
    rules = (native_tree / "glassbox-rules.yaml").read_text()
    assert "histogram_count(rate(vllm:inter_token_latency_seconds[5m]))" in rules
    slo_rules = (native_tree / "slo" / "example.rules.yaml").read_text()
    assert "histogram_fraction(-Inf, 0.5, rate(vllm:time_to_first_token_seconds{" in slo_rules


@pytest.mark.parametrize("path", TEST_FILES, ids=[p.name for p in TEST_FILES])
def test_native_histograms_give_the_classic_tests_records_and_alert_times(
    path: Path, native_tree: Path
) -> None:
    document = yaml.safe_load(path.read_text())
    native = native_test_file(document, list(document["rule_files"]))
    assert native.left_out == LEFT_OUT.get(path.name, [])
    where = native_tree / path.relative_to(REPO / "alerts")
    text = yaml.safe_dump(native.document, sort_keys=False, width=200, allow_unicode=True)
    where.write_text(text)
    fed = yaml.safe_dump(native.document["tests"])
    # Every vLLM histogram of the inputs is fed as a native one, none as classic series.
    assert not re.search(r"series: '?vllm:[a-z0-9_:]+_(bucket|count|sum)\{", fed)
    if re.search(r"vllm:[a-z0-9_:]+_(bucket|count|sum)\{", path.read_text()):
        assert "{{schema:-53 " in text
    classic = promtool_3("test", "rules", str(path))
    assert (classic.returncode == 0) == (path.name not in WINDOWS_MOVED), classic.stdout
    if path.name in WINDOWS_MOVED:
        return
    result = promtool_3("test", "rules", str(where))
    assert result.returncode == 0, f"{where.name}:\n{result.stdout}{result.stderr}"


def _until(test: dict[str, object]) -> float:
    """The last time a test checks anything."""
    checks = [*(test.get("promql_expr_test") or []), *(test.get("alert_rule_test") or [])]  # type: ignore[misc]
    return max(seconds(str(c["eval_time"])) for c in checks)


@pytest.mark.parametrize("path", TEST_FILES, ids=[p.name for p in TEST_FILES])
def test_the_classic_and_native_rules_agree_at_every_minute_side_by_side(
    path: Path, native_tree: Path
) -> None:
    document = yaml.safe_load(path.read_text())
    classic_groups, native_groups = [], []
    for name in document["rule_files"]:
        classic_groups += yaml.safe_load((path.parent / name).read_text())["groups"]
        native_path = native_tree / (path.parent / name).resolve().relative_to(REPO / "alerts")
        native_groups += yaml.safe_load(native_path.read_text())["groups"]
    rules = native_tree / "side-by-side" / path.name.replace("_test", "_rules")
    rules.parent.mkdir(exist_ok=True)
    rules.write_text(yaml.safe_dump({"groups": side_by_side_rules(classic_groups, native_groups)}))
    query = differences_query(classic_groups)
    step = seconds(str(document.get("evaluation_interval", "1m")))
    compared = [t for t in document["tests"] if not lacks_a_boundary(t)]
    tests = [side_by_side_test(t, query, _until(t), step) for t in compared]
    order = document.get("group_eval_order")
    side = {
        "rule_files": [rules.name],
        "evaluation_interval": document.get("evaluation_interval", "1m"),
        **({"group_eval_order": order + ["native_" + g for g in order]} if order else {}),
        "tests": tests,
    }
    where = rules.parent / path.name
    where.write_text(yaml.safe_dump(side, sort_keys=False, width=200, allow_unicode=True))
    assert sum(len(t["promql_expr_test"]) for t in tests) > len(tests)  # every minute
    result = promtool_3("test", "rules", str(where))
    assert result.returncode == 0, f"{where.name}:\n{result.stdout[-4000:]}{result.stderr}"


def test_side_by_side_catches_a_native_rule_that_reads_the_wrong_part(
    native_tree: Path, tmp_path: Path
) -> None:
    # The comparison can fail: the native ITL record made to read the count as its sum.
    path = REPO / "alerts" / "tests" / "recording_rules_test.yaml"
    document = yaml.safe_load(path.read_text())
    classic_groups = yaml.safe_load((REPO / "alerts" / "glassbox-rules.yaml").read_text())["groups"]
    native_groups = yaml.safe_load((native_tree / "glassbox-rules.yaml").read_text())["groups"]
    for group in native_groups:
        for rule in group["rules"]:
            if (
                rule.get("record")
                == "namespace_job_model_name:vllm_inter_token_latency_seconds:rate5m"
            ):
                rule["expr"] = rule["expr"].replace("histogram_sum(", "histogram_count(", 1)
    rules = tmp_path / "rules.yaml"
    rules.write_text(yaml.safe_dump({"groups": side_by_side_rules(classic_groups, native_groups)}))
    query = differences_query(classic_groups)
    tests = [side_by_side_test(t, query, _until(t), 60.0) for t in document["tests"]]
    where = tmp_path / "test.yaml"
    where.write_text(yaml.safe_dump({"rule_files": [rules.name], "tests": tests}, width=200))
    result = promtool_3("test", "rules", str(where))
    assert result.returncode == 1
    shown = result.stdout + result.stderr
    assert 'record="namespace_job_model_name:vllm_inter_token_latency_seconds:rate5m"' in shown


def test_in_a_series_first_window_a_native_rate_extrapolates_past_zero(tmp_path: Path) -> None:
    # Why the side-by-side histograms count from an offset: Prometheus extrapolates a
    # counter's rate back no further than its zero, a native histogram's to the window's
    # edge. One observation a second from 0, read 3 minutes in, and once the window is full.
    test = {
        "rule_files": [],
        "tests": [
            {
                "interval": "1m",
                "input_series": [
                    {"series": "c_count", "values": "0+60x10"},
                    {
                        "series": "c",
                        "values": "{{schema:-53 sum:0 count:0 buckets:[0]}}"
                        "+{{schema:-53 sum:0 count:60 buckets:[60]}}x10",
                    },
                ],
                "promql_expr_test": [
                    {"expr": e, "eval_time": t, "exp_samples": [{"labels": "{}", "value": v}]}
                    for e, t, v in [
                        ("rate(c_count[5m])", "3m", 0.6000000000000001),
                        ("histogram_count(rate(c[5m]))", "3m", 0.7000000000000001),
                        ("rate(c_count[5m])", "8m", 1.0),
                        ("histogram_count(rate(c[5m]))", "8m", 1.0),
                    ]
                ],
            }
        ],
    }
    where = tmp_path / "first_window_test.yaml"
    where.write_text(yaml.safe_dump(test))
    result = promtool_3("test", "rules", str(where))
    assert result.returncode == 0, result.stdout + result.stderr
