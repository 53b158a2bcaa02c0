"""The parallel layout of the model vLLM serves, resolved by one ranking shared by the
exporter and the lab: tensor- and pipeline-parallel sizes from the flags, else from vLLM's
engine-config log line, else 1; data-parallel from the number of engines on vLLM's page,
else that line, else 1.
"""

from __future__ import annotations

from dataclasses import dataclass

from vllm_glassbox.exporter.startup_log import StartupFacts


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
        tensor=tensor_flag or logged.tensor_parallel or 1,
        pipeline=pipeline_flag or logged.pipeline_parallel or 1,
        # The page's engines first: for a dense model vLLM runs data-parallel engines
        # independently, and each one's engine-config line says data_parallel_size=1.
        data=engines or logged.data_parallel or 1,
    )
