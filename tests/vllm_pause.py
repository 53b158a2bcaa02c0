"""vLLM held still while a test reads it: its dev-mode `/pause` (VLLM_SERVER_DEV_MODE=1)
with `mode=keep` stops the scheduler with every request kept where it is (running ones
hold their KV blocks, waiting ones stay queued) until `/resume`. Whatever reads vLLM in
between (an exporter's poll, a Prometheus scrape, the test) reads the same state, however
late its answer comes on a busy machine: a test that asserts what a poll saw need not
hope that the poll landed in time.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator

import httpx
from prometheus_client.parser import text_string_to_metric_families

#: Counters that move with every engine step: equal in two reads, the engine is still.
STEP_COUNTERS = (
    "vllm:num_preemptions_total",
    "vllm:generation_tokens_total",
    "vllm:prompt_tokens_total",
    "vllm:spec_decode_num_drafts_total",
)
KEEP = {"mode": "keep", "clear_cache": "false"}


def vllm_values(url: str, names: tuple[str, ...]) -> dict[str, float]:
    """Each name's value on vLLM's page, summed over its series (0 where absent)."""
    text = httpx.get(url + "/metrics", timeout=60).text
    found = dict.fromkeys(names, 0.0)
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name in found:
                found[s.name] += s.value
    return found


def _wait(condition: Callable[[], bool], what: str, timeout_seconds: float) -> None:
    deadline = time.monotonic() + timeout_seconds
    while not condition():
        if time.monotonic() > deadline:
            raise RuntimeError(f"not {what} after {timeout_seconds:g}s")
        time.sleep(0.3)


def wait_for_frozen_counters(url: str, timeout_seconds: float = 120.0) -> None:
    """Until two reads of vLLM's step counters agree: a paused engine's last step may
    still be on its way to the API server."""
    previous: list[dict[str, float]] = []

    def same_twice() -> bool:
        previous.append(vllm_values(url, STEP_COUNTERS))
        return len(previous) > 1 and previous[-1] == previous[-2]

    _wait(same_twice, "vLLM's counters frozen by the pause", timeout_seconds)


def pause(url: str) -> float:
    """Pause vLLM (requests kept) and wait until it is still; returns the unix time from
    which every read of it shows the frozen state."""
    httpx.post(url + "/pause", params=KEEP, timeout=60).raise_for_status()
    wait_for_frozen_counters(url)
    return time.time()


def resume(url: str) -> None:
    httpx.post(url + "/resume", timeout=60).raise_for_status()


@contextlib.contextmanager
def frozen(url: str) -> Iterator[float]:
    """vLLM paused for the block (the unix time it was still from), resumed after it,
    whatever the block raised."""
    try:
        yield pause(url)
    finally:
        resume(url)
