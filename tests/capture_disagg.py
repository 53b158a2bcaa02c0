"""Capture a prefill/decode pair of the real vLLM CPU build, joined by a KV connector.

Run by hand (two vLLM CPU servers at a time), never by the suite:

    .venv/bin/python -m tests.capture_disagg --nixl-site DIR   # rewrites tests/fixtures/...

Two pairs, each a producer (prefill) and a consumer (decode) serving the tiny generated
Qwen2 checkpoint as "tiny", one core each:

  nixl     NixlConnector (UCX over loopback; the CPU platform keeps the KV cache in host
           memory, `kv_buffer_device: cpu`). NIXL is a package of its own: DIR holds
           `pip install --no-deps --target DIR nixl==1.5.1 nixl-cu12==1.5.1` (its UCX runs
           without CUDA). Traffic as a P/D proxy sends it: each request to the producer
           with `max_tokens 1` and `kv_transfer_params.do_remote_decode`, then to the
           consumer with the producer's answer (`do_remote_prefill`, its block ids). Then
           the misconfiguration of a public report (modelplane/modelplane#175): requests
           sent to the consumer alone, which prefills them itself.
  example  ExampleConnector (ships with vLLM, no package: KV through safetensors files in
           a shared folder). The producer computes each prompt and stores its KV; the
           consumer loads the whole blocks of it. Then the consumer pointed at another
           folder: it finds nothing and prefills everything.

Prompts are token ids (never re-tokenized), each request's own (no prefix shared between
requests), PROMPT_TOKENS long, so where each token came from is known by hand: the
CPU backend's blocks are 128 tokens. Pages are written with comment lines saying what
produced them, as tests/capture_fixtures.py does.
"""

from __future__ import annotations

import argparse
import datetime
import importlib.metadata
import json
import os
import shutil
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
from vllm_glassbox.lab.backends.server_process import ServerProcess, free_port
from vllm_glassbox.lab.backends.tinymodel import TinyModelSpec, generate

FIXTURES = Path(__file__).resolve().parent / "fixtures"
OUT = FIXTURES / "metrics" / "cpu-0.32-disagg"
LOGS = FIXTURES / "logs"
POOL_BYTES = 33554432  # 16,384 tokens of the tiny model (2,048 bytes per token)
PROMPT_TOKENS = 300  # two whole blocks of 128 and 44 tokens more
OUTPUT_TOKENS = 32
REQUESTS = 4  # through the pair
MISROUTED = 3  # to the consumer alone
ORPHANED = 2  # prefilled for a consumer that never fetches them
LEASE_SECONDS = 12  # the producer's kv_lease_duration: its KV waits this long for a fetch


def prompt_ids(n: int) -> list[int]:
    """Request n's prompt: PROMPT_TOKENS token ids no other request's prompt starts with
    (its first id is its own), so no prefix cache is shared between requests."""
    rest = [(n * 131 + i * 7) % 1000 + 3 for i in range(1, PROMPT_TOKENS)]
    return [(n * 37 + 11) % 997 + 3, *rest]


