"""Where the lab's vLLM runs: the contract both backends (local, kubernetes) fulfil.

A phase asks for vLLM's original arguments with some flags overridden *by name*; the
backend makes a server run with exactly that, waits until it serves, and hands back its
URL and the startup log of that server. `restore()` puts things back as they were
(stops the child process; restores the Deployment's original args). It is idempotent and
is called on success, failure and interrupt.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
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


class Backend(Protocol):
    name: str

    def deploy(self, overrides: FlagOverrides) -> Deployed:
        """Run vLLM with its original args plus `overrides`; return once /health answers."""
        ...

    def restore(self) -> None:
        """Undo every change: back to the original args, or no child process left."""
        ...
