"""A bursty ramp into a preemption storm against a running vLLM, with two glassbox exporters
beside it (the chart's defaults, 5 s polls over a 60 s window; and 1 s polls), and what
each said at every poll set against vLLM's own page.

Run by hand against a vLLM already serving (never by the suite):

    python3 scripts/gpu/storm_timeline.py --url http://127.0.0.1:8000 --out DIR \\
        [--profile gpu|cpu] [--model NAME] [--tail 70]

Every second it reads vLLM's /metrics (the pool's usage, running, waiting, waiting for
capacity, preemptions), and at each exporter's own poll period that exporter's /findings
and `glassbox explain --exporter URL --format json` (the command, run in-process through
its `main`). Bursts of requests come at a rising size (`--profile`: the GPU's 2,048-token
essays, or the CPU build's 1,900 tokens on its 4,096-token pool) until the pool preempts,
then the traffic stops and the drain is watched for `--tail` seconds (longer than the
window, so the storm is seen leaving it).

DIR/timeline.jsonl: one line per reading, {"t", "unix", "source", ...}; source "vllm",
"findings/<exporter>" or "explain/<exporter>". DIR/summary.json: the run, the raw storm
(first and last preemption, peaks) and each source's findings. DIR/exporter-*.log: their
output. `scripts/gpu/storm_timeline_report.py DIR` turns it into markdown.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import itertools
import json
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families

#: Request sizes of a profile: max_tokens, the bursts' sizes, seconds between bursts.
PROFILES: dict[str, dict[str, Any]] = {
    # 108 requests of 2,048 tokens on a 96,016-token pool (one H200, 7B, utilization 0.16):
    # the pool overflows within the ramp, and ramp, drain and tail fit about five minutes.
    "gpu": {"max_tokens": 2048, "bursts": [4, 8, 16, 16, 32, 32], "every": 4.0},
    "cpu": {"max_tokens": 1900, "bursts": [2, 3, 4, 6], "every": 6.0},
}
PROMPT = "Write an extremely long and detailed essay, number {i}."
#: The two exporters: name, poll period, window (seconds).
EXPORTERS = (("chart-5s", 5.0, 60.0), ("poll-1s", 1.0, 60.0))
GAUGES = {
    "vllm:kv_cache_usage_perc": "usage",
    "vllm:num_requests_running": "running",
    "vllm:num_requests_waiting": "waiting",
    "vllm:num_preemptions_total": "preemptions",
}


def raw_page(text: str) -> dict[str, float]:
    """vLLM's page read with prometheus_client's parser: the pool and the queue, the
    fullest engine's usage, the others summed over engines."""
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            name = GAUGES.get(sample.name)
            if sample.name == "vllm:num_requests_waiting_by_reason":
                name = f"waiting_{sample.labels.get('reason', '')}"
            if name is None:
                continue
            if name == "usage":
                out[name] = max(out.get(name, 0.0), sample.value)
            else:
                out[name] = out.get(name, 0.0) + sample.value
    return out


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Exporter:
    name: str
    interval: float
    window: float
    port: int
    process: subprocess.Popen[bytes]

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"


