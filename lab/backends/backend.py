"""Where the lab's vLLM runs: the contract both backends (local, kubernetes) fulfil.

A phase asks for vLLM's original arguments with some flags overridden *by name*; the
backend makes a server run with exactly that, waits until it serves, and hands back its
URL and the startup log of that server. `restore()` puts things back as they were
(stops the child process; restores the Deployment's original args). It is idempotent and
is called on success, failure and interrupt. `restore_leftover()` undoes what a killed
run left (`glassbox lab restore`, and the start of every run).
"""

from __future__ import annotations

import contextlib
import signal
import sys
import threading
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from types import FrameType
from typing import Protocol


class _Remove:
    """Sentinel: remove this flag from vLLM's arguments."""

    def __repr__(self) -> str:
        return "REMOVE"


REMOVE = _Remove()

FlagValue = str | None | _Remove
"""A flag's value: a string; None for a flag without value (`--enforce-eager`); REMOVE."""

FlagOverrides = Mapping[str, FlagValue]
"""Flag name with its dashes (`--gpu-memory-utilization`) -> value."""


@dataclass(frozen=True)
class Deployed:
    url: str  # base URL of vLLM's OpenAI server, as reachable from the lab
    startup_log: str  # the log of this server's startup (for weights, KV memory, KV tokens)
    served_model_name: str  # what to put in requests' "model"
    log_path: str | None = None  # where the backend keeps this server's whole log
    model_dir: str | None = None  # the checkpoint, when the lab can read it (for weights)
    # Set when the backend knows them: the server already running with exactly these args
    # was kept (not started again), and how long its start took.
    reused: bool = False
    startup_seconds: float | None = None


class Backend(Protocol):
    name: str

    def deploy(self, overrides: FlagOverrides) -> Deployed:
        """Run vLLM with its original args plus `overrides`; return once /health answers."""
        ...

    def restore(self) -> None:
        """Undo every change: back to the original args, or no child process left."""
        ...

    def restore_leftover(self) -> str | None:
        """Undo what an earlier run left behind because it was killed (SIGKILL, OOM, node
        loss) before it could restore; say what was done, or None if nothing was left."""
        ...


# -- always restore ----------------------------------------------------------------------


class Terminated(BaseException):
    """SIGTERM arrived. A BaseException, like KeyboardInterrupt: `except Exception` in a
    phase must not swallow it and carry on."""

    def __init__(self, signum: int) -> None:
        super().__init__(f"terminated by signal {signal.Signals(signum).name}")
        self.signum = signum


def _raise_terminated(signum: int, frame: FrameType | None) -> None:
    raise Terminated(signum)


def _hold_on(signum: int, frame: FrameType | None) -> None:
    print(
        f"{signal.Signals(signum).name} received while restoring the original state; "
        "finishing that first (SIGKILL aborts it and leaves the changes in place)",
        file=sys.stderr,
        flush=True,
    )


@contextlib.contextmanager
def restoring(backend: Backend) -> Iterator[Backend]:
    """Run the body, then always `backend.restore()`: on success, on error, on Ctrl-C or
    SIGINT (KeyboardInterrupt, even when the process inherited SIGINT ignored) and on
    SIGTERM (raised as `Terminated`). While restoring, further SIGINT/SIGTERM are reported
    and ignored, so a second Ctrl-C cannot leave a patched Deployment behind. Signal
    handlers are installed only in the main thread."""
    main = threading.current_thread() is threading.main_thread()
    previous = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)} if main else {}
    if main:
        # Set both, whatever was inherited: a parent without job control (`cmd &` in a
        # script, nohup, a CI runner) starts us with SIGINT ignored, and Python then never
        # raises KeyboardInterrupt, so `kill -INT` would leave the changes in place.
        signal.signal(signal.SIGINT, signal.default_int_handler)
        signal.signal(signal.SIGTERM, _raise_terminated)
    try:
        yield backend
    finally:
        if main:
            signal.signal(signal.SIGINT, _hold_on)
            signal.signal(signal.SIGTERM, _hold_on)
        try:
            backend.restore()
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)


def exit_code(error: BaseException) -> int:
    """The shell's convention for a run ended by `error`: 128 + signal, else 1."""
    if isinstance(error, Terminated):
        return 128 + error.signum
    if isinstance(error, KeyboardInterrupt):
        return 128 + signal.SIGINT
    return 1
