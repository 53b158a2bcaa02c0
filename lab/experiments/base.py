"""What an experiment kind is: the contract between a kind's package and the rest of the lab.

A kind is one package of this folder. It holds its phase (the plan's type, parsed from
the phase's YAML with `plan_yaml`), its run against the servers the lab starts (through
the `Services` below: `segment`, `measure_each`, `warm_up`, `progress`), its result
(`to_json` for results.json), the judgements of its numbers, its section of report.md
and its plots. The package's `__init__.py` ends with its `Experiment`, and
`experiments/__init__.py` lists it: a new kind is one new package and its line there.
"""

from __future__ import annotations

from collections.abc import Callable, Set
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import Generic, Protocol, Self, TypeVar

from vllm_glassbox.core.own_page import ExporterPage
from vllm_glassbox.core.snapshot import Snapshot
from vllm_glassbox.lab.backends.backend import Deployed, FlagOverrides, Terminated
from vllm_glassbox.lab.backends.server_process import ServerError
from vllm_glassbox.lab.plan_yaml import Node
from vllm_glassbox.lab.progress import Progress
from vllm_glassbox.lab.results import PhaseBody, PhaseResult, Startup
from vllm_glassbox.lab.vllm.client import LabError, Measured, VllmClient

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


class SingleServer:
    """What a phase of one server (one model, no variants) says of its start: the
    KV-pressure and rate-sweep phases, frozen dataclasses with a `model` and `flags`."""

    model: str | None
    flags: FlagOverrides

    @property
    def server_starts(self) -> int:
        return 1

    def models(self) -> list[tuple[str, str]]:
        return [("model", self.model)] if self.model is not None else []

    def without_models(self, models: Set[str]) -> tuple[Self, list[str]]:
        return self, []  # one server, no variants to leave out

    @property
    def overrides(self) -> FlagOverrides:
        """The phase's flags, its model (when it names one) as --model."""
        return {**self.flags, **({"--model": self.model} if self.model else {})}


@dataclass
class Served:
    """One started server, as a kind's run sees it inside `Services.segment`."""

    deployed: Deployed
    client: VllmClient
    startup: Startup
    first: Snapshot  # right after the server was ready: the segment's numbers start here


class ExporterView(Protocol):
    """The exporter beside the servers, read while a kind runs and at the end of each
    segment (`sidecar.ExporterBeside`)."""

    def page(self) -> ExporterPage:
        """Its page now (an empty one when it cannot be read)."""
        ...

    def page_since(self, unix_time: float) -> tuple[ExporterPage, bool]:
        """Its page as of a poll begun after `unix_time`, and whether one came in time."""
        ...


class Services(Protocol):
    """What a kind's run needs from the running lab (the runner's `Lab` provides it)."""

    @property
    def progress(self) -> Progress: ...

    @property
    def peak_bandwidth(self) -> float | None:
        """The hardware's peak memory bandwidth, bytes per second, when known."""
        ...

    @property
    def exporter(self) -> ExporterView | None:
        """The exporter beside the servers, when the run has one."""
        ...

    @property
    def out_dir(self) -> Path | None:
        """Where a kind keeps files of its own (the benchmark's JSON)."""
        ...

    def segment(
        self, phase: Phase, variant: str, overrides: FlagOverrides
    ) -> AbstractContextManager[Served]:
        """A server started with `overrides`, its startup facts read, watched by the
        observers, stopped or kept for the next segment after the block."""
        ...

    def measure_each(self, served: Served, bodies: list[dict[str, object]]) -> list[Measured]:
        """Requests one after the other, each measured apart, with live token progress."""
        ...

    def warm_up(self, served: Served, body: dict[str, object], count: int) -> None:
        """`count` unmeasured requests: `body` with at most a few tokens to generate."""
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
    run: Callable[[Services, P], B]
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
