"""Capture the vLLM pages and startup logs in tests/fixtures from the real vLLM CPU build.

Run by hand (four vLLM CPU servers; a quarter of an hour on a shared two-core machine),
never by the suite:

    .venv/bin/python -m tests.capture_fixtures            # rewrites tests/fixtures/...

Two servers, each serving a tiny generated Qwen2 checkpoint as "tiny":

  plain  no speculation, a 16,384-token pool (128 blocks of 128 tokens):
         idle page, then three sequential requests of 64 tokens (a page after the first
         and after the third).
  spec   ngram speculation, a 4,096-token pool (32 blocks):
         idle page, two sequential 256-token requests on a repetitive prompt (a page
         after each), then a flood of 12 concurrent long requests that overflows the
         pool: a page mid-flood (requests waiting, preemptions seen) and one after.
  tp2    the plain server at --tensor-parallel-size 2,
  dp2    and at --data-parallel-size 2: idle page, then a page after two requests of 64.
  dp2-forms  the dp2 start twice, its startup log only: once as text, once with
         --logging-config.formatter json (vLLM's python-json-logger records).

Requests never overlap except in the flood, so the increase between two consecutive
pages is known by hand (e.g. 3 × 64 generated tokens, 3 first tokens, 3 × 63 decode
steps). Every page starts with comment lines saying what produced it; comments are
valid exposition text, so the pages are used as they are.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import datetime
import importlib.metadata
import json
import os
import re
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
from vllm_glassbox.core.snapshot import PREEMPTIONS, WAITING, read_snapshot
from vllm_glassbox.lab.backends.server_process import ServerError, ServerProcess
from vllm_glassbox.lab.backends.tinymodel import TinyModelSpec, generate

FIXTURES = Path(__file__).resolve().parent / "fixtures"
SPEC_CONFIG = (
    '{"method":"ngram","num_speculative_tokens":5,"prompt_lookup_max":4,"prompt_lookup_min":1}'
)
PLAIN_PROMPT = "Kubernetes is"
REPETITIVE_PROMPT = " ".join(["1 2 3 4 5"] * 10)
FLOOD_REQUESTS = 12
FLOOD_MAX_TOKENS = 1900
PLAIN_POOL_BYTES = 33554432  # 16,384 tokens of the tiny model (2,048 bytes per token)
SMALL_POOL_BYTES = 8388608  # 4,096 tokens: 32 blocks of 128


@dataclass
class Capture:
    """One server's session: its flags, the requests sent so far, the pages written."""

    name: str
    server: ServerProcess
    flags: list[str]
    out: Path
    header: list[str]
    sent: list[str] = field(default_factory=list)

    def page(self, path: str) -> str:
        r = httpx.get(self.server.url + path, timeout=10)
        r.raise_for_status()
        return r.text

    def save(self, filename: str, text: str, note: str) -> Path:
        lines = [
            *self.header,
            f"# server: {self.name}, flags: {' '.join(self.flags)}",
            "# requests completed before this page: "
            + ("; ".join(self.sent) if self.sent else "none"),
            f"# this page: {note}",
        ]
        path = self.out / filename
        path.write_text("".join(f"{line}\n" for line in lines) + text)
        print(f"  wrote {path.relative_to(FIXTURES.parent.parent)} ({len(text)} bytes)")
        return path


def complete(url: str, prompt: str, max_tokens: int, **extra: Any) -> dict[str, Any]:
    body = {
        "model": "tiny",
        "prompt": prompt,
        "max_tokens": max_tokens,
        "temperature": 0,
        "ignore_eos": True,
        **extra,
    }
    r = httpx.post(url + "/v1/completions", json=body, timeout=900)
    r.raise_for_status()
    result: dict[str, Any] = r.json()
    return result


def _request_note(prompt: str, max_tokens: int, **extra: Any) -> str:
    params = {"max_tokens": max_tokens, "temperature": 0, "ignore_eos": True, **extra}
    shown = prompt if len(prompt) < 30 else prompt[:20] + f"... ({len(prompt)} chars)"
    return f"completion {json.dumps(shown)} {json.dumps(params, sort_keys=True)}"


def _start(name: str, model_dir: Path, extra_flags: list[str], workdir: Path) -> ServerProcess:
    log_path = workdir / f"{name}.log"
    log_path.unlink(missing_ok=True)
    server = ServerProcess(_flags(model_dir, extra_flags), log_path=log_path)
    server.start()
    server.wait_ready()
    return server


def _keep_startup_log(server: ServerProcess, dest: Path) -> None:
    """The log as it stood when /health first answered: the startup, nothing after."""
    dest.write_text(server.log_text())
    print(f"  wrote {dest.relative_to(FIXTURES.parent.parent)}")


