"""The SLO file: reading and checking it, its objectives, the bucket boundary each latency
objective counts, and what renders but does not do what the file seems to say.

An SLO file (docs/slo.md has the whole story):

    buckets:                 # optional: vLLM's --custom-histogram-buckets, as vLLM was given it
      time_to_first_token: [0.1, 0.25, 0.5, 1.0, 2.5, 5.0]
    objectives:
      - name: chat-ttft      # the `slo` label: lower case letters, digits and dashes
        sli: ttft            # ttft, tpot (per request), e2e or errors
        threshold: 500ms     # latency only: 500ms, 2s, 1m, or seconds
        target: 99%          # or 0.99: the share of requests that must be good
        window: 28d          # whole days (default 28d): the error budget's period
        namespace: team-a    # optional (default: every namespace)
        model: qwen          # optional (default: every model)

A latency objective counts the requests in one bucket of vLLM's histogram: the bucket of
its threshold, or, when the threshold is not a boundary of vLLM's buckets, the nearest
boundary below it (never a rounding up: a request just over the threshold is never counted
good). `warnings()` says which. The chart (`prometheusRule.slo`) takes the same data and its
template fills the same rule text (glassbox/slo_rules.yaml, the package root's data).
"""

from __future__ import annotations

import functools
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from decimal import Decimal
from importlib import resources
from pathlib import Path
from typing import Any

import yaml

# --- what vLLM measures ---------------------------------------------------------------------


@dataclass(frozen=True)
class Histogram:
    """A vLLM latency histogram an objective reads, and its bucket family as vLLM's
    --custom-histogram-buckets names it."""

    name: str
    family: str
    default_buckets: tuple[float, ...]


RULES_TEMPLATE = "slo_rules.yaml"


def template_text() -> str:
    """The rule template (glassbox/slo_rules.yaml; the chart has a copy in files/slo/)."""
    return (resources.files("vllm_glassbox") / RULES_TEMPLATE).read_text(encoding="utf-8")


@functools.cache
def template_document() -> Mapping[str, Any]:
    """The rule template read as YAML, once a process (the histograms and the burn alerts
    come from it; never to be changed): with libyaml's parser where PyYAML has it, which
    reads the same document ten times faster (an import of the exporter reads it)."""
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    document: Mapping[str, Any] = yaml.load(template_text(), Loader=loader)
    return document


def _histograms(found: Mapping[str, Any]) -> dict[str, Histogram]:
    return {
        sli: Histogram(h["name"], h["family"], tuple(float(b) for b in h["buckets"]))
        for sli, h in found.items()
    }


#: Latency SLIs (ttft, tpot: each request's time per output token, e2e) and vLLM's
#: histogram of each, from the rule template: the chart reads the same.
HISTOGRAMS = _histograms(template_document()["histograms"])
ERRORS = "errors"
SLIS = (*HISTOGRAMS, ERRORS)
#: Every family vLLM's --custom-histogram-buckets takes (its JSON may be pasted whole).
BUCKET_FAMILIES = (
    "request_latency", "time_to_first_token", "inter_token_latency", "iteration_tokens",
    "request_params_n", "request_num_preemptions", "request_tokens", "kv_cache_residency",
)  # fmt: skip

#: The SRE workbook's burn rates (alerts in slo_rules.yaml): the fast page's and the slow
#: one's. A target whose budget times the factor reaches 1 can never burn that fast.
FAST_BURN, SLOW_BURN = 14.4, 6.0

# The grammar the chart's schema and template read too (values.schema.json, _slo.tpl).
NAME = re.compile(r"^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$")
NAMESPACE = NAME
MODEL = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._/:+-]{0,254}$")
THRESHOLD = re.compile(r"^([0-9]+(?:\.[0-9]+)?)(ms|s|m)$")
TARGET_PERCENT = re.compile(r"^([0-9]+(?:\.[0-9]+)?)%$")
WINDOW = re.compile(r"^([1-9][0-9]*)d$")
_UNIT_SECONDS = {"ms": "0.001", "s": "1", "m": "60"}
MAX_WINDOW_DAYS = 365
MAX_BOUNDARY = 1e6  # seconds; beyond it vLLM writes `le` in exponent form
DEFAULT_WINDOW = "28d"
KEYS = ("name", "sli", "threshold", "target", "window", "namespace", "model")


