"""What the scripts that keep copies of the sources share (sync-chart-files.py for the
chart, sync-mixin.py for the mixin): the copies checked for drift, or written, and the
command line of both.

Each script says what its folder must hold (`expected(repo)`: each file's path in the
folder and its exact content); this module compares, writes and reports.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path

Expected = Callable[[Path], dict[Path, bytes]]


def drift(want: dict[Path, bytes], folder: Path) -> list[str]:
    """Files that differ from their sources, are missing, or have no source."""
    have = {p.relative_to(folder) for p in folder.rglob("*") if p.is_file()}
    problems = [f"{folder / n}: missing" for n in sorted(set(want) - have)]
    problems += [f"{folder / n}: no source (stale)" for n in sorted(have - set(want))]
    problems += [
        f"{folder / n}: differs from its source"
        for n in sorted(set(want) & have)
        if (folder / n).read_bytes() != want[n]
    ]
    return problems


def write(want: dict[Path, bytes], folder: Path) -> list[Path]:
    if folder.exists():
        for stale in [p for p in folder.rglob("*") if p.is_file()]:
            if stale.relative_to(folder) not in want:
                stale.unlink()
    for name, content in want.items():
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_bytes(content)
    return [folder / n for n in want]


def main(argv: list[str], doc: str, expected: Expected, folder: Path, repo: Path) -> int:
    """`SCRIPT [--check]`: write `folder` (relative to the repository) from the sources,
    or write nothing and exit 1 naming each file that drifted."""
    script = Path(sys.argv[0]).name
    parser = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="write nothing; exit 1 on drift")
    parser.add_argument("--repo", type=Path, default=repo, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    target = args.repo / folder
    want = expected(args.repo)
    if args.check:
        problems = drift(want, target)
        for problem in problems:
            print(problem, file=sys.stderr)
        if problems:
            print(f"run scripts/{script} and commit the result", file=sys.stderr)
            return 1
        print(f"{target}: every copy matches its source")
        return 0
    for path in write(want, target):
        print(path.relative_to(args.repo))
    return 0
