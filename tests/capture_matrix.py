"""Capture the version matrix in tests/fixtures/matrix/: real vLLM CPU servers of several
releases, each from a virtualenv of its own, and `glassbox exporter` run beside each.

Run by hand through scripts/capture-matrix.sh (which installs each release first with
scripts/install-vllm-version.sh), never by the suite:

    .venv/bin/python -m tests.capture_matrix 0.11.0 --python /work/venvs/vllm-0.11.0/bin/python

For one release, into tests/fixtures/matrix/<version>/, serving the same tiny Qwen2
checkpoint as tests/capture_fixtures.py (TinyModelSpec("tiny-capture")) as "tiny":

  spec    TP=1, a 16,384-token pool, ngram speculation; `glassbox exporter` beside it
          from its first idle poll on (one process for the whole session, window one
          hour, so its windowed series cover everything since the idle page):
          idle.txt; after-3x64.txt (3 requests of 64 tokens on a plain prompt);
          spec-after-2x256.txt (2 more of 256 on a repetitive prompt); then the server is
          stopped and started again with the same flags, appending to the same log:
          restart-idle.txt, restart-after-1x64.txt (one more plain request).
  dp2     --data-parallel-size 2 (threads bound by hand, no torch.compile), no
          speculation, its own exporter: dp2-idle.txt, dp2-after-2x64.txt; or, where the
          CPU build refuses it, dp2-refused.log.

Beside each page after requests, `exporter-<page>` is the exporter's own /metrics as of a
poll made after that page was read (no request in between: the same counters).
Requests never overlap, so every increase between two pages is known by hand.
`capture.json` records the flags, the versions and how long each start took.
"""

from __future__ import annotations

import argparse
import datetime
import importlib.metadata
import json
import shlex
import subprocess
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from vllm_glassbox.core.errors import ScrapeError
from vllm_glassbox.core.fetch import fetch_once
from vllm_glassbox.core.own_page import ExporterPage
from vllm_glassbox.lab.backends.server_process import (
    ChildProcess,
    ServerError,
    ServerProcess,
    exceptions_in_log,
)
from vllm_glassbox.lab.backends.tinymodel import TinyModelSpec, generate

from tests.capture_fixtures import (
    PLAIN_POOL_BYTES,
    PLAIN_PROMPT,
    REPETITIVE_PROMPT,
    SPEC_CONFIG,
    Capture,
    _flags,
    _request_note,
    _shown_flags,
    complete,
)

MATRIX = Path(__file__).resolve().parent / "fixtures" / "matrix"
PORT_BASE = 18200  # the server at BASE+1, the data-parallel one at +2, the exporter at +51
PLAIN_FLAGS = ["--kv-cache-memory-bytes", str(PLAIN_POOL_BYTES)]
SPEC_FLAGS = [*PLAIN_FLAGS, "--speculative-config", SPEC_CONFIG]
DP_FLAGS = [
    "--data-parallel-size",
    "2",
    "--kv-cache-memory-bytes",
    str(PLAIN_POOL_BYTES),
    "--enforce-eager",  # no torch.compile in each engine: minutes less on two cores
]
# Two CPU engines on this machine's one NUMA node: vLLM refuses to bind their threads
# itself ("Not enough allowed NUMA nodes"), so each gets one core by hand.
DP_ENV = {"VLLM_CPU_OMP_THREADS_BIND": "0|1"}
START_TIMEOUT = 1200.0


@dataclass
class Session:
    """One release's capture: where it goes and what it recorded."""

    version: str
    python: Path
    out: Path
    workdir: Path
    header: list[str]
    port_base: int = PORT_BASE
    kv_space_gib: int | None = None

    def flags(self, flags: list[str]) -> list[str]:
        """`flags` as this release takes them: without --kv-cache-memory-bytes where its
        CPU build ignores it (its pool is then VLLM_CPU_KVCACHE_SPACE, whole GiB)."""
        if self.kv_space_gib is None:
            return flags
        i = flags.index("--kv-cache-memory-bytes")
        return flags[:i] + flags[i + 2 :]

    record: dict[str, Any] = field(default_factory=dict)

    @property
    def command(self) -> str:
        return f"{shlex.quote(str(self.python))} -m vllm.entrypoints.openai.api_server"


def refusal(log_text: str) -> str:
    """The first exception a failed start's log names."""
    found = exceptions_in_log(log_text)
    return found[0] if found else "no exception in the log"


