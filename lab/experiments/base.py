"""What an experiment kind is: the contract between a kind's module and the rest of the lab.

A kind is one module of this package. It holds its phase (the plan's type, parsed from
the phase's YAML with `plan_yaml`), its run against the servers the lab starts (the
runner's `Lab`: `segment`, `measure_each`, `warm_up`, `progress`), its result (`to_json`
for results.json), the judgements of its numbers, its section of report.md and its plots.
The module ends with its `Experiment`, and `experiments/__init__.py` lists it: a new
kind is one new module and its line there.
"""

from __future__ import annotations

from collections.abc import Callable, Set
from dataclasses import dataclass
from typing import TYPE_CHECKING, Generic, Protocol, Self, TypeVar

from vllm_glassbox.lab.backend import Terminated
from vllm_glassbox.lab.measure import LabError
from vllm_glassbox.lab.plan_yaml import Node
from vllm_glassbox.lab.results import PhaseBody, PhaseResult
from vllm_glassbox.lab.server_process import ServerError

if TYPE_CHECKING:
    from vllm_glassbox.lab.runner import Lab

STOPPED = (KeyboardInterrupt, Terminated)  # Ctrl-C, SIGTERM: stop, restore, report


class Phase(Protocol):
    """A phase of a plan, as its kind's module parses it."""

    @property
    def name(self) -> str: ...

    @property
    def kind(self) -> str: ...

    @property
    def server_starts(self) -> int:
        """How many times the phase starts vLLM (the costly part of a run)."""
        ...

    def models(self) -> list[tuple[str, str]]:
        """Every model the phase names: (where in the phase, model)."""
        ...

    def without_models(self, models: Set[str]) -> tuple[Self, list[str]]:
        """The phase without its variants that serve one of `models`, and their names."""
        ...

    def describe(self) -> str:
        """What the phase will do, in one line (`glassbox lab check`)."""
        ...


P = TypeVar("P", bound=Phase)
B = TypeVar("B", bound=PhaseBody)


@dataclass(frozen=True)
class Experiment(Generic[P, B]):
    """One kind of phase: the functions the plan reader, the runner and the report call."""

    kind: str
    phase: type[P]
    result: type[B]
    #: The phase from its YAML (`phases[i]`), its problems recorded on the node.
    parse: Callable[[Node, str], P]
    #: The phase against the lab's servers; PhaseFailed carries what it measured.
    run: Callable[[Lab, P], B]
    #: The report's summary line of the phase (after its name), if it has one.
    summary: Callable[[B], str | None]
    #: The phase's section of report.md, under its heading and any error.
    section: Callable[[PhaseResult, B], list[str]]
    #: PNG bytes by path in the output directory.
    plots: Callable[[PhaseResult, B], dict[str, bytes]]


class PhaseFailed(Exception):
    """A phase that measured something but did not complete: both are reported."""

    def __init__(self, message: str, body: PhaseBody) -> None:
        super().__init__(message)
        self.message = message
        self.body = body


def describe_error(e: BaseException) -> str:
    text = str(e).strip() or type(e).__name__
    if isinstance(e, LabError | ServerError | ValueError | OSError):
        return text
    return f"{type(e).__name__}: {text}"
