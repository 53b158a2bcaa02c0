"""The lab's experiment kinds, one package each (see `base.py` for what a kind provides).

The order here is the order `glassbox lab check` and plan errors list the kinds in.
"""

from __future__ import annotations

from typing import Any

from vllm_glassbox.lab.experiments.base import Experiment, Phase
from vllm_glassbox.lab.experiments.kv_pressure import EXPERIMENT as KV_PRESSURE
from vllm_glassbox.lab.experiments.quantization import EXPERIMENT as QUANTIZATION
from vllm_glassbox.lab.experiments.rate_sweep import EXPERIMENT as RATE_SWEEP
from vllm_glassbox.lab.experiments.spec_decode import EXPERIMENT as SPEC_DECODE
from vllm_glassbox.lab.results import PhaseBody

EXPERIMENTS: tuple[Experiment[Any, Any], ...] = (QUANTIZATION, KV_PRESSURE, SPEC_DECODE, RATE_SWEEP)
KINDS = tuple(e.kind for e in EXPERIMENTS)

_BY_KIND = {e.kind: e for e in EXPERIMENTS}
_BY_PHASE: dict[type, Experiment[Any, Any]] = {e.phase: e for e in EXPERIMENTS}
_BY_RESULT: dict[type, Experiment[Any, Any]] = {e.result: e for e in EXPERIMENTS}


def experiment(kind: str) -> Experiment[Any, Any] | None:
    """The kind a plan's phase names, if there is one."""
    return _BY_KIND.get(kind)


def for_phase(phase: Phase) -> Experiment[Any, Any]:
    """The kind of a parsed phase."""
    return _BY_PHASE[type(phase)]


def for_body(body: PhaseBody) -> Experiment[Any, Any]:
    """The kind whose result this is."""
    return _BY_RESULT[type(body)]