class Exporter:
    """`glassbox exporter` as its own process, polling `target` every second."""

    def __init__(self, target: str, log: Path, session: Session) -> None:
        glassbox = Path(sys.executable).parent / "glassbox"
        port = session.port_base + 51
        self.url = f"http://127.0.0.1:{port}"
        self.argv = [
            str(glassbox),
            "exporter",
            "--target",
            target,
            "--listen",
            f"127.0.0.1:{port}",
            "--interval",
            "1s",
            "--window",
            "3600s",
            "--timeout",
            "5s",
            "--vllm-log",
            str(log),
            "--model-dir",
            str(session.record["model_dir"]),
        ]
        self.process = ChildProcess(self.argv, session.workdir / "exporter.log", name="exporter")

    def shown_argv(self) -> str:
        return " ".join(["glassbox", *self.argv[1:4], "<server>", *self.argv[5:-4]]) + (
            " --vllm-log <the server's log> --model-dir <tiny-capture>"
        )

    def start(self) -> None:
        self.process.start()
        self.process.wait_for(lambda: self._read()[1].target_up is True, 120, 0.5)

    def _read(self) -> tuple[str, ExporterPage]:
        """Its page now, as text and read back; an empty one when it does not answer."""
        try:
            text = fetch_once(self.url, "/metrics", 5.0)
        except ScrapeError:
            return "", ExporterPage({})
        return text, ExporterPage.parse(text)

    def page_after(self, unix_time: float) -> str:
        """Its page as of a successful poll that started after `unix_time`."""
        read: list[str] = []

        def polled_since() -> bool:
            text, page = self._read()
            read[:] = [text]
            return page.polled_since(unix_time)

        self.process.wait_for(polled_since, 60, 0.3)
        return read[0]

    def stop(self) -> None:
        self.process.stop()


def _start(session: Session, name: str, flags: list[str], port: int, **env: str) -> ServerProcess:
    if session.kv_space_gib is not None:
        env = {**env, "VLLM_CPU_KVCACHE_SPACE": str(session.kv_space_gib)}
    server = ServerProcess(
        _flags(session.record["model_dir"], flags),
        log_path=session.workdir / f"{name}.log",
        command=session.command,
        port=port,
        env=env,
    )
    began = time.monotonic()
    server.start()
    try:
        server.wait_ready(timeout_seconds=START_TIMEOUT)
    except ServerError:
        server.stop()
        raise
    seconds = round(time.monotonic() - began, 1)
    session.record.setdefault("start_seconds", {}).setdefault(name, []).append(seconds)
    print(f"  {name} ready in {seconds} s")
    return server


def _save_with_exporter(cap: Capture, exporter: Exporter, filename: str, note: str) -> None:
    read_at = time.time()
    cap.save(filename, cap.page("/metrics"), note)
    text = exporter.page_after(read_at)
    lines = [
        *cap.header,
        f"# glassbox exporter beside the server: {exporter.shown_argv()}",
        f"# this page: its /metrics as of a poll after {filename} was read, no request between",
    ]
    (cap.out / f"exporter-{filename}").write_text("".join(f"{x}\n" for x in lines) + text)


def _send(cap: Capture, prompt: str, max_tokens: int, times: int, **extra: Any) -> None:
    for _ in range(times):
        complete(cap.server.url, prompt, max_tokens, **extra)
        cap.sent.append(_request_note(prompt, max_tokens, **extra))


def capture_spec(session: Session) -> None:
    log = session.workdir / "spec.log"
    log.unlink(missing_ok=True)
    flags = session.flags(SPEC_FLAGS)
    try:
        server = _start(session, "spec", flags, session.port_base + 1)
    except ServerError as e:
        # A release whose CPU build cannot speculate: its refusal kept, the rest without.
        (session.out / "spec-refused.log").write_text(log.read_text(errors="replace"))
        session.record["spec_refused"] = refusal(log.read_text(errors="replace"))
        print(f"  speculation refused: {session.record['spec_refused']} ({e})")
        log.unlink()
        flags = session.flags(PLAIN_FLAGS)
        server = _start(session, "spec", flags, session.port_base + 1)
    session.record["spec_flags"] = _shown_flags(flags)
    (session.out / "startup.log").write_text(server.log_text())
    exporter = Exporter(server.url, log, session)
    exporter.start()
    try:
        cap = Capture("spec", server, _shown_flags(flags), session.out, session.header)
        (session.out / "version.json").write_text(cap.page("/version"))
        cap.save("idle.txt", cap.page("/metrics"), "idle right after startup")
        _send(cap, PLAIN_PROMPT, 64, 3)
        _save_with_exporter(cap, exporter, "after-3x64.txt", "after 3 requests of 64")
        _send(cap, REPETITIVE_PROMPT, 256, 2, repetition_penalty=1.0)
        _save_with_exporter(
            cap, exporter, "spec-after-2x256.txt", "after 2 more, repetitive, of 256"
        )
        server.stop()
        server = _start(session, "spec", flags, session.port_base + 1)
        (session.out / "restart.log").write_text(server.log_text())
        cap.server = server
        cap.sent = ["(the server was stopped and started again with the same flags)"]
        cap.save("restart-idle.txt", cap.page("/metrics"), "idle right after the restart")
        _send(cap, PLAIN_PROMPT, 64, 1)
        _save_with_exporter(
            cap, exporter, "restart-after-1x64.txt", "after the restart and 1 request of 64"
        )
    finally:
        exporter.stop()
        server.stop()


