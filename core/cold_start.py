"""How long each start of vLLM took, stage by stage, as its log tells it.

`ColdStart.feed(line)` reads one start's stage lines per process (the patterns:
`log_patterns.py`; the processes: `log_writers.py`); `read_cold_starts(text)` gives every
start of a log; `derive.startup_stages` turns one into the stage seconds.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace

from vllm_glassbox.core.log_patterns import (
    COMPILE,
    ENGINE_INIT,
    GRAPHS,
    LOAD_TIME,
    MODEL_LOAD_TIME,
    READY,
    SERVED_MODEL,
    SERVER_START,
    LogTime,
    log_time,
    served_name,
)
from vllm_glassbox.core.log_writers import REPEATED, text_line, writer


def _add(per_process: Mapping[str, float], process: str, seconds: float) -> dict[str, float]:
    return {**per_process, process: per_process.get(process, 0.0) + seconds}


@dataclass(frozen=True)
class ColdStart:
    """One start of vLLM as its log tells it: what each stage took, as logged.

    Per-process values are kept apart (tensor-parallel ranks work side by side, so the
    slowest rank is the stage's time); `derive.startup_stages` makes the stage seconds.
    A field the version does not log stays empty or None.
    """

    starts: int = 0  # how many starts the log has shown so far (this one is the last)
    started_at: LogTime | None = None  # the server-version line
    ready_at: LogTime | None = None  # the first "Starting vLLM … server … on" line
    model_name: str | None = None  # served_model_name of the engine-config line
    model_load_seconds: Mapping[str, float] = field(default_factory=dict)  # latest per process
    weights_load_seconds: Mapping[str, float] = field(default_factory=dict)  # summed per process
    compile_seconds: Mapping[str, float] = field(default_factory=dict)  # summed per process
    cuda_graph_seconds: Mapping[str, float] = field(default_factory=dict)  # summed per process
    engine_init_seconds: float | None = None  # the slowest engine's; includes compile, graphs
    engine_init_compile_seconds: float | None = None  # its "(compilation: S s)"
    # A stage line came from behind a prefix glassbox does not know, or stands for several
    # ranks (Ray's deduplication): ranks cannot be told apart, so no stage is read
    # (derive.startup_stages).
    ranks_unknown: bool = False

    @property
    def ready_after_seconds(self) -> float | None:
        """Process start to ready: the log's time from the server-version line to the API
        server's "Starting vLLM … server … on" line."""
        if self.started_at is None or self.ready_at is None:
            return None
        return self.started_at.seconds_until(self.ready_at)

    @property
    def start_label(self) -> str:
        """The start as a label value: its log time, "" when the log did not show it."""
        return str(self.started_at) if self.started_at else ""

    def _by(self, line: str, fact_at: int) -> tuple[ColdStart, str]:
        """The process that wrote a stage line, and this start marked when its ranks cannot
        be told apart (a prefix of no known shape, a line Ray deduplicated)."""
        who = writer(line, fact_at)
        unknown = who.unknown_prefix or ("across cluster]" in line and REPEATED.search(line))
        if unknown and not self.ranks_unknown:
            return replace(self, ranks_unknown=True), who.process
        return self, who.process

    def feed(self, raw_line: str) -> ColdStart:
        """This start after one more log line; a server-version line begins a new start."""
        line = text_line(raw_line)
        if SERVER_START.search(line):
            return ColdStart(starts=self.starts + 1, started_at=log_time(line))
        if READY.search(line):
            if self.ready_at is not None:  # the other API servers of the same start
                return self
            return replace(self, ready_at=log_time(line))
        if m := MODEL_LOAD_TIME.search(line):
            cold, process = self._by(line, m.start())
            loads = {**cold.model_load_seconds, process: float(m["sec"])}
            return replace(cold, model_load_seconds=loads)
        if m := LOAD_TIME.search(line):
            cold, process = self._by(line, m.start())
            weights = _add(cold.weights_load_seconds, process, float(m["sec"]))
            return replace(cold, weights_load_seconds=weights)
        if m := COMPILE.search(line):
            cold, process = self._by(line, m.start())
            compiled = _add(cold.compile_seconds, process, float(m["sec"]))
            return replace(cold, compile_seconds=compiled)
        if m := GRAPHS.search(line):
            cold, process = self._by(line, m.start())
            graphs = _add(cold.cuda_graph_seconds, process, float(m["sec"]))
            return replace(cold, cuda_graph_seconds=graphs)
        if m := ENGINE_INIT.search(line):
            seconds = float(m["sec"])
            if self.engine_init_seconds is not None and seconds <= self.engine_init_seconds:
                return self  # data-parallel engines each log theirs: the slowest counts
            compile_part = float(m["compile"]) if m["compile"] else None
            return replace(
                self, engine_init_seconds=seconds, engine_init_compile_seconds=compile_part
            )
        if self.model_name is None and (m := SERVED_MODEL.search(line)):
            return replace(self, model_name=served_name(m["name"]))
        return self


def read_cold_starts(text: str) -> list[ColdStart]:
    """Every start a log shows, oldest first (lines before the first start make one too,
    when they say anything)."""
    starts: list[ColdStart] = []
    current = ColdStart()
    for line in text.splitlines():
        fed = current.feed(line)
        if fed.starts != current.starts and current != ColdStart(starts=current.starts):
            starts.append(current)
        current = fed
    if current != ColdStart(starts=current.starts):
        starts.append(current)
    return starts


def latest_start(text: str) -> ColdStart | None:
    """The last start a server's log shows (the lab's figures of the server it started)."""
    starts = read_cold_starts(text)
    return starts[-1] if starts else None
