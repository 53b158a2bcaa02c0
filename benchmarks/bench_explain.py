"""What `glassbox explain` costs against the fleet benchmark's Prometheus at 1,000 pods.

    flock /work/heavy.lock .venv/bin/python benchmarks/bench_explain.py          # ~12 minutes
    .venv/bin/python benchmarks/bench_explain.py --pods 100 --warmup 120 --repeats 3
    flock /work/heavy.lock .venv/bin/python benchmarks/bench_explain.py --slo FILE   # and its SLOs

The fleet of bench_fleet.py (tests/fleet.py: one process serving every pod's vLLM page and
exporter page, one pod in ten under KV pressure, pods over PODS/10 namespaces and 4
models), scraped by Debian's Prometheus every 15 s with alerts/*.yaml loaded. After the
warm-up, `glassbox explain` runs as a person runs it (the command in this process, its
output written to a buffer) for one model in one namespace (a namespace with a pod under
pressure), then for the whole fleet, REPEATS times each, alternately; each run's wall
time, the scenes and findings it wrote, and the load average are printed. The targets:
one model within 10 s, the whole fleet within 60 s. With --slo FILE the SLO file's rules
are loaded too (every group at the 30 s interval: a budget group's 5 minutes would
outlast the warm-up) and the command is given the file, so its objectives are read.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from vllm_glassbox import rules  # noqa: E402
from vllm_glassbox.core import slo  # noqa: E402
from vllm_glassbox.core.prometheus import Prometheus  # noqa: E402
from vllm_glassbox.core.units import parse_duration  # noqa: E402
from vllm_glassbox.explain.cli import main as explain  # noqa: E402
from vllm_glassbox.explain.from_prometheus import Selection, queries  # noqa: E402
from vllm_glassbox.lab.backends.prometheus_process import PrometheusProcess  # noqa: E402

from tests.fleet import Fleet, plan_pods, serve  # noqa: E402

RULE_FILES = sorted(str(p) for p in (REPO / "alerts").glob("*.yaml"))
SCRAPE = "15s"


def timed(args: list[str]) -> tuple[float, int, int]:
    """One run: wall seconds, scenes, findings (exit status 0 asserted)."""
    out, err = io.StringIO(), io.StringIO()
    began = time.perf_counter()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        status = explain([*args, "--format", "json"])
    seconds = time.perf_counter() - began
    if status != 0:
        raise RuntimeError(f"glassbox explain {' '.join(args)}: status {status}: {err.getvalue()}")
    scenes = json.loads(out.getvalue())["scenes"]
    return seconds, len(scenes), sum(len(s["findings"]) for s in scenes)


def spread(values: list[float]) -> str:
    return (
        f"median {statistics.median(values):.2f} s (min {min(values):.2f}, max {max(values):.2f}, "
        f"n {len(values)})"
    )


def slo_rule_files(path: Path | None, work: Path) -> list[str]:
    """The SLO file's rules (glassbox rules --slo), every group at the global interval."""
    if path is None:
        return []
    document = yaml.safe_load(rules.slo_rule_file_text(slo.read_slo_file(path), path.name, []))
    for group in document["groups"]:
        group.pop("interval", None)
    written = work / "slo.rules.yaml"
    written.write_text(yaml.safe_dump(document, sort_keys=False, allow_unicode=True))
    return [str(written)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pods", type=int, default=1000)
    parser.add_argument("--warmup", type=float, default=330.0, help="seconds before measuring")
    parser.add_argument("--since", default="5m")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--slo", type=Path, help="an SLO file: its rules loaded, and --slo given")
    args = parser.parse_args()

    plan = plan_pods(args.pods, namespaces=max(2, args.pods // 10), models=4)
    pressured = next(p for p in plan if p.under_pressure)
    fleet = Fleet(plan)
    with (
        tempfile.TemporaryDirectory(prefix="glassbox-bench-explain-") as work,
        serve(fleet, args.port) as serving,
    ):
        config = {
            "global": {
                "scrape_interval": SCRAPE,
                "scrape_timeout": "10s",
                "evaluation_interval": "30s",
            },
            "rule_files": RULE_FILES + slo_rule_files(args.slo, Path(work)),
            "scrape_configs": serving.scrape_configs(SCRAPE, "10s"),
        }
        with PrometheusProcess(Path(work), config) as prometheus:
            with Prometheus(prometheus.url, timeout_seconds=120) as client:
                deadline = time.monotonic() + 900
                while True:
                    up = client.query("count(up == 1)")
                    if up and int(float(up[0]["value"][1])) >= 2 * args.pods:
                        break
                    if time.monotonic() > deadline:
                        raise RuntimeError(f"not every target was scraped: {up}")
                    time.sleep(2)
            print(
                f"{args.pods} pods, {2 * args.pods} targets up; warming up {args.warmup:g} s",
                file=sys.stderr,
            )
            time.sleep(args.warmup)
            one = [
                "--prometheus",
                prometheus.url,
                "--since",
                args.since,
                "--namespace",
                pressured.namespace,
                "--model",
                pressured.model,
            ]
            whole = ["--prometheus", prometheus.url, "--since", args.since]
            if args.slo:
                one += ["--slo", str(args.slo)]
                whole += ["--slo", str(args.slo)]
            load_before = os.getloadavg()[0]
            runs: dict[str, list[float]] = {"one": [], "fleet": []}
            shape: dict[str, tuple[int, int]] = {}
            for _ in range(args.repeats):
                for name, argv in (("one", one), ("fleet", whole)):
                    seconds, scenes, findings = timed(argv)
                    runs[name].append(seconds)
                    shape[name] = (scenes, findings)
            load_after = os.getloadavg()[0]
            # Where the fleet's time goes: each query alone, one after the other.
            with Prometheus(prometheus.url, timeout_seconds=120) as client:
                at = time.time()
                sel = Selection(prometheus.url, None, None, parse_duration(args.since), at)
                slowest = []
                for name, expr in queries(sel).items():
                    began = time.perf_counter()
                    client.query(expr, at)
                    slowest.append((time.perf_counter() - began, name))
    print(
        f"pods {args.pods}, --since {args.since}, warm-up {args.warmup:g} s"
        + (f", SLO rules of {args.slo}" if args.slo else "")
    )
    print(f"load average {load_before:.1f} -> {load_after:.1f}")
    total = sum(seconds for seconds, _ in slowest)
    top = ", ".join(f"{name} {seconds:.2f} s" for seconds, name in sorted(slowest)[::-1][:5])
    print(f"the fleet's {len(slowest)} queries one after the other: {total:.2f} s; slowest: {top}")
    for name, target in (("one", 10.0), ("fleet", 60.0)):
        scenes, findings = shape[name]
        verdict = "within" if max(runs[name]) <= target else "OVER"
        print(
            f"{name:6} {spread(runs[name])}; {scenes} scenes, {findings} findings; "
            f"{verdict} the {target:g} s target"
        )


if __name__ == "__main__":
    main()
