"""The KV-pressure phase: its parameters, the article's run as defaults, read from YAML."""

from __future__ import annotations

from dataclasses import dataclass

from vllm_glassbox.core.derive import KV_POOL_FULL
from vllm_glassbox.lab.backends.backend import FlagOverrides
from vllm_glassbox.lab.experiments.base import SingleServer
from vllm_glassbox.lab.plan_yaml import (
    Node,
    Request,
    count,
    duration,
    fraction,
    positive_int,
    read_flags,
    read_request,
    text,
)

KIND = "kv-pressure"
#: The article's run (SPEC §1).
KV_PRESSURE_PROMPT = "Write an extremely long and detailed essay, number {i}."


@dataclass(frozen=True)
class KvPressurePhase(SingleServer):
    name: str
    model: str | None
    flags: FlagOverrides
    request: Request  # prompt may contain {i}, the request's index
    concurrency: int
    poll_seconds: float
    timeout_seconds: float
    saturation: float  # KV usage from which the pool counts as full
    warmup: int  # short requests before the flood, so one-time costs do not delay it
    kind: str = KIND

    def describe(self) -> str:
        return (
            f"{self.concurrency} requests of {self.request.max_tokens} tokens at once, "
            f"polled every {self.poll_seconds:g}s"
        )


def parse(node: Node, name: str) -> KvPressurePhase:
    """The phase from its YAML, the article's run as defaults."""
    request = read_request(node, KV_PRESSURE_PROMPT, 4096, 0.7)
    try:
        request.prompt.format(i=0)
    except (KeyError, IndexError, ValueError) as e:
        node.problem("prompt", f"only {{i}} may be formatted into it ({e!r})")
    return KvPressurePhase(
        name=name,
        model=node.get("model", text, None),
        flags=read_flags(node, "flags", {"--gpu-memory-utilization": "0.20"}),
        request=request,
        concurrency=node.get("concurrency", positive_int, 32),
        poll_seconds=node.get("poll", duration, 5.0),
        timeout_seconds=node.get("timeout", duration, 3600.0),
        saturation=node.get("saturation", fraction, KV_POOL_FULL),
        warmup=node.get("warmup", count, 1),
    )
