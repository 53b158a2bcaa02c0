"""vLLM held still while a test reads it: its engine processes stopped (SIGSTOP) and
continued (SIGCONT), its API server left running. Running requests keep their KV blocks,
waiting ones stay queued, and once the API server has taken in the last step's outputs
every read of vLLM (an exporter's poll, a Prometheus scrape, the test's) reads the same
state, however late its answer comes on a busy machine.

Why not vLLM's own dev-mode `/pause`: it is a request to the API server, which on two
cores under a flood of 16 requests answered `/health` after 6.4 s and a `/metrics` read
after 23.6 s, the whole flood (measured beside a busy core): a pause asked for at a full
pool landed after the pool had emptied. A signal lands at once.

Why a real-time helper lets vLLM run (`Held.run`): on this machine, while vLLM works,
every process of normal priority is kept off the CPU for 4 to 8 s now and then (the
stall watch saw it beside a test's `time.sleep(0.2)` that took 5.8 s, with vLLM at nice
10, and with vLLM at SCHED_IDLE too), while a SCHED_FIFO process ran on time. So the
slice of vLLM's running is timed by a process of its own at SCHED_FIFO (`chrt`), which
continues the engine and stops it again: a slice is as long as asked, whatever the test
process was kept from doing meanwhile.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
from prometheus_client.parser import text_string_to_metric_families
from vllm_glassbox.lab.backends.server_process import ServerProcess

#: Counters that move with every engine step: equal in two reads, the engine is still.
STEP_COUNTERS = (
    "vllm:num_preemptions_total",
    "vllm:generation_tokens_total",
    "vllm:prompt_tokens_total",
    "vllm:spec_decode_num_drafts_total",
)


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
    """Until two reads of vLLM's step counters agree: a stopped engine's last step may
    still be on its way to the API server."""
    previous: list[dict[str, float]] = []

    def same_twice() -> bool:
        previous.append(vllm_values(url, STEP_COUNTERS))
        return len(previous) > 1 and previous[-1] == previous[-2]

    _wait(same_twice, "vLLM's counters frozen by the stop", timeout_seconds)


def engine_pids(server: ServerProcess) -> list[int]:
    """The processes of the server's group (its own session) but the API server itself:
    vLLM's engine core and its helpers."""
    leader = server.pid
    if leader is None:
        raise RuntimeError("vLLM is not running: nothing to hold still")
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError):
            # "pid (comm) state ppid pgrp ...": comm may hold spaces and parentheses.
            fields = stat.read_text().rsplit(")", 1)[1].split()
            pid = int(stat.parent.name)
            if int(fields[2]) == leader and pid != leader:
                found.append(pid)
    if not found:
        raise RuntimeError(f"vLLM (pid {leader}) has no engine process to hold still")
    return found


def _signal_all(pids: list[int], sig: signal.Signals) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):  # a helper that ended meanwhile
            os.kill(pid, sig)


# Continue the engine, let it run $0 seconds, stop it again: run at SCHED_FIFO.
_SLICE = 'kill -CONT "$@"; sleep "$0"; kill -STOP "$@"'


def _on_time() -> list[str]:
    """`chrt -f 10` where the machine grants it (root, or CAP_SYS_NICE); else nothing,
    and a slice may run longer than asked on a loaded machine."""
    chrt = shutil.which("chrt")
    if chrt and subprocess.run([chrt, "-f", "10", "true"], capture_output=True).returncode == 0:
        return [chrt, "-f", "10"]
    return []


class Held:
    """vLLM's engine stopped (see `held`); `run` lets it go for a slice."""

    def __init__(self, server: ServerProcess) -> None:
        self.server = server
        self.pids = engine_pids(server)
        self.on_time = _on_time()
        self.still_since = self._stop()

    def _stop(self) -> float:
        _signal_all(self.pids, signal.SIGSTOP)
        wait_for_frozen_counters(self.server.url)
        return time.time()

    def run(self, seconds: float) -> float:
        """vLLM runs `seconds` (timed at SCHED_FIFO), then is held still again; returns the
        unix time from which every read of it shows the new state."""
        slice_ = [*self.on_time, "sh", "-c", _SLICE, f"{seconds:.3f}", *map(str, self.pids)]
        subprocess.run(slice_, check=True, capture_output=True)
        self.still_since = self._stop()  # the stop was sent: wait until the page holds
        return self.still_since

    def release(self) -> None:
        _signal_all(self.pids, signal.SIGCONT)


@contextlib.contextmanager
def held(server: ServerProcess) -> Iterator[Held]:
    """vLLM's engine stopped for the block, running only in the slices the block gives it
    (`Held.run`), and running again after it, whatever the block raised."""
    hold: Held | None = None
    try:
        hold = Held(server)
        yield hold
    finally:
        if hold is not None:
            hold.release()
        else:  # stopped part way: continue whatever was stopped
            _signal_all(engine_pids(server), signal.SIGCONT)


def pause(server: ServerProcess) -> float:
    """Stop vLLM's engine and wait until its counters are still (it is not continued);
    returns the unix time from which every read of it shows the frozen state."""
    return Held(server).still_since
