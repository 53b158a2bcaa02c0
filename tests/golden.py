"""Golden files of the exporter's /metrics output (tests/golden/*.prom).

`check_golden` compares a rendering with its file; `pytest --update-golden` rewrites the
files instead (review the diff before committing). Volatile lines (wall-clock times, the
package version, process_* of the test process) are stripped before either.
"""

from __future__ import annotations

import difflib
from pathlib import Path

import pytest

GOLDEN = Path(__file__).resolve().parent / "golden"

#: Families whose values depend on when and where the test runs, not on the pages.
VOLATILE_PREFIXES = (
    "glassbox_last_scrape_success_timestamp_seconds",  # time.time()
    "glassbox_target_last_restart_timestamp_seconds",  # time.time() of a poll
    "glassbox_scrape_duration_seconds",  # a measured duration
    "glassbox_build_info",  # the package version
    "process_",  # the test process itself
    "python_",
)


def family_of(line: str) -> str:
    """The metric name a line of exposition belongs to ('' for blank lines)."""
    if line.startswith("# HELP ") or line.startswith("# TYPE "):
        return line.split(" ", 3)[2]
    return line.split("{", 1)[0].split(" ", 1)[0]


def strip_volatile(exposition: str) -> str:
    return "".join(
        line
        for line in exposition.splitlines(keepends=True)
        if not family_of(line).startswith(VOLATILE_PREFIXES)
    )


def check_golden(name: str, text: str, update: bool, suffix: str = ".prom") -> None:
    """Assert `text` equals tests/golden/<name><suffix>, or rewrite that file when `update`
    (`name` may name a subfolder: explain/fleet)."""
    path = GOLDEN / f"{name}{suffix}"
    if update:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        return
    if not path.exists():
        pytest.fail(f"{path} does not exist: run `pytest --update-golden` and review it")
    expected = path.read_text()
    if text != expected:
        diff = "".join(
            difflib.unified_diff(
                expected.splitlines(keepends=True),
                text.splitlines(keepends=True),
                f"golden/{name}{suffix}",
                "output",
            )
        )
        pytest.fail(
            f"output differs from golden/{name}{suffix} "
            f"(`pytest --update-golden` rewrites it after review):\n{diff}",
            pytrace=False,
        )
