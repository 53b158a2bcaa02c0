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

Who logs the weights differs: V0 and v0.11.0 log every rank's shard, and every
data-parallel engine its own copy; from 0.11.1 only the first rank of a node logs (its
shard). So the facts keep every weights line by the process that wrote it (its log
prefix, `writer`) and the engine it belongs to, and the derivation core
(`derive.weights_from_log`) turns them into the whole model's bytes. What the log does not
let glassbox place (a prefix of no known shape, workers of several engines, experts split
across engines) is named by `StartupFacts.unrecognised()` and gives no weights.

vLLM's JSON log (`--logging-config.formatter json`) is read record by record as the text
line each stands for (`_text_line`): its `process` and process name place it as the text
prefix does.

`StartupFacts.feed(line)` is pure; `LogFollower` is the I/O that tails the file across
restarts (truncation or rotation).

`ColdStart.feed(line)` reads the same log for how long one start took, stage by stage
(`read_cold_starts(text)` for every start of a log); `derive.startup_stages` turns it into
the stage seconds.
"""

from __future__ import annotations

import functools
import json
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta

from vllm_glassbox.units import GIB

_ANSI = re.compile(r"\x1b\[[0-9;]*m")
# Numbers as vLLM writes them, and no longer: a line whose number does not fit (1.2.3, a
# thousand digits) is not a startup fact, so it never raises and never yields inf.
_NUMBER = r"[0-9]{1,15}(?:\.[0-9]{1,15})?"
_COUNT = r"[0-9]{1,3}(?:,[0-9]{3}){1,5}|[0-9]{1,18}"  # 487,424 or 487424
_WEIGHTS = re.compile(
    rf"(?:Model loading took|Loading model weights took) (?P<size>{_NUMBER}) (?P<unit>GiB|GB|MB)"
    rf"(?: memory)?(?: and (?P<sec>{_NUMBER}) seconds?)?"
)
# vLLM's "GB" and "MB" are binary units (it divides by 2**30 and 2**20).
_UNIT_BYTES = {"GiB": GIB, "GB": GIB, "MB": 1024**2}
_KV_MEMORY = re.compile(rf"Available KV cache memory: (?P<gib>{_NUMBER}) ?GiB")
_KV_TOKENS = re.compile(
    rf"(?P<device>[A-Za-z]+(?: \+ host)?) KV cache size: (?P<tokens>{_COUNT}) tokens"
)
_CONCURRENCY = re.compile(
    rf"Maximum concurrency for (?P<len>{_COUNT}) tokens per request: (?P<x>{_NUMBER})x"
)
_ENGINE_CONFIG = re.compile(  # 0.3 names no version
    r"Initializing an? (?:V[01] )?LLM engine (?:\(v(?P<version>[^)\s]{1,64})\) )?with config: "
)
_LAYOUT = {
    name: re.compile(rf"(?<![\w.]){name}=([0-9]{{1,9}})(?![0-9])")
    for name in ("tensor_parallel_size", "pipeline_parallel_size", "data_parallel_size")
}
_DTYPE = re.compile(r"(?<![\w.])dtype=torch\.(\w{1,32})")
# The checkpoint a start loads and the name it serves it as (the page's model_name).
_CONFIG_MODEL = re.compile(r"with config: model='(?P<model>[^']{1,1024})'")
_CONFIG_SERVED = re.compile(r"\bserved_model_name=(?P<name>[^,\s]{1,1024})")
_LOAD_TIME = re.compile(rf"Loading weights took (?P<sec>{_NUMBER}) seconds")
# "vLLM API server version X" (older); the banner's "█  version X" (0.30+), or
# "vLLM server version X, serving model M" when the banner is off (VLLM_DISABLE_LOG_LOGO).
_SERVER_START = re.compile(
    r"(?:vLLM (?:API )?server version|█\s+version) (?P<version>[0-9][^\s,]{0,63})"
)
# V0's KV pool in blocks ("# GPU blocks: 5691, # CPU blocks: 2048"; "# npu blocks" on
# Ascend, "# cuda blocks" on some builds): tokens need the page's block size.
_V0_BLOCKS = re.compile(r"# (?:[A-Za-z]{1,8}) blocks: (?P<blocks>[0-9]{1,12}), # CPU blocks")
# Expert parallelism: the flag (the non-default-args line, an engine-config line that
# prints it), or the MoE layer's "[EP Rank 0/2] Expert parallelism is enabled." (0.2x+,
# printed only with EP). Not parallel_state's "…, EP rank 1": vLLM prints it without
# expert parallelism too (dense models under DP on 0.11, every MoE model later). Workers
# named …_EP<e> (Writer.expert_parallel) are evidence as well.
_EXPERT_PARALLEL = re.compile(
    r"'enable_expert_parallel': True|enable_expert_parallel=True"
    r"|Expert parallelism is enabled"
)
# A hybrid model (attention beside mamba layers) shares its KV blocks between groups.
_HYBRID_KV = re.compile(r"mamba page size|attention page size is >= mamba")


# --- who wrote a line -----------------------------------------------------------------
#
# vLLM's child processes prefix their lines with "(name pid=N)"; launchers nest their own
# outside it, and Ray adds the node's address:
#   (Worker_TP1 pid=421) INFO …                                  0.11+ (ANSI until 0.30)
#   (VllmWorker rank=1 pid=97) INFO …   (VllmWorker TP1 pid=9) INFO …        0.8–0.10
#   (VllmWorkerProcess pid=273) INFO …                           V0 multiprocessing
#   (RayWorkerWrapper pid=263, ip=10.0.16.95) INFO …             Ray, across nodes
#   (APIServer pid=1) (DPEngineCoreActor pid=7, ip=10.0.0.2) INFO …   Ray data parallel
#   (EngineCore_DP0 pid=559) (Worker_TP0 pid=566) INFO …         nested (Ascend)
# The innermost prefix is the process; the innermost engine prefix of the chain places it
# in its data-parallel engine. What a launcher writes before them ("[RAW SERVER] ", a
# timestamp, a container name) is skipped; a parenthesised group right before the level
# that is not a process prefix is a shape glassbox does not know.

# --- JSON records ----------------------------------------------------------------------
#
# With --logging-config.formatter json (0.32; or VLLM_LOGGING_CONFIG_PATH naming a
# dictConfig with python-json-logger's JsonFormatter), each line is one record and no line
# has a "(name pid=N)" prefix:
#   {"asctime": "2026-12-01 23:37:00,487", "levelname": "INFO", "name": "vllm.…",
#    "processName": "EngineCore_DP0", "process": 1100, "message": "…",
#    "vllm_process_name": "EngineCore_DP0"}
# A record is read as the text line vLLM would have written: "(name pid=N) LEVEL MM-DD
# HH:MM:SS [logger] message", its name vLLM's own (`vllm_process_name`, 0.32's record
# factory) or else multiprocessing's (`processName`: EngineCore_DP0, VllmWorker-1,
# MainProcess). A record that names no process cannot be placed in a process or engine:
# it is read behind a group that is no process prefix (json_record_without_process).

_JSON_TIME = re.compile(r"(?:[0-9]{4}-)?(?P<md>\d\d-\d\d)[ T](?P<hms>\d\d:\d\d:\d\d)")
_JSON_UNPLACED = "(json record without process)"
_JSON_LEVELS = frozenset(("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"))


@functools.lru_cache(maxsize=64)  # a follower feeds each line to the facts and the start
def _text_line(raw_line: str) -> str:
    """A log line as text: ANSI codes removed, a JSON record as vLLM's text line."""
    line = _ANSI.sub("", raw_line)
    if not line.startswith("{") or not line.rstrip().endswith("}"):
        return line
    try:
        record = json.loads(line)
    except ValueError:
        return line
    message = record.get("message", record.get("msg")) if isinstance(record, dict) else None
    if not isinstance(message, str):
        return line
    # The level ends the prefixes (_LEVEL); a record without one reads as INFO.
    level = record.get("levelname", record.get("level"))
    level = level.upper() if isinstance(level, str) and level.upper() in _JSON_LEVELS else "INFO"
    stamp = record.get("asctime", record.get("timestamp"))
    when = _JSON_TIME.match(stamp) if isinstance(stamp, str) else None
    head = f"{level} {when['md']} {when['hms']}" if when else level
    name = record.get("vllm_process_name") or record.get("processName")
    pid = record.get("process")
    if isinstance(pid, int) and not isinstance(pid, bool) and 0 <= pid < 10**10:
        who = f"({name} pid={pid})" if isinstance(name, str) and name else f"(pid={pid})"
    else:
        who = _JSON_UNPLACED
    logger = record.get("name")
    where = logger if isinstance(logger, str) and logger else "-"
    return f"{who} {head} [{where[:128]}] {message}"


