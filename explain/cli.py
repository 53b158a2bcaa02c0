"""`glassbox explain`: what a running server does, in words, with the numbers behind it
and what would change it.

    glassbox explain --prometheus URL [--namespace NS] [--model M] [--since 1h] [--at TIME]
      [--slo FILE]
    glassbox explain --exporter URL [--ca-file F] [--username-file F --password-file F]
      [--format text|markdown|json] [--lab results.json] [--gpu-memory BYTES]

The output is written whole once everything is read, or not at all. Exit status:

| status | meaning |
| --- | --- |
| 0 | explained (whatever was found) |
| 2 | the command line is wrong |
| 3 | Prometheus cannot be reached, or answers errors |
| 4 | Prometheus has no vLLM series at all over the window |
| 5 | nothing for the namespace or model asked (the message lists those there are) |
| 6 | the exporter cannot be reached, or is not a glassbox exporter |
| 7 | the --lab file cannot be read as a lab run's results.json |
| 8 | the --slo file is no SLO file (each problem named) |
"""

from __future__ import annotations

import argparse
import datetime
import sys
import time
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

from vllm_glassbox.core.errors import ScrapeError
from vllm_glassbox.core.fetch import TargetCredentials
from vllm_glassbox.core.helptext import examples
from vllm_glassbox.core.prometheus import Prometheus, PrometheusError
from vllm_glassbox.core.slo import SloError, SloFile, read_slo_file
from vllm_glassbox.core.units import base_url_problems, parse_duration, parse_positive_number
from vllm_glassbox.explain.diagnoses import explain
from vllm_glassbox.explain.findings import Explained
from vllm_glassbox.explain.from_exporter import read_findings_page
from vllm_glassbox.explain.from_lab import LabFileError, baseline, load_results
from vllm_glassbox.explain.from_prometheus import (
    NotFound,
    NothingHere,
    Selection,
    read_scenes,
    with_slo_file,
)
from vllm_glassbox.explain.render import FORMATS, render
from vllm_glassbox.explain.scene import LabBaseline, Reading, Scene

EXIT_PROMETHEUS = 3
EXIT_NOTHING = 4
EXIT_NOT_FOUND = 5
EXIT_EXPORTER = 6
EXIT_LAB = 7
EXIT_SLO = 8


def parse_time(text: str) -> float:
    """Unix seconds, or an ISO 8601 time (UTC unless it says otherwise)."""
    try:
        return float(text)
    except ValueError:
        pass
    try:
        moment = datetime.datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise ValueError(f"not a time: {text!r} (unix seconds or ISO 8601)") from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=datetime.UTC)
    return moment.timestamp()


def _parser(prog: str) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=prog,
        description="Explain what vLLM is doing: findings in words, most severe first, each "
        "with its numbers, the series they came from, what would change it and what it "
        "assumes. Reads Prometheus (every model and namespace it scrapes, or the ones "
        "named) or one exporter.",
        **examples(
            "glassbox explain --prometheus http://prometheus:9090 --namespace llm --since 1h",
            "glassbox explain --prometheus http://prometheus:9090 --model qwen --format markdown",
            "glassbox explain --prometheus http://prometheus:9090 --slo slo.yaml",
            "glassbox explain --exporter http://127.0.0.1:9400 --lab out/results.json",
        ),
    )
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--prometheus", metavar="URL", help="Prometheus' base URL")
    source.add_argument("--exporter", metavar="URL", help="a glassbox exporter's base URL")
    parser.add_argument("--namespace", help="only this namespace (with --prometheus)")
    parser.add_argument("--model", help="only this model_name (with --prometheus)")
    parser.add_argument(
        "--since",
        default="1h",
        metavar="DUR",
        help="the window (with --prometheus): 30m, 1h, 2h… (default 1h)",
    )
    parser.add_argument(
        "--at",
        metavar="TIME",
        help="the window's end (with --prometheus): unix seconds or ISO 8601 (default now)",
    )
    parser.add_argument("--format", choices=FORMATS, default="text")
    parser.add_argument(
        "--lab",
        metavar="FILE",
        help="a lab run's results.json: its measured precisions, fitted line and step "
        "without speculation, set beside what the server shows",
    )
    parser.add_argument(
        "--slo",
        metavar="FILE",
        help="the SLO file the rules were rendered from (with --prometheus): each "
        "objective's own threshold beside the bucket boundary counted, and its objectives "
        "Prometheus has no record of",
    )
    parser.add_argument(
        "--gpu-memory",
        metavar="BYTES",
        type=parse_positive_number,
        help="one GPU's memory in bytes (e.g. 150e9), which no series shows: the "
        "--gpu-memory-utilization that would hold the KV demand",
    )
    parser.add_argument("--timeout", default="30s", metavar="DUR", help="per request (default 30s)")
    parser.add_argument("--ca-file", metavar="FILE", help="CA to trust for an https exporter")
    parser.add_argument(
        "--username-file", metavar="FILE", help="basic auth towards the exporter (its web config)"
    )
    parser.add_argument("--password-file", metavar="FILE", help="its password")
    return parser


