"""Talking to the vLLM under test: completions, and counter snapshots around them.

The numbers themselves come from the derivation core: a request's increase is the core's
`snapshot_increases` on both sides of it (its counter and restart rule, the exporter's
too), combined over engines with `engines_together`, and every derived value is a
function of `core/derive/`.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import httpx
from vllm_glassbox.core import derive
from vllm_glassbox.core import snapshot as s
from vllm_glassbox.core.derive import Increase, engines_together, snapshot_increases
from vllm_glassbox.core.errors import ScrapeError
from vllm_glassbox.core.fetch import Fetcher
from vllm_glassbox.core.snapshot import (
    GENERATION_TOKENS,
    REQUESTS_FINISHED,
    Snapshot,
    read_snapshot,
)
from vllm_glassbox.lab.vllm.credentials import ApiKey


class LabError(RuntimeError):
    """A failure of the experiment (vLLM refused a request, a page was unreadable…)."""


def increase(before: Snapshot, after: Snapshot, seconds: float) -> Increase:
    """How much every canonical counter grew from one snapshot to the next, all engines
    (a restart in between, by the core's rule, counts what the new process counted); the
    engine steps unknown where several API servers each count a step they took part in
    (`derive.steps_counted_once`, the page's multiprocess mode)."""
    grown = engines_together(snapshot_increases(before, after, seconds).values(), seconds)
    if not derive.steps_counted_once(after.process_start_time, None):
        return grown.unknown(s.ENGINE_STEPS)
    return grown


def gauge_total(snapshot: Snapshot, name: str) -> float | None:
    """A gauge summed over engines (requests running/waiting); None when no engine has it."""
    values = [e.gauges[name] for e in snapshot.engines.values() if name in e.gauges]
    return sum(values) if values else None


def gauge_max(snapshot: Snapshot, name: str) -> float | None:
    """A gauge's largest value over engines (KV usage: the fullest pool)."""
    values = [e.gauges[name] for e in snapshot.engines.values() if name in e.gauges]
    return max(values) if values else None


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

    def __init__(
        self,
        url: str,
        model: str,
        request_timeout: float = 1800.0,
        api_key: ApiKey | None = None,
    ) -> None:
        self.url = url.rstrip("/")
        self.model = model
        self.api_key = api_key  # a vLLM started with --api-key: every request carries it
        self._http = httpx.Client(
            timeout=httpx.Timeout(request_timeout, connect=10.0),
            headers=api_key.headers() if api_key else None,
        )
        # The exporter's fetcher: a hard deadline and a byte cap, whatever vLLM does.
        self._pages = Fetcher(
            self.url,
            timeout_seconds=10.0,
            credentials=api_key.credentials() if api_key else None,
        )

    def close(self) -> None:
        self._http.close()
        self._pages.close()

    def snapshot(self, timeout: float = 10.0) -> Snapshot:
        try:
            page = self._pages.get_text("/metrics", timeout)
        except ScrapeError as e:
            raise LabError(f"cannot read {self.url}: {e}") from None
        try:
            return read_snapshot(page)
        except ScrapeError as e:
            raise LabError(f"cannot read {self.url}/metrics: {e}") from None

    def complete(self, body: Mapping[str, Any]) -> Completion:
        started = time.monotonic()
        try:
            r = self._http.post(self.url + "/v1/completions", json=dict(body))
        except httpx.HTTPError as e:
            raise LabError(f"completion request failed: {type(e).__name__}: {e}") from None
        if r.status_code == 401:
            raise LabError(
                "vLLM answered HTTP 401: it was started with an API key; name where the "
                "lab finds it with the plan's api_key (or VLLM_API_KEY_FILE, VLLM_API_KEY)"
            )
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

    def measure_each(self, bodies: Sequence[Mapping[str, Any]]) -> list[Measured]:
        """Send the requests one after the other, each with its own increase around it
        (so their spread can be told)."""
        out = []
        before = self.snapshot()
        for body in bodies:
            started = time.monotonic()
            done = self.complete(body)
            after = self.settled_snapshot(before, done.completion_tokens, 1)
            out.append(Measured((done,), increase(before, after, time.monotonic() - started)))
            before = after
        return out


class Sampler:
    """Polls /metrics on a fixed period (the KV-pressure timeline, live progress).

    It runs apart from the request load: a process of its own (`lab/vllm/poller.py`) with its
    own connection and a schedule that waits for nothing, which appends every page to a
    file with the times it was sent and came back; a thread here reads the file.
    `on_sample(t, snapshot, latency, delay)` gets each page with the seconds since the
    first poll when it arrived, how long vLLM took to answer, and how late after its tick
    the poll was sent (the machine's CPU starved the poller); a poll that fails or outlasts its
    deadline goes to `on_missed(t, error)` — recorded, never skipped silently — and the
    next follows at once. Entering waits for the first poll (t = 0).
    """

    def __init__(
        self,
        client: VllmClient,
        period: float,
        on_sample: Callable[[float, Snapshot, float, float], None],
        on_missed: Callable[[float, str], None] = lambda t, error: None,
        deadline: float | None = None,
    ) -> None:
        self.url = client.url
        self.token_file = client.api_key.file if client.api_key else None
        self.period = period
        # A poll may be late (a saturated API server stalls for seconds: a late page is
        # still a page); past this it failed.
        self.deadline = deadline if deadline is not None else max(2.0 * period, 10.0)
        self.on_sample = on_sample
        self.on_missed = on_missed
        self.errors = 0
        self.polls = 0
        self._start: float | None = None
        self._stop = threading.Event()
        self._first = threading.Event()
        self._reader = threading.Thread(target=self._read, name="sampler", daemon=True)
        self._proc: subprocess.Popen[bytes] | None = None
        self._path = ""

    def __enter__(self) -> Sampler:
        fd, self._path = tempfile.mkstemp(prefix="glassbox-poll-", suffix=".jsonl")
        os.close(fd)
        self._proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "vllm_glassbox.lab.vllm.poller",
                self.url,
                str(self.period),
                str(self.deadline),
                self._path,
                *([self.token_file] if self.token_file else []),
            ],
            stdin=subprocess.PIPE,  # closed by us, or by the kernel if the lab dies
            stdout=subprocess.DEVNULL,
            # A session of its own is a scheduling group of its own (Linux autogroups): a
            # mostly idle one, so its polls wake on time however busy the lab's
            # process is. Ctrl-C reaches it through the lab, which closes its stdin.
            start_new_session=True,
        )
        self._reader.start()
        self._first.wait(timeout=30.0)  # a Python start on a loaded machine
        return self

    def __exit__(self, *exc: object) -> None:
        proc, self._proc = self._proc, None
        if proc is not None:
            with contextlib.suppress(OSError):
                proc.stdin.close()  # type: ignore[union-attr]
            try:
                proc.wait(timeout=self.deadline + 5.0)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        self._stop.set()
        self._reader.join(timeout=10.0)
        with contextlib.suppress(OSError):
            os.unlink(self._path)

    def _read(self) -> None:
        """Follow the poller's file: one JSON line per poll, dispatched in order."""
        with open(self._path, encoding="utf-8") as f:
            partial = ""
            while True:
                chunk = f.readline()
                if not chunk:
                    if self._stop.is_set():
                        return
                    time.sleep(0.05)
                    continue
                partial += chunk
                if not partial.endswith("\n"):
                    continue
                line, partial = partial, ""
                try:
                    self._dispatch(json.loads(line))
                except Exception as e:  # a bad line or callback must not stop the timeline
                    self.errors += 1
                    self.on_missed(self._t(time.monotonic()), f"poll not read: {e}")
                finally:
                    self._first.set()

    def _t(self, when: float) -> float:
        if self._start is None:
            self._start = when
        return when - self._start

    def _dispatch(self, poll: dict[str, Any]) -> None:
        sent, received = float(poll["sent"]), float(poll["received"])
        if self._start is None:
            self._start = sent  # t = 0 is the first poll
        self.polls += 1
        if "page" not in poll:
            self.errors += 1
            self.on_missed(self._t(received), f"cannot read {self.url}: {poll['error']}")
            return
        try:
            snapshot = read_snapshot(str(poll["page"]))
        except ScrapeError as e:
            self.errors += 1
            self.on_missed(self._t(received), f"cannot read {self.url}/metrics: {e}")
            return
        delay = sent - float(poll.get("scheduled", sent))
        self.on_sample(self._t(received), snapshot, received - sent, delay)
