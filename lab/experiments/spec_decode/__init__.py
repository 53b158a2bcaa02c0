"""The speculative-decoding experiment: the same requests with speculation on and off.

The runs with speculation share one server started with `--speculative-config` (ngram
by default), the others one started without it; the first request after each start is
measured apart (it pays one-time costs). Each run's TPOT is the median of its requests;
its speed-up is the baseline's TPOT over its own, where the baseline must not have
drafted. Which runs speculated, and how the running vLLM treats a repetition penalty,
are said in words.

`phase.py` the phase and its YAML, `run.py` the runs against their servers, `result.py`
what it found (results.json: `runs[]`, `speedup`, `first_request_prefill_seconds`),
`judge.py` what the numbers mean, `report.py` its section of report.md, `plot.py` its plot.
"""

from __future__ import annotations

from vllm_glassbox.lab.experiments.base import Experiment
from vllm_glassbox.lab.experiments.spec_decode.judge import penalty_finding, spec_runs
from vllm_glassbox.lab.experiments.spec_decode.phase import (
    KIND,
    SpecDecodePhase,
    SpecRun,
    parse,
)
from vllm_glassbox.lab.experiments.spec_decode.plot import plots
from vllm_glassbox.lab.experiments.spec_decode.report import section, summary
from vllm_glassbox.lab.experiments.spec_decode.result import SpecDecodeResult, SpecRunResult
from vllm_glassbox.lab.experiments.spec_decode.run import run

EXPERIMENT = Experiment(
    KIND, SpecDecodePhase, SpecDecodeResult, parse, run, summary, section, plots
)

__all__ = [
    "EXPERIMENT",
    "KIND",
    "SpecDecodePhase",
    "SpecDecodeResult",
    "SpecRun",
    "SpecRunResult",
    "penalty_finding",
    "spec_runs",
]
