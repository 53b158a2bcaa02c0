"""The KV-pressure experiment: many long requests at once against one server's KV pool.

The flood is sent all at once; a sampler polls vLLM's page every `poll` seconds for the
pool's usage, the queue and preemptions. The timeline is cut into the article's acts —
the pool fills, requests queue at a full pool, vLLM preempts — each named only where its
condition holds; the largest jump of preemptions in one poll and the gaps between polls
are reported.

`phase.py` the phase and its YAML, `run.py` the flood against a server, `result.py` what
it found (results.json: `kv_cache_blocks`, `kv_cache_tokens`, `timeline[]`,
`max_preemption_jump`), `judge.py` the acts, `report.py` its section of report.md,
`plot.py` its plot.
"""

from __future__ import annotations

from vllm_glassbox.lab.experiments.base import Experiment
from vllm_glassbox.lab.experiments.kv_pressure.judge import (
    missing_acts,
    name_acts,
    pressure_summary,
    timeline_point,
)
from vllm_glassbox.lab.experiments.kv_pressure.phase import KIND, KvPressurePhase, parse
from vllm_glassbox.lab.experiments.kv_pressure.plot import plots
from vllm_glassbox.lab.experiments.kv_pressure.report import section, summary
from vllm_glassbox.lab.experiments.kv_pressure.result import (
    Act,
    KvPressureResult,
    MissedPoll,
    PressureSummary,
)
from vllm_glassbox.lab.experiments.kv_pressure.run import run
from vllm_glassbox.lab.experiments.pool_acts import SATURATED, TimelinePoint, act_names

EXPERIMENT = Experiment(
    KIND, KvPressurePhase, KvPressureResult, parse, run, summary, section, plots
)

__all__ = [
    "EXPERIMENT",
    "KIND",
    "SATURATED",
    "Act",
    "KvPressurePhase",
    "KvPressureResult",
    "MissedPoll",
    "PressureSummary",
    "TimelinePoint",
    "act_names",
    "missing_acts",
    "name_acts",
    "pressure_summary",
    "timeline_point",
]
