"""The rule files with more aggregation labels, and the rules of an SLO file
(`glassbox rules`).

alerts/*.yaml keep `namespace` (and `job`, and for alerts `instance`) in every aggregation
and vector match, so two teams serving the same model stay apart and every alert reaches
its namespace's route. A fleet that puts more labels on every series (`cluster` on each
cluster's Prometheus, `region`, ...) keeps those too with this command, as
kube-prometheus-stack's `additionalAggregationLabels` does:

    glassbox rules --aggregation-labels cluster --out rules/ alerts/glassbox-*.yaml

Each `by (` and `on (` of every expression gets the labels first: `sum by (namespace,
job, model_name)` becomes `sum by (cluster, namespace, job, model_name)`. The chart's
`prometheusRule.additionalAggregationLabels` does the same in its template (the same
pattern, in Go's regexp syntax); tests/rules/test_rules.py checks that the two agree.

An SLO file (core/slo/, docs/slo.md) becomes one rule file of its own, with the
aggregation labels too when given:

    glassbox rules --slo slo.yaml --out rules/     # writes rules/slo.rules.yaml

A latency threshold that is not a bucket boundary is warned about on stderr (the rules
count the nearest boundary below); a file with problems writes nothing and names each.

A Prometheus that keeps vLLM's histograms as native ones (Prometheus 3's
`convert_classic_histograms_to_nhcb`) has no `_bucket`, `_sum` or `_count` series; the
rules that read them in their native form (glassbox/histograms.py), for the rule files and
an SLO file alike:

    glassbox rules --histograms native --out rules/ alerts/glassbox-*.yaml
    glassbox rules --histograms native --slo slo.yaml --out rules/
"""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml
from vllm_glassbox.core import slo
from vllm_glassbox.core.helptext import examples
from vllm_glassbox.histograms import CLASSIC, MODES, NATIVE, NativeError, native_rules

# The labels the rules already aggregate or match on: adding one again is a mistake.
RULE_LABELS = frozenset({"namespace", "job", "instance", "model_name", "engine", "position"})
LABEL_NAME = re.compile(r"[a-zA-Z][a-zA-Z0-9_]*")  # as the chart's values.schema.json
# `by (` or `on (` as a whole word, the labels go right after the parenthesis. The chart's
# template (helm/vllm-glassbox/templates/prometheusrule.yaml) uses the same pattern.
GROUPING = re.compile(r"\b(by|on)\s*\(")


class LabelError(ValueError):
    pass


def checked_labels(labels: Sequence[str]) -> list[str]:
    """The labels, or a LabelError naming the first that is no label name, a label the
    rules already keep, or given twice."""
    seen: list[str] = []
    for label in labels:
        if not LABEL_NAME.fullmatch(label):
            raise LabelError(f"{label!r} is not a label name Prometheus accepts on a series")
        if label in RULE_LABELS:
            raise LabelError(f"{label!r}: the rules keep it already")
        if label in seen:
            raise LabelError(f"{label!r} is given twice")
        seen.append(label)
    return seen


def with_aggregation_labels(expr: str, labels: Sequence[str]) -> str:
    """`expr` with `labels` first in every `by (...)` and `on (...)`."""
    if not labels:
        return expr
    first = ", ".join(labels)
    return GROUPING.sub(lambda m: f"{m.group(1)} ({first}, ", expr)


def rules_with_aggregation_labels(document: dict[str, Any], labels: Sequence[str]) -> None:
    """Every rule's expression of a rule file (parsed YAML) changed in place."""
    for group in document["groups"]:
        for rule in group["rules"]:
            rule["expr"] = with_aggregation_labels(rule["expr"], labels)


class _BlockStrings(yaml.SafeDumper):
    """Multi-line strings (the expressions) as YAML blocks, as the sources write them; no
    anchors (a rule's labels are written out where they apply)."""

    def ignore_aliases(self, data: Any) -> bool:
        return True


def _str(dumper: yaml.SafeDumper, text: str) -> yaml.ScalarNode:
    style = "|" if "\n" in text else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", text, style=style)


_BlockStrings.add_representer(str, _str)


def _options(labels: Sequence[str], histograms: str) -> str:
    """The command's options that made a file, as its header names them."""
    shown = f" --aggregation-labels {','.join(labels)}" if labels else ""
    return shown + (f" --histograms {histograms}" if histograms != CLASSIC else "")


def rule_file_text(
    source_text: str, source_name: str, labels: Sequence[str], histograms: str = CLASSIC
) -> str:
    """A rule file's text with the labels added (and its histograms read as native ones),
    under a header that says so."""
    document = yaml.safe_load(source_text)
    if histograms == NATIVE:
        native_rules(document)
    rules_with_aggregation_labels(document, labels)
    header = (
        f"# GENERATED by `glassbox rules{_options(labels, histograms)}` from "
        f"{source_name}: do not edit.\n"
    )
    body = yaml.dump(document, Dumper=_BlockStrings, sort_keys=False, width=100)
    return header + body


