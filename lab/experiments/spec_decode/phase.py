"""The speculative-decoding phase: its runs (speculation on or off, request extras, the
baseline), the article's run as defaults, read from YAML."""

from __future__ import annotations

from collections.abc import Mapping, Set
from dataclasses import dataclass
from typing import Any

from vllm_glassbox.lab.backends.backend import REMOVE, FlagOverrides
from vllm_glassbox.lab.plan_yaml import (
    MISSING,
    Node,
    Request,
    boolean,
    flag_value,
    positive_int,
    read_flags,
    read_request,
    request_fields,
    text,
    unique,
)

KIND = "spec-decode"
# The article's run (SPEC §1).
SPEC_DECODE_PROMPT = " ".join(["1 2 3 4 5"] * 10)
SPECULATIVE_CONFIG = "--speculative-config"
NGRAM_CONFIG = {
    "method": "ngram",
    "num_speculative_tokens": 5,
    "prompt_lookup_max": 4,
    "prompt_lookup_min": 1,
}


@dataclass(frozen=True)
class SpecRun:
    label: str
    extra: Mapping[str, Any]
    baseline: bool  # the run the others' speed-up is measured against
    speculation: bool = True  # False: on a server started without --speculative-config


@dataclass(frozen=True)
class SpecDecodePhase:
    name: str
    model: str | None
    flags: FlagOverrides
    request: Request
    runs: tuple[SpecRun, ...]
    requests: int  # measured requests per run (TPOT: their median)
    kind: str = KIND

    @property
    def baseline(self) -> SpecRun:
        return next(r for r in self.runs if r.baseline)

    @property
    def flags_without_speculation(self) -> FlagOverrides:
        """The phase's flags for the runs without speculation (a server of their own)."""
        return {**self.flags, SPECULATIVE_CONFIG: REMOVE}

    @property
    def server_starts(self) -> int:
        return len({r.speculation for r in self.runs})

    def models(self) -> list[tuple[str, str]]:
        return [("model", self.model)] if self.model is not None else []

    def without_models(self, models: Set[str]) -> tuple[SpecDecodePhase, list[str]]:
        return self, []  # one model for every run: no variants to leave out

    def describe(self) -> str:
        runs = ", ".join(
            r.label + (" (baseline)" if r.baseline else "") + ("" if r.speculation else " [off]")
            for r in self.runs
        )
        return f"{self.requests} request(s) per run: {runs}"


def _run_extra(value: object) -> dict[str, Any]:
    """A spec run's request fields: on top of the phase's, the temperature included."""
    return request_fields(value, {"model", "prompt", "max_tokens", "stream"})


def _run(node: Node) -> SpecRun:
    return SpecRun(
        label=node.get("label", text),
        extra=node.get("extra", _run_extra, {}),
        baseline=node.get("baseline", boolean, False),
        speculation=node.get("speculation", boolean, True),
    )


def parse(node: Node, name: str) -> SpecDecodePhase:
    """The phase from its YAML, the article's run as defaults."""
    request = read_request(node, SPEC_DECODE_PROMPT, 256, 0.0)
    runs = node.each("runs", _run)
    if node.raw("runs") is MISSING:
        # The article's two requests with speculation on, and the baseline: the same
        # request on a server without speculation (a run that drafts is no baseline).
        runs = [
            SpecRun("repetition_penalty 1.0", {"repetition_penalty": 1.0}, False),
            SpecRun("model defaults", {}, False),
            SpecRun("no speculation", {"repetition_penalty": 1.0}, True, speculation=False),
        ]
    elif len(runs) < 2:
        node.problem("runs", "needs at least two runs to compare")
    unique(node, "runs", [r.label for r in runs])
    baselines = [r.label for r in runs if r.baseline]
    if len(baselines) > 1:
        node.problem("runs", f"only one run can be the baseline, not {baselines}")
    elif runs and not baselines:  # compare against the last run
        runs[-1] = SpecRun(runs[-1].label, runs[-1].extra, True, runs[-1].speculation)
    flags = read_flags(node, "flags", {SPECULATIVE_CONFIG: flag_value(NGRAM_CONFIG)})
    if flags.get(SPECULATIVE_CONFIG, REMOVE) is REMOVE and any(r.speculation for r in runs):
        node.problem("flags", f"{SPECULATIVE_CONFIG} is needed by the runs with speculation")
    return SpecDecodePhase(
        name=name,
        model=node.get("model", text, None),
        flags=flags,
        request=request,
        runs=tuple(runs),
        requests=node.get("requests", positive_int, 3),
    )