def capture_plain(model_dir: Path, workdir: Path, header: list[str]) -> None:
    flags = ["--kv-cache-memory-bytes", str(PLAIN_POOL_BYTES)]
    server = _start("plain", model_dir, flags, workdir)
    try:
        _keep_startup_log(server, FIXTURES / "logs" / "cpu-0.32-plain-startup.log")
        cap = Capture(
            "plain", server, _shown_flags(flags), FIXTURES / "metrics" / "cpu-0.32", header
        )
        (cap.out / "version.json").write_text(cap.page("/version"))
        cap.save("plain-idle.txt", cap.page("/metrics"), "(a) idle right after startup")
        for i in range(3):
            complete(server.url, PLAIN_PROMPT, 64)
            cap.sent.append(_request_note(PLAIN_PROMPT, 64))
            if i == 0:
                cap.save("plain-after-1x64.txt", cap.page("/metrics"), "after 1 request")
        cap.save("plain-after-3x64.txt", cap.page("/metrics"), "(b) after 3 requests of 64")
    finally:
        server.stop()


def _wait_for(
    page: Callable[[], str], accept: Callable[[str], bool], deadline: float
) -> str | None:
    while time.monotonic() < deadline:
        text = page()
        if accept(text):
            return text
        time.sleep(0.5)
    return None


def _preempting(text: str) -> bool:
    snap = read_snapshot(text)
    return any(
        e.gauges.get(WAITING, 0) > 0 and e.counters.get(PREEMPTIONS, 0) > 0
        for e in snap.engines.values()
    )


def capture_spec(model_dir: Path, workdir: Path, header: list[str]) -> None:
    flags = ["--kv-cache-memory-bytes", str(SMALL_POOL_BYTES), "--speculative-config", SPEC_CONFIG]
    server = _start("spec", model_dir, flags, workdir)
    try:
        _keep_startup_log(server, FIXTURES / "logs" / "cpu-0.32-spec-startup.log")
        cap = Capture(
            "spec", server, _shown_flags(flags), FIXTURES / "metrics" / "cpu-0.32", header
        )
        cap.save("spec-idle.txt", cap.page("/metrics"), "idle right after startup")
        for i in (1, 2):
            complete(server.url, REPETITIVE_PROMPT, 256, repetition_penalty=1.0)
            cap.sent.append(_request_note(REPETITIVE_PROMPT, 256, repetition_penalty=1.0))
            cap.save(
                f"spec-after-{i}x256.txt",
                cap.page("/metrics"),
                f"(c) after {i} repetitive request(s) of 256 tokens",
            )

        flood_note = f"{FLOOD_REQUESTS} concurrent " + _request_note(
            "Write an extremely long and detailed essay, number {i}.",
            FLOOD_MAX_TOKENS,
            temperature=0.7,
        )
        with concurrent.futures.ThreadPoolExecutor(max_workers=FLOOD_REQUESTS) as pool:
            futures = [
                pool.submit(
                    complete,
                    server.url,
                    f"Write an extremely long and detailed essay, number {i}.",
                    FLOOD_MAX_TOKENS,
                    temperature=0.7,
                )
                for i in range(FLOOD_REQUESTS)
            ]
            mid = _wait_for(lambda: cap.page("/metrics"), _preempting, time.monotonic() + 300)
            if mid is None:
                raise RuntimeError("the flood never showed waiting > 0 with preemptions > 0")
            cap.save(
                "flood-mid.txt",
                mid,
                f"(d) mid-flood (waiting > 0, preemptions > 0) during {flood_note}",
            )
            for f in futures:
                f.result()
        cap.sent.append(flood_note)
        cap.save("flood-after.txt", cap.page("/metrics"), "(d) after the flood completed")
    finally:
        server.stop()


PARALLEL_FLAGS = {
    "tp2": ["--tensor-parallel-size", "2"],
    "dp2": ["--data-parallel-size", "2"],
}


def capture_parallel(name: str, model_dir: Path, workdir: Path, header: list[str]) -> None:
    """The plain server split over two workers (tp2) or two engines (dp2), if the CPU
    build runs it: its startup log, an idle page, and a page after two 64-token requests.
    A refusal is kept as the log of the attempt (`logs/cpu-0.32-<name>-refused.log`)."""
    flags = [*PARALLEL_FLAGS[name], "--kv-cache-memory-bytes", str(PLAIN_POOL_BYTES)]
    flags.append("--enforce-eager")  # no torch.compile per worker: minutes less on 2 cores
    log_path = workdir / f"{name}.log"
    log_path.unlink(missing_ok=True)
    # Two CPU workers on this machine's one NUMA node: vLLM refuses to bind their threads
    # itself ("Not enough allowed NUMA nodes"), so each gets one core by hand.
    server = ServerProcess(
        _flags(model_dir, flags), log_path=log_path, env={"VLLM_CPU_OMP_THREADS_BIND": "0|1"}
    )
    server.start()
    try:
        try:
            server.wait_ready(timeout_seconds=900)
        except ServerError:
            refused = FIXTURES / "logs" / f"cpu-0.32-{name}-refused.log"
            refused.write_text(server.log_text())
            print(f"  the CPU build did not start with {' '.join(flags)}: see {refused}")
            return
        _keep_startup_log(server, FIXTURES / "logs" / f"cpu-0.32-{name}-startup.log")
        cap = Capture(name, server, _shown_flags(flags), FIXTURES / "metrics" / "cpu-0.32", header)
        cap.save(f"{name}-idle.txt", cap.page("/metrics"), "idle right after startup")
        for _ in range(2):
            complete(server.url, PLAIN_PROMPT, 64)
            cap.sent.append(_request_note(PLAIN_PROMPT, 64))
        cap.save(f"{name}-after-2x64.txt", cap.page("/metrics"), "after 2 requests of 64")
    finally:
        server.stop()