_PREFIX = re.compile(
    r"\((?:(?P<name>[^()\s][^()]{0,127}?) )?pid=(?P<pid>[0-9]{1,10})"
    r"(?:, ip=(?P<ip>[0-9A-Fa-f.:]{1,45}))?\)"
)
# The level and its date; a JSON record without a time has "LEVEL [logger]" (_text_line).
_LEVEL = re.compile(r"\b(?:DEBUG|INFO|WARNING|ERROR|CRITICAL) (?:\d\d-\d\d |\[)")
_UNKNOWN_ENGINE = "?"  # a process behind a prefix glassbox does not know
# Ray prints one line for N alike lines of its workers (numbers ignored), the first of
# them shown: "(RayWorkerWrapper pid=7, ip=…) INFO … took 24.4 GB [repeated 3x across cluster]".
_REPEATED = re.compile(r"\[repeated (?P<n>[0-9]{1,6})x across cluster\]")
# The lines of a stage that ranks run side by side (one per rank).
_STAGE_LINE = re.compile(
    r"Model loading took|Loading weights took|torch\.compile (?:takes|took)"
    r"|Graph capturing finished"
)
_GROUP_AT_END = re.compile(r"\([^()]{1,200}\)\s*$")
# Data-parallel engines: EngineCore_DP<n> (0.11+), EngineCore_<n> (0.8–0.10), and the
# workers of one (Worker_DP<n>_TP<m>); EngineCore and DPEngineCoreActor without a number
# are engines too, each its own. Engine n means at least n + 1 engines, as TP ranks do;
# a worker is named _DP<n> only where there are several engines (0.32's
# multiproc_executor.py: "if dp_size > 1").
_ENGINE = re.compile(r"^(?:EngineCore|DPEngineCoreActor)(?:_(?:DP)?(?P<index>[0-9]{1,9}))?$")
_WORKER_OF_ENGINE = re.compile(r"^Worker_DP(?P<index>[0-9]{1,9})(?:_|$)")
# Ranks a worker's name states: Worker_TP1, Worker_PP1_TP0, VllmWorker TP1, VllmWorker rank=1,
# VllmWorker-1 (the multiprocessing name: a JSON record's processName, or a text line
# before vLLM renames the worker).
_TP_RANK = re.compile(r"(?:_| )TP(?P<n>[0-9]{1,6})(?:_|$)")
_PP_RANK = re.compile(r"(?:_| )PP(?P<n>[0-9]{1,6})(?:_|$)")
_ANY_RANK = re.compile(r"(?: rank=|^VllmWorker-)(?P<n>[0-9]{1,6})$")
# A worker of an expert-parallel rank: vLLM appends _EP<e> to a worker's name only with
# --enable-expert-parallel (Worker_DP0_TP1_EP1, Worker_DP1_EP1).
_EP_RANK = re.compile(r"_EP(?P<n>[0-9]{1,6})$")


