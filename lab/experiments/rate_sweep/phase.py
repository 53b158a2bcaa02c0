"""The rate-sweep phase: its rates (a list, or doubling until the server falls behind),
arrivals, lengths, SLOs and the benchmark's command, read from YAML."""

from __future__ import annotations

import math
import shlex
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from vllm_glassbox.core import slo
from vllm_glassbox.core.derive import KV_POOL_FULL
from vllm_glassbox.lab.backends.backend import FlagOverrides
from vllm_glassbox.lab.experiments.base import SingleServer
from vllm_glassbox.lab.plan_yaml import (
    MISSING,
    Node,
    count,
    duration,
    fraction,
    kind_name,
    non_negative,
    positive_int,
    positive_number,
    read_flags,
    text,
)

KIND = "rate-sweep"

#: `vllm bench serve` without the `vllm` console script, which some builds lack (the CPU
#: build's distribution is not named vllm, and its CLI asks for that name's version):
#: the same parser and main function the subcommand calls.
BENCH_LAUNCHER = (
    "import sys\n"
    "from vllm.benchmarks.serve import add_cli_args, main\n"
    "try:\n"
    "    from vllm.utils.argparse_utils import FlexibleArgumentParser\n"
    "except ImportError:  # vLLM <= 0.11\n"
    "    from vllm.utils import FlexibleArgumentParser\n"
    "parser = FlexibleArgumentParser(prog='vllm bench serve')\n"
    "add_cli_args(parser)\n"
    "main(parser.parse_args(sys.argv[1:]))\n"
)
DEFAULT_BENCH_COMMAND = (sys.executable, "-c", BENCH_LAUNCHER)


@dataclass(frozen=True)
class Doubling:
    """Rates from `start`, doubled after every step the server keeps up with."""

    start: float
    max_steps: int


@dataclass(frozen=True)
class RateSweepPhase(SingleServer):
    name: str
    model: str | None
    flags: FlagOverrides
    rates: tuple[float, ...] | Doubling
    burstiness: float  # 1: Poisson arrivals; inf: constant
    input_len: int
    output_len: int
    step_seconds: float  # each step offers rate × step_seconds requests
    min_requests: int
    max_concurrency: int | None
    goodput: Mapping[str, float]  # SLO name (ttft, tpot, e2el) -> seconds
    temperature: float
    keep_up: float  # achieved / offered from which a step keeps up
    poll_seconds: float
    saturation: float  # KV usage from which the pool counts as full
    warmup: int
    step_timeout_seconds: float
    tokenizer: str | None  # when the lab cannot read the served checkpoint
    bench_command: tuple[str, ...]
    seed: int = 0
    #: An SLO file (`slo: FILE`): goodput and the knee by its objectives, the same
    #: definition as its rules (core/slo/), instead of the benchmark's `goodput`.
    slo: slo.SloFile | None = None
    kind: str = KIND

    @property
    def arrivals(self) -> str:
        if self.burstiness == 1.0:
            return "Poisson"
        if math.isinf(self.burstiness):
            return "constant"
        return f"gamma (burstiness {self.burstiness:g})"

    def requests_at(self, rate: float) -> int:
        return max(self.min_requests, math.ceil(rate * self.step_seconds))

    def describe(self) -> str:
        rates = (
            f"from {self.rates.start:g} req/s doubling until it falls behind (at most "
            f"{self.rates.max_steps} steps)"
            if isinstance(self.rates, Doubling)
            else "at " + ", ".join(f"{r:g}" for r in self.rates) + " req/s"
        )
        limit = f", at most {self.max_concurrency} at once" if self.max_concurrency else ""
        slos = ", ".join(f"{k} ≤ {v * 1000:g} ms" for k, v in self.goodput.items())
        if self.slo:
            slos = f"the objectives of {self.slo.source}"
        return (
            f"vllm bench serve {rates}, {self.arrivals} arrivals for {self.step_seconds:g}s "
            f"a step, {self.input_len} tokens in / {self.output_len} out{limit}"
            + (f", goodput {slos}" if slos else "")
        )


