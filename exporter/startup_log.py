"""Startup facts from vLLM's log: weights, KV memory, KV tokens, the parallel layout.

No vLLM metric carries the size of the weights; the log does, in formats that changed
across versions (see docs/vllm-metrics.md §6):

    (EngineCore_DP0 pid=123) INFO 10-05 12:00:00 [gpu_model_runner.py:2653]
        Model loading took 14.9935 GiB and 6.123456 seconds          (one line in the log)
    ... Model loading took 15.5 GiB memory and 6.123456 seconds          (0.14+, rounded)
    ... Available KV cache memory: 26.05 GiB
    ... GPU KV cache size: 487,424 tokens                                   (≤0.27)
    ... CPU KV cache size: 524,288 tokens, Maximum concurrency for 2,048 tokens per request: 256.00x
    ... Initializing a V1 LLM engine (v0.24.0) with config: model='...', ...,
        dtype=torch.bfloat16, ..., tensor_parallel_size=2, pipeline_parallel_size=1,
        data_parallel_size=1, ...                                   (V0: "an LLM engine")

Who logs the weights differs: v0.11.0 logs every rank's shard, and every data-parallel
engine its own copy; from 0.11.1 only the first rank of a node logs (its shard). So the
facts keep every weights line by the process that wrote it, and the derivation core
(`derive.weights_from_log`) turns them into the whole model's bytes.

`StartupFacts.feed(line)` is pure; `LogFollower` is the I/O that tails the file across
restarts (truncation or rotation).

`ColdStart.feed(line)` reads the same log for how long one start took, stage by stage
(`read_cold_starts(text)` for every start of a log); `derive.startup_stages` turns it into
the stage seconds.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta

GIB = 1024**3

_ANSI = re.compile(r"\x1b\[[0-9;]*m")
# Numbers as vLLM writes them, and no longer: a line whose number does not fit (1.2.3, a
# thousand digits) is not a startup fact, so it never raises and never yields inf.
_NUMBER = r"[0-9]{1,15}(?:\.[0-9]{1,15})?"
_COUNT = r"[0-9]{1,3}(?:,[0-9]{3}){1,5}|[0-9]{1,18}"  # 487,424 or 487424
_PROCESS = re.compile(r"\((?P<proc>[A-Za-z0-9_\-\[\]]+) pid=(?P<pid>\d+)\)")
_WEIGHTS = re.compile(
    rf"(?:Model loading took|Loading model weights took) (?P<gib>{_NUMBER}) (?:GiB|GB)"
    rf"(?: memory)?(?: and (?P<sec>{_NUMBER}) seconds?)?"
)
_KV_MEMORY = re.compile(rf"Available KV cache memory: (?P<gib>{_NUMBER}) ?GiB")
_KV_TOKENS = re.compile(
    rf"(?P<device>[A-Za-z]+(?: \+ host)?) KV cache size: (?P<tokens>{_COUNT}) tokens"
)
_CONCURRENCY = re.compile(
    rf"Maximum concurrency for (?P<len>{_COUNT}) tokens per request: (?P<x>{_NUMBER})x"
)
_ENGINE_CONFIG = re.compile(r"Initializing an? (?:V1 )?LLM engine \(v[^)]*\) with config: ")
_LAYOUT = {
    name: re.compile(rf"(?<![\w.]){name}=([0-9]{{1,9}})(?![0-9])")
    for name in ("tensor_parallel_size", "pipeline_parallel_size", "data_parallel_size")
}
_DTYPE = re.compile(r"(?<![\w.])dtype=torch\.(\w{1,32})")
_DP_RANK = re.compile(r"_DP([0-9]{1,9})")
_LOAD_TIME = re.compile(rf"Loading weights took (?P<sec>{_NUMBER}) seconds")
# "vLLM API server version X" (older); the banner's "█  version X" (0.30+), or
# "vLLM server version X, serving model M" when the banner is off (VLLM_DISABLE_LOG_LOGO).
_SERVER_START = re.compile(
    r"(?:vLLM (?:API )?server version|█\s+version) (?P<version>[0-9][^\s,]{0,63})"
)


@dataclass(frozen=True)
class StartupFacts:
    """What the latest startup in a log said."""

    # "Model loading took" bytes by the process that logged them ("Worker_TP1:421").
    weights_by_rank: dict[str, float] = field(default_factory=dict)
    model_load_seconds: float | None = None
    weights_load_seconds: float | None = None
    kv_cache_memory_bytes: float | None = None
    kv_cache_tokens: int | None = None
    max_model_len: int | None = None
    max_concurrency: float | None = None
    vllm_version: str | None = None
    startups: int = 0  # how many startups the log has shown so far
    # The engine-config line: None where this version's line does not say.
    tensor_parallel: int | None = None
    pipeline_parallel: int | None = None
    data_parallel: int | None = None
    model_dtype: str | None = None  # "bfloat16", "float32", ...

    def weights_by_engine(self) -> dict[int, list[float]]:
        """The logged weights by data-parallel engine: one entry per process that logged
        (a shard under tensor or pipeline parallelism, else the whole copy)."""
        engines: dict[int, list[float]] = {}
        for rank, size in self.weights_by_rank.items():
            m = _DP_RANK.search(rank.partition(":")[0])
            engines.setdefault(int(m.group(1)) if m else 0, []).append(size)
        return engines

    def feed(self, raw_line: str) -> StartupFacts:
        """The facts after one more log line (a new startup clears the old facts)."""
        line = _ANSI.sub("", raw_line)
        if m := _SERVER_START.search(line):
            return StartupFacts(vllm_version=m.group("version"), startups=self.startups + 1)
        if m := _WEIGHTS.search(line):
            proc = _PROCESS.search(line)
            rank = proc.group("proc") + ":" + proc.group("pid") if proc else "main"
            facts = self
            if rank in self.weights_by_rank:  # the same rank loading again: a restart
                # whose engine-config line, logged before its weights, is the latest one.
                facts = replace(
                    StartupFacts(startups=self.startups + 1),
                    tensor_parallel=self.tensor_parallel,
                    pipeline_parallel=self.pipeline_parallel,
                    data_parallel=self.data_parallel,
                    model_dtype=self.model_dtype,
                )
            seconds = float(m.group("sec")) if m.group("sec") else facts.model_load_seconds
            return replace(
                facts,
                weights_by_rank={**facts.weights_by_rank, rank: float(m.group("gib")) * GIB},
                model_load_seconds=seconds,
                startups=max(facts.startups, 1),
            )
        if _ENGINE_CONFIG.search(line):
            return _with_engine_config(self, line)
        if m := _KV_MEMORY.search(line):
            return replace(self, kv_cache_memory_bytes=float(m.group("gib")) * GIB)
        if m := _LOAD_TIME.search(line):
            return replace(self, weights_load_seconds=float(m.group("sec")))
        facts = self
        if m := _KV_TOKENS.search(line):
            facts = replace(facts, kv_cache_tokens=int(m.group("tokens").replace(",", "")))
        if m := _CONCURRENCY.search(line):
            facts = replace(
                facts,
                max_model_len=int(m.group("len").replace(",", "")),
                max_concurrency=float(m.group("x")),
            )
        return facts


def _with_engine_config(facts: StartupFacts, line: str) -> StartupFacts:
    sizes = {name: int(m.group(1)) for name, p in _LAYOUT.items() if (m := p.search(line))}
    dtype = _DTYPE.search(line)
    return replace(
        facts,
        tensor_parallel=sizes.get("tensor_parallel_size", facts.tensor_parallel),
        pipeline_parallel=sizes.get("pipeline_parallel_size", facts.pipeline_parallel),
        data_parallel=sizes.get("data_parallel_size", facts.data_parallel),
        model_dtype=dtype.group(1) if dtype else facts.model_dtype,
    )


def read_facts(text: str) -> StartupFacts:
    facts = StartupFacts()
    for line in text.splitlines():
        facts = facts.feed(line)
    return facts


# --- cold start: how long each start took, stage by stage ------------------------------
#
# Every vLLM line carries "LEVEL MM-DD HH:MM:SS" (no year, local time), every version.
# A start begins at the server-version line (_SERVER_START, vLLM's first line of a start)
# and is ready at the API server's "Starting vLLM API server 0 on http://…" (≤0.2x) or
# "Starting vLLM server on http://…" (0.24+); uvicorn's "Application startup complete."
# carries no time. Stage lines, per process unless said otherwise:
#   Model loading took 14.9935 GiB and 6.123456 seconds          (0.11; later "GiB memory")
#   Loading weights took 1.21 seconds                            (every version, CPU build too)
#   torch.compile takes 20.78 s in total                         (0.11–0.2x)
#   [backbone] torch.compile took 27.96 s in total               (later; a tag per model)
#   Graph capturing finished in 8 secs, took 0.46 GiB            (CUDA graphs)
#   init engine (profile, create kv cache, warmup model) took 44.12 seconds   (engine core)
#   init engine (...) took 51.14 s (compilation: 28.87 s)                     (0.2x+)

_LOG_TIME = re.compile(
    r"\b(?:DEBUG|INFO|WARNING|ERROR|CRITICAL) "
    r"(?P<mon>\d\d)-(?P<day>\d\d) (?P<h>\d\d):(?P<m>\d\d):(?P<s>\d\d)\b"
)
_READY = re.compile(r"Starting vLLM (?:API )?server(?: \d+)? on ")
_SERVED_MODEL = re.compile(r"\bserved_model_name=(?P<name>[^,\s]+)")
_MODEL_LOAD_TIME = re.compile(
    r"Model loading took [0-9.]+ (?:GiB|GB)(?: memory)? and (?P<sec>[0-9.]+) seconds"
)
_COMPILE = re.compile(
    r"torch\.compile (?:and initial profiling/warmup run together )?"
    r"(?:takes|took) (?P<sec>[0-9.]+) s in total"
)
_GRAPHS = re.compile(r"Graph capturing finished in (?P<sec>[0-9.]+) secs?")
_ENGINE_INIT = re.compile(
    r"init engine \(profile, create kv cache, warmup model\) took (?P<sec>[0-9.]+) "
    r"(?:seconds|s)(?: \(compilation: (?P<compile>[0-9.]+) s)?"
)


@dataclass(frozen=True, order=True)
class LogTime:
    """A vLLM log timestamp: month, day and second of the day (the log has no year)."""

    month: int
    day: int
    second_of_day: int

    def __str__(self) -> str:
        h, rest = divmod(self.second_of_day, 3600)
        return f"{self.month:02d}-{self.day:02d} {h:02d}:{rest // 60:02d}:{rest % 60:02d}"

    def seconds_until(self, later: LogTime) -> float:
        """Seconds from this time to a later one of the same log (across New Year too)."""
        # A common year unless a date is 29 February (only leap years have one).
        year = 2000 if (2, 29) in ((self.month, self.day), (later.month, later.day)) else 2001
        start = datetime(year, self.month, self.day) + timedelta(seconds=self.second_of_day)
        end = datetime(year, later.month, later.day) + timedelta(seconds=later.second_of_day)
        if end < start:  # the log went past 31 December
            end += timedelta(days=365)
        return (end - start).total_seconds()


def log_time(line: str) -> LogTime | None:
    """The timestamp of a vLLM log line (ANSI codes already removed), if it has one."""
    m = _LOG_TIME.search(line)
    if m is None:
        return None
    try:
        datetime(2000, int(m["mon"]), int(m["day"]))  # a real date (2000 has 29 February)
    except ValueError:
        return None
    second = int(m["h"]) * 3600 + int(m["m"]) * 60 + int(m["s"])
    return LogTime(int(m["mon"]), int(m["day"]), second)


def _process(line: str) -> str:
    """The process a line comes from ("Worker_TP0:985"), or "main" without a prefix."""
    proc = _PROCESS.search(line)
    return proc.group("proc") + ":" + proc.group("pid") if proc else "main"


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
    engine_init_seconds: float | None = None  # includes compile and graph capture
    engine_init_compile_seconds: float | None = None  # its "(compilation: S s)"

    @property
    def start_label(self) -> str:
        """The start as a label value: its log time, "" when the log did not show it."""
        return str(self.started_at) if self.started_at else ""

    def feed(self, raw_line: str) -> ColdStart:
        """This start after one more log line; a server-version line begins a new start."""
        line = _ANSI.sub("", raw_line)
        if _SERVER_START.search(line):
            return ColdStart(starts=self.starts + 1, started_at=log_time(line))
        if _READY.search(line):
            if self.ready_at is not None:  # the other API servers of the same start
                return self
            return replace(self, ready_at=log_time(line))
        if m := _MODEL_LOAD_TIME.search(line):
            loads = {**self.model_load_seconds, _process(line): float(m["sec"])}
            return replace(self, model_load_seconds=loads)
        if m := _LOAD_TIME.search(line):
            weights = _add(self.weights_load_seconds, _process(line), float(m["sec"]))
            return replace(self, weights_load_seconds=weights)
        if m := _COMPILE.search(line):
            compiled = _add(self.compile_seconds, _process(line), float(m["sec"]))
            return replace(self, compile_seconds=compiled)
        if m := _GRAPHS.search(line):
            graphs = _add(self.cuda_graph_seconds, _process(line), float(m["sec"]))
            return replace(self, cuda_graph_seconds=graphs)
        if m := _ENGINE_INIT.search(line):
            compile_part = float(m["compile"]) if m["compile"] else None
            return replace(
                self,
                engine_init_seconds=float(m["sec"]),
                engine_init_compile_seconds=compile_part,
            )
        if self.model_name is None and (m := _SERVED_MODEL.search(line)):
            return replace(self, model_name=m["name"])
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


class LogFollower:
    """Tails a log file: new lines since the last call, across truncation and rotation."""

    def __init__(self, path: str, max_line_bytes: int = 64 * 1024) -> None:
        self.path = path
        self.max_line_bytes = max_line_bytes
        self._inode: int | None = None
        self._offset = 0
        self._partial = b""
        self.facts = StartupFacts()
        self.cold_start = ColdStart()

    def poll(self, max_bytes: int = 4 * 1024 * 1024) -> StartupFacts:
        """Read what was appended (at most max_bytes per call) and update the facts."""
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            return self.facts
        if st.st_ino != self._inode or st.st_size < self._offset:
            self._inode, self._offset, self._partial = st.st_ino, 0, b""  # rotated/truncated
        if st.st_size == self._offset:
            return self.facts
        with open(self.path, "rb") as f:
            f.seek(self._offset)
            chunk = f.read(max_bytes)
        self._offset += len(chunk)
        lines = (self._partial + chunk).split(b"\n")
        self._partial = lines.pop()
        if len(self._partial) > self.max_line_bytes:  # a runaway line: drop it
            self._partial = b""
        for line in lines:
            text = line[: self.max_line_bytes].decode("utf-8", "replace")
            self.facts = self.facts.feed(text)
            self.cold_start = self.cold_start.feed(text)
        return self.facts
