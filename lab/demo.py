"""`glassbox demo`: the whole story on this machine, with no GPU and no cluster.

The shipped CPU plan (`lab/plans/cpu-demo.yaml`) on the local backend: the real vLLM CPU
build serving tiny generated models, restarted per phase on one fixed port; this
machine's memory bandwidth measured first (a copy benchmark: the peak of the bandwidth
series); the exporter beside each server (`lab/sidecar.py`, started when the server is
ready, stopped with it); when Debian's Prometheus is installed, one on loopback with
glassbox's recording rules and alerts and the rules of the demo's objectives
(`lab/plans/cpu-demo.slo.yaml`), scraping vLLM, the exporter and the lab's phase series,
whose data the dashboards are drawn from at the end. Then report.md,
results.json and the plots, and a short summary on stdout.
"""

from __future__ import annotations

import argparse
import contextlib
import shutil
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import replace
from pathlib import Path

import yaml
from vllm_glassbox.core import slo
from vllm_glassbox.core.helptext import examples
from vllm_glassbox.lab.backends.backend import exit_code as stopped_exit_code
from vllm_glassbox.lab.backends.local import LocalBackend
from vllm_glassbox.lab.backends.prometheus_process import PrometheusProcess, scrape_config
from vllm_glassbox.lab.backends.server_process import DEFAULT_COMMAND, ServerError, free_port
from vllm_glassbox.lab.backends.targets import TINY_PREFIX
from vllm_glassbox.lab.experiments.base import Phase
from vllm_glassbox.lab.launch import run_plan
from vllm_glassbox.lab.plan import Plan, PlanError, resolve_plan
from vllm_glassbox.lab.progress import Progress
from vllm_glassbox.lab.report import summary_lines
from vllm_glassbox.lab.runner import STOPPED
from vllm_glassbox.lab.sidecar import LOOPBACK
from vllm_glassbox.lab.telemetry import PhaseInfo

SCRAPE_INTERVAL = "2s"
#: glassbox's recording rules and alerts, in a source checkout (not in an installed wheel).
RULES_DIR = Path(__file__).resolve().parent.parent / "alerts"
#: The demo's objectives: their attainment, budget and burn on the SLO dashboard and the
#: overview's SLO row (package data, beside the plan).
DEMO_SLO = Path(__file__).resolve().parent / "plans" / "cpu-demo.slo.yaml"


def cpu_flags(cpuinfo: str) -> set[str]:
    """The CPU's feature flags from /proc/cpuinfo's text."""
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "flags":
            return set(value.split())
    return set()


def without_awq(plan: Plan) -> tuple[Plan, list[str]]:
    """The plan minus its AWQ tiny-model variants, and what was left out.

    vLLM's CPU build runs AWQ only with its AVX-512 kernels (`cpu_gemm_wna16` is absent
    from the AVX2 library), so on an AVX2-only CPU the variant could only fail.
    """
    if plan.local is None:
        return plan, []
    awq = {
        f"{TINY_PREFIX}{name}"
        for name, spec in plan.local.tiny_models.items()
        if spec.precision == "awq"
    }
    dropped: list[str] = []
    phases: list[Phase] = []
    for phase in plan.phases:
        kept, left_out = phase.without_models(awq)
        phases.append(kept)
        dropped += left_out
    return replace(plan, phases=tuple(phases)), dropped


def rule_files(directory: Path = RULES_DIR) -> list[str]:
    return sorted(str(p) for p in directory.glob("*.yaml")) if directory.is_dir() else []


def slo_rule_file(objectives: Path, workdir: Path) -> str:
    """The objectives' rules as `glassbox rules --slo` writes them, in `workdir`, every
    group at the demo's evaluation interval: the budget group's 5 minutes would give a
    run of a few minutes one or two evaluations, and the overview's attainment none."""
    groups = slo.rule_groups(slo.read_slo_file(objectives))
    for group in groups:
        group.pop("interval", None)
    workdir.mkdir(parents=True, exist_ok=True)
    path = workdir / "slo.rules.yaml"
    text = f"# The rules of {objectives.name} (glassbox rules --slo), for the demo's Prometheus.\n"
    path.write_text(text + yaml.safe_dump({"groups": groups}, sort_keys=False, allow_unicode=True))
    return str(path)


def demo_rule_files(workdir: Path, directory: Path = RULES_DIR) -> list[str]:
    """What the demo's Prometheus loads: glassbox's rule files and the demo's objectives'
    rules (none without the rule files: a wheel without alerts/)."""
    rules = rule_files(directory)
    return [*rules, slo_rule_file(DEMO_SLO, workdir)] if rules else []


