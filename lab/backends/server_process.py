"""A vLLM server (or anything that takes vLLM's flags), or any command, as a child process.

Started in its own process group with its log captured to a file, so stopping it takes
every worker it spawned with it, and stopped at exit if nobody did: the lab and the tests
never leave a process behind.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import re
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Self

from vllm_glassbox.core.errors import ScrapeError
from vllm_glassbox.core.fetch import fetch_once

DEFAULT_COMMAND = f"{shlex.quote(sys.executable)} -m vllm.entrypoints.openai.api_server"

# A Python exception as a traceback's last line names it: "ModuleNotFoundError: No module…",
# alone or behind vLLM's process prefix "(EngineCore_DP0 pid=1) " or a log line's
# "[core.py:936] " (colours removed first).
_EXCEPTION = re.compile(r"(?:^|[)\]] )([A-Za-z_][\w.]*(?:Error|Exception): .+)")
_ANSI = re.compile(r"\x1b\[[0-9;]*m")


def exceptions_in_log(text: str) -> list[str]:
    """The exceptions a log names, each once, first ones first."""
    found: list[str] = []
    for line in text.splitlines():
        m = _EXCEPTION.search(_ANSI.sub("", line).strip())
        if m and m.group(1) not in found:
            found.append(m.group(1))
    return found


# Strong references: a child dropped without stop() must still be stopped at exit.
_live: set[ChildProcess] = set()


class ServerError(RuntimeError):
    pass


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class ChildProcess:
    """`argv` run until stop(), in a session of its own (its own process group), its
    output appended to `log_path`. `name` says what it is in errors."""

    def __init__(
        self,
        argv: Sequence[str],
        log_path: Path,
        env: Mapping[str, str] | None = None,
        name: str = "server",
    ) -> None:
        self.argv = list(argv)
        self.log_path = log_path
        self.env = dict(env) if env is not None else None
        self.name = name
        self._proc: subprocess.Popen[bytes] | None = None

    def start(self) -> Self:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "ab") as log:
            self._proc = subprocess.Popen(
                self.argv,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=self.env,
                start_new_session=True,  # its own process group: stop() reaches the workers
            )
        _live.add(self)
        return self

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc else None

    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def wait_for(self, ready: Callable[[], bool], timeout_seconds: float, poll: float) -> None:
        """Wait until `ready()` holds; raise with the log's tail if it dies or stalls."""
        deadline = time.monotonic() + timeout_seconds
        while time.monotonic() < deadline:
            if not self.running():
                raise ServerError(
                    f"{self.name} exited with code "
                    f"{self._proc.returncode if self._proc else '?'} "
                    f"before it was ready{self.errors_in_log()}:\n{self.log_tail()}"
                )
            if ready():
                return
            time.sleep(poll)
        raise ServerError(f"{self.name} not ready after {timeout_seconds:g}s:\n{self.log_tail()}")

    def log_text(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def log_tail(self, lines: int = 30) -> str:
        return "\n".join(self.log_text().splitlines()[-lines:])

    def errors_in_log(self, most: int = 3) -> str:
        """The exceptions the log names (`ModuleNotFoundError: …`), first ones first: a
        server's last lines often only say "see root cause above"."""
        found = exceptions_in_log(self.log_text())
        return f" ({'; '.join(found[:most])})" if found else ""

    def stop(self, grace_seconds: float = 15.0) -> int | None:
        """SIGTERM the whole process group, then SIGKILL what is left; the exit code
        (None when it was not running)."""
        proc, self._proc = self._proc, None
        if proc is None:
            return None
        _live.discard(self)
        code = None
        for sig, wait in ((signal.SIGTERM, grace_seconds), (signal.SIGKILL, 5.0)):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, sig)
                os.killpg(proc.pid, signal.SIGCONT)  # a stopped worker acts on it only then
            try:
                code = proc.wait(timeout=wait)
                break
            except subprocess.TimeoutExpired:
                continue
        # Workers may outlive the leader for a moment; make sure the group is gone.
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        return code

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


class ServerProcess(ChildProcess):
    """`command` + `args` (vLLM's flags), serving at `url` once /health answers."""

    def __init__(
        self,
        args: Sequence[str],
        log_path: Path,
        command: str = DEFAULT_COMMAND,
        port: int | None = None,
        env: Mapping[str, str] | None = None,
    ) -> None:
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        super().__init__(
            [*shlex.split(command), *args, "--host", "127.0.0.1", "--port", str(self.port)],
            log_path,
            {**os.environ, "HF_HUB_OFFLINE": "1", **(env or {})},
        )

    def wait_ready(self, timeout_seconds: float = 300.0) -> None:
        """Wait for /health to answer 200; raise with the log's tail if it dies or stalls."""
        self.wait_for(self._healthy, timeout_seconds, poll=0.5)

    def _healthy(self) -> bool:
        with contextlib.suppress(ScrapeError):
            fetch_once(self.url, "/health", timeout_seconds=2.0)
            return True
        return False


@atexit.register
def _stop_all() -> None:
    for server in list(_live):
        server.stop(grace_seconds=5.0)
