"""`glassbox dashboards generate [--check]` and `glassbox dashboards snapshot`."""

from __future__ import annotations

import argparse
import re
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from vllm_glassbox.core.helptext import examples
from vllm_glassbox.dashboards import catalog


def build_parser(prog: str) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=prog,
        description="Generate glassbox's Grafana dashboards; snapshot them as PNG.",
        **examples(
            "glassbox dashboards generate --check",
            "glassbox dashboards snapshot --prometheus http://127.0.0.1:9090 --out shots "
            "--from -15m",
        ),
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    gen = sub.add_parser(
        "generate",
        help="write dashboards/generated/<uid>.json from the Python sources",
        description="Write each dashboard's JSON (sorted, indented) from its Python source.",
        **examples("glassbox dashboards generate", "glassbox dashboards generate --check"),
    )
    gen.add_argument(
        "--check",
        action="store_true",
        help="write nothing; exit 1 and name the files that differ from the sources",
    )
    gen.add_argument(
        "--out",
        type=Path,
        default=catalog.GENERATED_DIR,
        metavar="DIR",
        help="where the JSON files go (default: the package's generated/ folder)",
    )
    snap = sub.add_parser(
        "snapshot",
        help="draw every panel's data from Prometheus as PNG (no Grafana needed)",
        description="Run every panel's queries against Prometheus over a time range (all "
        "variables on All) and draw each panel, and each dashboard as a sheet, as PNG.",
        **examples(
            "glassbox dashboards snapshot --prometheus http://127.0.0.1:9090 --out shots "
            "--from -15m",
            "glassbox dashboards snapshot --prometheus http://prom:9090 --out shots "
            "--from 2026-11-30T10:00:00Z --to 2026-11-30T11:00:00Z",
        ),
    )
    snap.add_argument("--prometheus", required=True, metavar="URL", help="Prometheus base URL")
    snap.add_argument("--out", required=True, type=Path, metavar="DIR", help="output folder")
    snap.add_argument(
        "--from",
        dest="start",
        default="-1h",
        metavar="T",
        help="start: unix seconds, RFC 3339 or relative like -15m (default %(default)s)",
    )
    snap.add_argument(
        "--to", dest="end", default="now", metavar="T", help="end, same forms (default now)"
    )
    return parser


#: A relative time such as -15m: argparse would take it for a flag of its own.
_RELATIVE_TIME = re.compile(r"^-[0-9]")


def join_relative_times(argv: Sequence[str]) -> list[str]:
    """`--from -15m` as `--from=-15m`, so that the value is read as one."""
    out: list[str] = []
    for arg in argv:
        if out and out[-1] in ("--from", "--to") and _RELATIVE_TIME.match(arg):
            out[-1] += f"={arg}"
        else:
            out.append(arg)
    return out


def main(argv: Sequence[str], prog: str = "glassbox dashboards") -> int:
    args = build_parser(prog).parse_args(join_relative_times(argv))
    if args.command == "generate":
        return _generate(args.out, args.check)
    return _snapshot(args.prometheus, args.out, args.start, args.end)


def _generate(out: Path, check: bool) -> int:
    if check:
        drifted = catalog.drift(out)
        for name in drifted:
            print(f"{out / name}: differs from the dashboard sources", file=sys.stderr)
        if drifted:
            print("run `glassbox dashboards generate` and commit the result", file=sys.stderr)
            return 1
        print(f"{len(catalog.MODULES)} dashboards in {out} match their sources")
        return 0
    for path in catalog.write(out):
        print(path)
    return 0


def _snapshot(url: str, out: Path, start_text: str, end_text: str) -> int:
    from vllm_glassbox.core.prometheus import Prometheus, PrometheusError
    from vllm_glassbox.dashboards.grafana import parse_time
    from vllm_glassbox.dashboards.pictures import draw_pictures

    now = time.time()
    try:
        start, end = parse_time(start_text, now), parse_time(end_text, now)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    prometheus = Prometheus(url)
    try:
        result = draw_pictures(prometheus, out, start, end)
    except (PrometheusError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    finally:
        prometheus.close()
    print(f"{len(result.files)} PNG files in {out} (index: {out / 'index.md'})")
    for panel in result.empty:
        print(f"no data: {panel.dashboard_uid} / {panel.title}", file=sys.stderr)
    for panel in result.failed:
        print(
            f"query failed: {panel.dashboard_uid} / {panel.title}: {panel.errors}", file=sys.stderr
        )
    return 1 if result.failed else 0