def capture_dp2(session: Session) -> None:
    log = session.workdir / "dp2.log"
    log.unlink(missing_ok=True)
    try:
        server = _start(session, "dp2", session.flags(DP_FLAGS), session.port_base + 2, **DP_ENV)
    except ServerError as e:
        (session.out / "dp2-refused.log").write_text(log.read_text(errors="replace"))
        session.record["dp2_refused"] = refusal(log.read_text(errors="replace"))
        print(f"  dp2 refused: {session.record['dp2_refused']} ({e})")
        return
    (session.out / "dp2-startup.log").write_text(server.log_text())
    exporter = Exporter(server.url, log, session)
    exporter.start()
    try:
        dp_flags = _shown_flags(session.flags(DP_FLAGS))
        cap = Capture("dp2", server, dp_flags, session.out, session.header)
        cap.save("dp2-idle.txt", cap.page("/metrics"), "idle right after startup")
        _send(cap, PLAIN_PROMPT, 64, 2)
        _save_with_exporter(cap, exporter, "dp2-after-2x64.txt", "after 2 requests of 64")
    finally:
        exporter.stop()
        server.stop()


README = """# vLLM {version}, CPU build, captured {captured}

Captured on this project's development machine (x86_64, 2 cores shared, Debian 12,
Python 3.11) by `scripts/capture-matrix.sh {version}` (`tests/capture_matrix.py`), from
vllm-cpu {vllm} with torch {torch} and transformers {transformers}, installed by
{installed_by}.

Model: `lab.backends.tinymodel.TinyModelSpec("tiny-capture")` (Qwen2, hidden 256, 4 layers,
2 KV heads, random BF16 safetensors of 6,955,520 bytes; 2,048 KV bytes per token),
served as `tiny`. Requests: `/v1/completions`, `temperature 0`, `ignore_eos: true`, one
at a time; the plain prompt `"Kubernetes is"`, the repetitive one `"1 2 3 4 5"` × 10
with `repetition_penalty 1.0`. Every page starts with `#` lines saying what preceded it.

**spec** server: `{spec_flags}`
(TP=1; {pool}).{spec_what} Started in {spec_starts} s (wall clock, process start to
`/health`; the second figure is the restart).

- `startup.log`: its output up to the moment `/health` first answered; `version.json`:
  its `/version`
- `idle.txt`: `/metrics` right after startup, after the exporter's first poll
- `after-3x64.txt`: after 3 plain requests of 64 tokens
- `spec-after-2x256.txt`: after 2 more, repetitive, of 256 tokens (drafted where the
  server speculates)
- `restart.log`: the same log after the server was stopped (SIGTERM) and started again
  with the same flags, appending: both starts
- `restart-idle.txt`, `restart-after-1x64.txt`: the restarted server idle, then after 1
  plain request of 64
- `exporter-*.txt`: `glassbox exporter --interval 1s --window 3600s --vllm-log <the log>
  --model-dir <the model>` beside the server (one process across the restart), its
  `/metrics` as of a poll after the page of the same name was read

**dp2** server: `{dp2_flags}` with `VLLM_CPU_OMP_THREADS_BIND=0|1`{dp2_env}. {dp2_what}
"""


def write_readme(out: Path, version: str, record: Mapping[str, Any]) -> None:
    installed = record["installed"]
    own = installed["vllm-cpu"] == importlib.metadata.version("vllm-cpu")
    starts = record.get("start_seconds", {})
    if "dp2_refused" in record:
        dp2 = f"Refused: {record['dp2_refused']} (`dp2-refused.log`: the attempt's log)."
    elif "dp2" in starts:
        dp2 = (
            f"Started in {starts['dp2'][0]} s. `dp2-startup.log`; `dp2-idle.txt`; "
            "`dp2-after-2x64.txt` after 2 plain requests of 64 (vLLM places each on an engine); "
            "`exporter-dp2-after-2x64.txt`, its own exporter's page."
        )
    else:
        dp2 = "Not captured."
    text = README.format(
        version=version,
        captured=record["captured"],
        vllm=installed["vllm-cpu"],
        torch=installed["torch"],
        transformers=installed["transformers"],
        installed_by="`scripts/setup.sh` (the project's own .venv)"
        if own
        else f"`scripts/install-vllm-version.sh {version}` into a virtualenv of its own",
        spec_flags=" ".join(record["spec_flags"]),
        pool=f"a {record['kv_pool_bytes'] // 2048:,}-token pool"
        + (
            f", set by {record['kv_space_env']}: this release's CPU build ignores "
            "--kv-cache-memory-bytes"
            if record.get("kv_space_env")
            else ""
        ),
        spec_what=f" Speculation refused: {record['spec_refused']} (`spec-refused.log`: "
        "the attempt's log); the server ran without."
        if "spec_refused" in record
        else "",
        spec_starts=" and ".join(str(x) for x in starts.get("spec", [])) or "?",
        dp2_flags=" ".join(record["dp2_flags"]),
        dp2_what=dp2,
        dp2_env=f" and {record['kv_space_env']}" if record.get("kv_space_env") else "",
    )
    notes = record.get("notes", [])  # written by hand into capture.json after a capture
    if notes:
        text += "\n## Notes\n\n" + "".join(f"- {note}\n" for note in notes)
    (out / "README.md").write_text(text)


