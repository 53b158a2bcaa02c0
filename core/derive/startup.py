"""Cold start: the stages of one start of vLLM from its log, how fast the weights
loaded; the first requests after a start, kept apart from the warm ones.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Protocol

from vllm_glassbox.core import snapshot as s
from vllm_glassbox.core.derive.arithmetic import ratio
from vllm_glassbox.core.derive.increases import Increase

STARTUP_STAGES = ("weights_load", "compile", "cuda_graphs", "engine_init", "other")


def _slowest(per_process: Mapping[str, float]) -> float | None:
    """A stage that ranks run side by side takes as long as its slowest rank."""
    return max(per_process.values()) if per_process else None


@dataclass(frozen=True)
class StartupStages:
    """Seconds of one start of vLLM, by stage; None for what the log does not show.

    The stages do not overlap, so they stack up to `total` (process start to ready):
    weights_load, then engine_init (vLLM's "init engine" less the compile and graph capture
    it contains: memory profiling, KV allocation, warm-up), compile, cuda_graphs, and
    other (the rest of the total: processes starting, the API server).
    """

    weights_load: float | None
    compile: float | None
    cuda_graphs: float | None
    engine_init: float | None
    other: float | None
    total: float | None

    def by_stage(self) -> dict[str, float]:
        """The stages present, by name (STARTUP_STAGES order)."""
        values = {name: getattr(self, name) for name in STARTUP_STAGES}
        return {name: value for name, value in values.items() if value is not None}


class LoggedStart(Protocol):
    """One start of vLLM as its log states it: seconds per process that wrote a stage's
    line (ranks work side by side), as the log reader gives them (`cold_start.ColdStart`)."""

    @property
    def model_load_seconds(self) -> Mapping[str, float]: ...

    @property
    def weights_load_seconds(self) -> Mapping[str, float]: ...

    @property
    def compile_seconds(self) -> Mapping[str, float]: ...

    @property
    def cuda_graph_seconds(self) -> Mapping[str, float]: ...

    @property
    def engine_init_seconds(self) -> float | None:
        """The slowest engine's "init engine", compile and graph capture included."""
        ...

    @property
    def engine_init_compile_seconds(self) -> float | None:
        """Its "(compilation: S s)": vLLM's own total over its models."""
        ...

    @property
    def ready_after_seconds(self) -> float | None:
        """Process start to ready, on the log's clock."""
        ...

    @property
    def ranks_unknown(self) -> bool:
        """A stage line did not tell its rank (a prefix of no known shape, Ray's
        deduplication): no rank's seconds can be told the slowest."""
        ...


def weights_load_seconds(
    model_load: Mapping[str, float], weights_load: Mapping[str, float]
) -> float | None:
    """How long loading the weights took: the slowest process's "Model loading took" (the
    whole load), else its "Loading weights took" (the CPU build logs only the weight read)."""
    slowest = _slowest(model_load)
    return slowest if slowest is not None else _slowest(weights_load)


def startup_stages(start: LoggedStart) -> StartupStages:
    """The stages of one start (see StartupStages); none but the total when a stage line
    does not tell its rank (a prefix glassbox does not know, a line Ray deduplicated)."""
    total = start.ready_after_seconds
    if start.ranks_unknown:
        return StartupStages(None, None, None, None, None, total)
    weights_load = weights_load_seconds(start.model_load_seconds, start.weights_load_seconds)
    compile_ = start.engine_init_compile_seconds
    if compile_ is None:
        compile_ = _slowest(start.compile_seconds)
    graphs = _slowest(start.cuda_graph_seconds)
    engine_init = None
    if start.engine_init_seconds is not None:
        inside = (compile_ or 0.0) + (graphs or 0.0)
        engine_init = max(start.engine_init_seconds - inside, 0.0)
    other = None
    if total is not None:
        logged = (weights_load or 0.0) + (compile_ or 0.0) + (graphs or 0.0) + (engine_init or 0.0)
        other = max(total - logged, 0.0)
    return StartupStages(weights_load, compile_, graphs, engine_init, other, total)


def model_load_bytes_per_second(
    weights_bytes: float | None, load_seconds: float | None
) -> float | None:
    """How fast the weights loaded: weights / the weights_load stage."""
    if weights_bytes is None or load_seconds is None:
        return None
    return ratio(weights_bytes, load_seconds)


@dataclass(frozen=True)
class FirstRequests:
    """The request(s) that finished first after a start: vLLM's prefill-time counters at
    the first poll that saw any (counted from 0 at the start), and when that poll was."""

    prefill_sum: float
    prefill_count: float
    at: float  # the poll's monotonic time


def first_request_prefill_seconds(first: FirstRequests | None) -> float | None:
    """Mean prefill of the first request(s) after a start: cold paths (JIT compiles) land here."""
    return None if first is None else ratio(first.prefill_sum, first.prefill_count)


def warm_request_prefill_seconds(
    d: Increase, first: FirstRequests | None, window_start: float
) -> float | None:
    """Mean prefill of the requests that finished in the window, the first ones after a
    start left out: Δ prefill sum / Δ prefill count, less the first requests' share."""
    total, count = d[s.PREFILL_SUM], d[s.PREFILL_COUNT]
    if first is not None and first.at > window_start:  # they finished inside the window
        total, count = total - first.prefill_sum, count - first.prefill_count
    return ratio(total, count)


def startup_without_stage(total: float | None, stage: float | None) -> float | None:
    """A start's seconds without one of its stages (which do not overlap)."""
    if total is None or stage is None:
        return None
    return max(total - stage, 0.0)
