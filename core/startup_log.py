"""Startup facts from vLLM's log: weights, KV memory, KV tokens, the parallel layout.

No vLLM metric carries the size of the weights; the log does, in wordings that changed
across versions (`log_patterns.py`, docs/vllm-metrics.md §6).

Who logs the weights differs: V0 and v0.11.0 log every rank's shard, and every
data-parallel engine its own copy; from 0.11.1 only the first rank of a node logs (its
shard). So the facts keep every weights line by the process that wrote it (its log
prefix, `log_writers.writer`) and the engine it belongs to, and the derivation core
(`derive.weights_from_log`) turns them into the whole model's bytes. What the log does not
let glassbox place (a prefix of no known shape, workers of several engines, experts split
across engines) is named by `StartupFacts.unrecognised()` and gives no weights.

`StartupFacts.feed(line)` is pure; `LogFollower` is the I/O that tails the file across
restarts (truncation or rotation) and feeds each line to the facts and to the cold start
(`cold_start.py`).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field, replace

from vllm_glassbox.core.cold_start import ColdStart
from vllm_glassbox.core.disagg_page import KvRole, role_in_log
from vllm_glassbox.core.log_patterns import (
    API_SERVER_PREFIX,
    API_SERVERS,
    CONCURRENCY,
    CONFIG_MODEL,
    CONFIG_SERVED,
    DTYPE,
    ENGINE_CONFIG,
    EXPERT_PARALLEL,
    HYBRID_KV,
    KV_MEMORY,
    KV_TOKENS,
    LAYOUT,
    SERVER_START,
    STAGE_LINE,
    UNIT_BYTES,
    V0_BLOCKS,
    WEIGHTS,
    served_name,
)
from vllm_glassbox.core.log_writers import (
    JSON_UNPLACED,
    LEVEL,
    REPEATED,
    UNKNOWN_ENGINE,
    Writer,
    text_line,
    writer,
)
from vllm_glassbox.core.units import GIB


@dataclass(frozen=True)
class StartupFacts:
    """What the latest startup in a log said."""

    # "Model loading took" bytes by the process that logged them ("Worker_TP1:421").
    weights_by_rank: dict[str, float] = field(default_factory=dict)
    # The data-parallel engine each of those processes belongs to, where its prefixes say.
    engine_of_rank: dict[str, str | None] = field(default_factory=dict)
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
    # How many API servers the start runs (API_SERVERS; the prefixes: at least the
    # highest ApiServer_<n> + 1, one where only "(APIServer pid=…)" writes).
    api_servers: int | None = None
    # The KV role and connector of `--kv-transfer-config` (the "non-default args" line).
    kv_role: KvRole | None = None
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
            or UNKNOWN_ENGINE in self.engine_of_rank.values()
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
                if who.unknown_prefix == JSON_UNPLACED
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
            api_servers=self.api_servers,
            kv_role=self.kv_role,
        )

    def _api_servers_in(self, line: str) -> StartupFacts:
        """The facts with what `line` says of the API servers (it names some)."""
        count = self.api_servers
        if m := API_SERVERS.search(line):
            count = max(int(m["started"] or m["flag"] or m["default"]), count or 0)
        if m := API_SERVER_PREFIX.search(line):
            count = max(int(m["index"]) + 1, count or 0) if m["index"] else count or 1
        return self if count == self.api_servers else replace(self, api_servers=count)

    def feed(self, raw_line: str) -> StartupFacts:
        """The facts after one more log line (a new startup clears the old facts)."""
        line = text_line(raw_line)
        if m := SERVER_START.search(line):
            return StartupFacts(vllm_version=m.group("version"), startups=self.startups + 1)
        facts = self
        if "(" in line and LEVEL.search(line):
            facts = facts._seeing(writer(line), line)
        if "Server" in line or "API server" in line or "api_server_count" in line:
            facts = facts._api_servers_in(line)
        if "kv_transfer_config" in line and (role := role_in_log(line)) is not None:
            facts = replace(facts, kv_role=role)
        repeated = REPEATED.search(line) if "across cluster]" in line else None
        if (
            repeated
            and STAGE_LINE.search(line)
            and "ray_deduplicated_lines" not in facts.unknown_lines
        ):
            # Hidden ranks' seconds: no stage is their slowest (RAY_DEDUP_LOGS=0 shows them).
            facts = replace(
                facts, unknown_lines={**facts.unknown_lines, "ray_deduplicated_lines": line[:200]}
            )
        if m := WEIGHTS.search(line):
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
            engine = UNKNOWN_ENGINE if who.unknown_prefix else who.engine
            size = float(m["size"]) * UNIT_BYTES[m["unit"]]
            return replace(
                facts,
                weights_by_rank={**facts.weights_by_rank, **dict.fromkeys(ranks, size)},
                engine_of_rank={**facts.engine_of_rank, **dict.fromkeys(ranks, engine)},
                startups=max(facts.startups, 1),
            )
        if m := ENGINE_CONFIG.search(line):
            facts = _with_engine_config(facts, line)
            if facts.vllm_version is None and m["version"]:  # no server-version line
                facts = replace(facts, vllm_version=m["version"])
            return facts
        if m := KV_MEMORY.search(line):
            return replace(facts, kv_cache_memory_bytes=float(m.group("gib")) * GIB)
        # A substring first: most lines are none of these, and the patterns scan the line.
        if "blocks: " in line and (m := V0_BLOCKS.search(line)):
            return replace(facts, kv_cache_blocks=int(m["blocks"]))
        expert_hint = "expert_parallel" in line or "Expert parallelism" in line
        if expert_hint and not facts.expert_parallel and EXPERT_PARALLEL.search(line):
            facts = replace(facts, expert_parallel=True)
        if "mamba" in line and not facts.hybrid_kv and HYBRID_KV.search(line):
            facts = replace(facts, hybrid_kv=True)
        if "KV cache size" in line and (m := KV_TOKENS.search(line)):
            tokens = int(m.group("tokens").replace(",", ""))
            if facts.kv_cache_tokens is not None:  # one line per rank (0.8): the smallest
                tokens = min(tokens, facts.kv_cache_tokens)
            facts = replace(facts, kv_cache_tokens=tokens)
        if m := CONCURRENCY.search(line):
            facts = replace(
                facts,
                max_model_len=int(m.group("len").replace(",", "")),
                max_concurrency=float(m.group("x")),
            )
        return facts


def _with_engine_config(facts: StartupFacts, line: str) -> StartupFacts:
    sizes = {name: int(m.group(1)) for name, p in LAYOUT.items() if (m := p.search(line))}
    dtype = DTYPE.search(line)
    model = CONFIG_MODEL.search(line)
    served = CONFIG_SERVED.search(line)
    return replace(
        facts,
        model=model["model"] if model else facts.model,
        served_model_name=served_name(served["name"]) if served else facts.served_model_name,
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