LOG_FORMS = {"text": [], "json": ["--logging-config.formatter", "json"]}


def capture_log_forms(model_dir: Path, workdir: Path) -> None:
    """The dp2 server's startup log in both of vLLM's log forms, the same flags otherwise:
    `logs/cpu-0.32-dp2-text-startup.log` and `logs/cpu-0.32-dp2-json-startup.log`."""
    for form, extra in LOG_FORMS.items():
        flags = [*PARALLEL_FLAGS["dp2"], "--kv-cache-memory-bytes", str(PLAIN_POOL_BYTES)]
        flags += ["--enforce-eager", *extra]
        log_path = workdir / f"dp2-{form}.log"
        log_path.unlink(missing_ok=True)
        server = ServerProcess(
            _flags(model_dir, flags), log_path=log_path, env={"VLLM_CPU_OMP_THREADS_BIND": "0|1"}
        )
        server.start()
        try:
            server.wait_ready(timeout_seconds=900)
            _keep_startup_log(server, FIXTURES / "logs" / f"cpu-0.32-dp2-{form}-startup.log")
        finally:
            server.stop()


# --- several API servers ---------------------------------------------------------------
#
# Each API server observes vllm:iteration_tokens_total once per engine step that had one of
# its own requests (vllm/v1/engine/async_llm.py's output handler); in multiprocess mode the
# page sums them. One long request A (LONG tokens, streamed) and, once A has its first
# token, SHORT_REQUESTS requests B of SHORT tokens one after another: every B runs inside
# A's steps, so the engine makes exactly LONG steps (each step of a B is one of A's). A
# single API server counts LONG; two count LONG + SHORT for every B the other API server
# took (the request log's "(ApiServer_<n> pid=…) … Received request … max_tokens=…" says
# which took which).
LONG, SHORT, SHORT_REQUESTS = 1536, 64, 4


def _serve_command(workdir: Path) -> tuple[str, dict[str, str]]:
    """`vllm serve` (the only launcher that runs several API servers) for the CPU build:
    its CLI and platform check read the version of a distribution named `vllm`, which
    vllm-cpu is not, so a stand-in `vllm` dist-info on PYTHONPATH names its version."""
    version = importlib.metadata.version("vllm-cpu")
    meta = workdir / "vllm-dist" / f"vllm-{version}+cpu.dist-info"
    meta.mkdir(parents=True, exist_ok=True)
    (meta / "METADATA").write_text(f"Metadata-Version: 2.1\nName: vllm\nVersion: {version}+cpu\n")
    (meta / "RECORD").write_text("")
    env = {**os.environ, "PYTHONPATH": str(meta.parent)}
    return f"{sys.executable} -m vllm.entrypoints.cli.main serve", env


def _long_with_shorts(url: str, trial: int) -> None:
    """A, and the Bs one after another once A has its first token, until A is done."""
    started = threading.Event()

    def long() -> None:
        body = {"model": "tiny", "prompt": f"Long {trial}", "max_tokens": LONG, "temperature": 0,
                "ignore_eos": True, "stream": True}  # fmt: skip
        with (
            httpx.Client(timeout=900) as client,
            client.stream("POST", url + "/v1/completions", json=body) as r,
        ):
            for line in r.iter_lines():
                if line.startswith("data:"):
                    started.set()

    a = threading.Thread(target=long)
    a.start()
    if not started.wait(300):
        raise RuntimeError("the long request never streamed a token")
    for b in range(SHORT_REQUESTS):
        complete(url, f"Short {trial} {b}", SHORT)
    a.join()


def _api_server_of(log: str, trial: int) -> list[tuple[str, int]]:
    """(API server, max_tokens) of the trial's requests, in the order they were received."""
    received = re.findall(
        r"^\((ApiServer_\d+|APIServer) pid=\d+\).*Received request .*max_tokens=(\d+)",
        log,
        re.MULTILINE,
    )
    return [(name, int(n)) for name, n in received][1 + trial * 5 : 1 + (trial + 1) * 5]


