"""The SLO rules' template (glassbox/slo_rules.yaml, package data; the chart fills a copy):
the burn alerts read from it, and its rules filled for each objective of an SLO file.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import yaml
from vllm_glassbox.core.slo.file import (
    ERRORS,
    FAST_BURN,
    SLOW_BURN,
    Objective,
    SloFile,
    number_text,
    template_document,
    template_text,
)

# --- the burn alerts ----------------------------------------------------------------------


@dataclass(frozen=True)
class BurnClause:
    """One clause of a burn alert: the error ratio over each of its windows (the records'
    suffixes, the long one first) above `factor` × the error budget."""

    windows: tuple[str, ...]
    factor: float


_BURN_TERM = re.compile(r"glassbox_slo_error_ratio:(\w+)\{[^}]*\} / @BUDGET@ > ([0-9.]+)")
_OR = re.compile(r"^\s*or\s*$", re.MULTILINE)


def _burn_alerts(template: Mapping[str, Any]) -> dict[str, tuple[BurnClause, ...]]:
    out = {}
    for group in template["groups"]:
        for rule in (r for r in group["rules"] if "alert" in r):
            clauses = []
            for clause in _OR.split(str(rule["expr"])):
                terms = _BURN_TERM.findall(clause)
                factors = {float(factor) for _, factor in terms}
                if len(factors) > 1:
                    raise ValueError(f"{rule['alert']}: one factor a clause, not {factors}")
                if terms:
                    clauses.append(BurnClause(tuple(w for w, _ in terms), factors.pop()))
            if clauses:
                out[str(rule["alert"])] = tuple(clauses)
    return out


#: The burn alerts, most urgent first, each as its clauses (any one fires it), read from
#: the rule template: what `glassbox explain` judges a burn by is what the alerts fire on.
BURN_ALERTS = _burn_alerts(template_document())


# --- the rules -----------------------------------------------------------------------------

_INDENT = " " * 10  # where the snippets go in the template (a line of an `expr: |-` block)
#: The part of the template that is filled: from its `groups:` line to the end.
GROUPS_TEXT = re.compile(r"^groups:\n.*", re.MULTILINE | re.DOTALL)


def selector(objective: Objective) -> str:
    """Which vLLM series the objective reads: its model (or any) and namespace (if given)."""
    model = f'model_name="{objective.model}"' if objective.model else 'model_name=~".+"'
    return model + (f', namespace="{objective.namespace}"' if objective.namespace else "")


def budget_lasts(window_days: int, factor: float) -> str:
    """How long a whole error budget of `window_days` lasts at a burn above `factor`, as a
    burn alert says it: 'under 2 days', 'under 2.1 days', 'under 12 hours' (rounded up to
    a tenth of a day, to an hour below two days; whole numbers, as the chart's template
    computes it)."""
    tenths_of_factor = round(factor * 10)
    tenths = -(-window_days * 100 // tenths_of_factor)  # ceil(days / factor * 10)
    if tenths < 20:
        return f"under {-(-window_days * 240 // tenths_of_factor)} hours"
    days = f"{tenths // 10}" if tenths % 10 == 0 else f"{tenths // 10}.{tenths % 10}"
    return f"under {days} days"


def placeholders(slo: SloFile, objective: Objective) -> dict[str, str]:
    boundary = slo.boundary(objective)
    histogram = objective.histogram
    return {
        "@NAME@": objective.name,
        "@SLI@": objective.sli,
        "@TARGET@": number_text(objective.target),
        "@BUDGET@": number_text(objective.budget),
        "@PERIOD@": objective.period,
        "@SELECTOR@": selector(objective),
        "@FAMILY@": histogram.name if histogram else "",
        "@LE@": boundary.le if boundary else "",
        "@FAST_GONE@": budget_lasts(objective.window_days, FAST_BURN),
        "@SLOW_GONE@": budget_lasts(objective.window_days, SLOW_BURN),
    }


def rule_groups(
    slo: SloFile, text: str | None = None, histograms: str = "classic"
) -> list[dict[str, Any]]:
    """Every objective's rule groups, from the template: its snippets filled in (a latency
    objective's native ones with `histograms="native"`), then its groups' text; rules whose
    expression is empty left out."""
    text = text if text is not None else template_text()
    snippets = yaml.safe_load(text)["sli"]
    groups_text = GROUPS_TEXT.search(text).group(0)  # type: ignore[union-attr]
    groups: list[dict[str, Any]] = []
    for objective in slo.objectives:
        simple = placeholders(slo, objective)
        latency = "latency_native" if histograms == "native" else "latency"
        kind = snippets[ERRORS if objective.sli == ERRORS else latency]

        def fill(s: str, values: Mapping[str, str] = simple) -> str:
            for key, value in values.items():
                s = s.replace(key, value)
            return s

        filled = {
            f"@{key.upper()}@": fill(str(kind[key])).replace("\n", "\n" + _INDENT)
            for key in ("requests", "errors", "missing_alert", "missing", "objective")
        }
        for group in yaml.safe_load(fill(fill(groups_text, filled)))["groups"]:
            group["rules"] = [r for r in group["rules"] if str(r["expr"]).strip()]
            groups.append(group)
    return groups
