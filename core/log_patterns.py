"""How vLLM writes what glassbox reads in its log, version by version: the patterns of
the startup facts and of the cold-start stages, and the log's timestamps.

    Model loading took 14.9935 GiB and 6.123456 seconds          (one line in the log)
    ... Model loading took 15.5 GiB memory and 6.123456 seconds          (0.14+, rounded)
    ... Available KV cache memory: 26.05 GiB
    ... GPU KV cache size: 487,424 tokens                                   (≤0.27)
    ... CPU KV cache size: 524,288 tokens, Maximum concurrency for 2,048 tokens per request: 256.00x
    ... Initializing a V1 LLM engine (v0.24.0) with config: model='...', ...,
        dtype=torch.bfloat16, ..., tensor_parallel_size=2, pipeline_parallel_size=1,
        data_parallel_size=1, ...                                   (V0: "an LLM engine")

A new version's wording is a change here (docs/vllm-metrics.md §6); who wrote a line is
`log_writers.py`, what glassbox makes of the lines `startup_log.py` and `cold_start.py`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import datetime, timedelta

from vllm_glassbox.core.units import GIB

# Numbers as vLLM writes them, and no longer: a line whose number does not fit (1.2.3, a
# thousand digits) is not a startup fact, so it never raises and never yields inf.
_NUMBER = r"[0-9]{1,15}(?:\.[0-9]{1,15})?"
_COUNT = r"[0-9]{1,3}(?:,[0-9]{3}){1,5}|[0-9]{1,18}"  # 487,424 or 487424
WEIGHTS = re.compile(
    rf"(?:Model loading took|Loading model weights took) (?P<size>{_NUMBER}) (?P<unit>GiB|GB|MB)"
    rf"(?: memory)?(?: and (?P<sec>{_NUMBER}) seconds?)?"
)
# vLLM's "GB" and "MB" are binary units (it divides by 2**30 and 2**20).
UNIT_BYTES = {"GiB": GIB, "GB": GIB, "MB": 1024**2}
KV_MEMORY = re.compile(rf"Available KV cache memory: (?P<gib>{_NUMBER}) ?GiB")
KV_TOKENS = re.compile(
    rf"(?P<device>[A-Za-z]+(?: \+ host)?) KV cache size: (?P<tokens>{_COUNT}) tokens"
)
CONCURRENCY = re.compile(
    rf"Maximum concurrency for (?P<len>{_COUNT}) tokens per request: (?P<x>{_NUMBER})x"
)
ENGINE_CONFIG = re.compile(  # 0.3 names no version
    r"Initializing an? (?:V[01] )?LLM engine (?:\(v(?P<version>[^)\s]{1,64})\) )?with config: "
)
LAYOUT = {
    name: re.compile(rf"(?<![\w.]){name}=([0-9]{{1,9}})(?![0-9])")
    for name in ("tensor_parallel_size", "pipeline_parallel_size", "data_parallel_size")
}
DTYPE = re.compile(r"(?<![\w.])dtype=torch\.(\w{1,32})")
# The checkpoint a start loads and the name it serves it as (the page's model_name).
CONFIG_MODEL = re.compile(r"with config: model='(?P<model>[^']{1,1024})'")
CONFIG_SERVED = re.compile(r"\bserved_model_name=(?P<name>[^,\s]{1,1024})")
LOAD_TIME = re.compile(rf"Loading weights took (?P<sec>{_NUMBER}) seconds")
# "vLLM API server version X" (older); the banner's "█  version X" (0.30+), or
# "vLLM server version X, serving model M" when the banner is off (VLLM_DISABLE_LOG_LOGO).
SERVER_START = re.compile(
    r"(?:vLLM (?:API )?server version|█\s+version) (?P<version>[0-9][^\s,]{0,63})"
)
# How many API servers a start runs (--api-server-count; data parallelism's default from
# 0.2x): the launcher's "Started N API server processes" (0.11+), the non-default args, the
# default taken from data parallelism; and each server's prefix, "(ApiServer_<n> pid=…)"
# where several run, "(APIServer pid=…)" where one does.
API_SERVERS = re.compile(
    r"Started (?P<started>[0-9]{1,4}) API server processes"
    r"|'api_server_count': (?P<flag>[0-9]{1,4})"
    r"|Defaulting api_server_count to \w{1,40} \((?P<default>[0-9]{1,4})\)"
)
API_SERVER_PREFIX = re.compile(r"\((?:ApiServer_(?P<index>[0-9]{1,4})|(?P<one>APIServer)) pid=")
# V0's KV pool in blocks ("# GPU blocks: 5691, # CPU blocks: 2048"; "# npu blocks" on
# Ascend, "# cuda blocks" on some builds): tokens need the page's block size.
V0_BLOCKS = re.compile(r"# (?:[A-Za-z]{1,8}) blocks: (?P<blocks>[0-9]{1,12}), # CPU blocks")
# Expert parallelism: the flag (the non-default-args line, an engine-config line that
# prints it), or the MoE layer's "[EP Rank 0/2] Expert parallelism is enabled." (0.2x+,
# printed only with EP). Not parallel_state's "…, EP rank 1": vLLM prints it without
# expert parallelism too (dense models under DP on 0.11, every MoE model later). Workers
# named …_EP<e> (Writer.expert_parallel) are evidence as well.
EXPERT_PARALLEL = re.compile(
    r"'enable_expert_parallel': True|enable_expert_parallel=True"
    r"|Expert parallelism is enabled"
)
# A hybrid model (attention beside mamba layers) shares its KV blocks between groups.
HYBRID_KV = re.compile(r"mamba page size|attention page size is >= mamba")

# The lines of a stage that ranks run side by side (one per rank).
STAGE_LINE = re.compile(
    r"Model loading took|Loading weights took|torch\.compile (?:takes|took)"
    r"|Graph capturing finished"
)


# --- cold start: how long each start took, stage by stage ------------------------------
#
# Every vLLM line carries "LEVEL MM-DD HH:MM:SS" (no year, local time), every version.
# A start begins at the server-version line (SERVER_START, vLLM's first line of a start)
# and is ready at the API server's "Starting vLLM API server 0 on http://…" (≤0.2x) or
# "Starting vLLM server on http://…" (0.24+), or the Rust front end's "(RustFrontend
# pid=…) INFO … OpenAI server is ready to accept requests" (VLLM_USE_RUST_FRONTEND=1);
# uvicorn's "Application startup complete." carries no time. Stage lines, per process
# unless said otherwise:
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
READY = re.compile(
    r"Starting vLLM (?:API )?server(?: \d+)? on |\bOpenAI server is ready to accept requests\b"
)
SERVED_MODEL = re.compile(r"\bserved_model_name=(?P<name>[^,\s]+)")
MODEL_LOAD_TIME = re.compile(
    r"Model loading took [0-9.]+ (?:GiB|GB)(?: memory)? and (?P<sec>[0-9.]+) seconds"
)
COMPILE = re.compile(
    r"torch\.compile (?:and initial profiling/warmup run together )?"
    r"(?:takes|took) (?P<sec>[0-9.]+) s in total"
)
GRAPHS = re.compile(r"Graph capturing finished in (?P<sec>[0-9.]+) secs?")
ENGINE_INIT = re.compile(
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


def served_name(raw: str) -> str:
    """The name without the ")" that closes 0.4's engine-config line."""
    return raw[:-1] if raw.endswith(")") and raw.count(")") > raw.count("(") else raw
