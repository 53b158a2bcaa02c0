"""The real stack's fill phase (tests/realstack.py): sampled requests that outgrow vLLM's
KV pool, one token per step each, in slices of vLLM's running; after each slice vLLM is
held still (tests/vllm_pause.py) and an exporter core of its own polls it, until a poll shows
the first preemption. What each poll published is kept (`FinePoll`), and `first_preemption`
reads the polls as vLLM's queue and counter show a preemption.
"""

from __future__ import annotations

import itertools
import math
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from vllm_glassbox.core import snapshot as s
from vllm_glassbox.core.snapshot import read_snapshot
from vllm_glassbox.exporter.service import ExporterConfig, Poller
from vllm_glassbox.lab.backends.server_process import ServerProcess

from tests.vllm_pause import held

REPO = Path(__file__).resolve().parent.parent

# 4 requests of up to 2,012 tokens need 8,048: the pool overflows. Sampled at 0.7 the
# random model's ngram drafts are rejected, so each request grows one token per step.
FILL_REQUESTS = 4
FILL_MAX_TOKENS = 2000
# vLLM runs this long between two polls of it held still, and a fifth of it once the pool
# is NEAR_FULL. The headroom is 0 for the last block of every request before the first
# preemption, 128 steps; a slice is this long exactly (a signal stops the engine), not
# this plus however late an HTTP pause lands.
FILL_SLICE_SECONDS = 0.25
NEAR_FULL = 0.75
WINDOW_SECONDS = 60.0  # the fine exporter core's window, as the stack's exporter's
# What the fine-grained exporter keeps of each poll (the per-engine series).
RUNNING, WAITING = "vllm:num_requests_running", "vllm:num_requests_waiting"
PREEMPTED = "vllm:num_preemptions_total"
GENERATED = "vllm:generation_tokens_total"
FINE_POLL_SERIES = frozenset(
    {
        "glassbox_kv_cache_used_tokens",
        "glassbox_kv_cache_free_tokens",
        "glassbox_kv_cache_headroom_requests",
        "glassbox_kv_cache_exhaustion_seconds",
        "glassbox_preemptions_per_second",
    }
)


@dataclass(frozen=True)
class FinePoll:
    at: float  # unix seconds the poll started
    # FINE_POLL_SERIES it published; RUNNING, WAITING, PREEMPTED, GENERATED from its page
    values: dict[str, float]


def steps_between(earlier: FinePoll, later: FinePoll) -> float:
    """How many engine steps vLLM ran between two polls: the fill requests grow one token
    per step each, so the tokens generated over the requests that ran."""
    running = max(earlier.values.get(RUNNING, 0), later.values.get(RUNNING, 0), 1)
    return (
        later.values.get(GENERATED, math.nan) - earlier.values.get(GENERATED, math.nan)
    ) / running


class _KeepingPages:
    """Wraps an exporter core's fetcher and keeps the last /metrics page it read."""

    def __init__(self, inner: Any) -> None:
        self.inner, self.page = inner, ""

    def get_text(self, path: str, *args: Any, **kwargs: Any) -> str:
        return str(self.get_page(path, *args, **kwargs).text)

    def get_page(self, path: str, *args: Any, **kwargs: Any) -> Any:
        page = self.inner.get_page(path, *args, **kwargs)
        if path.startswith("/metrics"):  # the whole page, or the filtered one
            self.page = page.text
        return page

    def close(self) -> None:
        self.inner.close()


def _fine_poller(vllm_url: str) -> tuple[Poller, _KeepingPages]:
    """A fresh exporter core for the fill (its window starts with it: rates and growth
    count from then on), keeping the page each poll read."""
    poller = Poller(
        ExporterConfig(
            target=vllm_url,
            interval_seconds=FILL_SLICE_SECONDS,
            window_seconds=WINDOW_SECONDS,
            # vLLM is held still at each poll: a late answer is still of the poll's moment.
            timeout_seconds=60.0,
        )
    )
    pages = _KeepingPages(poller.fetcher)
    poller.fetcher = pages  # type: ignore[assignment]
    return poller, pages


def _poll_still(poller: Poller, pages: _KeepingPages, still: float) -> FinePoll | None:
    """One poll of vLLM held still since unix time `still` (tests/vllm_pause.py): what it
    published, with vLLM's running and waiting requests and preemptions from the same
    page; None if three polls of the same frozen state all failed."""
    for _ in range(3):
        if poller.poll_once():
            break
    else:
        return None
    values = {
        sample.name: sample.value
        for family in poller.published
        for sample in family.samples
        if sample.name in FINE_POLL_SERIES
    }
    for engine in read_snapshot(pages.page).engines.values():
        values[RUNNING] = engine.gauges.get(s.RUNNING, math.nan)
        values[WAITING] = engine.gauges.get(s.WAITING, math.nan)
        values[PREEMPTED] = engine.counters.get(s.PREEMPTIONS, math.nan)
        values[GENERATED] = engine.counters.get(s.GENERATION_TOKENS, math.nan)
    return FinePoll(still, values)