@dataclass(frozen=True)
class Writer:
    """The process that wrote a log line, as its prefixes say."""

    process: str  # "Worker_TP1:421", "RayWorkerWrapper:263@10.0.16.95"; "main": no prefix
    name: str  # "Worker_TP1"; "" without a prefix
    engine: str | None  # "DP1", or an unnumbered engine process; None: the line does not say
    unknown_prefix: str | None = None  # a group before the level that is no process prefix
    tensor_ranks: int = 0  # the ranks its name implies: TP1 -> at least 2
    pipeline_ranks: int = 0
    data_ranks: int = 0  # the engines its prefixes imply: EngineCore_DP1 -> at least 2
    expert_parallel: bool = False  # a worker of an expert-parallel rank (…_EP<e>)


def _process_key(m: re.Match[str]) -> str:
    key = f"{m['name'] or ''}:{m['pid']}"
    return f"{key}@{m['ip']}" if m["ip"] else key


def _engine_of(m: re.Match[str]) -> str | None:
    name = m["name"] or ""
    if e := _ENGINE.match(name):
        return f"DP{e['index']}" if e["index"] else _process_key(m)
    if w := _WORKER_OF_ENGINE.match(name):
        return f"DP{w['index']}"
    return None


def _engines_implied(m: re.Match[str]) -> int:
    """How many engines a prefix's name implies at least (0: it does not say)."""
    name = m["name"] or ""
    if (e := _ENGINE.match(name)) and e["index"]:
        return int(e["index"]) + 1
    if w := _WORKER_OF_ENGINE.match(name):
        return max(int(w["index"]) + 1, 2)
    return 0


