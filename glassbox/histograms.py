"""The rules for native histograms: the rule files of alerts/ with every classic histogram
series read as the native histogram it becomes.

A Prometheus that keeps vLLM's histograms as native ones (`convert_classic_histograms_to_nhcb`,
Prometheus 3; Grafana Alloy likewise) stores no `_bucket`, `_sum` or `_count` series: the
classic rules would read nothing, without an error. Each reading is rewritten as its
native form (docs/fleet.md, "Native histograms"):

    rate(vllm:X_count{...}[5m])   ->  histogram_count(rate(vllm:X{...}[5m]))
    rate(vllm:X_sum{...}[5m])     ->  histogram_sum(rate(vllm:X{...}[5m]))
    sum by (..., le) (rate(vllm:X_bucket[5m]))  ->  sum by (...) (rate(vllm:X[5m]))

(`increase` likewise), and a record of buckets (`…_le:vllm_X_bucket:rate5m`) becomes the
record of the native histogram (`…:vllm_X:rate5m`). The SLO rules' template has its
native snippets written beside the classic ones (`sli.latency_native`:
`histogram_fraction`). Anything of a classic histogram left after the rewrite is an
error, never a rule that reads nothing.
"""

from __future__ import annotations

import re
from typing import Any

CLASSIC = "classic"
NATIVE = "native"
MODES = (CLASSIC, NATIVE)

_NAME = r"vllm:[a-zA-Z0-9_:]*?"
_SELECTOR = r"(?P<sel>\{[^{}]*\})?"
_RANGE = r"\[(?P<range>[^\]]+)\]"
_COUNT_OR_SUM = re.compile(
    rf"\b(?P<fn>rate|increase)\((?P<name>{_NAME})_(?P<part>count|sum){_SELECTOR}{_RANGE}\)"
)
_BUCKETS_BY_LE = re.compile(
    r"sum by \((?P<by>[^()]*?),\s*le\)\s*\(\s*"
    rf"rate\((?P<name>{_NAME})_bucket{_SELECTOR}{_RANGE}\)\s*\)"
)
_LE_RECORD = re.compile(
    r"^(?P<level>[a-zA-Z0-9_]+)_le:(?P<metric>[a-zA-Z0-9_]+)_bucket:(?P<op>\w+)$"
)
# What the rewrite must leave nothing of: a classic histogram series of vLLM's.
_CLASSIC_LEFT = re.compile(rf"\b{_NAME}_(?:bucket|count|sum)\b")


class NativeError(ValueError):
    pass


def native_expr(expr: str) -> str:
    """`expr` with each classic histogram series read as its native histogram."""
    out = _COUNT_OR_SUM.sub(
        lambda m: f"histogram_{m['part']}({m['fn']}({m['name']}{m['sel'] or ''}[{m['range']}]))",
        expr,
    )
    out = _BUCKETS_BY_LE.sub(
        lambda m: f"sum by ({m['by']}) (\n  rate({m['name']}{m['sel'] or ''}[{m['range']}])\n)",
        out,
    )
    left = _CLASSIC_LEFT.search(out)
    if left is not None:
        raise NativeError(f"{left.group(0)}: no native form of this reading in {expr.strip()!r}")
    return out


def native_record(name: str) -> str:
    """A record's name in the native rules: a record of buckets becomes one of the
    histogram (`namespace_job_model_name:vllm_time_to_first_token_seconds:rate5m`)."""
    m = _LE_RECORD.match(name)
    return name if m is None else f"{m['level']}:{m['metric']}:{m['op']}"


def native_rules(document: dict[str, Any]) -> None:
    """Every rule of a rule file (parsed YAML) in its native form, in place."""
    for group in document["groups"]:
        for rule in group["rules"]:
            rule["expr"] = native_expr(rule["expr"])
            if "record" in rule:
                rule["record"] = native_record(rule["record"])
