"""The promtool tests replayed on VictoriaMetrics' vmalert: the same rule files, the same
input series, the same expectations.

Every group of every file in alerts/tests/ (and the recording rules' comparison with the
derivation core, tests/rules/test_rules.py) is written into a running VictoriaMetrics by
remote write, stale markers included, each group at a start of its own eight days apart
(longer than the longest window, 7 days, so groups never see each other's series).
vmalert replays the group's rule files over that stretch at the file's evaluation
interval — recording groups first, so that alerts reading a record find it, as they do in
promtool — and writes records and alert state (ALERTS) back. Then every check promtool
makes holds on what vmalert wrote: the alerts firing at each evaluation time with their
labels, and each expression's samples (a selector reads the samples vmalert recorded at
that instant; any other expression is asked of VictoriaMetrics at that instant).

Debian's vmalert 1.79 has no unit-test command of its own (vmalert-tool came in 1.92):
replay mode is how it evaluates rules over history. It differs from promtool in one way
the checks allow for: vmalert writes no stale marker for a record that stops, so a record
is read at its exact instant, not with Prometheus' 5-minute lookback.
"""

from __future__ import annotations

import math
import time
from collections import Counter
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import promql_parser
import pytest
import yaml

from tests import remote_write
from tests.rules import test_rules
from tests.rules.promtool_cases import UNIT_TEST_FILES, Case, case_of, cases
from tests.victoria import VictoriaMetrics, replay, samples_at

pytestmark = [pytest.mark.victoriametrics, pytest.mark.slow]

SPACING_SECONDS = 8 * 86400
# What ALERTS adds to an alert's own labels (alertgroup: vmalert's group name).
ALERT_STATE_LABELS = {"__name__", "alertstate", "alertgroup"}
RELATIVE_TOLERANCE = 1e-9  # float arithmetic in another order; anything more is a difference


def derivation_core_cases() -> Iterator[Case]:
    """test_rules' comparison of every ratio rule with core/derive/, on pages captured
    from vLLM, as promtool cases (the same series and expectations promtool runs)."""
    for name, scenario in sorted(test_rules.SCENARIOS.items()):
        group = {
            "name": f"recording rules equal derive.py: {name}",
            "interval": "1m",
            "input_series": test_rules.promtool_series(scenario),
            "promql_expr_test": test_rules.comparison_cases(test_rules.core_increases(scenario)),
        }
        document = {"rule_files": [str(test_rules.RULES_FILE)], "evaluation_interval": "1m"}
        yield case_of(test_rules.RULES_FILE, document, group)


CASES = [*cases(), *derivation_core_cases()]


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Iterator[VictoriaMetrics]:
    with VictoriaMetrics(tmp_path_factory.mktemp("victoria-metrics")) as vm:
        yield vm


ANCHOR = time.time() // 3600 * 3600


def split_by_kind(rule_files: tuple[Path, ...], work: Path) -> tuple[Path, Path]:
    """The groups of `rule_files` in two files: those that only record, then the rest.
    Alerts lose their annotations: replay writes labels only (ALERTS), and 1.79 refuses
    the `query` template function in replay mode (live vmalert runs it: test_vmalert.py)."""
    recording: list[dict[str, Any]] = []
    other: list[dict[str, Any]] = []
    for path in rule_files:
        for group in yaml.safe_load(path.read_text())["groups"]:
            for rule in group["rules"]:
                rule.pop("annotations", None)
            only_records = all("record" in rule for rule in group["rules"])
            (recording if only_records else other).append(group)
    out = (work / "recording.yaml", work / "other.yaml")
    for path, groups in zip(out, (recording, other), strict=True):
        path.write_text(yaml.safe_dump({"groups": groups}, sort_keys=False))
    return out


def replayed(case: Case, store: VictoriaMetrics, work: Path) -> float:
    """`case` written into the store and replayed by vmalert; its start time."""
    start = ANCHOR - (CASES.index(case) + 1) * SPACING_SECONDS
    remote_write.write(store.write_url, case.series(start))
    store.flush()
    interval = f"{case.evaluation_interval:g}s"
    for rule_file in split_by_kind(case.rule_files, work):
        replay([rule_file], store, start, start + case.duration, interval, work / "vmalert.log")
    return start


def _labels(labels: dict[str, str], drop: set[str]) -> frozenset[tuple[str, str]]:
    return frozenset((k, v) for k, v in labels.items() if k not in drop)


def firing(store: VictoriaMetrics, alertname: str, at: float) -> list[frozenset[tuple[str, str]]]:
    """The label sets of `alertname`'s alerts vmalert had firing at `at`."""
    selector = f'ALERTS{{alertname="{alertname}",alertstate="firing"}}'
    found = samples_at(store.export(selector, at - 1, at + 1), at)
    return sorted((_labels(labels, ALERT_STATE_LABELS) for labels, _ in found), key=sorted)


def expression_samples(
    store: VictoriaMetrics, expr: str, at: float, step: float
) -> list[tuple[frozenset[tuple[str, str]], float]]:
    """`expr` at `at`: a selector's samples recorded at that instant, any other expression
    as VictoriaMetrics evaluates it there (looking back one evaluation interval)."""
    if isinstance(promql_parser.parse(expr), promql_parser.VectorSelector):
        found = samples_at(store.export(expr, at - 1, at + 1), at)
        return [(_labels(labels, set()), value) for labels, value in found]
    return [(_labels(labels, set()), value) for labels, value in store.query(expr, at, step)]


def _close(got: float, want: float) -> bool:
    return math.isclose(got, want, rel_tol=RELATIVE_TOLERANCE, abs_tol=1e-12)


def _matches(
    got: list[tuple[frozenset[tuple[str, str]], float]],
    want: tuple[tuple[frozenset[tuple[str, str]], float], ...],
) -> bool:
    if Counter(labels for labels, _ in got) != Counter(labels for labels, _ in want):
        return False
    values = dict(got)
    return all(_close(values[labels], value) for labels, value in want)


def _shown(samples: Sequence[tuple[frozenset[tuple[str, str]], float]]) -> list[str]:
    return sorted(f"{dict(sorted(labels))} {value!r}" for labels, value in samples)


def test_every_promtool_file_is_replayed() -> None:
    assert {c.file for c in CASES} >= set(UNIT_TEST_FILES)
    assert any(c.alerts for c in CASES) and any(c.exprs for c in CASES)


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_vmalert_fires_and_records_what_promtool_expects_on_the_same_series(
    case: Case, store: VictoriaMetrics, tmp_path: Path
) -> None:
    start = replayed(case, store, tmp_path)
    differences = []
    for alert in case.alerts:
        got = firing(store, alert.alertname, start + alert.at)
        want = sorted(alert.firing, key=sorted)
        if Counter(got) != Counter(want):
            differences.append(f"{alert.describe()}: vmalert {got}, promtool expects {want}")
    for check in case.exprs:
        at = start + check.at
        got_samples = expression_samples(store, check.expr, at, case.evaluation_interval)
        if not _matches(got_samples, check.samples):
            differences.append(
                f"{check.expr.strip()} at {check.at / 60:g}m: vmalert {_shown(got_samples)}, "
                f"promtool expects {_shown(check.samples)}"
            )
    assert not differences, "\n".join(differences)
