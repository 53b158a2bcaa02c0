"""The promtool tests of the classic rules, fed the same traffic as native histograms.

Each test file of alerts/tests/ and alerts/slo/tests/ becomes a test file for the native
rules (`glassbox rules --histograms native`): every vLLM histogram its input series give
as `_bucket`, `_sum` and `_count` series becomes one native histogram series with vLLM's
boundaries (what Prometheus 3 stores with `convert_classic_histograms_to_nhcb`: a
custom-buckets histogram, schema -53), sample for sample; every other series stays as it
is. What promtool checks stays as it is too — the same records with the same values at the
same times, the same alerts firing at the same times — except where a record's name
changes (the TTFT record of buckets becomes the record of the histogram: each of its
buckets checked as `histogram_fraction(-Inf, le, …) * histogram_count(…)`) and the
classic rules' missing-boundary record and alert, which have no native form (left out,
and counted).
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from vllm_glassbox.histograms import native_expr, native_record

from tests.rules.promtool_cases import expand, parse_series

_HISTOGRAM_SERIES = re.compile(r"^(?P<family>vllm:[a-zA-Z0-9_:]*?)_(?P<part>bucket|count|sum)$")
#: What the classic rules check that the native ones have no form of.
NO_NATIVE_FORM = ("glassbox_slo_boundary_missing", "VLLMSLOBoundaryMissing")
Values = list[float | None]


@dataclass
class _Histogram:
    """One classic histogram series set of a test: its parts' samples, by part."""

    count: Values | None = None
    sum: Values | None = None
    buckets: dict[float, Values] = field(default_factory=dict)

    def sample(self, i: int) -> str:
        """The native histogram at step i in promtool's notation; `_` where a part missed
        its scrape, `stale` where it went stale."""
        count = (
            self._at(self.count, i)
            if self.count is not None
            else self._at(self.buckets.get(math.inf), i)
        )
        parts = [count, self._at(self.sum, i) if self.sum is not None else 0.0]
        bounds = sorted(b for b in self.buckets if b != math.inf)
        cumulative = [self._at(self.buckets[b], i) for b in bounds]
        if any(v is None for v in [*parts, *cumulative]):
            return "_"
        if any(math.isnan(v) for v in [*parts, *cumulative] if v is not None):
            return "stale"
        total, s = float(count or 0.0), float(parts[1] or 0.0)
        edges = [0.0, *(float(v or 0.0) for v in cumulative), total]
        counts = [edges[j + 1] - edges[j] for j in range(len(edges) - 1)]
        bucket_text = " ".join(_number(c) for c in counts)
        custom = f" custom_values:[{' '.join(_number(b) for b in bounds)}]" if bounds else ""
        return (
            f"{{{{schema:-53 sum:{_number(s)} count:{_number(total)}{custom} "
            f"buckets:[{bucket_text}]}}}}"
        )

    def steps(self) -> int:
        parts = [p for p in (self.count, self.sum, *self.buckets.values()) if p is not None]
        return max(len(p) for p in parts)

    @staticmethod
    def _at(values: Values | None, i: int) -> float | None:
        return values[i] if values is not None and i < len(values) else None


def _number(value: float) -> str:
    return repr(float(value)) if not float(value).is_integer() else str(int(value))


def _series_text(name: str, labels: Iterable[tuple[str, str]]) -> str:
    inner = ",".join(f'{k}="{v}"' for k, v in labels)
    return f"{name}{{{inner}}}"