@contextlib.contextmanager
def prometheus(
    workdir: Path, targets: dict[str, int], rules: Sequence[str] = ()
) -> Iterator[str | None]:
    """Debian's Prometheus on loopback scraping `targets`; None when it is not installed
    or does not get ready (the run goes on without dashboard pictures)."""
    if shutil.which("prometheus") is None:
        yield None
        return
    server = PrometheusProcess(
        workdir,
        scrape_config(
            {job: f"{LOOPBACK}:{port}" for job, port in targets.items()},
            SCRAPE_INTERVAL,
            "1500ms",
            rules,
        ),
        tsdb=workdir / "data",
        flags=["--storage.tsdb.retention.time=1d"],
    )
    try:
        server.start(ready_timeout_seconds=30)
    except ServerError:
        yield None
        return
    try:
        yield server.url
    finally:
        server.stop()


def build_parser(prog: str) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog=prog,
        description="Run the lab's three experiments on this machine with the vLLM CPU "
        "build and tiny generated models, the exporter beside vLLM, and write the report.",
        **examples("glassbox demo", "glassbox demo --out demo-out --no-prometheus"),
    )
    p.add_argument(
        "--out", default="demo-out", metavar="DIR", help="output directory (default %(default)s)"
    )
    p.add_argument(
        "--plan",
        default="cpu-demo",
        metavar="PLAN.yaml",
        help="the plan (default: the shipped cpu-demo)",
    )
    p.add_argument(
        "--server-command",
        default=DEFAULT_COMMAND,
        metavar="CMD",
        help="the program taking vLLM's flags (default: vLLM's OpenAI server)",
    )
    p.add_argument(
        "--no-prometheus",
        action="store_true",
        help="do not start a Prometheus (no dashboard pictures)",
    )
    return p


def main(argv: Sequence[str], prog: str = "glassbox demo") -> int:
    args = build_parser(prog).parse_args(argv)
    try:
        plan = resolve_plan(args.plan)
        if plan.local is None:
            raise PlanError(["target.local: required by the demo"], plan.name)
    except PlanError as e:
        print(f"{prog}: {e}", file=sys.stderr)
        return 2
    notes: list[str] = []
    try:
        flags = cpu_flags(Path("/proc/cpuinfo").read_text())
    except OSError:
        flags = set()
    if "avx512f" not in flags:
        plan, dropped = without_awq(plan)
        if dropped:
            notes.append(
                f"Left out {', '.join(dropped)}: vLLM's CPU build runs AWQ only with its "
                "AVX-512 kernels, and this CPU has no AVX-512."
            )
    assert plan.local is not None
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    started = time.time()
    rules = demo_rule_files(out / "prometheus") if not args.no_prometheus else []
    if not rules and not args.no_prometheus:
        notes.append(
            f"glassbox's recording rules were not found ({RULES_DIR}): the dashboards' fleet "
            "panels have no data."
        )
    ports = {"vllm": free_port(), "glassbox": free_port(), "glassbox-lab": free_port()}
    backend = LocalBackend(plan.local, out / "logs", args.server_command, port=ports["vllm"])
    phase_info = PhaseInfo()
    metrics_server = phase_info.serve(LOOPBACK, ports["glassbox-lab"])
    try:
        prom_ctx = (
            contextlib.nullcontext(None)
            if args.no_prometheus
            else prometheus(out / "prometheus", ports, rules)
        )
        with prom_ctx as prom_url, Progress() as progress:
            progress.note(
                f"glassbox demo: {plan.name}, {len(plan.phases)} phases; vLLM CPU on port "
                f"{ports['vllm']}, exporter on {ports['glassbox']}"
                + (f", Prometheus at {prom_url}" if prom_url else ", no Prometheus")
            )
            results = run_plan(
                plan,
                backend,
                progress,
                out,
                observers=[phase_info],
                notes=notes,
                exporter_port=ports["glassbox"],
                prometheus_url=prom_url,
            )
    except STOPPED as e:
        print(f"\n{prog}: interrupted; partial report in {out / 'report.md'}", file=sys.stderr)
        return stopped_exit_code(e)
    finally:
        metrics_server.shutdown()
        metrics_server.server_close()
    minutes = (time.time() - started) / 60
    print(f"\nglassbox demo finished in {minutes:.1f} min: {out / 'report.md'}")
    for line in summary_lines(results):
        print("  - " + line.replace("**", ""))
    return 0 if results.status == "ok" else 1