def slo_rule_file_text(
    objectives: slo.SloFile, source_name: str, labels: Sequence[str], histograms: str = CLASSIC
) -> str:
    """The rule file of an SLO file: a header naming the file, the boundary each latency
    objective counts, and every objective's groups."""
    document = {"groups": slo.rule_groups(objectives, histograms=histograms)}
    rules_with_aggregation_labels(document, labels)
    command = f"glassbox rules --slo {source_name}" + _options(labels, histograms)
    lines = [f"# GENERATED by `{command}`: do not edit."]
    for o in objectives.objectives:
        boundary = objectives.boundary(o)
        if boundary is not None and o.threshold_seconds is not None:
            counted = "its threshold" if boundary.exact else "the nearest boundary below"
            lines.append(
                f"# {o.name}: {o.sli} ≤ {slo.seconds_text(o.threshold_seconds)}, counted in "
                f'the bucket le="{boundary.le}" ({counted}).'
            )
    body = yaml.dump(document, Dumper=_BlockStrings, sort_keys=False, width=100, allow_unicode=True)
    return "\n".join(lines) + "\n" + body


def main(argv: Sequence[str], prog: str = "glassbox rules") -> int:
    parser = argparse.ArgumentParser(
        prog=prog,
        description="Write the rule files with more aggregation labels, or the rules of an "
        "SLO file.",
        **examples(
            f"{prog} --aggregation-labels cluster --out rules/ alerts/glassbox-*.yaml",
            f"{prog} --slo slo.yaml --out rules/",
            f"{prog} --slo slo.yaml --aggregation-labels cluster --out rules/",
            f"{prog} --histograms native --out rules/ alerts/glassbox-*.yaml",
        ),
    )
    parser.add_argument(
        "--aggregation-labels",
        default="",
        help="comma-separated labels every rule keeps besides its own, e.g. cluster",
    )
    parser.add_argument(
        "--slo", type=Path, help="an SLO file (docs/slo.md): write its rules as FILE.rules.yaml"
    )
    parser.add_argument(
        "--histograms",
        choices=MODES,
        default=CLASSIC,
        help="classic: read vLLM's histograms as _bucket, _sum and _count series (default); "
        "native: as native histograms (histogram_count, histogram_sum, histogram_fraction), "
        "for a Prometheus that converts them (convert_classic_histograms_to_nhcb)",
    )
    parser.add_argument("--out", type=Path, required=True, help="folder for the new files")
    parser.add_argument("files", nargs="*", type=Path, help="rule files (alerts/*.yaml)")
    args = parser.parse_args(argv)
    labels: list[str] = []
    if args.aggregation_labels or (args.files and not args.slo and args.histograms == CLASSIC):
        try:
            labels = checked_labels([x.strip() for x in args.aggregation_labels.split(",")])
        except LabelError as e:
            parser.error(f"--aggregation-labels: {e}")
    if not args.files and not args.slo:
        parser.error("give rule files (with --aggregation-labels), --slo FILE, or both")
    if args.out.exists() and not args.out.is_dir():
        parser.error(f"--out: {str(args.out)!r} is a file, not a folder")
    if any(f.resolve().parent == args.out.resolve() for f in args.files):
        parser.error("--out: give another folder than the sources'")
    texts = {}
    for path in args.files:
        try:
            texts[path.name] = rule_file_text(path.read_text(), path.name, labels, args.histograms)
        except NativeError as e:
            print(f"{prog}: {path}: {e}", file=sys.stderr)
            return 1
        except (OSError, yaml.YAMLError, KeyError, TypeError) as e:
            print(f"{prog}: {path}: not a rule file ({e})", file=sys.stderr)
            return 1
    if args.slo:
        try:
            objectives = slo.read_slo_file(args.slo)
        except slo.SloError as e:
            print(f"{prog}: {e}", file=sys.stderr)
            return 1
        for warning in slo.warnings(objectives):
            print(f"{prog}: warning: {warning}", file=sys.stderr)
        name = f"{args.slo.stem}.rules.yaml"
        if name in texts:
            parser.error(f"--slo: {name} would overwrite a rule file of the same name")
        texts[name] = slo_rule_file_text(objectives, args.slo.name, labels, args.histograms)
    try:
        written = write_files(args.out, texts)
    except OSError as e:
        print(f"{prog}: --out: cannot write into {str(args.out)!r}: {e}", file=sys.stderr)
        return 1
    for path in written:
        print(path)
    return 0


def write_files(out: Path, texts: dict[str, str]) -> list[Path]:
    """Every file written whole, or none: each to a temporary name first, all renamed
    into place once all are written (OSError, and nothing left behind, otherwise)."""
    out.mkdir(parents=True, exist_ok=True)
    pending: list[tuple[Path, Path]] = []
    try:
        for name, text in texts.items():
            temporary = out / f".{name}.partial"
            pending.append((temporary, out / name))
            temporary.write_text(text)
        for temporary, path in pending:
            temporary.replace(path)
    finally:
        for temporary, _ in pending:
            temporary.unlink(missing_ok=True)
    return [path for _, path in pending]
