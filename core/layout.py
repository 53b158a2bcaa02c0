"""The parallel layout of the model vLLM serves, resolved by one ranking shared by the
exporter and the lab: tensor- and pipeline-parallel sizes from the flags, else from vLLM's
engine-config log line, else the ranks its workers' log prefixes name, else 1;
data-parallel from the number of engines on vLLM's page, else that line, else the
engines its log prefixes name (engine n: at least n + 1), else 1.
"""

from __future__ import annotations

from dataclasses import dataclass

from vllm_glassbox.core.startup_log import StartupFacts


@dataclass(frozen=True)
class ParallelLayout:
    tensor: int = 1
    pipeline: int = 1
    data: int = 1

    @property
    def shards(self) -> int:
        """Parts one copy of the model is split into (one per GPU of an engine)."""
        return self.tensor * self.pipeline


def resolve_layout(
    facts: StartupFacts | None,
    tensor_flag: int | None = None,
    pipeline_flag: int | None = None,
    engines: int | None = None,
) -> ParallelLayout:
    logged = facts or StartupFacts()
    return ParallelLayout(
        # Without an engine-config line, the ranks the workers' prefixes name (Worker_TP1,
        # VllmWorker rank=1) are the least the layout has.
        tensor=tensor_flag or logged.tensor_parallel or logged.tensor_ranks_seen or 1,
        pipeline=pipeline_flag or logged.pipeline_parallel or logged.pipeline_ranks_seen or 1,
        # The page's engines first: for a dense model vLLM runs data-parallel engines
        # independently, and each one's engine-config line says data_parallel_size=1.
        # EngineCore_DP1 alone in a log still means two engines (data_ranks_seen).
        data=engines
        or logged.data_parallel
        or max(len(logged.engines_seen), logged.data_ranks_seen)
        or 1,
    )