def _installed(python: Path) -> dict[str, str]:
    code = (
        "import importlib.metadata as m, json;"
        "print(json.dumps({p: m.version(p) for p in ('vllm-cpu', 'torch', 'transformers')}))"
    )
    out = subprocess.run([str(python), "-c", code], capture_output=True, text=True, check=True)
    versions: dict[str, str] = json.loads(out.stdout)
    return versions


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tests.capture_matrix", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("version", help="the vllm-cpu release, e.g. 0.11.0")
    parser.add_argument("--python", type=Path, required=True, help="its virtualenv's python")
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/glassbox-matrix"))
    parser.add_argument("--port-base", type=int, default=PORT_BASE, help="loopback ports from")
    parser.add_argument("--only", choices=["spec", "dp2"], help="capture one server only")
    parser.add_argument(
        "--kv-space-gib",
        type=int,
        help="set the pool by VLLM_CPU_KVCACHE_SPACE (GiB) instead of --kv-cache-memory-bytes, "
        "which the CPU build of releases before 0.2x ignores",
    )
    parser.add_argument(
        "--readme", action="store_true", help="only rewrite README.md from capture.json"
    )
    args = parser.parse_args(argv)
    out = MATRIX / args.version
    if args.readme:
        record = json.loads((out / "capture.json").read_text())
        for refused in ("spec_refused", "dp2_refused"):
            log = out / f"{refused.replace('_', '-')}.log"
            if log.exists():
                record[refused] = refusal(log.read_text(errors="replace"))
        (out / "capture.json").write_text(json.dumps(record, indent=2, sort_keys=True) + "\n")
        write_readme(out, args.version, record)
        return 0
    out.mkdir(parents=True, exist_ok=True)
    workdir = args.workdir / args.version
    workdir.mkdir(parents=True, exist_ok=True)
    # A fixed path keeps the model directory the same in every regenerated log.
    model_dir = generate(TinyModelSpec("tiny-capture"), args.workdir / "models")
    installed = _installed(args.python)
    date = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    header = [
        f"# glassbox fixture captured {date} from the real vLLM CPU build "
        f"vllm-cpu {installed['vllm-cpu']} (torch {installed['torch']}, "
        f"transformers {installed['transformers']})",
        "# by tests/capture_matrix.py; model: lab.backends.tinymodel "
        "TinyModelSpec('tiny-capture') (Qwen2, hidden 256, 4 layers, random bf16 weights)",
    ]
    session = Session(
        args.version, args.python, out, workdir, header, args.port_base, args.kv_space_gib
    )
    session.record = {"model_dir": model_dir}
    record_path = out / "capture.json"
    previous = json.loads(record_path.read_text()) if record_path.exists() else {}
    if args.only in (None, "spec"):
        print(f"{args.version}: spec server")
        capture_spec(session)
    if args.only in (None, "dp2"):
        print(f"{args.version}: dp2 server")
        capture_dp2(session)
    record = {
        **previous,
        "captured": date,
        "installed": installed,
        "spec_flags": session.record.get("spec_flags", previous.get("spec_flags")),
        "dp2_flags": _shown_flags(session.flags(DP_FLAGS)),
        "dp2_env": DP_ENV,
        "kv_pool_bytes": PLAIN_POOL_BYTES
        if args.kv_space_gib is None
        else args.kv_space_gib * 2**30,
        "kv_space_env": None
        if args.kv_space_gib is None
        else f"VLLM_CPU_KVCACHE_SPACE={args.kv_space_gib}",
        "start_seconds": {
            **previous.get("start_seconds", {}),
            **session.record.get("start_seconds", {}),
        },
    }
    for refused in ("spec_refused", "dp2_refused"):
        if refused in session.record:
            record[refused] = session.record[refused]
    record_path.write_text(json.dumps(record, indent=2, sort_keys=True) + "\n")
    write_readme(out, args.version, record)
    return 0


if __name__ == "__main__":
    sys.exit(main())
