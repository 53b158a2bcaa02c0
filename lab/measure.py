"""Talking to the vLLM under test: completions, and counter snapshots around them.

The numbers themselves come from the derivation core: a request's increase is the core's
`snapshot_increases` on both sides of it (its counter and restart rule, the exporter's
too), combined over engines with `engines_together`, and every derived value is a
function of `exporter/derive.py`.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import httpx
from vllm_glassbox.exporter.derive import Increase, engines_together, snapshot_increases
from vllm_glassbox.exporter.snapshot import (
    GENERATION_TOKENS,
    REQUESTS_FINISHED,
    Snapshot,
    read_snapshot,
)
from vllm_glassbox.exporter.textformat import PageError


class LabError(RuntimeError):
    """A failure of the experiment (vLLM refused a request, a page was unreadable…)."""


def increase(before: Snapshot, after: Snapshot, seconds: float) -> Increase:
    """How much every canonical counter grew from one snapshot to the next, all engines
    (a restart in between, by the core's rule, counts what the new process counted)."""
    return engines_together(snapshot_increases(before, after, seconds).values(), seconds)


def gauge_total(snapshot: Snapshot, name: str) -> float | None:
    """A gauge summed over engines (requests running/waiting); None when no engine has it."""
    values = [e.gauges[name] for e in snapshot.engines.values() if name in e.gauges]
    return sum(values) if values else None


def gauge_max(snapshot: Snapshot, name: str) -> float | None:
    """A gauge's largest value over engines (KV usage: the fullest pool)."""
    values = [e.gauges[name] for e in snapshot.engines.values() if name in e.gauges]
    return max(values) if values else None


def counter_total(snapshot: Snapshot, name: str) -> float:
    return sum(e.counters.get(name, 0.0) for e in snapshot.engines.values())


@dataclass(frozen=True)
class Completion:
    prompt_tokens: int
    completion_tokens: int
    wall_seconds: float
    text: str


@dataclass(frozen=True)
class Measured:
    """One or more requests and the increase of every counter around them."""

    completions: tuple[Completion, ...]
    increase: Increase


class VllmClient:
    """The OpenAI-compatible server under test: /metrics and /v1/completions."""

    def __init__(self, url: str, model: str, request_timeout: float = 1800.0) -> None:
        self.url = url.rstrip("/")
        self.model = model
        self._http = httpx.Client(timeout=httpx.Timeout(request_timeout, connect=10.0))

    def close(self) -> None:
        self._http.close()

    def snapshot(self) -> Snapshot:
        try:
            r = self._http.get(self.url + "/metrics", timeout=10.0)
            r.raise_for_status()
            return read_snapshot(r.text)
        except (httpx.HTTPError, PageError) as e:
            raise LabError(f"cannot read {self.url}/metrics: {e}") from None

    def complete(self, body: Mapping[str, Any]) -> Completion:
        started = time.monotonic()
        try:
            r = self._http.post(self.url + "/v1/completions", json=dict(body))
        except httpx.HTTPError as e:
            raise LabError(f"completion request failed: {type(e).__name__}: {e}") from None
        if r.status_code != 200:
            raise LabError(f"vLLM answered HTTP {r.status_code}: {r.text[:500]}")
        data = r.json()
        usage = data.get("usage") or {}
        choices = data.get("choices") or [{}]
        return Completion(
            prompt_tokens=int(usage.get("prompt_tokens", 0)),
            completion_tokens=int(usage.get("completion_tokens", 0)),
            wall_seconds=time.monotonic() - started,
            text=str(choices[0].get("text", "")),
        )

    def settled_snapshot(
        self, before: Snapshot, tokens: int, requests: int, timeout: float = 5.0
    ) -> Snapshot:
        """The first snapshot that counts the finished requests.

        vLLM may record a request's last iteration just after answering it; reading the
        counters too early would cut the last step off.
        """
        deadline = time.monotonic() + timeout
        while True:
            after = self.snapshot()
            grown = increase(before, after, 0.0)
            if (
                grown[GENERATION_TOKENS] >= tokens and grown[REQUESTS_FINISHED] >= requests
            ) or time.monotonic() > deadline:
                return after
            time.sleep(0.05)

    def measure(self, bodies: Sequence[Mapping[str, Any]]) -> Measured:
        """Send the requests one after the other; the increase around all of them."""
        before = self.snapshot()
        started = time.monotonic()
        done = tuple(self.complete(b) for b in bodies)
        after = self.settled_snapshot(before, sum(c.completion_tokens for c in done), len(done))
        return Measured(done, increase(before, after, time.monotonic() - started))


class Sampler:
    """Polls /metrics on a fixed period in the background (timeline, live progress).

    `on_sample(t, snapshot)` is called with seconds since start; a failed poll is skipped.
    """

    def __init__(
        self,
        client: VllmClient,
        period: float,
        on_sample: Callable[[float, Snapshot], None],
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.client = client
        self.period = period
        self.on_sample = on_sample
        self.clock = clock
        self.errors = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="sampler", daemon=True)
        self._start = 0.0

    def __enter__(self) -> Sampler:
        self._start = self.clock()
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=15.0)

    def sample_now(self) -> None:
        try:
            snapshot = self.client.snapshot()
        except LabError:
            self.errors += 1
            return
        self.on_sample(self.clock() - self._start, snapshot)

    def _run(self) -> None:
        next_at = self._start
        while not self._stop.is_set():
            self.sample_now()
            next_at += self.period
            now = self.clock()
            if next_at < now:  # fell behind: keep the period, skip the missed ticks
                next_at = now + self.period
            self._stop.wait(max(0.0, next_at - now))
