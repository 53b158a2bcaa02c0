"""Who wrote a line of vLLM's log: the process prefixes of every version and launcher, and
vLLM's JSON records read as the text lines they stand for.

The process that wrote a line (`writer`) places it: a tensor- or pipeline-parallel rank,
a data-parallel engine, or a prefix of no known shape, which glassbox names rather than
guesses. What the lines say is read by `startup_log.py` and `cold_start.py`.
"""

from __future__ import annotations

import functools
import json
import re
from dataclasses import dataclass

_ANSI = re.compile(r"\x1b\[[0-9;]*m")


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
JSON_UNPLACED = "(json record without process)"
_JSON_LEVELS = frozenset(("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"))


@functools.lru_cache(maxsize=64)  # a follower feeds each line to the facts and the start
def text_line(raw_line: str) -> str:
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
    # The level ends the prefixes (LEVEL); a record without one reads as INFO.
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
        who = JSON_UNPLACED
    logger = record.get("name")
    where = logger if isinstance(logger, str) and logger else "-"
    return f"{who} {head} [{where[:128]}] {message}"


_PREFIX = re.compile(
    r"\((?:(?P<name>[^()\s][^()]{0,127}?) )?pid=(?P<pid>[0-9]{1,10})"
    r"(?:, ip=(?P<ip>[0-9A-Fa-f.:]{1,45}))?\)"
)
# The level and its date; a JSON record without a time has "LEVEL [logger]" (text_line).
LEVEL = re.compile(r"\b(?:DEBUG|INFO|WARNING|ERROR|CRITICAL) (?:\d\d-\d\d |\[)")
UNKNOWN_ENGINE = "?"  # a process behind a prefix glassbox does not know
# Ray prints one line for N alike lines of its workers (numbers ignored), the first of
# them shown: "(RayWorkerWrapper pid=7, ip=…) INFO … took 24.4 GB [repeated 3x across cluster]".
REPEATED = re.compile(r"\[repeated (?P<n>[0-9]{1,6})x across cluster\]")
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
    level = LEVEL.search(line, 0, before if before is not None else len(line))
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