def _scenes_from_prometheus(args: argparse.Namespace, gpu_memory: Reading | None) -> list[Scene]:
    selection = Selection(
        args.prometheus.rstrip("/"),
        args.namespace,
        args.model,
        parse_duration(args.since),
        parse_time(args.at) if args.at else time.time(),
    )
    with Prometheus(selection.prometheus_url, parse_duration(args.timeout)) as client:
        return read_scenes(client, selection, gpu_memory)


def _scenes_from_exporter(args: argparse.Namespace, gpu_memory: Reading | None) -> list[Scene]:
    url = args.exporter.rstrip("/")
    credentials = TargetCredentials(
        ca_file=args.ca_file, username_file=args.username_file, password_file=args.password_file
    )
    scenes = read_findings_page(url, parse_duration(args.timeout), credentials)
    return [
        replace(scene, scope=replace(scene.scope, where=url), gpu_memory=gpu_memory)
        for scene in scenes
    ]


def main(argv: Sequence[str], prog: str = "glassbox explain") -> int:
    parser = _parser(prog)
    args = parser.parse_args(argv)
    url = args.prometheus or args.exporter
    problems = base_url_problems(url)
    if problems:
        parser.error(f"{url}: {'; '.join(problems)}")
    if args.exporter and (args.namespace or args.model or args.at):
        parser.error("--namespace, --model and --at select in Prometheus: not with --exporter")
    if args.exporter and args.slo:
        parser.error("--slo reads the SLO rules' records in Prometheus: not with --exporter")
    if args.prometheus and (args.ca_file or args.username_file or args.password_file):
        parser.error("--ca-file, --username-file and --password-file reach an exporter")
    if bool(args.username_file) != bool(args.password_file):
        parser.error("--username-file and --password-file go together")
    try:
        parse_duration(args.since)
        parse_duration(args.timeout)
        if args.at:
            parse_time(args.at)
    except ValueError as e:
        parser.error(str(e))
    gpu_memory = Reading(args.gpu_memory, "--gpu-memory") if args.gpu_memory is not None else None
    lab: LabBaseline | None = None
    if args.lab:
        try:
            lab = baseline(load_results(args.lab), args.lab)
        except LabFileError as e:
            print(f"{prog}: --lab: {e}", file=sys.stderr)
            return EXIT_LAB
    objectives: SloFile | None = None
    if args.slo:
        try:
            objectives = read_slo_file(Path(args.slo))
        except SloError as e:
            print(f"{prog}: --slo: {e}", file=sys.stderr)
            return EXIT_SLO
    try:
        if args.prometheus:
            scenes = _scenes_from_prometheus(args, gpu_memory)
        else:
            scenes = _scenes_from_exporter(args, gpu_memory)
    except PrometheusError as e:
        print(f"{prog}: Prometheus at {args.prometheus}: {e}", file=sys.stderr)
        return EXIT_PROMETHEUS
    except NothingHere as e:
        print(f"{prog}: {e}", file=sys.stderr)
        return EXIT_NOTHING
    except NotFound as e:
        print(f"{prog}: {e}", file=sys.stderr)
        return EXIT_NOT_FOUND
    except ScrapeError as e:
        print(f"{prog}: the exporter at {args.exporter}: {e}", file=sys.stderr)
        return EXIT_EXPORTER
    if objectives is not None:
        scenes = [with_slo_file(scene, objectives) for scene in scenes]
    explained: list[Explained] = [explain(replace(scene, lab=lab or scene.lab)) for scene in scenes]
    sys.stdout.write(render(explained, args.format))
    return 0