class SloError(ValueError):
    """Every problem of an SLO file, each as `key: message`, under the file's name."""

    def __init__(self, problems: Sequence[str], source: str) -> None:
        self.problems = list(problems)
        self.source = source
        super().__init__(f"{source}: {len(problems)} problem(s):\n  " + "\n  ".join(self.problems))


@dataclass(frozen=True)
class Objective:
    name: str
    sli: str
    target: float
    window_days: int
    threshold_seconds: float | None  # latency objectives only
    namespace: str | None
    model: str | None

    @property
    def histogram(self) -> Histogram | None:
        return HISTOGRAMS.get(self.sli)

    @property
    def budget(self) -> float:
        """The share of requests that may be bad: 1 - target (0.001 for 99.9 %, not the
        0.000999… of binary floating point: the chart's arithmetic is decimal)."""
        return float(Decimal(1) - _decimal(self.target))

    @property
    def period(self) -> str:
        return f"{self.window_days}d"

    def applies_to(self, model: str) -> bool:
        return self.model is None or self.model == model


@dataclass(frozen=True)
class Boundary:
    """The bucket a latency objective counts: `seconds`, written as vLLM writes `le`."""

    seconds: float
    exact: bool  # the objective's own threshold, not the nearest boundary below it

    @property
    def le(self) -> str:
        return le_text(self.seconds)


@dataclass(frozen=True)
class SloFile:
    source: str  # the file's name, for messages
    objectives: tuple[Objective, ...]
    buckets: Mapping[str, tuple[float, ...]]  # family -> boundaries, given in the file

    def boundaries(self, objective: Objective) -> tuple[float, ...]:
        histogram = objective.histogram
        if histogram is None:
            return ()
        return self.buckets.get(histogram.family, histogram.default_buckets)

    def boundary(self, objective: Objective) -> Boundary | None:
        """The bucket the objective counts; None for errors (and for a threshold below every
        boundary, which `parse` refuses)."""
        if objective.threshold_seconds is None:
            return None
        below = [b for b in self.boundaries(objective) if b <= objective.threshold_seconds]
        if not below:
            return None
        return Boundary(max(below), max(below) == objective.threshold_seconds)


# --- formatting, the same in the chart's template ----------------------------------------


def le_text(seconds: float) -> str:
    """A boundary as vLLM's exposition writes its `le` label ('0.5', '1.0', '2560.0'):
    prometheus_client's floatToGoString, which is Python's repr below MAX_BOUNDARY."""
    return repr(float(seconds))


def number_text(value: float) -> str:
    """A target or budget as the rules write it ('0.99', '0.001'): printf's %.10g."""
    return f"{value:.10g}"


def seconds_text(seconds: float) -> str:
    return f"{seconds * 1000:g} ms" if seconds < 1 else f"{seconds:g} s"


# --- reading a file ------------------------------------------------------------------------


def _kind(value: object) -> str:
    return {dict: "a mapping", list: "a list", str: "a string", bool: "a boolean"}.get(
        type(value), type(value).__name__
    )


def _number(value: object) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value)


def _decimal(value: float) -> Decimal:
    """A number as the chart's template computes with it (sprig's mulf, divf and subf
    work in decimal, from each float's shortest form), so both round alike."""
    return Decimal(repr(float(value)))


def threshold_seconds(value: object) -> float:
    """'500ms', '2s', '1m' or a number of seconds, > 0."""
    number = _number(value)
    if number is None:
        m = THRESHOLD.match(value) if isinstance(value, str) else None
        if m is None:
            raise ValueError(
                f"must be a duration such as 500ms, 2s or 1m, or seconds, not {value!r}"
            )
        number = float(_decimal(float(m.group(1))) * Decimal(_UNIT_SECONDS[m.group(2)]))
    if not (math.isfinite(number) and number > 0):
        raise ValueError(f"must be more than 0 seconds, not {value!r}")
    return number


