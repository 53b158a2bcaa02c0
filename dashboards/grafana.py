"""What Grafana does with a dashboard's JSON before it draws, as pure functions.

Time ranges and the built-in intervals as Grafana computes them (`$__interval`,
`$__rate_interval`, `$__range`), the dashboard variables substituted with "All" (`.*`),
the legend format, and the panels in grid order.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from vllm_glassbox.core.units import parse_duration

# --- time ranges --------------------------------------------------------------------------


def parse_time(text: str, now: float) -> float:
    """Unix seconds ('1732900000'), RFC 3339 ('2024-11-29T16:00:00Z'), or relative to
    now ('now', '-15m', 'now-15m')."""
    raw = text.strip()
    try:
        return float(raw)
    except ValueError:
        pass
    relative = raw.removeprefix("now")
    if relative == "":
        return now
    if relative.startswith("-"):
        try:
            return now - parse_duration(relative[1:])
        except ValueError:
            pass
    try:
        moment = datetime.fromisoformat(raw)
    except ValueError:
        raise ValueError(
            f"not a time: {text!r} (use unix seconds, RFC 3339 like 2024-11-29T16:00:00Z, "
            "or relative like -15m)"
        ) from None
    if moment.tzinfo is None:
        raise ValueError(f"RFC 3339 time without a zone: {text!r} (add Z or +00:00)")
    return moment.timestamp()


@dataclass(frozen=True)
class TimeRange:
    start: float
    end: float
    step: float
    scrape_interval: float

    @property
    def rate_interval(self) -> float:
        """Grafana's $__rate_interval: max($__interval + scrape interval, 4 × scrape)."""
        return max(self.step + self.scrape_interval, 4 * self.scrape_interval)


def check_range(start: float, end: float) -> None:
    if not end > start:
        raise ValueError(f"the range is empty: start {start:g} is not before end {end:g}")


def time_range(start: float, end: float, scrape_interval: float, points: int = 400) -> TimeRange:
    """About `points` points over the range, never finer than the scrape interval."""
    check_range(start, end)
    step = max(scrape_interval, (end - start) / points)
    return TimeRange(start, end, float(math.ceil(step)) if step >= 1 else step, scrape_interval)


# --- variables ----------------------------------------------------------------------------


def _promql_duration(seconds: float) -> str:
    ms = max(1, round(seconds * 1000))
    return f"{ms // 1000}s" if ms % 1000 == 0 else f"{ms}ms"


_VARIABLE = re.compile(r"\$\{(\w+)(?::\w+)?\}|\$(\w+)|\[\[(\w+)\]\]")


def substitute(expr: str, variables: Iterable[str], span: TimeRange) -> str:
    """The expression Grafana would send with every variable on "All" (`.*`)."""
    builtin = {
        "__rate_interval": _promql_duration(span.rate_interval),
        "__interval": _promql_duration(span.step),
        "__range": _promql_duration(span.end - span.start),
    }
    names = set(variables)

    def replace(m: re.Match[str]) -> str:
        name = m.group(1) or m.group(2) or m.group(3)
        if name in builtin:
            return builtin[name]
        if name in names:
            return ".*"
        raise ValueError(f"unknown Grafana variable ${name} in: {expr}")

    return _VARIABLE.sub(replace, expr)


def variable_names(dashboard: dict[str, Any]) -> list[str]:
    return [str(v["name"]) for v in dashboard.get("templating", {}).get("list", [])]


# --- legends and panels -------------------------------------------------------------------

_LEGEND = re.compile(r"\{\{\s*(\w+)\s*\}\}")


def legend(template: str, labels: dict[str, str]) -> str:
    """Grafana's legend format: {{label}} replaced, absent labels empty; else the series."""
    if template:
        text = _LEGEND.sub(lambda m: labels.get(m.group(1), ""), template)
        return re.sub(r"\s+", " ", text.replace("()", "")).strip()
    name = labels.get("__name__", "")
    rest = ", ".join(f'{k}="{v}"' for k, v in sorted(labels.items()) if k != "__name__")
    return f"{name}{{{rest}}}" if rest else name or "{}"


def panels_of(dashboard: dict[str, Any]) -> list[dict[str, Any]]:
    """Panels with queries, in grid order (rows are headings, not panels)."""
    flat: list[dict[str, Any]] = []
    for panel in dashboard.get("panels", []):
        flat.extend(panel.get("panels", []) if panel.get("type") == "row" else [panel])
    return sorted(flat, key=lambda p: (p["gridPos"]["y"], p["gridPos"]["x"]))
