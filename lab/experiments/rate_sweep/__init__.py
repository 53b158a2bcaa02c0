"""The rate sweep: vLLM's own benchmark at rising request rates, and why the server stops
keeping up.

Each step runs `vllm bench serve` (it ships with vLLM: the lab adds no load generator)
against one server: random prompts of given input and output lengths, Poisson or constant
arrivals (`--burstiness`) at the step's rate, optionally `--max-concurrency`, goodput
under the plan's SLOs. The benchmark's own JSON of each step is kept. Beside it, a
poller reads vLLM's page every `poll` seconds (the KV pool's usage and forecasts, the
queue, preemptions), the exporter beside the server gives its forecast series, and the
counters around the step give the server's view through the derivation core (TPOT from
counters, tokens per engine step, preemptions per second, weight-read bandwidth).

What it finds: the knee (the highest rate the server keeps up with), the mechanism that
ends it, whether the client's and the counters' TPOT agree, and whether the pool's
forecasts saw the first preemption coming, how long before, and how often they warned of
nothing (`pool_forecasts.py`).

`phase.py` the phase and its YAML, `bench.py` the benchmark of one step, `run.py` the
steps against the server, `result.py` what it found (results.json: `steps[]`, `knee`,
`forecast`), `views.py` each step from the client's and the server's side, `judge.py`
what the numbers mean, `report.py` its section of report.md, `plot.py` its plots.
"""

from __future__ import annotations

from vllm_glassbox.lab.experiments.base import Experiment
from vllm_glassbox.lab.experiments.rate_sweep.bench import bench_args, run_bench
from vllm_glassbox.lab.experiments.rate_sweep.judge import (
    ADMISSION,
    CLIENT_LIMIT,
    DECODE_STEPS,
    FAILED,
    FIRST_STEP,
    KV_POOL,
    LIMITS,
    TPOT_AGREEMENT,
    UNEXPLAINED,
    achieved_rate,
    find_knee,
    judge_steps,
    keeps_up,
    slo_share,
    tpot_verdict,
)
from vllm_glassbox.lab.experiments.rate_sweep.phase import KIND, Doubling, RateSweepPhase, parse
from vllm_glassbox.lab.experiments.rate_sweep.plot import plots
from vllm_glassbox.lab.experiments.rate_sweep.report import section, summary
from vllm_glassbox.lab.experiments.rate_sweep.result import (
    ClientView,
    Knee,
    RateSweepResult,
    ServerView,
    SweepPoint,
    SweepStep,
)
from vllm_glassbox.lab.experiments.rate_sweep.run import run
from vllm_glassbox.lab.experiments.rate_sweep.views import backlog_growth, client_view

EXPERIMENT = Experiment(KIND, RateSweepPhase, RateSweepResult, parse, run, summary, section, plots)

__all__ = [
    "ADMISSION",
    "CLIENT_LIMIT",
    "DECODE_STEPS",
    "EXPERIMENT",
    "FAILED",
    "FIRST_STEP",
    "KIND",
    "KV_POOL",
    "LIMITS",
    "TPOT_AGREEMENT",
    "UNEXPLAINED",
    "ClientView",
    "Doubling",
    "Knee",
    "RateSweepPhase",
    "RateSweepResult",
    "ServerView",
    "SweepPoint",
    "SweepStep",
    "achieved_rate",
    "backlog_growth",
    "bench_args",
    "client_view",
    "find_knee",
    "judge_steps",
    "keeps_up",
    "run_bench",
    "slo_share",
    "tpot_verdict",
]
