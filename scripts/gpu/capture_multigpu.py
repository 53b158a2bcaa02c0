"""Capture vLLM's CUDA build on two GPUs: data parallel, tensor parallel with a mixture of
experts, and data parallel with expert parallelism; the glassbox exporter beside each.

Run by hand on a machine with two GPUs where vLLM and glassbox import (never by the suite):

    python3 scripts/gpu/capture_multigpu.py --out DIR [--only dp2,moe-tp2,moe-dp2-ep]

Models are config-only folders for vLLM's dummy loader (random weights of the real shapes
and dtypes): a Qwen2.5-7B-Instruct-shaped dense model (lab/backends/tinymodel.py) and a
Qwen3-30B-A3B-shaped mixture of experts (48 layers, 128 experts, 8 per token). Every
server is started with `--kv-cache-memory-bytes` and a small `--gpu-memory-utilization`
so that two can share the GPUs: dp2 and moe-tp2 run side by side, moe-dp2-ep after dp2.
Their timings therefore say nothing about speed; the pages and logs are what counts.
For a rehearsal on vLLM's CPU build, CAPTURE_MAX_MODEL_LEN and CAPTURE_FLOOD_TOKENS make
the requests fit a small model.

Per server, under DIR/NAME/: `vllm.log` (its whole output), `exporter.log`, and pages
`vllm-<step>.txt` / `exporter-<step>.txt` read at each step; each page starts with `#`
lines saying when and after what. Each scenario ends as DIR/NAME.tar.gz.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tarfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import httpx
from vllm_glassbox.lab.backends.tinymodel import TinyModelSpec, generate, write_tokenizer

DENSE = TinyModelSpec(
    "qwen7b",
    hidden_size=3584,
    intermediate_size=18944,
    num_layers=28,
    num_heads=28,
    num_kv_heads=4,
    vocab_size=152064,
    max_position_embeddings=32768,
    checkpoint=False,
)
#: Qwen3-30B-A3B's config.json, as published, for the dummy loader.
MOE_CONFIG = {
    "architectures": ["Qwen3MoeForCausalLM"],
    "model_type": "qwen3_moe",
    "attention_bias": False,
    "attention_dropout": 0.0,
    "bos_token_id": 1,
    "eos_token_id": 2,
    "decoder_sparse_step": 1,
    "head_dim": 128,
    "hidden_act": "silu",
    "hidden_size": 2048,
    "initializer_range": 0.02,
    "intermediate_size": 6144,
    "max_position_embeddings": 40960,
    "max_window_layers": 48,
    "mlp_only_layers": [],
    "moe_intermediate_size": 768,
    "norm_topk_prob": True,
    "num_attention_heads": 32,
    "num_experts": 128,
    "num_experts_per_tok": 8,
    "num_hidden_layers": 48,
    "num_key_value_heads": 4,
    "output_router_logits": False,
    "rms_norm_eps": 1e-6,
    "rope_scaling": None,
    "rope_theta": 1000000.0,
    "router_aux_loss_coef": 0.001,
    "sliding_window": None,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
    "use_cache": True,
    "use_sliding_window": False,
    "vocab_size": 151936,
}
# 58,000 tokens of the dense model (57,344 KV bytes per token) per engine: the H200 plan's
# pool, which 32 requests of 4,096 tokens overflow.
DENSE_POOL_BYTES = 3325952000
MOE_POOL_BYTES = 8 * 2**30
MAX_MODEL_LEN = os.environ.get("CAPTURE_MAX_MODEL_LEN", "8192")
FLOOD_TOKENS = int(os.environ.get("CAPTURE_FLOOD_TOKENS", "4096"))
FLOOD_PROMPT = "Write an extremely long and detailed essay, number {i}."


def moe_model(root: Path) -> Path:
    directory = root / "qwen3-30b-a3b"
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "config.json").write_text(json.dumps(MOE_CONFIG, indent=1))
    (directory / "generation_config.json").write_text('{"bos_token_id": 1, "eos_token_id": 2}')
    if not (directory / "tokenizer.json").exists():
        write_tokenizer(directory)
    return directory


@dataclass
class Scenario:
    name: str
    model: str  # "dense" or "moe"
    flags: list[str]
    port: int
    flood: int = 0  # concurrent 4,096-token requests after the short ones; 0: none
    out: Path = field(default=Path("."))
    log: list[str] = field(default_factory=list)

    def say(self, text: str) -> None:
        line = f"{time.strftime('%H:%M:%S')} {self.name}: {text}"
        self.log.append(line)
        print(line, flush=True)


SCENARIOS = {
    "dp2": Scenario(
        "dp2",
        "dense",
        [
            "--data-parallel-size", "2",
            "--kv-cache-memory-bytes", str(DENSE_POOL_BYTES),
            "--gpu-memory-utilization", "0.3",
        ],
        8100,
        flood=64,
    ),
    "moe-tp2": Scenario(
        "moe-tp2",
        "moe",
        [
            "--tensor-parallel-size", "2",
            "--kv-cache-memory-bytes", str(MOE_POOL_BYTES),
            "--gpu-memory-utilization", "0.4",
        ],
        8200,
    ),
    "moe-dp2-ep": Scenario(
        "moe-dp2-ep",
        "moe",
        [
            "--data-parallel-size", "2",
            "--enable-expert-parallel",
            "--kv-cache-memory-bytes", str(MOE_POOL_BYTES),
            "--gpu-memory-utilization", "0.4",
        ],
        8300,
    ),
}  # fmt: skip


def save_page(s: Scenario, url: str, filename: str, note: str) -> None:
    try:
        text = httpx.get(url, timeout=10).text
    except httpx.HTTPError as e:
        s.say(f"{url}: {e!r}")
        return
    header = f"# {s.name}, {time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime())}: {note}\n"
    (s.out / filename).write_text(header + text)


def complete(port: int, prompt: str, max_tokens: int, temperature: float) -> int:
    r = httpx.post(
        f"http://127.0.0.1:{port}/v1/completions",
        json={
            "model": "q",
            "prompt": prompt,
            "max_tokens": max_tokens,
            "temperature": temperature,
            "ignore_eos": True,
        },
        timeout=900,
    )
    r.raise_for_status()
    return int(r.json()["usage"]["completion_tokens"])


#: Every process started, so that the deadline can stop them all.
RUNNING: list[subprocess.Popen[bytes]] = []


def stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is not None:
        return
    os.killpg(proc.pid, signal.SIGINT)
    try:
        proc.wait(20)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def run(s: Scenario, models: dict[str, Path], root: Path) -> None:
    s.out = root / s.name
    s.out.mkdir(parents=True, exist_ok=True)
    env = {
        **os.environ,
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "VLLM_NO_USAGE_STATS": "1",
        "VLLM_USE_FLASHINFER_SAMPLER": "0",
    }
    cmd = [
        sys.executable, "-m", "vllm.entrypoints.openai.api_server",
        "--model", str(models[s.model]), "--served-model-name", "q",
        "--load-format", "dummy", "--max-model-len", MAX_MODEL_LEN,
        "--host", "127.0.0.1", "--port", str(s.port), *s.flags,
    ]  # fmt: skip
    s.say(" ".join(cmd[1:]))
    vllm_log = s.out / "vllm.log"
    with vllm_log.open("wb") as out:
        server = subprocess.Popen(
            cmd, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True
        )
    RUNNING.append(server)
    exporter_port = s.port + 1
    with (s.out / "exporter.log").open("wb") as out:
        exporter = subprocess.Popen(
            [
                sys.executable, "-c", "import sys; from vllm_glassbox.cli import main; "
                "sys.exit(main())", "exporter",
                "--target", f"http://127.0.0.1:{s.port}",
                "--listen", f"127.0.0.1:{exporter_port}",
                "--interval", "1s", "--window", "30s",
                "--vllm-log", str(vllm_log), "--model-dir", str(models[s.model]),
                "--gpu", "H200",
            ],
            stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True,
        )  # fmt: skip
    RUNNING.append(exporter)
    vllm = f"http://127.0.0.1:{s.port}/metrics"
    mine = f"http://127.0.0.1:{exporter_port}/metrics"
    started = time.monotonic()
    try:
        while True:
            if server.poll() is not None:
                s.say(f"vLLM exited with {server.returncode} before it was ready")
                return
            try:
                if httpx.get(f"http://127.0.0.1:{s.port}/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() - started > 420:
                s.say("not ready after 420 s")
                return
            time.sleep(1)
        s.say(f"ready after {time.monotonic() - started:.0f} s")
        time.sleep(3)  # the exporter's next polls see the idle page
        save_page(s, vllm, "vllm-idle.txt", "right after startup, no request yet")
        save_page(s, mine, "exporter-idle.txt", "the exporter beside it, idle")
        with ThreadPoolExecutor(4) as pool:
            tokens = list(pool.map(lambda _: complete(s.port, "Kubernetes is", 128, 0.0), range(4)))
        s.say(f"4 concurrent requests of 128 tokens: {tokens}")
        time.sleep(3)
        save_page(s, vllm, "vllm-after-4x128.txt", "after 4 concurrent requests of 128 tokens")
        save_page(s, mine, "exporter-after-4x128.txt", "the exporter after them")
        if s.flood:
            flood(s, vllm, mine)
    finally:
        stop(server)
        stop(exporter)
        (s.out / "capture.txt").write_text("\n".join(s.log) + "\n")


def flood(s: Scenario, vllm: str, mine: str) -> None:
    """`s.flood` concurrent 4,096-token requests; both pages every 2 s while they run."""
    done = threading.Event()

    def poll() -> None:
        n = 0
        while not done.is_set():
            n += 1
            note = f"flood poll {n}, {time.strftime('%H:%M:%S')}"
            save_page(s, vllm, f"vllm-flood-{n:03d}.txt", note)
            save_page(s, mine, f"exporter-flood-{n:03d}.txt", note)
            done.wait(2)

    poller = threading.Thread(target=poll)
    poller.start()
    t0 = time.monotonic()
    try:
        with ThreadPoolExecutor(s.flood) as pool:
            tokens = list(
                pool.map(
                    lambda i: complete(s.port, FLOOD_PROMPT.format(i=i), FLOOD_TOKENS, 0.7),
                    range(s.flood),
                )
            )
        seconds = time.monotonic() - t0
        s.say(f"flood of {s.flood} x {FLOOD_TOKENS}: {sum(tokens)} tokens in {seconds:.1f} s")
    finally:
        done.set()
        poller.join()
    time.sleep(3)
    save_page(s, vllm, "vllm-after-flood.txt", "the flood completed")
    save_page(s, mine, "exporter-after-flood.txt", "the exporter after the flood")


def pack(root: Path, name: str) -> None:
    with tarfile.open(root / f"{name}.tar.gz", "w:gz") as tar:
        tar.add(root / name, arcname=name)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--models", type=Path, default=Path("/tmp/models"))
    p.add_argument("--work", type=Path, default=Path("/tmp/capture-work"))
    p.add_argument("--only", default=",".join(SCENARIOS))
    p.add_argument(
        "--deadline",
        type=float,
        default=540,
        help="seconds; then every server is stopped and what was captured is packed",
    )
    args = p.parse_args()
    chosen = [SCENARIOS[n] for n in args.only.split(",")]
    models = {"dense": generate(DENSE, args.models), "moe": moe_model(args.models)}
    work = args.work

    def lane(names: list[Scenario]) -> None:
        for s in names:
            try:
                run(s, models, work)
            except Exception as e:  # one scenario's failure must not stop the others
                s.say(f"failed: {e!r}")
            (work / s.name).mkdir(parents=True, exist_ok=True)
            (work / s.name / "capture.txt").write_text("\n".join(s.log) + "\n")
            pack(work, s.name)
            (work / f"{s.name}.tar.gz").rename(args.out / f"{s.name}.tar.gz")

    # dp2 then moe-dp2-ep (both data parallel: never side by side), moe-tp2 beside them.
    lanes = [[s for s in chosen if s.name != "moe-tp2"], [s for s in chosen if s.name == "moe-tp2"]]
    threads = [threading.Thread(target=lane, args=(names,)) for names in lanes if names]
    for t in threads:
        t.start()
    deadline = time.monotonic() + args.deadline
    while any(t.is_alive() for t in threads) and time.monotonic() < deadline:
        time.sleep(1)
    if any(t.is_alive() for t in threads):
        print(f"deadline of {args.deadline:.0f} s: stopping every server", flush=True)
        for proc in list(RUNNING):
            stop(proc)
    for t in threads:
        t.join()
    return 0


if __name__ == "__main__":
    sys.exit(main())
