"""Service-level objectives: an SLO file read and checked, the bucket boundary each latency
objective counts, the rules it renders, and the lab's goodput judged by the same objectives
(docs/slo.md).

- `file`: the SLO file's format: reading and checking it, its objectives and buckets, the
  boundary each latency objective counts, its warnings
- `rules`: the rule template (glassbox/slo_rules.yaml): the burn alerts read from it, and
  its rules filled for each objective
- `goodput`: the lab's goodput, request by request, by the same objectives

Every public name is the package's too (`from vllm_glassbox.core import slo; slo.parse`;
tests/core/test_core_packages.py fails on one the package does not export).
"""

from __future__ import annotations

from vllm_glassbox.core.slo.file import (
    BUCKET_FAMILIES,
    DEFAULT_WINDOW,
    ERRORS,
    FAST_BURN,
    HISTOGRAMS,
    KEYS,
    MAX_BOUNDARY,
    MAX_WINDOW_DAYS,
    MODEL,
    NAME,
    NAMESPACE,
    RULES_TEMPLATE,
    SLIS,
    SLOW_BURN,
    TARGET_PERCENT,
    THRESHOLD,
    WINDOW,
    Boundary,
    Histogram,
    Objective,
    SloError,
    SloFile,
    le_text,
    number_text,
    parse,
    read_slo_file,
    seconds_text,
    target_share,
    template_document,
    template_text,
    threshold_seconds,
    warnings,
    window_days,
)
from vllm_glassbox.core.slo.goodput import (
    Attainment,
    Goodput,
    RequestOutcome,
    goodput,
    judge,
)
from vllm_glassbox.core.slo.rules import (
    BURN_ALERTS,
    GROUPS_TEXT,
    BurnClause,
    budget_lasts,
    placeholders,
    rule_groups,
    selector,
)

__all__ = [
    "BUCKET_FAMILIES",
    "BURN_ALERTS",
    "DEFAULT_WINDOW",
    "ERRORS",
    "FAST_BURN",
    "GROUPS_TEXT",
    "HISTOGRAMS",
    "KEYS",
    "MAX_BOUNDARY",
    "MAX_WINDOW_DAYS",
    "MODEL",
    "NAME",
    "NAMESPACE",
    "RULES_TEMPLATE",
    "SLIS",
    "SLOW_BURN",
    "TARGET_PERCENT",
    "THRESHOLD",
    "WINDOW",
    "Attainment",
    "Boundary",
    "BurnClause",
    "Goodput",
    "Histogram",
    "Objective",
    "RequestOutcome",
    "SloError",
    "SloFile",
    "budget_lasts",
    "goodput",
    "judge",
    "le_text",
    "number_text",
    "parse",
    "placeholders",
    "read_slo_file",
    "rule_groups",
    "seconds_text",
    "selector",
    "target_share",
    "template_document",
    "template_text",
    "threshold_seconds",
    "warnings",
    "window_days",
]