def complete(
    url: str, prompt: list[int], max_tokens: int, model: str = "tiny", **extra: Any
) -> dict[str, Any]:
    body = {
        "model": model,
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


@dataclass
class Server:
    """One server of a pair: its role, flags, process, and the requests it has served."""

    name: str
    flags: list[str]
    process: ServerProcess
    sent: list[str] = field(default_factory=list)

    def page(self) -> str:
        r = httpx.get(self.process.url + "/metrics", timeout=10)
        r.raise_for_status()
        return r.text


def kv_config(connector: str, role: str, extra: dict[str, Any]) -> str:
    config: dict[str, Any] = {"kv_connector": connector, "kv_role": role}
    if connector == "NixlConnector":
        config["kv_buffer_device"] = "cpu"
    if extra:
        config["kv_connector_extra_config"] = extra
    return json.dumps(config, separators=(",", ":"))


def start_server(
    name: str, model_dir: Path, kv_config: str, workdir: Path, env: dict[str, str]
) -> Server:
    flags = [
        "--kv-cache-memory-bytes",
        str(POOL_BYTES),
        "--enforce-eager",
        "--kv-transfer-config",
        kv_config,
    ]
    args = [
        "--model",
        str(model_dir),
        "--served-model-name",
        "tiny",
        "--max-model-len",
        "2048",
        *flags,
    ]
    log = workdir / f"{name}.log"
    log.unlink(missing_ok=True)
    process = ServerProcess(args, log_path=log, env=env)
    process.start()
    process.wait_ready(timeout_seconds=900)
    shown = [
        "--model",
        "<tiny-capture>",
        "--served-model-name",
        "tiny",
        "--max-model-len",
        "2048",
        *[f"'{f}'" if f.startswith("{") else f for f in flags],
    ]
    return Server(name, shown, process)


def save(
    server: Server, header: list[str], filename: str, note: str, text: str | None = None
) -> None:
    """The server's page (`text`, else one fetched now) as a fixture with its header."""
    text = server.page() if text is None else text
    lines = [
        *header,
        f"# server: {server.name}, flags: {' '.join(server.flags)}",
        "# requests completed before this page: "
        + ("; ".join(server.sent) if server.sent else "none"),
        f"# this page: {note}",
    ]
    path = OUT / filename
    path.write_text("".join(f"{line}\n" for line in lines) + text)
    print(f"  wrote {path.relative_to(FIXTURES.parent.parent)} ({len(text)} bytes)")


def _keep_log(server: Server, dest: Path) -> None:
    dest.write_text(server.process.log_text())
    print(f"  wrote {dest.relative_to(FIXTURES.parent.parent)}")


def _note(n: int, max_tokens: int, params: str) -> str:
    return f"request {n}: {PROMPT_TOKENS} prompt token ids, max_tokens {max_tokens}{params}"


def cpu_env(core: str, extra: dict[str, str] | None = None) -> dict[str, str]:
    return {"VLLM_CPU_OMP_THREADS_BIND": core, **(extra or {})}


def capture_nixl(model_dir: Path, workdir: Path, header: list[str], site: Path) -> None:
    """The NIXL pair; pages of both, idle, after REQUESTS through the pair, and after
    MISROUTED to the consumer alone."""
    pythonpath = os.pathsep.join([str(site), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    ucx = {"UCX_TLS": "tcp,self", "UCX_NET_DEVICES": "lo", "PYTHONPATH": pythonpath}
    p_port, d_port = free_port(), free_port()
    lease = {"kv_lease_duration": LEASE_SECONDS}
    producer = start_server(
        "nixl-producer",
        model_dir,
        kv_config("NixlConnector", "kv_producer", lease),
        workdir,
        cpu_env("0", {**ucx, "VLLM_NIXL_SIDE_CHANNEL_PORT": str(p_port)}),
    )
    try:
        consumer = start_server(
            "nixl-consumer",
            model_dir,
            kv_config("NixlConnector", "kv_consumer", {}),
            workdir,
            cpu_env("1", {**ucx, "VLLM_NIXL_SIDE_CHANNEL_PORT": str(d_port)}),
        )
        try:
            _keep_log(producer, LOGS / "cpu-0.32-nixl-producer-startup.log")
            _keep_log(consumer, LOGS / "cpu-0.32-nixl-consumer-startup.log")
            save(producer, header, "nixl-producer-idle.txt", "idle right after startup")
            save(consumer, header, "nixl-consumer-idle.txt", "idle right after startup")
            for n in range(REQUESTS):
                prefill = complete(
                    producer.process.url,
                    prompt_ids(n),
                    1,
                    kv_transfer_params={
                        "do_remote_decode": True,
                        "do_remote_prefill": False,
                        "remote_engine_id": None,
                        "remote_block_ids": None,
                        "remote_host": None,
                        "remote_port": None,
                    },
                )
                producer.sent.append(_note(n, 1, ", kv_transfer_params.do_remote_decode"))
                params = prefill.get("kv_transfer_params")
                if not params:
                    raise RuntimeError(f"the producer answered no kv_transfer_params: {prefill}")
                complete(
                    consumer.process.url, prompt_ids(n), OUTPUT_TOKENS, kv_transfer_params=params
                )
                consumer.sent.append(_note(n, OUTPUT_TOKENS, ", the producer's kv_transfer_params"))
            save(
                producer,
                header,
                "nixl-producer-after-pair.txt",
                f"after {REQUESTS} requests prefilled here for the consumer",
            )
            save(
                consumer,
                header,
                "nixl-consumer-after-pair.txt",
                f"after {REQUESTS} requests decoded here from the producer's KV",
            )
            for n in range(REQUESTS, REQUESTS + MISROUTED):
                complete(consumer.process.url, prompt_ids(n), OUTPUT_TOKENS)
                consumer.sent.append(_note(n, OUTPUT_TOKENS, ", no kv_transfer_params"))
            save(
                producer,
                header,
                "nixl-producer-after-misrouted.txt",
                f"after {MISROUTED} more requests sent to the consumer alone (none here)",
            )
            save(
                consumer,
                header,
                "nixl-consumer-after-misrouted.txt",
                f"after {MISROUTED} requests sent here alone, no kv_transfer_params: "
                "the consumer prefilled them itself",
            )
            capture_nixl_failures(producer, consumer, header)
        finally:
            consumer.process.stop()
    finally:
        producer.process.stop()


REMOTE_DECODE = {
    "do_remote_decode": True,
    "do_remote_prefill": False,
    "remote_engine_id": None,
    "remote_block_ids": None,
    "remote_host": None,
    "remote_port": None,
}


def _counter(page: str, name: str) -> float:
    return sum(
        float(line.rsplit(" ", 1)[1]) for line in page.splitlines() if line.startswith(name + "{")
    )


def _wait_counter(server: Server, name: str, at_least: float, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if _counter(server.page(), name) >= at_least:
            return True
        time.sleep(1.0)
    return False


def capture_nixl_failures(producer: Server, consumer: Server, header: list[str]) -> None:
    """KV the consumer never fetches (it expires on the producer after its lease), and a
    fetch from a producer that is not there (the consumer's handshake fails)."""
    for n in range(REQUESTS + MISROUTED, REQUESTS + MISROUTED + ORPHANED):
        complete(producer.process.url, prompt_ids(n), 1, kv_transfer_params=REMOTE_DECODE)
        producer.sent.append(_note(n, 1, ", do_remote_decode, never fetched"))
    expired = "vllm:nixl_num_kv_expired_reqs_total"
    if not _wait_counter(producer, expired, ORPHANED, LEASE_SECONDS * 10):
        print(f"  the producer counted no {ORPHANED} expired requests")
    save(
        producer,
        header,
        "nixl-producer-after-expiry.txt",
        f"{ORPHANED} requests prefilled for a consumer that never fetched them, their "
        f"KV lease ({LEASE_SECONDS} s) run out",
    )
    n = REQUESTS + MISROUTED + ORPHANED
    prefill = complete(producer.process.url, prompt_ids(n), 1, kv_transfer_params=REMOTE_DECODE)
    producer.sent.append(_note(n, 1, ", do_remote_decode"))
    params = {
        **prefill["kv_transfer_params"],
        "remote_port": free_port(),
        "remote_engine_id": "nowhere",
    }
    try:
        complete(consumer.process.url, prompt_ids(n), OUTPUT_TOKENS, kv_transfer_params=params)
        outcome = "answered"
    except httpx.HTTPError as e:
        outcome = f"failed ({type(e).__name__})"
    consumer.sent.append(
        _note(
            n,
            OUTPUT_TOKENS,
            f", kv_transfer_params naming a port no producer listens on: {outcome}",
        )
    )
    failed = "vllm:nixl_num_failed_transfers_total"
    if not _wait_counter(consumer, failed, 1, 120):
        print("  the consumer counted no failed transfer")
    save(
        consumer,
        header,
        "nixl-consumer-after-failure.txt",
        "after a request whose KV was to come from a producer that is not there",
    )


def capture_example(model_dir: Path, workdir: Path, header: list[str]) -> None:
    """The ExampleConnector pair (a shared folder), then the consumer alone on another
    folder: pages of both, idle and after each."""
    shared, elsewhere = workdir / "kv-shared", workdir / "kv-elsewhere"
    for folder in (shared, elsewhere):
        shutil.rmtree(folder, ignore_errors=True)
        folder.mkdir(parents=True)
    path = {"shared_storage_path": str(shared)}
    producer = start_server(
        "example-producer",
        model_dir,
        kv_config("ExampleConnector", "kv_producer", path),
        workdir,
        cpu_env("0"),
    )
    try:
        consumer = start_server(
            "example-consumer",
            model_dir,
            kv_config("ExampleConnector", "kv_consumer", path),
            workdir,
            cpu_env("1"),
        )
        try:
            _keep_log(consumer, LOGS / "cpu-0.32-example-consumer-startup.log")
            save(producer, header, "example-producer-idle.txt", "idle right after startup")
            save(consumer, header, "example-consumer-idle.txt", "idle right after startup")
            for n in range(REQUESTS):
                complete(producer.process.url, prompt_ids(n), 1)
                producer.sent.append(_note(n, 1, ""))
                complete(consumer.process.url, prompt_ids(n), OUTPUT_TOKENS)
                consumer.sent.append(_note(n, OUTPUT_TOKENS, ", after the producer's"))
            save(
                producer,
                header,
                "example-producer-after-pair.txt",
                f"after {REQUESTS} requests prefilled here, KV stored in the shared folder",
            )
            save(
                consumer,
                header,
                "example-consumer-after-pair.txt",
                f"after the same {REQUESTS} requests, KV loaded from the shared folder",
            )
        finally:
            consumer.process.stop()
    finally:
        producer.process.stop()
    misplaced = start_server(
        "example-consumer-elsewhere",
        model_dir,
        kv_config("ExampleConnector", "kv_consumer", {"shared_storage_path": str(elsewhere)}),
        workdir,
        cpu_env("1"),
    )
    try:
        for n in range(MISROUTED):
            complete(misplaced.process.url, prompt_ids(n), OUTPUT_TOKENS)
            misplaced.sent.append(_note(n, OUTPUT_TOKENS, ", the producer's folder not given"))
        save(
            misplaced,
            header,
            "example-consumer-elsewhere.txt",
            f"a consumer given an empty folder, after {MISROUTED} requests the producer "
            "had prefilled into the shared one: it prefilled them itself",
        )
    finally:
        misplaced.process.stop()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tests.capture_disagg", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/glassbox-capture-disagg"))
    parser.add_argument("--nixl-site", type=Path, help="where nixl and nixl-cu12 are installed")
    parser.add_argument("--only", choices=["nixl", "example"])
    args = parser.parse_args(argv)
    OUT.mkdir(parents=True, exist_ok=True)
    model_dir = generate(TinyModelSpec("tiny-capture"), args.workdir / "models")
    version = importlib.metadata.version("vllm-cpu")
    date = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    header = [
        f"# glassbox fixture captured {date} from the real vLLM CPU build vllm-cpu {version}",
        "# by tests/capture_disagg.py; model: lab.backends.tinymodel "
        "TinyModelSpec('tiny-capture') (Qwen2, hidden 256, 4 layers, random bf16 weights)",
    ]
    if args.only in (None, "nixl"):
        if args.nixl_site is None:
            parser.error("the NIXL pair needs --nixl-site")
        print("NIXL pair")
        capture_nixl(model_dir, args.workdir, header, args.nixl_site)
    if args.only in (None, "example"):
        print("ExampleConnector pair")
        capture_example(model_dir, args.workdir, header)
    return 0


if __name__ == "__main__":
    sys.exit(main())
