"""The house's sizes, read from the source: no module over 500 lines, no function over 80.

A module that outgrows the first is split by concern (`core/derive/`, `core/slo/`); a
function that outgrows the second into well-named steps. Every source package is read:
the core, the sidecar, explain, the dashboards, the lab and the command.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
PACKAGES = ("core", "exporter", "explain", "dashboards", "lab", "glassbox")
MAX_MODULE_LINES = 500
MAX_FUNCTION_LINES = 80


def modules(package: str) -> list[Path]:
    return sorted((REPO / package).rglob("*.py"))


def long_functions(source: str, limit: int) -> list[tuple[str, int, int]]:
    """(name, first line, lines) of every function or method longer than `limit` lines,
    its decorators left out and its docstring counted."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            lines = (node.end_lineno or node.lineno) - node.lineno + 1
            if lines > limit:
                found.append((node.name, node.lineno, lines))
    return found


@pytest.mark.parametrize("package", PACKAGES)
def test_no_module_is_over_500_lines(package: str) -> None:
    assert modules(package)
    too_long = {
        str(path.relative_to(REPO)): n
        for path in modules(package)
        if (n := len(path.read_text().splitlines())) > MAX_MODULE_LINES
    }
    assert too_long == {}


@pytest.mark.parametrize("package", PACKAGES)
def test_no_function_is_over_80_lines(package: str) -> None:
    too_long = [
        f"{path.relative_to(REPO)}:{line} {name} ({lines} lines)"
        for path in modules(package)
        for name, line, lines in long_functions(path.read_text(), MAX_FUNCTION_LINES)
    ]
    assert too_long == []


def test_a_function_is_measured_from_its_def_to_its_last_line() -> None:
    def lines(n: int, indent: str) -> str:
        return "".join(f"{indent}x{i} = {i}\n" for i in range(n))

    eighty = "@decorated\ndef short():\n" + lines(79, " " * 4)
    longer = "class C:\n    def longer(self):\n" + lines(81, " " * 8)
    assert long_functions(eighty + longer, 80) == [("longer", 83, 82)]
    assert long_functions(eighty, 79) == [("short", 2, 80)]
    assert long_functions(eighty + longer, 82) == []


def test_no_symbolic_link_is_tracked() -> None:
    """A link committed by accident (a set-up folder linked into a second checkout) replaces
    the real folder in every checkout that merges it."""
    import subprocess

    listed = subprocess.run(
        ["git", "ls-files", "-s"], cwd=REPO, capture_output=True, text=True, check=True
    ).stdout
    links = [line.split("\t", 1)[1] for line in listed.splitlines() if line.startswith("120000")]
    assert links == []
