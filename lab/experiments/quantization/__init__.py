"""The quantization experiment: decode time per token against the bytes of the weights.

Each variant (a model, maybe quantized, with its flags) is served by a server of its own,
warmed up and measured request by request, round after round with the order reversed
each round. TPOT is the median of a variant's requests. The line TPOT = a·GiB + b goes
through the chosen variants; every other variant sits on it within a tolerance, above it
(slower than its bytes predict) or below it, with the likely reason; a quantized variant
that vLLM loaded at full size is named and left out; the slope's inverse is the marginal
weight-read bandwidth, set against the hardware's peak (`derive`).

`phase.py` the phase and its YAML, `run.py` the variants against their servers,
`result.py` what it found (results.json: `variants[]`, `fit`), `judge.py` the numbers and
the line, `report.py` its section of report.md, `plot.py` its plot.
"""

from __future__ import annotations

from vllm_glassbox.lab.experiments.base import Experiment
from vllm_glassbox.lab.experiments.quantization.judge import (
    fit_tpot,
    full_size_variants,
    variant_result,
)
from vllm_glassbox.lab.experiments.quantization.phase import (
    KIND,
    QuantizationPhase,
    Variant,
    parse,
)
from vllm_glassbox.lab.experiments.quantization.plot import plots
from vllm_glassbox.lab.experiments.quantization.report import section, summary
from vllm_glassbox.lab.experiments.quantization.result import (
    ABOVE_LINE,
    BELOW_LINE,
    FITTED,
    FULL_SIZE,
    ON_LINE,
    Fit,
    Prediction,
    QuantizationResult,
    VariantResult,
)
from vllm_glassbox.lab.experiments.quantization.run import run

EXPERIMENT = Experiment(
    KIND, QuantizationPhase, QuantizationResult, parse, run, summary, section, plots
)

__all__ = [
    "ABOVE_LINE",
    "BELOW_LINE",
    "EXPERIMENT",
    "FITTED",
    "FULL_SIZE",
    "KIND",
    "ON_LINE",
    "Fit",
    "Prediction",
    "QuantizationPhase",
    "QuantizationResult",
    "Variant",
    "VariantResult",
    "fit_tpot",
    "full_size_variants",
    "variant_result",
]
