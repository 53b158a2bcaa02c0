"""The local backend: vLLM (or anything taking vLLM's flags) as a child process.

Each `deploy` stops the previous server and starts a new one from the plan's base args
with the phase's flags set by name (`lab/backends/args.py`), its whole log captured to its own
file — unless the server running has exactly the args asked for: then it is kept (a
start costs about a minute on two cores; the counters the lab reads are increases, so a
segment does not need a fresh server). A value `tiny:NAME` anywhere in the args names a
tiny model of the plan (`target.local.tiny_models`), generated on first use
(`lab/backends/tinymodel.py`). `restore()` stops the server; `ServerProcess` kills its whole
process group, so no worker survives.
"""

from __future__ import annotations

import re
import time
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path

from vllm_glassbox.lab.backends.args import apply_overrides, flag_value
from vllm_glassbox.lab.backends.backend import Deployed, FlagOverrides
from vllm_glassbox.lab.backends.server_process import DEFAULT_COMMAND, ServerProcess
from vllm_glassbox.lab.backends.targets import TINY_PREFIX, LocalTarget
from vllm_glassbox.lab.backends.tinymodel import generate


class LocalBackend:
    name = "local"

    def __init__(
        self,
        target: LocalTarget,
        log_dir: Path,
        server_command: str = DEFAULT_COMMAND,
        port: int | None = None,
        env: Mapping[str, str] | None = None,
    ) -> None:
        self.target = target
        self.log_dir = log_dir
        self.server_command = server_command
        self.port = port  # fixed, so a Prometheus can follow the restarts; else a free one
        self.env = {**target.env, **(env or {})}
        self.started = 0
        self._server: ServerProcess | None = None
        self._deployed: tuple[list[str], Deployed] | None = None  # the running server's

    @property
    def server(self) -> ServerProcess | None:
        return self._server

    def resolve(self, args: list[str]) -> list[str]:
        """`tiny:NAME` values -> generated model directories."""

        def one(arg: str) -> str:
            head, eq, value = arg.rpartition("=") if "=" in arg else ("", "", arg)
            if not value.startswith(TINY_PREFIX):
                return arg
            name = value[len(TINY_PREFIX) :]
            spec = self.target.tiny_models.get(name)
            if spec is None:
                known = ", ".join(sorted(self.target.tiny_models)) or "none"
                raise ValueError(f"{value!r} is not a tiny model of the plan (known: {known})")
            return head + eq + str(generate(spec, self.target.model_cache))

        return [one(a) for a in args]

    def restore_leftover(self) -> None:
        """Nothing outlives the lab here but, after a SIGKILL, the server itself: its
        process group is its own (see docs/lab.md); the lab keeps no record of it."""
        return None

    def deploy(self, overrides: FlagOverrides) -> Deployed:
        args = self.resolve(apply_overrides(self.target.args, overrides))
        kept = self._keep(args)
        if kept is not None:
            return kept
        self.restore()
        model = flag_value(args, "--model")
        served = flag_value(args, "--served-model-name") or model or ""
        self.started += 1
        label = re.sub(r"[^A-Za-z0-9_.-]+", "-", Path(model or "server").name)
        log_path = self.log_dir / f"{self.started:02d}-{label}.log"
        # Known to restore() before it exists as a process: Ctrl-C cannot slip between.
        self._server = ServerProcess(
            args, log_path, command=self.server_command, port=self.port, env=self.env
        )
        started = time.monotonic()
        self._server.start()
        self._server.wait_ready(self.target.startup_timeout_seconds)
        deployed = Deployed(
            url=self._server.url,
            startup_log=self._server.log_text(),
            served_model_name=served.split()[0] if served else "",
            log_path=str(log_path),
            model_dir=model if model and Path(model).is_dir() else None,
            startup_seconds=time.monotonic() - started,
        )
        self._deployed = (args, deployed)
        return deployed

    def _keep(self, args: list[str]) -> Deployed | None:
        """The running server, when it was started with exactly `args` and still serves."""
        if self._server is None or self._deployed is None or self._deployed[0] != args:
            return None
        if not self._server.running():
            return None
        self._server.wait_ready(self.target.startup_timeout_seconds)
        return replace(self._deployed[1], reused=True)

    def restore(self) -> None:
        self._deployed = None
        server, self._server = self._server, None
        if server is not None:
            server.stop()
