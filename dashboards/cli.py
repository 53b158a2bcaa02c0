"""`glassbox dashboards generate [--check]` and `glassbox dashboards snapshot`."""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from vllm_glassbox.dashboards import catalog


def build_parser(prog: str) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=prog, description="Generate glassbox's Grafana dashboards; snapshot them as PNG."
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    gen = sub.add_parser(
        "generate",
        help="write dashboards/generated/<uid>.json from the Python sources",
        description="Write each dashboard's JSON (sorted, indented) from its Python source.",
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


def main(argv: Sequence[str], prog: str = "glassbox dashboards") -> int:
    args = build_parser(prog).parse_args(list(argv))
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
    from vllm_glassbox.dashboards.grafana import parse_time
    from vllm_glassbox.dashboards.pictures import draw_pictures
    from vllm_glassbox.prometheus import Prometheus, PrometheusError

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
