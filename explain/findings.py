"""A finding and the numbers in it.

Every number a finding states is a `Figure`: either read as the source gave it (`read`:
a counter's increase, a gauge, a label) or computed by a function of the derivation core
(`core`: `core/derive/`, and only there — `core` refuses any other function). The
sentences are templates whose `{name}` fields are figures, so the words and the numbers
are kept apart: `render.py` formats them, `tests/explain/test_no_arithmetic.py` checks
that the diagnoses do no arithmetic of their own.
"""

from __future__ import annotations

import math
import string
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from vllm_glassbox.core import derive
from vllm_glassbox.core.derive import Increase
from vllm_glassbox.explain.scene import Reading, Scope, Window

Severity = Literal["critical", "warning", "info", "ok"]
SEVERITIES: tuple[Severity, ...] = ("critical", "warning", "info", "ok")

#: How a figure is shown (render.py): seconds, bytes, bytes/s, a share, a count…
Unit = Literal[
    "seconds",
    "bytes",
    "bytes_per_second",
    "ratio",  # a share: shown in %
    "error",  # a prediction's error (predicted / measured − 1): shown in %, signed
    "tokens",
    "count",
    "factor",  # tokens per pass, a cost in plain steps: 3 significant digits
    "times",  # a speed-up: 3.4×
    "clock",  # a moment, unix seconds: shown as the time of day (UTC)
    "cost",  # in the unit of the GPU-hour price (it has no currency): 3 significant digits
]


@dataclass(frozen=True)
class Figure:
    """One number of a finding: its value, its unit, how it came about (`by`: a core
    function, `derive.NAME`, or `read`) and the series it rests on."""

    value: float
    unit: Unit
    by: str
    sources: tuple[str, ...] = ()


Argument = Reading | Figure | Window | Increase | float | int | None


def _unwrapped(argument: Argument) -> tuple[Any, tuple[str, ...]]:
    if isinstance(argument, Reading):
        return argument.value, (argument.source,)
    if isinstance(argument, Figure):
        return argument.value, argument.sources
    if isinstance(argument, Window):
        return argument.increase, (argument.source,)
    return argument, ()


def core(fn: Callable[..., float | int | None], *args: Argument, unit: Unit) -> Figure | None:
    """`fn` of the derivation core over `args` (readings, figures, a window's increase,
    plain values such as a threshold); None when it is absent or an argument is."""
    if getattr(derive, getattr(fn, "__name__", ""), None) is not fn:
        raise TypeError(f"{fn!r} is not a function of the derivation core")
    values: list[Any] = []
    sources: list[str] = []
    for argument in args:
        value, where = _unwrapped(argument)
        values.append(value)
        sources.extend(where)
    result = fn(*values)
    if result is None or not math.isfinite(result):
        return None
    return Figure(float(result), unit, f"derive.{fn.__name__}", tuple(dict.fromkeys(sources)))


def read(reading: Reading | None, unit: Unit) -> Figure | None:
    """A reading, as it was read."""
    if reading is None or not math.isfinite(reading.value):
        return None
    return Figure(reading.value, unit, "read", (reading.source,))


def counted(window: Window | None, counter: str, unit: Unit = "count") -> Figure | None:
    """How much one of vLLM's counters grew over the window, as read."""
    if window is None or not window.increase.has(counter):
        return None
    value = window.increase[counter]
    if not math.isfinite(value):
        return None
    return Figure(value, unit, "read", (f"{window.source}: {counter}",))


@dataclass(frozen=True)
class Statement:
    """A sentence whose numbers are figures: `template` names them as `{name}` fields."""

    template: str
    figures: Mapping[str, Figure] = field(default_factory=dict)

    def __post_init__(self) -> None:
        named = {f for _, f, _, _ in string.Formatter().parse(self.template) if f}
        if named != set(self.figures):
            raise ValueError(f"{self.template!r} names {sorted(named)}: {sorted(self.figures)}")

    def text(self, show: Callable[[Figure], str]) -> str:
        return self.template.format(**{k: show(v) for k, v in self.figures.items()})


def say(template: str, **figures: Figure | None) -> Statement:
    """The statement of `template` with these figures; every one must be there (a
    diagnosis checks first: an absent number is never printed)."""
    missing = sorted(name for name, figure in figures.items() if figure is None)
    if missing:
        raise ValueError(f"{template!r}: no figure for {', '.join(missing)}")
    return Statement(template, {k: v for k, v in figures.items() if v is not None})


def say_if(template: str, **figures: Figure | None) -> Statement | None:
    """The statement, or None when one of its figures is absent (a what-if that cannot
    be computed is left out, not guessed)."""
    if any(figure is None for figure in figures.values()):
        return None
    return say(template, **figures)


def joined(first: Statement, *more: Statement | None) -> Statement:
    """One sentence of several parts (the absent ones left out)."""
    template, figures = first.template, dict(first.figures)
    for part in more:
        if part is not None:
            template = f"{template}{part.template}"
            figures |= part.figures
    return Statement(template, figures)


@dataclass(frozen=True)
class Finding:
    """One diagnosis of one scene, in words, with its numbers."""

    diagnosis: str  # the function that made it (diagnoses/): glassbox, kv_pool, …
    finding: str  # which of its outcomes: preemption_storm, bypassed, …
    severity: Severity
    title: str
    what: Statement  # what is happening, one sentence with its numbers
    change: tuple[Statement, ...] = ()  # what would change it
    assumes: tuple[str, ...] = ()
    unseen: tuple[str, ...] = ()  # what it could not see
    runbook: str | None = None  # a section of alerts/runbook.md
    #: Other findings of the same scene that usually explain this one, as `diagnosis/finding`
    #: (`diagnoses.explain` keeps those that are there).
    see: tuple[str, ...] = ()
    #: What it read that no number of it shows (an alert's state), for the evidence.
    also_read: tuple[str, ...] = ()

    @property
    def key(self) -> str:
        """How another finding refers to this one: `diagnosis/finding`."""
        return f"{self.diagnosis}/{self.finding}"

    @property
    def blind(self) -> bool:
        """glassbox unable to read something: these come first."""
        return self.diagnosis == "glassbox"

    @property
    def figures(self) -> dict[str, Figure]:
        out = dict(self.what.figures)
        for i, s in enumerate(self.change):
            out |= {f"change{i}.{k}": v for k, v in s.figures.items()}
        return out

    @property
    def evidence(self) -> tuple[str, ...]:
        """Every series and query its numbers rest on, once, in order, and what else it read."""
        sources = [src for f in self.figures.values() for src in f.sources]
        return tuple(dict.fromkeys([*sources, *self.also_read]))


@dataclass(frozen=True)
class Explained:
    """The findings of one scene, most severe first."""

    scope: Scope
    findings: tuple[Finding, ...]


def ordered(findings: list[Finding]) -> tuple[Finding, ...]:
    """glassbox's own blind spots first, then by severity (a stable sort: within one
    severity, the diagnoses' order)."""
    return tuple(sorted(findings, key=lambda f: (not f.blind, SEVERITIES.index(f.severity))))