def native_input(series: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """A test's input series with each classic histogram as one native histogram series."""
    histograms: dict[tuple[str, tuple[tuple[str, str], ...]], _Histogram] = {}
    out: list[dict[str, Any]] = []
    for item in series:
        labels = parse_series(item["series"])
        m = _HISTOGRAM_SERIES.match(labels.pop("__name__", ""))
        if m is None:
            out.append(item)
            continue
        le = labels.pop("le", None)
        h = histograms.setdefault((m["family"], tuple(sorted(labels.items()))), _Histogram())
        values = expand(str(item["values"]))
        if m["part"] == "bucket":
            h.buckets[float(le) if le is not None else math.inf] = values
        else:
            setattr(h, m["part"], values)
    for (family, labels), h in histograms.items():
        samples = " ".join(h.sample(i) for i in range(h.steps()))
        out.append({"series": _series_text(family, labels), "values": samples})
    return out


def _native_checks(check: dict[str, Any]) -> list[dict[str, Any]]:
    """One promql_expr_test item of the classic tests as the native tests check it."""
    expr = str(check["expr"]).strip()
    renamed = native_record(expr)
    if renamed == expr:
        return [{**check, "expr": native_expr(expr)}]
    # A record of buckets: each bucket as the native histogram's count at or below it.
    checks = []
    for sample in check.get("exp_samples") or []:
        labels = parse_series(sample["labels"])
        labels.pop("__name__", None)
        le = labels.pop("le")
        selector = _series_text(renamed, sorted(labels.items()))
        count = f"histogram_count({selector})"
        query = count if le == "+Inf" else f"histogram_fraction(-Inf, {le}, {selector}) * {count}"
        shown = _series_text("", sorted(labels.items()))
        checks.append(
            {"expr": query, "eval_time": check["eval_time"],
             "exp_samples": [{"labels": shown, "value": sample["value"]}]}
        )  # fmt: skip
    return checks


def lacks_a_boundary(test: dict[str, Any]) -> bool:
    """Whether a test feeds a histogram without the objective's boundary: the classic rules
    flag it (and leave the objective's numbers absent); a native histogram's boundaries
    are not readable in PromQL, so the native rules count it by interpolation instead."""
    checks = [
        *((c["expr"], c.get("exp_samples")) for c in test.get("promql_expr_test") or []),
        *((c["alertname"], c.get("exp_alerts")) for c in test.get("alert_rule_test") or []),
    ]
    return any(
        expected and any(n in str(what) for n in NO_NATIVE_FORM) for what, expected in checks
    )


@dataclass
class NativeFile:
    document: dict[str, Any]
    left_out: list[str]  # the checks with no native form, by test and what they check


def native_test_file(document: dict[str, Any], rule_files: list[str]) -> NativeFile:
    """A classic promtool test file (parsed YAML) as the native rules' test file."""
    left_out: list[str] = []
    tests = []
    for test in document["tests"]:
        if lacks_a_boundary(test):
            left_out.append(
                f"{test.get('name')}: the whole test (its histogram lacks the boundary)"
            )
            continue
        test = dict(test)
        test["input_series"] = native_input(test.get("input_series") or [])
        checks = []
        for check in test.get("promql_expr_test") or []:
            if any(name in str(check["expr"]) for name in NO_NATIVE_FORM):
                left_out.append(f"{test.get('name')}: {str(check['expr']).strip()}")
                continue
            checks += _native_checks(check)
        alerts = []
        for check in test.get("alert_rule_test") or []:
            if check["alertname"] in NO_NATIVE_FORM:
                left_out.append(f"{test.get('name')}: {check['alertname']}")
                continue
            alerts.append(check)
        test["promql_expr_test"], test["alert_rule_test"] = checks, alerts
        tests.append(test)
    return NativeFile({**document, "rule_files": rule_files, "tests": tests}, left_out)


# --- side by side: the classic and the native rules on the same traffic, every minute ---
#
# Prometheus extrapolates a classic counter's rate no further back than where it would
# reach zero, and a native histogram's rate to the window's edge (Prometheus 3.5: a series
# counting 1 a second from 0 reads 0.6/s classic, 0.7/s native at 3 minutes): the two
# differ in a series' first window, and so do the longer windows that sum those minutes.
# Side by side, every histogram therefore counts from OFFSET, as a server up for a while
# does (its rates unchanged); the first window is a test of its own.

NATIVE_PREFIX = "native_"
NATIVE_ALERT = "Native"
TOLERANCE = 1e-9  # relative: a bucket's count is fraction × count in floating point
OFFSET = 1e6


def _renamed(names: Iterable[str]) -> list[tuple[re.Pattern[str], str]]:
    """A pattern and its replacement for each record name, the longest first (a name is
    never a word of another's)."""
    return [
        (re.compile(rf"(?<![\w:]){re.escape(n)}(?![\w:])"), NATIVE_PREFIX + n)
        for n in sorted(names, key=len, reverse=True)
    ]


def side_by_side_rules(
    classic: list[dict[str, Any]], native: list[dict[str, Any]]
) -> list[dict[str, Any]]:
    """One rule file's groups: the classic groups as they are, then the native groups with
    every record and alert renamed (`native_<record>`, `<Alert>Native`), so both evaluate
    on the same series at the same times and can be compared by name."""
    records = [r["record"] for g in native for r in g["rules"] if "record" in r]
    renames = _renamed(records)
    out = [*classic]
    for group in native:
        rules = []
        for rule in group["rules"]:
            rule = dict(rule)
            for pattern, replacement in renames:
                rule["expr"] = pattern.sub(replacement, rule["expr"])
            if "record" in rule:
                rule["record"] = NATIVE_PREFIX + rule["record"]
            else:
                rule["alert"] = rule["alert"] + NATIVE_ALERT
            rules.append(rule)
        out.append({**group, "name": NATIVE_PREFIX + group["name"], "rules": rules})
    return out


def _tagged(expr: str, label: str) -> str:
    """`expr` with a label saying what it found."""
    return f'label_replace(({expr}), "{label}", "yes", "", "")'


def differences_query(classic: list[dict[str, Any]]) -> str:
    """A query that is empty when every record of the classic rules equals its native
    counterpart (the same label sets, values within TOLERANCE) and every alert is in the
    same state with the same labels; else it names what differs (the `record` label)."""
    names = [r["record"] for g in classic for r in g["rules"] if "record" in r]
    buckets = [n for n in names if native_record(n) != n]
    skipped = "|".join([".*boundary_missing.*", *map(re.escape, buckets)])
    skipped_native = "|".join(
        [".*boundary_missing.*", *(re.escape(native_record(n)) for n in buckets)]
    )
    ours = (
        f'label_replace({{__name__=~"namespace_.+:.+",__name__!~"{skipped}"}}, '
        '"record", "$1", "__name__", "(.+)")'
    )
    theirs = (
        f'label_replace({{__name__=~"{NATIVE_PREFIX}namespace_.+:.+",'
        f'__name__!~"{NATIVE_PREFIX}({skipped_native})"}}, '
        f'"record", "$1", "__name__", "{NATIVE_PREFIX}(.+)")'
    )
    parts = [
        _tagged(f"abs({ours} - {theirs}) > {TOLERANCE} * abs({ours})", "differs"),
        _tagged(f"{ours} unless {theirs}", "only_classic"),
        _tagged(f"{theirs} unless {ours}", "only_native"),
    ]
    for name in buckets:  # a record of buckets: its +Inf bucket, the histogram's count
        whole = f'sum without (le) ({name}{{le="+Inf"}})'
        count = f"histogram_count({NATIVE_PREFIX}{native_record(name)})"
        parts.append(_tagged(f"abs({whole} - {count}) > {TOLERANCE} * abs({whole})", name))
    no_form = "|".join(NO_NATIVE_FORM)
    native_alerts = (
        f'label_replace(ALERTS{{alertname=~".+{NATIVE_ALERT}"}}, '
        f'"alertname", "$1", "alertname", "(.+){NATIVE_ALERT}")'
    )
    classic_alerts = f'ALERTS{{alertname!~".+{NATIVE_ALERT}|{no_form}"}}'
    parts += [
        _tagged(f"{classic_alerts} unless {native_alerts}", "alert_only_classic"),
        _tagged(f"{native_alerts} unless {classic_alerts}", "alert_only_native"),
    ]
    return "\n or ".join(parts)


def _offset(series: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The series with every histogram part counting from OFFSET (missed scrapes and stale
    markers as they are), in promtool's notation one sample at a time."""
    out = []
    for item in series:
        name = parse_series(item["series"]).get("__name__", "")
        if _HISTOGRAM_SERIES.match(name) is None:
            out.append(item)
            continue
        shown = [
            "_" if v is None else "stale" if math.isnan(v) else _number(v + OFFSET)
            for v in expand(str(item["values"]))
        ]
        out.append({**item, "values": " ".join(shown)})
    return out


def _completed(series: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The series with every classic histogram whole, as a real page has it: a `_sum`
    where a test gave none (constant: no time observed; missed where its count missed),
    a `_count` from the `+Inf` bucket where a test gave only buckets."""
    parts: dict[tuple[str, tuple[tuple[str, str], ...]], dict[str, Any]] = {}
    for item in series:
        labels = parse_series(item["series"])
        m = _HISTOGRAM_SERIES.match(labels.pop("__name__", ""))
        if m is None:
            continue
        le = labels.pop("le", None)
        found = parts.setdefault((m["family"], tuple(sorted(labels.items()))), {})
        found[m["part"] if le in (None, "+Inf") else "some_bucket"] = item["values"]
    added = []
    for (family, labels), found in parts.items():
        count = found.get("count", found.get("bucket"))
        if count is None:
            continue
        if "count" not in found:
            added.append({"series": _series_text(f"{family}_count", labels), "values": count})
        if "sum" not in found:
            shown = [
                "_" if v is None else "stale" if math.isnan(v) else "0" for v in expand(str(count))
            ]
            added.append(
                {"series": _series_text(f"{family}_sum", labels), "values": " ".join(shown)}
            )
    return [*series, *added]


def side_by_side_test(
    test: dict[str, Any], query: str, until_seconds: float, step_seconds: float
) -> dict[str, Any]:
    """A test group: its input series (histograms whole, from OFFSET) and their native
    form together, and the differences query checked empty at every step up to
    `until_seconds`."""
    series = _offset(_completed(test.get("input_series") or []))
    natives = [s for s in native_input(series) if s not in series]
    steps = int(until_seconds // step_seconds)
    checks = [
        {"expr": query, "eval_time": f"{int(i * step_seconds)}s", "exp_samples": []}
        for i in range(steps + 1)
    ]
    return {
        "name": f"side by side: {test.get('name')}",
        "interval": test.get("interval", "1m"),
        "input_series": [*series, *natives],
        "promql_expr_test": checks,
    }