def writer(line: str, before: int | None = None) -> Writer:
    """Who wrote a line (ANSI codes removed): the prefixes before its level, or before
    `before` (where the fact starts) on a line without a level."""
    level = _LEVEL.search(line, 0, before if before is not None else len(line))
    return _writer_of(line[: level.start()] if level else line[: before or 0], level is not None)


@functools.lru_cache(maxsize=4096)
def _writer_of(head: str, before_a_level: bool) -> Writer:
    """The writer a line's head names (cached: a log repeats a few heads)."""
    chain = list(_PREFIX.finditer(head))
    leftover = _GROUP_AT_END.search(_PREFIX.sub("", head)) if before_a_level else None
    unknown = leftover.group(0).strip() if leftover else None
    if not chain:
        return Writer("main", "", None, unknown)
    engines = [e for m in chain if (e := _engine_of(m))]
    inner = chain[-1]
    name = inner["name"] or ""
    tp = max((int(m["n"]) + 1 for m in _TP_RANK.finditer(name)), default=0)
    pp = max((int(m["n"]) + 1 for m in _PP_RANK.finditer(name)), default=0)
    if not tp and (m := _ANY_RANK.search(name)):  # "rank=N" counts TP × PP ranks
        tp = int(m["n"]) + 1
    engine = engines[-1] if engines else None
    dp = max((_engines_implied(m) for m in chain), default=0)
    ep = _EP_RANK.search(name) is not None
    return Writer(_process_key(inner), name, engine, unknown, tp, pp, dp, ep)


