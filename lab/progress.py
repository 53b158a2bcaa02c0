"""The live progress display on stderr.

On a terminal one line is repainted twice a second: phase, variant, elapsed time, what
is happening, generated tokens and a bar. Anywhere else (CI logs, a Kubernetes Job) it
prints plain lines: when something starts or ends, and a status line at most every
`quiet_seconds`.
"""

from __future__ import annotations

import shutil
import sys
import threading
import time
from collections.abc import Callable
from typing import TextIO

BAR_WIDTH = 24


def bar(done: float, total: float, width: int = BAR_WIDTH) -> str:
    filled = 0 if total <= 0 else min(width, int(width * done / total))
    return "█" * filled + "░" * (width - filled)


def clock_text(seconds: float) -> str:
    m, sec = divmod(int(seconds), 60)
    h, m = divmod(m, 60)
    return f"{h}:{m:02d}:{sec:02d}" if h else f"{m}:{sec:02d}"


def number_text(value: float | None, unit: str = "", scale: float = 1.0, digits: int = 3) -> str:
    """A number in a progress line: `digits` significant digits, – when unknown."""
    return "–" if value is None else f"{value * scale:.{digits}g}{unit}"


class Progress:
    def __init__(
        self,
        stream: TextIO | None = None,
        tty: bool | None = None,
        clock: Callable[[], float] = time.monotonic,
        quiet_seconds: float = 15.0,
    ) -> None:
        self.stream = stream or sys.stderr
        self.tty = self.stream.isatty() if tty is None else tty
        self.clock = clock
        self.quiet_seconds = quiet_seconds
        self._lock = threading.Lock()
        self._where = ""
        self._status = ""
        self._tokens: tuple[float, float] | None = None
        self._started = clock()
        self._last_plain = 0.0
        self._stop = threading.Event()
        self._painter: threading.Thread | None = None

    def __enter__(self) -> Progress:
        if self.tty:
            self._painter = threading.Thread(target=self._paint_loop, name="progress", daemon=True)
            self._painter.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._painter:
            self._painter.join(timeout=2)
        if self.tty:
            self._write("\r\x1b[K")

    def begin(self, phase: str, variant: str | None = None) -> None:
        with self._lock:
            self._where = phase + (f" › {variant}" if variant else "")
            self._status, self._tokens = "", None
            self._started = self.clock()

    def status(self, text: str) -> None:
        with self._lock:
            changed = text != self._status
            self._status = text
        if changed:
            self._plain(force=True)

    def tokens(self, done: float, total: float) -> None:
        with self._lock:
            self._tokens = (done, total)
        self._plain(force=False)

    def note(self, text: str) -> None:
        """A permanent line (a result, a warning)."""
        with self._lock:
            self._write(("\r\x1b[K" if self.tty else "") + text + "\n")

    def line(self) -> str:
        elapsed = clock_text(self.clock() - self._started)
        text = f"{self._where}  {elapsed}  {self._status}"
        if self._tokens is not None:
            done, total = self._tokens
            text += f"  {bar(done, total)} {int(done):,}/{int(total):,} tokens"
        return text

    def _plain(self, force: bool) -> None:
        if self.tty:
            return
        now = self.clock()
        with self._lock:
            if force or now - self._last_plain >= self.quiet_seconds:
                self._last_plain = now
                self._write(self.line() + "\n")

    def _paint_loop(self) -> None:
        while not self._stop.wait(0.5):
            with self._lock:
                if self._where:
                    # A line longer than the terminal would wrap and never be erased.
                    width = shutil.get_terminal_size().columns
                    self._write("\r\x1b[K" + self.line()[: max(width - 1, 20)])

    def _write(self, text: str) -> None:
        try:
            self.stream.write(text)
            self.stream.flush()
        except (OSError, ValueError):  # a closed stderr must not stop the lab
            pass