def waits_again(polls: list[FinePoll]) -> FinePoll | None:
    """Once the fill requests run and none waits, the first poll where one waits again:
    the clean sign of a preemption, and the moment a lead is measured against."""
    admitted = next(
        (
            i
            for i, p in enumerate(polls)
            if p.values.get(RUNNING, 0) > 0 and p.values.get(WAITING) == 0
        ),
        None,
    )
    if admitted is None:
        return None
    return next((p for p in polls[admitted:] if p.values.get(WAITING, 0) > 0), None)


def first_preemption(polls: list[FinePoll]) -> FinePoll | None:
    """The first poll of the fill phase that shows a request preempted. vLLM puts a
    preempted request back in the queue, and its num_preemptions_total counts it only
    when the request runs again. So: `waits_again`; and where the queue never emptied
    first (under load a request can arrive late, or wait from the start), the first poll
    where a request went back from running to waiting, once the counter has confirmed a
    preemption; else, when the polls missed both (under load most time out and few are
    kept), the first poll whose counter grew: the latest the preemption can have been."""
    queue = waits_again(polls)
    counted = [p.values.get(PREEMPTED, math.nan) for p in polls]
    confirmed = len(polls) > 1 and counted[-1] > counted[0]
    went_back = next(
        (
            later
            for earlier, later in itertools.pairwise(polls)
            if later.values.get(RUNNING, 0) < earlier.values.get(RUNNING, 0)
            and later.values.get(WAITING, 0) > earlier.values.get(WAITING, 0)
        ),
        None,
    )
    counter_grew = next(
        (
            later
            for earlier, later in itertools.pairwise(polls)
            if later.values.get(PREEMPTED, math.nan) > earlier.values.get(PREEMPTED, math.nan)
        ),
        None,
    )
    found = [p for p in (queue, went_back if confirmed else None, counter_grew) if p is not None]
    return min(found, key=lambda p: p.at) if found else None


def _slice_after(poll: FinePoll | None) -> float:
    """How long vLLM runs before the next poll: shorter once the pool is nearly full."""
    used = poll.values.get("glassbox_kv_cache_used_tokens", 0.0) if poll else 0.0
    free = poll.values.get("glassbox_kv_cache_free_tokens", 0.0) if poll else 0.0
    near = used + free > 0 and used / (used + free) >= NEAR_FULL
    return FILL_SLICE_SECONDS / 5 if near else FILL_SLICE_SECONDS


def fill_until_preempted(
    vllm: ServerProcess, model: str, polls: list[FinePoll], deadline_seconds: float = 900.0
) -> None:
    """The fill, in slices: vLLM runs FILL_SLICE_SECONDS (a fifth of it once the pool is
    NEAR_FULL), then is held still and polled by an exporter core (each poll appended to
    `polls`), until a poll shows the first preemption. Every poll reads a state that holds
    still, one slice after the last, so none is lost to a late answer."""
    poller, pages = _fine_poller(vllm.url)
    with tempfile.TemporaryFile() as errors:
        client = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "tests.fill_requests",
                vllm.url,
                model,
                str(FILL_REQUESTS),
                str(FILL_MAX_TOKENS),
            ],
            cwd=REPO,
            stdout=subprocess.DEVNULL,
            stderr=errors,
        )
        try:
            deadline = time.monotonic() + deadline_seconds  # a hang, not a measurement
            with held(vllm) as hold:
                while first_preemption(polls) is None:
                    if time.monotonic() > deadline:
                        raise RuntimeError("the fill phase never made vLLM preempt")
                    ended = client.poll() is not None  # a last poll has the last word
                    still = hold.run(_slice_after(polls[-1] if polls else None))
                    poll = _poll_still(poller, pages, still)
                    if poll is not None:
                        polls.append(poll)
                    if ended and first_preemption(polls) is None:
                        errors.seek(0)
                        seen = [(p.values.get(RUNNING), p.values.get(WAITING)) for p in polls]
                        raise RuntimeError(
                            "the fill requests ended before vLLM preempted (running, "
                            f"waiting per poll: {seen}):\n{errors.read().decode()[-2000:]}"
                        )
        finally:
            client.terminate()
            try:
                client.wait(timeout=10)
            except subprocess.TimeoutExpired:
                client.kill()
                client.wait()
            poller.fetcher.close()