@dataclass(frozen=True)
class StartupFacts:
    """What the latest startup in a log said."""

    # "Model loading took" bytes by the process that logged them ("Worker_TP1:421").
    weights_by_rank: dict[str, float] = field(default_factory=dict)
    # The data-parallel engine each of those processes belongs to, where its prefixes say.
    engine_of_rank: dict[str, str | None] = field(default_factory=dict)
    model_load_seconds: float | None = None
    weights_load_seconds: float | None = None
    kv_cache_memory_bytes: float | None = None
    kv_cache_tokens: int | None = None  # the smallest a rank logged: what vLLM uses
    kv_cache_blocks: int | None = None  # V0's "# GPU blocks: N" (per engine)
    max_model_len: int | None = None
    max_concurrency: float | None = None
    vllm_version: str | None = None
    startups: int = 0  # how many startups the log has shown so far
    # The engine-config line: None where this version's line does not say.
    tensor_parallel: int | None = None
    pipeline_parallel: int | None = None
    data_parallel: int | None = None
    model_dtype: str | None = None  # "bfloat16", "float32", ...
    # Which model this start loaded (the engine-config line): the checkpoint (`model=`)
    # and the name it serves it as (`served_model_name=`, the page's model_name label).
    model: str | None = None
    served_model_name: str | None = None
    # What the process prefixes show: the engines, and how many tensor- and
    # pipeline-parallel ranks (a lower bound where no engine-config line says).
    engines_seen: frozenset[str] = frozenset()
    tensor_ranks_seen: int = 0
    pipeline_ranks_seen: int = 0
    data_ranks_seen: int = 0  # the engines the prefixes imply (EngineCore_1 -> at least 2)
    expert_parallel: bool = False
    hybrid_kv: bool = False  # the log says the KV pool is shared by layer groups
    # Shapes of lines glassbox does not read, with the first such line.
    unknown_lines: Mapping[str, str] = field(default_factory=dict)

    def weights_by_engine(self) -> dict[str, list[float]]:
        """The logged weights by data-parallel engine: one entry per process that logged
        (a shard under tensor or pipeline parallelism, else the whole copy). A process
        whose prefix names no engine belongs to the only engine there is; where several
        engines run it cannot be placed (`unplaced_weights`)."""
        only = next(iter(self.engines_seen)) if len(self.engines_seen) == 1 else "0"
        # One GPU per engine (TP = PP = 1) under several engines: an unplaced worker's
        # line is one engine's whole copy, not a shard to add to another worker's.
        own_copy = self._one_gpu_per_engine and len(self.engines_seen) > 1
        engines: dict[str, list[float]] = {}
        for rank, size in self.weights_by_rank.items():
            engine = self.engine_of_rank.get(rank) or (f"copy of {rank}" if own_copy else only)
            engines.setdefault(engine, []).append(size)
        return engines

    @property
    def _one_gpu_per_engine(self) -> bool:
        """The engine-config line says TP = PP = 1: every worker holds a whole copy."""
        return self.tensor_parallel == 1 and (self.pipeline_parallel or 1) == 1

    @property
    def unplaced_weights(self) -> bool:
        """Some weights line comes from a worker of one of several engines, which one the
        log does not say (0.8–0.10 workers under data parallelism). Where the engine-config
        line says one GPU per engine (TP = PP = 1), every worker holds the whole model
        whichever engine it serves (vLLM 0.24's `(Worker pid=…)` under DP on CUDA)."""
        return (
            not self._one_gpu_per_engine
            and len(self.engines_seen) > 1
            and any(self.engine_of_rank.get(rank) is None for rank in self.weights_by_rank)
        )

    @property
    def weights_readable(self) -> bool:
        """Whether the weights lines make the whole model: each placed in its engine, by
        prefixes glassbox knows, and no engine holding a share of the experts only."""
        return not (
            self.unplaced_weights
            or self.experts_split_across_engines
            or _UNKNOWN_ENGINE in self.engine_of_rank.values()
        )

    @property
    def experts_split_across_engines(self) -> bool:
        """Expert parallelism over data-parallel engines: each engine holds only its share
        of the experts, so no engine's copy is the whole model."""
        engines = max(len(self.engines_seen), self.data_ranks_seen, self.data_parallel or 1)
        return self.expert_parallel and engines > 1

    def unrecognised(self) -> dict[str, str]:
        """Shapes of this startup's log glassbox cannot read or place, each with a line or
        a sentence that shows it (`glassbox_input_unrecognised{source="log"}`)."""
        shapes = dict(self.unknown_lines)
        if self.unplaced_weights:
            shapes["unplaced_engine"] = "weights logged by workers of several engines: " + (
                ", ".join(r for r in self.weights_by_rank if self.engine_of_rank.get(r) is None)
            )
        if self.experts_split_across_engines and self.weights_by_rank:
            shapes["experts_across_engines"] = (
                "expert parallelism across data-parallel engines: no engine holds the model"
            )
        return shapes

    def _seeing(self, who: Writer, line: str) -> StartupFacts:
        """These facts with what one line's prefixes show (self when nothing new)."""
        engines = self.engines_seen
        if who.engine is not None and who.engine not in engines:
            engines = engines | {who.engine}
        unknown = self.unknown_lines
        if who.unknown_prefix is not None:
            shape = (
                "json_record_without_process"
                if who.unknown_prefix == _JSON_UNPLACED
                else "unknown_process_prefix"
            )
            if shape not in unknown:
                unknown = {**unknown, shape: line[:200]}
        if (
            engines is self.engines_seen
            and unknown is self.unknown_lines
            and who.tensor_ranks <= self.tensor_ranks_seen
            and who.pipeline_ranks <= self.pipeline_ranks_seen
            and who.data_ranks <= self.data_ranks_seen
            and (self.expert_parallel or not who.expert_parallel)
        ):
            return self
        return replace(
            self,
            engines_seen=engines,
            tensor_ranks_seen=max(who.tensor_ranks, self.tensor_ranks_seen),
            pipeline_ranks_seen=max(who.pipeline_ranks, self.pipeline_ranks_seen),
            data_ranks_seen=max(who.data_ranks, self.data_ranks_seen),
            expert_parallel=self.expert_parallel or who.expert_parallel,
            unknown_lines=unknown,
        )

    def _restarted(self) -> StartupFacts:
        """A new startup found by a process loading its weights again: its engine-config
        line and prefixes, logged before the weights, are the latest ones."""
        return replace(
            StartupFacts(startups=self.startups + 1),
            tensor_parallel=self.tensor_parallel,
            pipeline_parallel=self.pipeline_parallel,
            data_parallel=self.data_parallel,
            model_dtype=self.model_dtype,
            model=self.model,
            served_model_name=self.served_model_name,
            vllm_version=self.vllm_version,
            engines_seen=self.engines_seen,
            tensor_ranks_seen=self.tensor_ranks_seen,
            pipeline_ranks_seen=self.pipeline_ranks_seen,
            data_ranks_seen=self.data_ranks_seen,
            expert_parallel=self.expert_parallel,
            hybrid_kv=self.hybrid_kv,
        )

    def feed(self, raw_line: str) -> StartupFacts:
        """The facts after one more log line (a new startup clears the old facts)."""
        line = _text_line(raw_line)
        if m := _SERVER_START.search(line):
            return StartupFacts(vllm_version=m.group("version"), startups=self.startups + 1)
        facts = self
        if "(" in line and _LEVEL.search(line):
            facts = facts._seeing(writer(line), line)
        repeated = _REPEATED.search(line) if "across cluster]" in line else None
        if (
            repeated
            and _STAGE_LINE.search(line)
            and "ray_deduplicated_lines" not in facts.unknown_lines
        ):
            # Hidden ranks' seconds: no stage is their slowest (RAY_DEDUP_LOGS=0 shows them).
            facts = replace(
                facts, unknown_lines={**facts.unknown_lines, "ray_deduplicated_lines": line[:200]}
            )
        if m := _WEIGHTS.search(line):
            who = writer(line, m.start())
            # A repeated line stands for that many ranks, their shards taken as equal.
            ranks = [who.process]
            if repeated:
                n = int(repeated["n"])
                ranks = [f"{who.process} [{k} of {n} repeated]" for k in range(1, n + 1)]
            elif who.process in facts.weights_by_rank and who.unknown_prefix is None:
                # The same process loading again. Behind a prefix glassbox cannot place
                # (a JSON record naming no process) ranks look alike: no restart is inferred.
                facts = facts._restarted()
            seconds = float(m["sec"]) if m["sec"] else None
            if facts.model_load_seconds is not None:  # ranks load side by side: the slowest
                seconds = max(seconds or 0.0, facts.model_load_seconds)
            engine = _UNKNOWN_ENGINE if who.unknown_prefix else who.engine
            size = float(m["size"]) * _UNIT_BYTES[m["unit"]]
            return replace(
                facts,
                weights_by_rank={**facts.weights_by_rank, **dict.fromkeys(ranks, size)},
                engine_of_rank={**facts.engine_of_rank, **dict.fromkeys(ranks, engine)},
                model_load_seconds=seconds,
                startups=max(facts.startups, 1),
            )
        if m := _ENGINE_CONFIG.search(line):
            facts = _with_engine_config(facts, line)
            if facts.vllm_version is None and m["version"]:  # no server-version line
                facts = replace(facts, vllm_version=m["version"])
            return facts
        if m := _KV_MEMORY.search(line):
            return replace(facts, kv_cache_memory_bytes=float(m.group("gib")) * GIB)
        if m := _LOAD_TIME.search(line):
            slowest = max(float(m["sec"]), facts.weights_load_seconds or 0.0)
            return replace(facts, weights_load_seconds=slowest)
        # A substring first: most lines are none of these, and the patterns scan the line.
        if "blocks: " in line and (m := _V0_BLOCKS.search(line)):
            return replace(facts, kv_cache_blocks=int(m["blocks"]))
        expert_hint = "expert_parallel" in line or "Expert parallelism" in line
        if expert_hint and not facts.expert_parallel and _EXPERT_PARALLEL.search(line):
            facts = replace(facts, expert_parallel=True)
        if "mamba" in line and not facts.hybrid_kv and _HYBRID_KV.search(line):
            facts = replace(facts, hybrid_kv=True)
        if "KV cache size" in line and (m := _KV_TOKENS.search(line)):
            tokens = int(m.group("tokens").replace(",", ""))
            if facts.kv_cache_tokens is not None:  # one line per rank (0.8): the smallest
                tokens = min(tokens, facts.kv_cache_tokens)
            facts = replace(facts, kv_cache_tokens=tokens)
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
    model = _CONFIG_MODEL.search(line)
    served = _CONFIG_SERVED.search(line)
    return replace(
        facts,
        model=model["model"] if model else facts.model,
        served_model_name=_served_name(served["name"]) if served else facts.served_model_name,
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
    def start_label(self) -> str:
        """The start as a label value: its log time, "" when the log did not show it."""
        return str(self.started_at) if self.started_at else ""

    def _by(self, line: str, fact_at: int) -> tuple[ColdStart, str]:
        """The process that wrote a stage line, and this start marked when its ranks cannot
        be told apart (a prefix of no known shape, a line Ray deduplicated)."""
        who = writer(line, fact_at)
        unknown = who.unknown_prefix or ("across cluster]" in line and _REPEATED.search(line))
        if unknown and not self.ranks_unknown:
            return replace(self, ranks_unknown=True), who.process
        return self, who.process

    def feed(self, raw_line: str) -> ColdStart:
        """This start after one more log line; a server-version line begins a new start."""
        line = _text_line(raw_line)
        if _SERVER_START.search(line):
            return ColdStart(starts=self.starts + 1, started_at=log_time(line))
        if _READY.search(line):
            if self.ready_at is not None:  # the other API servers of the same start
                return self
            return replace(self, ready_at=log_time(line))
        if m := _MODEL_LOAD_TIME.search(line):
            cold, process = self._by(line, m.start())
            loads = {**cold.model_load_seconds, process: float(m["sec"])}
            return replace(cold, model_load_seconds=loads)
        if m := _LOAD_TIME.search(line):
            cold, process = self._by(line, m.start())
            weights = _add(cold.weights_load_seconds, process, float(m["sec"]))
            return replace(cold, weights_load_seconds=weights)
        if m := _COMPILE.search(line):
            cold, process = self._by(line, m.start())
            compiled = _add(cold.compile_seconds, process, float(m["sec"]))
            return replace(cold, compile_seconds=compiled)
        if m := _GRAPHS.search(line):
            cold, process = self._by(line, m.start())
            graphs = _add(cold.cuda_graph_seconds, process, float(m["sec"]))
            return replace(cold, cuda_graph_seconds=graphs)
        if m := _ENGINE_INIT.search(line):
            seconds = float(m["sec"])
            if self.engine_init_seconds is not None and seconds <= self.engine_init_seconds:
                return self  # data-parallel engines each log theirs: the slowest counts
            compile_part = float(m["compile"]) if m["compile"] else None
            return replace(
                self, engine_init_seconds=seconds, engine_init_compile_seconds=compile_part
            )
        if self.model_name is None and (m := _SERVED_MODEL.search(line)):
            return replace(self, model_name=_served_name(m["name"]))
        return self


def _served_name(raw: str) -> str:
    """The name without the ")" that closes 0.4's engine-config line."""
    return raw[:-1] if raw.endswith(")") and raw.count(")") > raw.count("(") else raw


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
