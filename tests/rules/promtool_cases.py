"""The promtool test files of alerts/tests/ as data another rule engine can replay.

Each test group becomes a `Case`: its input series as timestamped samples (promtool's
expanding notation read as promtool reads it, stale markers included), the rule files it
loads, and what promtool checks: which alerts fire at which evaluation time, with which
labels, and which samples an expression gives. Every file and group is read as it is
found: a new test file or group is replayed with the others.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import promql_parser
import yaml

from tests.remote_write import STALE_NAN, Series

REPO = Path(__file__).resolve().parents[2]
UNIT_TEST_FILES = sorted((REPO / "alerts" / "tests").glob("*.yaml"))

_NUMBER = r"(?:[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?|[-+]?Inf|NaN)"
_EXPANDING = re.compile(rf"(?P<a>{_NUMBER})(?:(?P<op>[-+])(?P<b>{_NUMBER}))?x(?P<n>\d+)")
_LABEL_PAIR = re.compile(r'([a-zA-Z_]\w*)\s*=\s*"((?:[^"\\]|\\.)*)"')


def expand(values: str) -> list[float | None]:
    """promtool's `values` notation: 'a+bxn' is a, a+b, …, a+n·b (n+1 samples), 'axn' a
    n+1 times, '_' a missed scrape (None), '_xn' n of them, 'stale' a stale marker."""
    out: list[float | None] = []
    for item in values.split():
        if item == "_":
            out.append(None)
        elif item == "stale":
            out.append(STALE_NAN)
        elif item.startswith("_x"):
            out += [None] * int(item[2:])
        elif m := _EXPANDING.fullmatch(item):
            a, n = float(m["a"]), int(m["n"])
            b = float(m["b"] or 0) * (-1 if m["op"] == "-" else 1)
            out += [a + i * b for i in range(n + 1)]
        else:
            out.append(float(item))
    return out


def parse_series(text: str) -> dict[str, str]:
    """'name{a="b"}' or '{a="b"}' as labels (the name as __name__ when given)."""
    name, _, rest = text.strip().partition("{")
    labels = {k: v.replace('\\"', '"').replace("\\\\", "\\") for k, v in _LABEL_PAIR.findall(rest)}
    return {"__name__": name.strip(), **labels} if name.strip() else labels


def seconds(duration: str) -> float:
    return float(promql_parser.parse_duration(duration).total_seconds())


@dataclass(frozen=True)
class AlertCheck:
    at: float  # seconds after the case's start
    alertname: str
    firing: tuple[frozenset[tuple[str, str]], ...]  # the label sets expected, alertname in

    def describe(self) -> str:
        return f"{self.alertname} at {self.at / 60:g}m"


@dataclass(frozen=True)
class ExprCheck:
    at: float
    expr: str
    samples: tuple[tuple[frozenset[tuple[str, str]], float], ...]  # (labels, value)


@dataclass(frozen=True)
class Case:
    file: Path
    name: str
    sample_interval: float  # the group's `interval`: one input sample each
    evaluation_interval: float  # the file's: rules are evaluated each
    rule_files: tuple[Path, ...]
    input_series: tuple[tuple[dict[str, str], tuple[float | None, ...]], ...]
    alerts: tuple[AlertCheck, ...]
    exprs: tuple[ExprCheck, ...]

    @property
    def id(self) -> str:
        return f"{self.file.name}: {self.name}"

    @property
    def duration(self) -> float:
        """Up to the last evaluation time promtool checks."""
        return max([c.at for c in self.alerts] + [c.at for c in self.exprs] + [0.0])

    def series(self, start: float) -> list[Series]:
        """The input series as samples from `start`, one per interval; missed scrapes
        left out. Values that are Unix times (promtool's clock starts at 0) move with
        the case, so that `time() - x` means what it meant to promtool."""
        return [
            (
                labels,
                [
                    (start + i * self.sample_interval, v + (start if _is_unix_time(labels) else 0))
                    for i, v in enumerate(values)
                    if v is not None
                ],
            )
            for labels, values in self.input_series
        ]


def _is_unix_time(labels: dict[str, str]) -> bool:
    name = labels.get("__name__", "")
    return name.endswith("_timestamp_seconds") or name == "process_start_time_seconds"


def _label_set(labels: dict[str, Any]) -> frozenset[tuple[str, str]]:
    return frozenset((str(k), str(v)) for k, v in labels.items())


def case_of(path: Path, document: dict[str, Any], group: dict[str, Any]) -> Case:
    rule_files = tuple((path.parent / f).resolve() for f in document.get("rule_files", []))
    alerts = tuple(
        AlertCheck(
            seconds(check["eval_time"]),
            check["alertname"],
            tuple(
                _label_set({**alert.get("exp_labels", {}), "alertname": check["alertname"]})
                for alert in check.get("exp_alerts") or []
            ),
        )
        for check in group.get("alert_rule_test", [])
    )
    exprs = tuple(
        ExprCheck(
            seconds(check["eval_time"]),
            check["expr"],
            tuple(
                (_label_set(parse_series(s["labels"])), float(s["value"]))
                for s in check.get("exp_samples") or []
            ),
        )
        for check in group.get("promql_expr_test", [])
    )
    return Case(
        file=path,
        name=group["name"],
        sample_interval=seconds(group.get("interval", document.get("evaluation_interval", "1m"))),
        evaluation_interval=seconds(document.get("evaluation_interval", "1m")),
        rule_files=rule_files,
        input_series=tuple(
            (parse_series(s["series"]), tuple(expand(str(s["values"]))))
            for s in group.get("input_series", [])
        ),
        alerts=alerts,
        exprs=exprs,
    )


def cases(paths: Sequence[Path] = UNIT_TEST_FILES) -> Iterator[Case]:
    for path in paths:
        document = yaml.safe_load(path.read_text())
        for group in document["tests"]:
            yield case_of(path, document, group)