def capture_api_servers(model_dir: Path, workdir: Path, header: list[str]) -> None:
    """`--api-server-count 2` and 1, the same trials: pages before and after the trial
    that shows the most steps counted twice, and each start's log."""
    command, env = _serve_command(workdir)
    for count in (2, 1):
        name = f"api{count}"
        flags = ["--kv-cache-memory-bytes", str(PLAIN_POOL_BYTES), "--api-server-count", str(count)]
        flags += ["--enable-log-requests"]
        log_path = workdir / f"{name}.log"
        log_path.unlink(missing_ok=True)
        server = ServerProcess(
            _flags(model_dir, flags), log_path=log_path, command=command, env=env
        )
        server.start()
        try:
            server.wait_ready(timeout_seconds=900)
            _keep_startup_log(server, FIXTURES / "logs" / f"cpu-0.32-{name}-startup.log")
            cap = Capture(
                name, server, _shown_flags(flags), FIXTURES / "metrics" / "cpu-0.32", header
            )
            complete(server.url, "Warm up", 16)
            cap.sent.append(_request_note("Warm up", 16))
            trials = []
            for trial in range(4):
                before = cap.page("/metrics")
                _long_with_shorts(server.url, trial)
                after = cap.page("/metrics")
                taken = _api_server_of(server.log_text(), trial)
                a = next(who for who, n in taken if n == LONG)
                other = sum(1 for who, n in taken if n == SHORT and who != a)
                note = (
                    f"trial {trial}: {LONG} tokens streamed, and from its first token "
                    f"{SHORT_REQUESTS} requests of {SHORT} one after another; received by "
                    + ", ".join(f"{who} (max_tokens {n})" for who, n in taken)
                    + f"; the engine made {LONG} steps, one API server per step counts "
                    f"{LONG} and {SHORT} more for each of the {other} short request(s) on "
                    "the other"
                )
                trials.append((other, trial, before, after, list(cap.sent), note))
                cap.sent.append(note)
            # The trial with the most short requests on the other API server.
            _, _, before, after, sent, note = max(trials, key=lambda t: (t[0], -t[1]))
            cap.sent = sent
            cap.save(f"{name}-before-trial.txt", before, f"before {note}")
            cap.sent.append(note)
            cap.save(f"{name}-after-trial.txt", after, f"after {note}")
        finally:
            server.stop()


def _flags(model_dir: Path, extra: list[str]) -> list[str]:
    return [
        "--model",
        str(model_dir),
        "--served-model-name",
        "tiny",
        "--max-model-len",
        "2048",
        *extra,
    ]


def _shown_flags(extra: list[str]) -> list[str]:
    shown = [
        "--model",
        "<tiny-capture>",
        "--served-model-name",
        "tiny",
        "--max-model-len",
        "2048",
        *extra,
    ]
    return [f"'{f}'" if f.startswith("{") else f for f in shown]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tests.capture_fixtures", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument(
        "--workdir",
        type=Path,
        default=Path("/tmp/glassbox-capture"),
        help="where the tiny model and the server logs go",
    )
    parser.add_argument(
        "--only",
        choices=["plain", "spec", *PARALLEL_FLAGS, "dp2-forms", "api-servers"],
        help="capture one server only",
    )
    args = parser.parse_args(argv)
    (FIXTURES / "metrics" / "cpu-0.32").mkdir(parents=True, exist_ok=True)
    (FIXTURES / "logs").mkdir(parents=True, exist_ok=True)
    # A fixed path keeps the model directory the same in every regenerated log.
    model_dir = generate(TinyModelSpec("tiny-capture"), args.workdir / "models")
    version = importlib.metadata.version("vllm-cpu")
    date = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    header = [
        f"# glassbox fixture captured {date} from the real vLLM CPU build vllm-cpu {version}",
        "# by tests/capture_fixtures.py; model: lab.backends.tinymodel "
        "TinyModelSpec('tiny-capture') (Qwen2, hidden 256, 4 layers, random bf16 weights)",
    ]
    if args.only in (None, "plain"):
        print("plain server")
        capture_plain(model_dir, args.workdir, header)
    if args.only in (None, "spec"):
        print("spec server")
        capture_spec(model_dir, args.workdir, header)
    for name in PARALLEL_FLAGS:
        if args.only in (None, name):
            print(f"{name} server")
            capture_parallel(name, model_dir, args.workdir, header)
    if args.only in (None, "dp2-forms"):
        print("dp2 server, text and json logs")
        capture_log_forms(model_dir, args.workdir)
    if args.only in (None, "api-servers"):
        print("two API servers, then one")
        capture_api_servers(model_dir, args.workdir, header)
    return 0


if __name__ == "__main__":
    sys.exit(main())
