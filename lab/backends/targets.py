"""Where a plan says vLLM runs: a local child process or a Kubernetes Deployment (the
plan's `target:`, read by `lab/plan.py`), and the tiny-model references of local args."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from vllm_glassbox.lab.backends.tinymodel import TinyModelSpec

#: A value `tiny:NAME` in the args names a tiny model of the plan, generated on first use.
TINY_PREFIX = "tiny:"


@dataclass(frozen=True)
class LocalTarget:
    """vLLM as a child process: its base args, and tiny models generated on demand."""

    args: tuple[str, ...]
    tiny_models: Mapping[str, TinyModelSpec]
    model_cache: Path
    startup_timeout_seconds: float
    env: Mapping[str, str] = field(default_factory=dict)  # for the server process
    exporter: bool = False  # run `glassbox exporter` beside each server (its series: report)


@dataclass(frozen=True)
class KubernetesTarget:
    """vLLM as a Deployment whose container args are patched per phase."""

    namespace: str
    deployment: str
    container: str
    url: str  # the Service, as reachable from the lab
    rollout_timeout_seconds: float