def target_share(value: object) -> float:
    """'99.9%' or 0.999, strictly between 0 and 1."""
    number = _number(value)
    if number is None:
        m = TARGET_PERCENT.match(value) if isinstance(value, str) else None
        if m is None:
            raise ValueError(f"must be a share such as 99% or 0.99, not {value!r}")
        number = float(_decimal(float(m.group(1))) / 100)
    if not 0 < number < 1:
        raise ValueError(f"must be above 0 and below 100 % (1), not {value!r}")
    return number


def window_days(value: object) -> int:
    m = WINDOW.match(value) if isinstance(value, str) else None
    if m is None or int(m.group(1)) > MAX_WINDOW_DAYS:
        raise ValueError(f"must be whole days such as 28d or 30d (at most 365d), not {value!r}")
    return int(m.group(1))


def _label_value(pattern: re.Pattern[str], what: str) -> Any:
    def check(value: object) -> str:
        if not isinstance(value, str) or not pattern.match(value):
            raise ValueError(f"must be {what}, not {value!r}")
        return value

    return check


def _boundaries(value: object) -> tuple[float, ...]:
    numbers = [_number(v) for v in value] if isinstance(value, list) else [None]
    if not numbers or any(n is None or not 0 < n < MAX_BOUNDARY for n in numbers):
        raise ValueError(f"must be a list of boundaries in seconds above 0, not {value!r}")
    bounds = tuple(n for n in numbers if n is not None)
    if list(bounds) != sorted(set(bounds)):
        raise ValueError(f"must rise, each boundary once (as vLLM requires), not {value!r}")
    return bounds


def parse(data: object, source: str) -> SloFile:
    """An SLO file's parsed YAML, checked; SloError lists every problem, each as
    'key: what is wrong'."""
    problems: list[str] = []

    def problem(where: str, message: str) -> None:
        problems.append(f"{where}: {message}")

    if data is None:
        raise SloError(["is empty: it needs `objectives`, a list of at least one"], source)
    if not isinstance(data, Mapping):
        raise SloError([f"must be a mapping with `objectives`, not {_kind(data)}"], source)
    for key in data:
        if key not in ("objectives", "buckets"):
            problem(str(key), "unknown key (known: buckets, objectives)")
    buckets: dict[str, tuple[float, ...]] = {}
    raw_buckets = data.get("buckets") or {}
    if not isinstance(raw_buckets, Mapping):
        problem("buckets", f"must be a mapping of bucket families, not {_kind(raw_buckets)}")
        raw_buckets = {}
    for family, bounds in raw_buckets.items():
        if family not in BUCKET_FAMILIES:
            problem(f"buckets.{family}", f"unknown family (vLLM's: {', '.join(BUCKET_FAMILIES)})")
            continue
        try:
            buckets[str(family)] = _boundaries(bounds)
        except ValueError as e:
            problem(f"buckets.{family}", str(e))
    raw_objectives = data.get("objectives")
    if not isinstance(raw_objectives, list) or not raw_objectives:
        problem("objectives", "required: a list of at least one objective")
        raw_objectives = []
    slo = SloFile(source, (), buckets)
    objectives: list[Objective] = []
    for i, raw in enumerate(raw_objectives):
        found = _objective(raw, f"objectives[{i}]", problem)
        if found is None:
            continue
        if found.name in {o.name for o in objectives}:
            problem(f"objectives[{i}].name", f"{found.name!r} is the name of an earlier objective")
        if found.histogram and found.threshold_seconds and slo.boundary(found) is None:
            smallest = le_text(slo.boundaries(found)[0])
            problem(
                f"objectives[{i}].threshold",
                f"below vLLM's smallest {found.histogram.family} boundary ({smallest} s): "
                "no request can be counted within it",
            )
        objectives.append(found)
    if problems:
        raise SloError(problems, source)
    return SloFile(source, tuple(objectives), buckets)


#: What an optional key left out means (a key given without a value is refused instead).
_LEFT_OUT_MEANS = {
    "model": "every model",
    "namespace": "every namespace",
    "window": f"the default {DEFAULT_WINDOW}",
}


