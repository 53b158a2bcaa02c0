"""`glassbox lab`: run a plan against a real vLLM and write the report.

    glassbox lab run PLAN.yaml [--backend kubernetes|local] [--out DIR]
                               [--server-command CMD] [--metrics-listen HOST:PORT]
                               [--prometheus URL]
    glassbox lab check PLAN.yaml
    glassbox lab restore PLAN.yaml [--backend kubernetes|local]

PLAN may also name a plan shipped with glassbox (`cpu-demo`, `seed-l40s`).
Exit status: 0 every phase ran, 1 a phase failed, 2 the plan or flags are invalid,
130 Ctrl-C, 143 SIGTERM (the server was still stopped / the Deployment restored).
`restore` puts back what a killed run left (the Deployment's original args): 0 done or
nothing to do, 1 it could not.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

from vllm_glassbox.core.helptext import examples
from vllm_glassbox.core.logs import add_log_flags, set_up_logging
from vllm_glassbox.core.units import parse_host_port
from vllm_glassbox.lab.backends.backend import Backend
from vllm_glassbox.lab.backends.backend import exit_code as stopped_exit_code
from vllm_glassbox.lab.backends.server_process import DEFAULT_COMMAND, free_port
from vllm_glassbox.lab.launch import run_plan
from vllm_glassbox.lab.plan import Plan, PlanError, resolve_plan
from vllm_glassbox.lab.progress import Progress
from vllm_glassbox.lab.results import LabResults
from vllm_glassbox.lab.runner import STOPPED
from vllm_glassbox.lab.telemetry import GrafanaAnnotations, Observer, PhaseInfo
from vllm_glassbox.lab.vllm.credentials import ApiKey, key_source, open_api_key

EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2


def build_parser(prog: str) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog=prog,
        description="Run the lab's experiments.",
        **examples(
            "glassbox lab run cpu-demo --backend local --out out",
            "glassbox lab check my-plan.yaml",
            "glassbox lab restore seed-l40s",
        ),
    )
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")
    run = sub.add_parser(
        "run",
        help="run a plan and write report.md, results.json, plots",
        description="Run a plan's phases against vLLM and write report.md, results.json "
        "and the plots.",
        **examples(
            "glassbox lab run cpu-demo --backend local --out out",
            "glassbox lab run seed-l40s --backend kubernetes --out out "
            "--prometheus http://prometheus:9090",
        ),
    )
    run.add_argument("plan", metavar="PLAN.yaml", help="plan file, or a shipped plan's name")
    run.add_argument(
        "--backend",
        choices=["kubernetes", "local"],
        help="where vLLM runs (default: the plan's only target)",
    )
    run.add_argument(
        "--out", default="lab-out", metavar="DIR", help="output directory (default %(default)s)"
    )
    run.add_argument(
        "--server-command",
        metavar="CMD",
        help="local backend: the program taking vLLM's flags "
        "(default: python -m vllm.entrypoints.openai.api_server)",
    )
    run.add_argument(
        "--metrics-listen",
        metavar="HOST:PORT",
        help="serve glassbox_lab_phase_info on HOST:PORT/metrics while running",
    )
    run.add_argument(
        "--prometheus",
        metavar="URL",
        help="a Prometheus scraping this vLLM and its exporter: the dashboards over the "
        "run are drawn into the report at the end",
    )
    add_log_flags(run, default_level="warning")
    check = sub.add_parser(
        "check",
        help="validate a plan and print what it would run",
        description="Validate a plan and print what it would run; exit 2 naming every problem.",
        **examples("glassbox lab check my-plan.yaml", "glassbox lab check cpu-demo"),
    )
    check.add_argument("plan", metavar="PLAN.yaml")
    restore = sub.add_parser(
        "restore",
        help="put back the original args a killed run left on the Deployment "
        "(every run also does this first)",
        description="Put back the original args a killed run left on the Deployment.",
        **examples("glassbox lab restore seed-l40s", "glassbox lab restore my-plan.yaml"),
    )
    restore.add_argument("plan", metavar="PLAN.yaml", help="plan file, or a shipped plan's name")
    restore.add_argument("--backend", choices=["kubernetes", "local"])
    return p


def choose_backend(plan: Plan, asked: str | None) -> str:
    if asked is not None:
        if asked not in plan.backends:
            raise PlanError([f"target.{asked}: required for --backend {asked}"], plan.name)
        return asked
    if len(plan.backends) != 1:
        raise PlanError(
            [f"target: has {' and '.join(plan.backends)}; choose one with --backend"], plan.name
        )
    return plan.backends[0]


def make_backend(
    plan: Plan,
    kind: str,
    out: Path,
    server_command: str | None,
    log: Callable[[str], None],
    api_key: ApiKey | None = None,
) -> Backend:
    if kind == "local":
        from vllm_glassbox.lab.backends.local import LocalBackend

        assert plan.local is not None
        # The plan's key guards the server the lab starts: vLLM reads VLLM_API_KEY as it
        # reads --api-key, and the key stays off the command line and out of its log.
        env = {"VLLM_API_KEY": api_key.value} if api_key else None
        return LocalBackend(plan.local, out / "logs", server_command or DEFAULT_COMMAND, env=env)
    from vllm_glassbox.lab.backends.kubernetes import KubernetesBackend, Timeouts

    target = plan.kubernetes
    assert target is not None
    return KubernetesBackend.from_environment(
        deployment=target.deployment,
        service_url=target.url,
        namespace=target.namespace,
        container=target.container,
        timeouts=Timeouts(rollout_seconds=target.rollout_timeout_seconds),
        log=log,
    )


def grafana_from(plan: Plan) -> GrafanaAnnotations | None:
    """Grafana from the environment (GLASSBOX_GRAFANA_URL/_TOKEN), else the plan."""
    url = os.environ.get("GLASSBOX_GRAFANA_URL") or (plan.grafana.url if plan.grafana else None)
    token_env = plan.grafana.token_env if plan.grafana else "GLASSBOX_GRAFANA_TOKEN"
    token = os.environ.get(token_env) or os.environ.get("GLASSBOX_GRAFANA_TOKEN")
    if not url or not token:
        return None
    return GrafanaAnnotations(url, token)


def exit_code(results: LabResults) -> int:
    return EXIT_OK if results.status == "ok" else EXIT_FAILED


def run(args: argparse.Namespace, prog: str) -> int:
    try:
        plan = resolve_plan(args.plan)
        kind = choose_backend(plan, args.backend)
        try:
            listen = parse_host_port(args.metrics_listen) if args.metrics_listen else None
        except ValueError as e:
            raise ValueError(f"--metrics-listen: {e}") from None
        if args.prometheus and not args.prometheus.startswith(("http://", "https://")):
            raise ValueError(f"--prometheus: {args.prometheus!r} is not an http(s) URL")
        if args.server_command and kind != "local":
            raise ValueError("--server-command is for the local backend")
        source = key_source(plan.api_key)
        api_key = open_api_key(source) if source else None
    except (PlanError, ValueError) as e:
        print(f"{prog}: {e}", file=sys.stderr)
        return EXIT_USAGE
    try:
        return _run(args, prog, plan, kind, listen, api_key)
    finally:
        if api_key is not None:
            api_key.close()


def _run(
    args: argparse.Namespace,
    prog: str,
    plan: Plan,
    kind: str,
    listen: tuple[str, int] | None,
    api_key: ApiKey | None,
) -> int:
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    observers: list[Observer] = []
    phase_info = PhaseInfo()
    observers.append(phase_info)
    server = None
    if listen is not None:
        try:
            server = phase_info.serve(*listen)
        except OSError as e:
            print(f"{prog}: cannot listen on {args.metrics_listen}: {e}", file=sys.stderr)
            return EXIT_USAGE
    grafana = grafana_from(plan)
    if grafana is not None:
        observers.append(grafana)
    try:
        with Progress() as progress:
            try:
                backend = make_backend(plan, kind, out, args.server_command, progress.note, api_key)
            except Exception as e:  # no kube-config, an unreachable cluster…
                print(f"{prog}: cannot set up the {kind} backend: {e}", file=sys.stderr)
                return EXIT_USAGE
            try:  # a run killed before it restored comes first
                leftover = backend.restore_leftover()
            except Exception as e:  # someone changed the args since; the API refuses…
                print(f"{prog}: cannot restore what an earlier run left: {e}", file=sys.stderr)
                return EXIT_FAILED
            if leftover:
                progress.note(leftover)
            beside = kind == "local" and plan.local is not None and plan.local.exporter
            results = run_plan(
                plan,
                backend,
                progress,
                out,
                observers=observers,
                notes=[leftover] if leftover else [],
                exporter_port=free_port() if beside else None,
                api_key=api_key,
                prometheus_url=args.prometheus,
            )
    except STOPPED as e:
        restored = "the server was stopped" if kind == "local" else "the args were restored"
        print(
            f"\n{prog}: interrupted; {restored}. Partial report: {out / 'report.md'}",
            file=sys.stderr,
        )
        return stopped_exit_code(e)
    finally:
        if server is not None:
            server.shutdown()
            server.server_close()
    print(f"report: {out / 'report.md'}  results: {out / 'results.json'}")
    return exit_code(results)


def check(args: argparse.Namespace, prog: str) -> int:
    try:
        plan = resolve_plan(args.plan)
    except PlanError as e:
        print(f"{prog}: {e}", file=sys.stderr)
        return EXIT_USAGE
    print(f"{plan.name}: valid; targets: {', '.join(plan.backends)}")
    if plan.peak_bandwidth is not None:
        peak = plan.peak_bandwidth
        print(
            "  peak memory bandwidth: "
            + (
                "measured by a copy benchmark when the run starts"
                if peak.bytes_per_second is None
                else f"{peak.bytes_per_second / 1e9:,.0f} GB/s from {peak.source}"
            )
        )
    if plan.api_key is not None:
        print(f"  API key: from {plan.api_key.describe()}")
    for phase in plan.phases:
        print(f"  {phase.name} ({phase.kind}): {phase.describe()}")
    # A phase whose first server has the args of the one before keeps it: one fewer.
    print(f"  at most {plan.server_starts} server start(s)")
    return EXIT_OK


def restore(args: argparse.Namespace, prog: str) -> int:
    try:
        plan = resolve_plan(args.plan)
        kind = choose_backend(plan, args.backend)
    except PlanError as e:
        print(f"{prog}: {e}", file=sys.stderr)
        return EXIT_USAGE

    def say(message: str) -> None:
        print(message, file=sys.stderr, flush=True)

    try:
        backend = make_backend(plan, kind, Path("lab-out"), None, say)
    except Exception as e:
        print(f"{prog}: cannot set up the {kind} backend: {e}", file=sys.stderr)
        return EXIT_USAGE
    try:
        done = backend.restore_leftover()
    except Exception as e:
        print(f"{prog}: {e}", file=sys.stderr)
        return EXIT_FAILED
    if done:
        print(done)
    elif kind == "local":
        print(
            "local backend: the lab keeps no record; a server a killed run left runs in its "
            "own process group (its pid is in the log's first lines): stop that group"
        )
    else:
        print(f"{plan.name}: no record of an interrupted run on the Deployment; nothing to do")
    return EXIT_OK


def main(argv: Sequence[str], prog: str = "glassbox lab") -> int:
    args = build_parser(prog).parse_args(argv)
    set_up_logging(getattr(args, "log_level", "warning"), getattr(args, "log_format", "logfmt"))
    commands = {"run": run, "check": check, "restore": restore}
    return commands[args.command](args, prog)