ARRIVALS = {"poisson": 1.0, "constant": math.inf}
SLOS = ("ttft", "tpot", "e2el")


def _rates(node: Node) -> tuple[float, ...] | Doubling:
    value = node.raw("rates")
    if value is MISSING or value is None:
        node.problem(
            "rates", "required: a list of requests per second, or {double_from, max_steps}"
        )
        return ()
    if isinstance(value, list):
        rates: list[float] = []
        for i, r in enumerate(value):
            try:
                rates.append(positive_number(r))
            except ValueError as e:
                node.problem("rates", f"[{i}] {e}")
        if not value:
            node.problem("rates", "needs at least one rate")
        if rates != sorted(set(rates)):
            node.problem("rates", "must rise from step to step, each rate once")
        return tuple(rates)
    if isinstance(value, dict):
        doubling = node.child("rates")
        found = Doubling(
            doubling.get("double_from", positive_number),
            doubling.get("max_steps", positive_int, 6),
        )
        doubling.done()
        return found
    node.problem(
        "rates", f"must be a list of rates or {{double_from, max_steps}}, not {kind_name(value)}"
    )
    return ()


def _burstiness(value: object) -> float:
    if isinstance(value, str) and value in ARRIVALS:
        return ARRIVALS[value]
    try:
        return positive_number(value)
    except ValueError:
        raise ValueError(
            f"must be poisson, constant or a burstiness > 0 (gamma arrivals), not {value!r}"
        ) from None


def _goodput(node: Node) -> dict[str, float]:
    slos = {}
    for key in list(node.data):
        if key not in SLOS:
            node.problem(str(key), f"unknown SLO (known: {', '.join(SLOS)})")
            continue
        slos[key] = node.get(key, duration)
    return slos


def _slo_file(value: object) -> slo.SloFile:
    """An SLO file's path (from where the lab runs), read and checked now."""
    if not isinstance(value, str) or not value.strip():
        raise ValueError(f"must be the path of an SLO file, not {value!r}")
    try:
        return slo.read_slo_file(Path(value).expanduser())
    except slo.SloError as e:
        raise ValueError(str(e)) from None


def _command(value: object) -> tuple[str, ...]:
    if isinstance(value, str):
        words = shlex.split(value)
    elif isinstance(value, list) and all(isinstance(w, str) for w in value):
        words = list(value)
    else:
        raise ValueError(f"must be a command (a string or a list of words), not {value!r}")
    if not words:
        raise ValueError("must not be empty")
    return tuple(words)


def parse(node: Node, name: str) -> RateSweepPhase:
    phase = RateSweepPhase(
        name=name,
        model=node.get("model", text, None),
        flags=read_flags(node, "flags"),
        rates=_rates(node),
        burstiness=node.get("arrivals", _burstiness, 1.0),
        input_len=node.get("input_len", positive_int, 128),
        output_len=node.get("output_len", positive_int, 256),
        step_seconds=node.get("step_duration", duration, 60.0),
        min_requests=node.get("min_requests", positive_int, 8),
        max_concurrency=node.get("max_concurrency", positive_int, None),
        goodput=_goodput(node.child("goodput")),
        temperature=node.get("temperature", non_negative, 0.0),
        keep_up=node.get("keep_up", fraction, 0.9),
        poll_seconds=node.get("poll", duration, 2.0),
        saturation=node.get("saturation", fraction, KV_POOL_FULL),
        warmup=node.get("warmup", count, 1),
        step_timeout_seconds=node.get("step_timeout", duration, 1800.0),
        tokenizer=node.get("tokenizer", text, None),
        bench_command=node.get("bench_command", _command, DEFAULT_BENCH_COMMAND),
        seed=node.get("seed", count, 0),
        slo=node.get("slo", _slo_file, None),
    )
    if phase.slo is not None and phase.goodput:
        node.problem("slo", "give an SLO file or the benchmark's goodput SLOs, not both")
    return phase