def _objective(raw: object, where: str, problem: Any) -> Objective | None:
    if not isinstance(raw, Mapping):
        problem(where, f"must be a mapping, not {_kind(raw)}")
        return None
    for key in raw:
        if key not in KEYS:
            problem(f"{where}.{key}", f"unknown key (known: {', '.join(KEYS)})")
    values: dict[str, Any] = {}
    readers = {
        "name": _label_value(NAME, "lower case letters, digits and dashes (a label value)"),
        "sli": _label_value(re.compile(f"^({'|'.join(SLIS)})$"), f"one of {', '.join(SLIS)}"),
        "target": target_share,
        "window": window_days,
        "namespace": _label_value(NAMESPACE, "a Kubernetes namespace name"),
        "model": _label_value(MODEL, "a served model name (letters, digits, ._/:+-)"),
        "threshold": threshold_seconds,
    }
    for key, read in readers.items():
        value = raw.get(key)
        if value is None and key in raw and key in _LEFT_OUT_MEANS:
            # `model:` with nothing after it reads as null: never "every model" by accident.
            problem(
                f"{where}.{key}",
                f"given without a value: name one, or leave the key out for {_LEFT_OUT_MEANS[key]}",
            )
            continue
        if value is None:
            if key in ("name", "sli", "target"):
                problem(f"{where}.{key}", "required")
            continue
        try:
            values[key] = read(value)
        except ValueError as e:
            problem(f"{where}.{key}", str(e))
    sli = values.get("sli")
    if sli in HISTOGRAMS and "threshold" not in values and raw.get("threshold") is None:
        problem(f"{where}.threshold", f"required for a latency objective ({sli})")
    if sli == ERRORS and raw.get("threshold") is not None:
        problem(f"{where}.threshold", "an errors objective has no threshold")
    if any(k not in values for k in ("name", "sli", "target")):
        return None
    return Objective(
        name=values["name"],
        sli=values["sli"],
        target=values["target"],
        window_days=values.get("window", window_days(DEFAULT_WINDOW)),
        threshold_seconds=values.get("threshold") if sli in HISTOGRAMS else None,
        namespace=values.get("namespace"),
        model=values.get("model"),
    )


def read_slo_file(path: Path) -> SloFile:
    try:
        with path.open(encoding="utf-8") as stream:  # its name, not "<unicode string>"
            data = yaml.safe_load(stream)
    except OSError as e:
        raise SloError([f"cannot be read ({e.strerror or e})"], str(path)) from None
    except UnicodeDecodeError as e:
        raise SloError([f"not UTF-8 text ({e.reason} at byte {e.start})"], str(path)) from None
    except yaml.YAMLError as e:
        raise SloError([f"not YAML ({e})"], str(path)) from None
    return parse(data, str(path))


def warnings(slo: SloFile) -> list[str]:
    """What renders but does not do what the file seems to say: a threshold that is not a
    boundary of vLLM's buckets (the nearest below is counted), a target whose budget is too
    large for a burn alert ever to fire."""
    out = []
    for i, o in enumerate(slo.objectives):
        where = f"{slo.source}: objectives[{i}] ({o.name})"
        boundary = slo.boundary(o)
        if o.histogram and o.threshold_seconds and boundary and not boundary.exact:
            given = (
                "the SLO file's buckets"
                if o.histogram.family in slo.buckets
                else ("vLLM's default buckets")
            )
            out.append(
                f"{where}: threshold {seconds_text(o.threshold_seconds)} is not a boundary of "
                f"{given} for {o.histogram.name}; the rules count requests ≤ "
                f'{seconds_text(boundary.seconds)} (le="{boundary.le}"), the nearest boundary '
                f"below. To count at the threshold itself, start vLLM with "
                f"--custom-histogram-buckets holding it in {o.histogram.family} and give the "
                "same buckets in the SLO file (docs/slo.md)."
            )
        for name, factor in (("fast", FAST_BURN), ("slow", SLOW_BURN)):
            if o.budget * factor >= 1:
                out.append(
                    f"{where}: target {o.target:.6g} leaves a budget of {o.budget:.6g}; a "
                    f"{name} burn ({factor:g}×) would need more than every request bad, so "
                    f"VLLMSLO{name.capitalize()}Burn can never fire."
                )
    return out
