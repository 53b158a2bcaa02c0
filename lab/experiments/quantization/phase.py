"""The quantization phase: its variants, rounds and tolerance, the article's run as
defaults, read from YAML."""

from __future__ import annotations

from collections.abc import Set
from dataclasses import dataclass, replace

from vllm_glassbox.lab.backends.backend import FlagOverrides
from vllm_glassbox.lab.plan_yaml import (
    MISSING,
    Node,
    Request,
    boolean,
    count,
    positive_int,
    ratio,
    read_flags,
    read_request,
    text,
    unique,
)

KIND = "quantization"
#: The article's run (SPEC §1).
QUANTIZATION_PROMPT = "Kubernetes is"


@dataclass(frozen=True)
class Variant:
    name: str
    model: str
    flags: FlagOverrides
    fit: bool  # a point the TPOT-vs-weights line is fitted through


@dataclass(frozen=True)
class QuantizationPhase:
    name: str
    flags: FlagOverrides
    request: Request
    variants: tuple[Variant, ...]
    warmup: int  # unmeasured requests after each server start
    requests: int  # measured requests per variant and round (TPOT: their median)
    rounds: int  # every variant started and measured once per round, the order reversed
    tolerance: float  # a predicted variant within this error ratio is on the line
    kind: str = KIND

    def order(self) -> list[tuple[int, Variant]]:
        """(round, variant) in the order they run: A B C, C B A, A B C…, so that a drift
        of the machine over the run does not land on one variant."""
        out: list[tuple[int, Variant]] = []
        for r in range(self.rounds):
            out += [(r, v) for v in (self.variants if r % 2 == 0 else self.variants[::-1])]
        return out

    @property
    def server_starts(self) -> int:
        """A variant that ends one round begins the next: the backends keep its server
        (the same args), so each turn of the rounds costs one start less."""
        if not self.variants:
            return 0
        return len(self.variants) * self.rounds - (self.rounds - 1)

    def models(self) -> list[tuple[str, str]]:
        return [(f"variants[{j}].model", v.model) for j, v in enumerate(self.variants)]

    def without_models(self, models: Set[str]) -> tuple[QuantizationPhase, list[str]]:
        kept = tuple(v for v in self.variants if v.model not in models)
        dropped = [v.name for v in self.variants if v.model in models]
        return replace(self, variants=kept), dropped

    def describe(self) -> str:
        fitted = [v.name for v in self.variants if v.fit]
        return (
            f"{len(self.variants)} variants × {self.rounds} round(s), "
            f"{self.warmup} warm-up + {self.requests} measured request(s) each; "
            f"line through {', '.join(fitted)}, on it within ±{self.tolerance:.0%}"
        )


def _variant(node: Node) -> Variant:
    return Variant(
        name=node.get("name", text),
        model=node.get("model", text),
        flags=read_flags(node, "flags"),
        fit=node.get("fit", boolean, False),
    )


def parse(node: Node, name: str) -> QuantizationPhase:
    """The phase from its YAML, the article's run as defaults."""
    request = read_request(node, QUANTIZATION_PROMPT, 128, 0.0)
    variants = node.each("variants", _variant)
    if not variants and node.raw("variants") is not MISSING:
        node.problem("variants", "needs at least one variant")
    elif node.raw("variants") is MISSING:
        node.problem("variants", "required")
    unique(node, "variants", [v.name for v in variants])
    if not any(v.fit for v in variants):  # no point chosen: fit through every variant
        variants = [Variant(v.name, v.model, v.flags, True) for v in variants]
    return QuantizationPhase(
        name=name,
        flags=read_flags(node, "flags"),
        request=request,
        variants=tuple(variants),
        warmup=node.get("warmup", count, 1),
        requests=node.get("requests", positive_int, 3),
        rounds=node.get("rounds", positive_int, 1),
        tolerance=node.get("tolerance", ratio, 0.10),
    )
