"""Capture the GPU's own telemetry beside vLLM's page at a few loads.

Run by hand on a GPU machine beside a running vLLM server (never by the suite):

    python3 scripts/gpu/telemetry_sweep.py http://127.0.0.1:8000 --out DIR \
        [--levels 1,4,16,64] [--seconds 30] [--max-tokens 256] [--model NAME]

For each load (a number of requests kept in flight), under DIR/c<level>/: vLLM's
/metrics before and after (`vllm-before.txt`, `vllm-after.txt`), `nvidia-smi`'s query
output sampled every 500 ms while the load ran (`nvidia-smi.csv`), and `meta.json` (when
each page was read, the requests made and failed). `dcgm.txt` beside them when
`--dcgm URL` names a dcgm-exporter to read after each load. Raw files only: glassbox's
figures come from `scripts/gpu/compare_telemetry.py`.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx

NVIDIA_SMI = [
    "nvidia-smi",
    "--query-gpu=timestamp,name,memory.used,memory.total,utilization.gpu,"
    "utilization.memory,power.draw,clocks.sm,clocks.mem",
    "--format=csv",
    "-lms",
    "500",
]
PROMPT = "Write a long and detailed essay about the history of computing, part {i}."


def _page(client: httpx.Client, url: str) -> str:
    return client.get(url, timeout=30.0).text


def _model(client: httpx.Client, base: str) -> str:
    return str(client.get(f"{base}/v1/models", timeout=30.0).json()["data"][0]["id"])


def _load(base: str, model: str, level: int, seconds: float, max_tokens: int) -> dict[str, int]:
    """Keep `level` completions in flight for `seconds`; count what came back."""
    done = {"requests": 0, "failed": 0}
    lock = threading.Lock()
    stop_at = time.monotonic() + seconds

    def worker(index: int) -> None:
        with httpx.Client(timeout=600.0) as client:
            i = index
            while time.monotonic() < stop_at:
                body = {
                    "model": model,
                    "prompt": PROMPT.format(i=i),
                    "max_tokens": max_tokens,
                    "temperature": 0.7,
                    "ignore_eos": True,
                }
                try:
                    ok = client.post(f"{base}/v1/completions", json=body).status_code == 200
                except httpx.HTTPError:
                    ok = False
                with lock:
                    done["requests" if ok else "failed"] += 1
                i += level

    with ThreadPoolExecutor(max_workers=level) as pool:
        list(pool.map(worker, range(level)))
    return done


def run_level(args: argparse.Namespace, model: str, level: int) -> None:
    out = Path(args.out) / f"c{level}"
    out.mkdir(parents=True, exist_ok=True)
    base = args.url.rstrip("/")
    with httpx.Client() as client:
        before_at = time.time()
        (out / "vllm-before.txt").write_text(_page(client, f"{base}/metrics"))
        with (out / "nvidia-smi.csv").open("w") as csv:
            sampler = subprocess.Popen(NVIDIA_SMI, stdout=csv, stderr=subprocess.DEVNULL)
            try:
                counts = _load(base, model, level, args.seconds, args.max_tokens)
            finally:
                sampler.terminate()
                sampler.wait(timeout=10)
        after_at = time.time()
        (out / "vllm-after.txt").write_text(_page(client, f"{base}/metrics"))
        if args.dcgm:
            (out / "dcgm.txt").write_text(_page(client, args.dcgm))
    meta = {"level": level, "before_at": before_at, "after_at": after_at, **counts}
    (out / "meta.json").write_text(json.dumps(meta, indent=2) + "\n")
    print(f"c{level}: {counts['requests']} requests, {counts['failed']} failed", flush=True)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("url", help="vLLM's base URL, e.g. http://127.0.0.1:8000")
    p.add_argument("--out", required=True, metavar="DIR")
    p.add_argument("--levels", default="1,4,16,64", help="requests in flight per load")
    p.add_argument("--seconds", type=float, default=30.0, help="how long each load runs")
    p.add_argument("--max-tokens", type=int, default=256)
    p.add_argument("--model", help="the served model's name (default: the first served)")
    p.add_argument("--dcgm", metavar="URL", help="a dcgm-exporter's /metrics to read too")
    args = p.parse_args()
    with httpx.Client() as client:
        model = args.model or _model(client, args.url.rstrip("/"))
    for level in (int(x) for x in args.levels.split(",")):
        run_level(args, model, level)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