@contextlib.contextmanager
def exporters(target: str, out: Path) -> Iterator[list[Exporter]]:
    """The two exporters beside vLLM, stopped (by their own pid) on the way out."""
    started: list[Exporter] = []
    # `python -m vllm_glassbox`: on the GPU machine glassbox is a --target folder on
    # PYTHONPATH, with no console script.
    glassbox = [sys.executable, "-m", "vllm_glassbox"]
    try:
        for name, interval, window in EXPORTERS:
            port = free_port()
            log = (out / f"exporter-{name}.log").open("wb")
            process = subprocess.Popen(
                [
                    *glassbox,
                    "exporter",
                    "--target",
                    target,
                    "--listen",
                    f"127.0.0.1:{port}",
                    "--interval",
                    f"{interval:g}s",
                    "--window",
                    f"{window:g}s",
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
            )
            started.append(Exporter(name, interval, window, port, process))
        for e in started:
            wait_ready(f"{e.url}/findings", 60.0)
        yield started
    finally:
        for e in started:
            e.process.terminate()
        for e in started:
            try:
                e.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                e.process.kill()


def wait_ready(url: str, seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(url, timeout=2).status_code == 200:
                return
        time.sleep(0.5)
    raise SystemExit(f"{url} did not answer within {seconds:g} s")


def kv_findings(body: dict[str, Any]) -> list[dict[str, Any]]:
    """The kv_pool findings of an explain/findings document, in short."""
    out = []
    for scene in body.get("scenes", []):
        for f in scene.get("findings", []):
            if f.get("diagnosis") == "kv_pool":
                out.append({k: f.get(k) for k in ("finding", "severity", "what")})
    return out


def explain_exporter(url: str) -> dict[str, Any]:
    """`glassbox explain --exporter URL --format json`, through the command's own main."""
    from vllm_glassbox.explain.cli import main

    buffer = io.StringIO()
    with contextlib.redirect_stdout(buffer), contextlib.redirect_stderr(io.StringIO()):
        status = main(["--exporter", url, "--format", "json"])
    try:
        return {"status": status, **json.loads(buffer.getvalue())}
    except ValueError:
        return {"status": status, "scenes": []}


class Recorder:
    def __init__(self, out: Path) -> None:
        self.file = (out / "timeline.jsonl").open("w")
        self.lock = threading.Lock()
        self.t0 = time.monotonic()

    def write(self, source: str, body: dict[str, Any]) -> None:
        line = {"t": round(time.monotonic() - self.t0, 3), "unix": time.time(), "source": source}
        with self.lock:
            self.file.write(json.dumps(line | body) + "\n")
            self.file.flush()


def sample(url: str, fleet: list[Exporter], rec: Recorder, stop: threading.Event) -> None:
    """Every second: vLLM's page; each exporter's findings and explain at its own period."""
    tick = 0
    client = httpx.Client(timeout=5)
    while not stop.is_set():
        with contextlib.suppress(httpx.HTTPError, ValueError):
            rec.write("vllm", raw_page(client.get(f"{url}/metrics").text))
        for e in fleet:
            if tick % int(e.interval) == 0:
                with contextlib.suppress(httpx.HTTPError, ValueError):
                    body = client.get(f"{e.url}/findings").json()
                    pools = [p for s in body.get("scenes_observed", []) for p in s.get("pools", [])]
                    rec.write(f"findings/{e.name}", {"kv_pool": kv_findings(body), "pools": pools})
                rec.write(f"explain/{e.name}", {"kv_pool": kv_findings(explain_exporter(e.url))})
        tick += 1
        stop.wait(1.0)
    client.close()


def model_of(url: str) -> str:
    return str(httpx.get(f"{url}/v1/models", timeout=10).json()["data"][0]["id"])


def drive(url: str, model: str, profile: dict[str, Any], rec: Recorder) -> None:
    """Bursts of rising size, each `every` seconds apart; returns when all have answered."""
    threads: list[threading.Thread] = []
    client = httpx.Client(timeout=1800)

    def one(i: int) -> None:
        body = {
            "model": model,
            "prompt": PROMPT.format(i=i),
            "max_tokens": profile["max_tokens"],
            "temperature": 0.7,
            "ignore_eos": True,
        }
        with contextlib.suppress(httpx.HTTPError):
            client.post(f"{url}/v1/completions", json=body)

    i = 0
    for size in profile["bursts"]:
        rec.write("load", {"burst": size})
        for _ in range(size):
            thread = threading.Thread(target=one, args=(i,), daemon=True)
            thread.start()
            threads.append(thread)
            i += 1
        time.sleep(profile["every"])
    for thread in threads:
        thread.join()
    rec.write("load", {"done": i})
    client.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", required=True, help="vLLM's base URL")
    parser.add_argument("--out", required=True, type=Path)
    parser.add_argument("--profile", choices=sorted(PROFILES), default="gpu")
    parser.add_argument("--model", help="the served model (default: vLLM's first)")
    parser.add_argument("--tail", type=float, default=70.0, help="seconds watched after")
    args = parser.parse_args(argv)
    url = args.url.rstrip("/")
    args.out.mkdir(parents=True, exist_ok=True)
    model = args.model or model_of(url)
    rec = Recorder(args.out)
    stop = threading.Event()
    with exporters(url, args.out) as fleet:
        time.sleep(max(e.interval for e in fleet) * 2)  # two polls each: a window to judge
        sampler = threading.Thread(target=sample, args=(url, fleet, rec, stop), daemon=True)
        sampler.start()
        started = time.time()
        drive(url, model, PROFILES[args.profile], rec)
        stop.wait(args.tail)
        stop.set()
        sampler.join(timeout=30)
    rec.file.close()
    run = {"url": url, "model": model, "profile": args.profile, "started": started}
    run["exporters"] = [{"name": n, "interval": i, "window": w} for n, i, w in EXPORTERS]
    summary = summarize(args.out / "timeline.jsonl", run)
    (args.out / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    print(json.dumps(summary["storm"], indent=1))
    return 0


def summarize(path: Path, run: dict[str, Any]) -> dict[str, Any]:
    """The raw storm from vLLM's pages, and how often each source named each finding."""
    lines = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    raw = [line for line in lines if line["source"] == "vllm" and "preemptions" in line]
    rises = [b for a, b in itertools.pairwise(raw) if b["preemptions"] > a["preemptions"]]
    storm = {
        "samples": len(raw),
        "preemptions": (raw[-1]["preemptions"] - raw[0]["preemptions"]) if raw else None,
        "first_preemption_t": rises[0]["t"] if rises else None,
        "last_preemption_t": rises[-1]["t"] if rises else None,
        "peak_usage": max((r.get("usage", 0.0) for r in raw), default=None),
        "peak_running": max((r.get("running", 0.0) for r in raw), default=None),
        "peak_waiting": max((r.get("waiting", 0.0) for r in raw), default=None),
        "peak_waiting_capacity": max((r.get("waiting_capacity", 0.0) for r in raw), default=None),
    }
    named: dict[str, dict[str, int]] = {}
    for line in lines:
        if line["source"].startswith(("findings/", "explain/")):
            counts = named.setdefault(line["source"], {})
            key = ",".join(f["finding"] for f in line["kv_pool"]) or "(none)"
            counts[key] = counts.get(key, 0) + 1
    return {"run": run, "storm": storm, "named": named}


if __name__ == "__main__":
    sys.exit(main())
