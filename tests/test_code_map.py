"""docs/code-map.md against the tree: every folder, module and subcommand is on the map."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest
from vllm_glassbox import cli

REPO = Path(__file__).resolve().parent.parent
MAP = (REPO / "docs" / "code-map.md").read_text()
PACKAGE_DIRS: dict[str, str] = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"][
    "setuptools"
]["package-dir"]


def test_the_map_gives_the_folder_of_every_import_path() -> None:
    for package, folder in PACKAGE_DIRS.items():
        assert f"| `{package}` | `{folder}/` |" in MAP, package


def _section(folder: str) -> str:
    """What the map says of one folder's modules: from its bold name to the next one."""
    start = MAP.index(f"**`{folder}/`**")
    rest = MAP[start + 1 :]
    ends = [m.start() for m in re.finditer(r"\n\*\*`|\n## ", rest)]
    return rest[: min(ends)] if ends else rest


@pytest.mark.parametrize("folder", sorted(PACKAGE_DIRS.values()))
def test_the_map_names_every_module_of_each_folder(folder: str) -> None:
    modules = [p.name for p in sorted((REPO / folder).glob("*.py")) if not p.name.startswith("_")]
    assert modules
    section = _section(folder)
    assert [m for m in modules if f"`{m}`" not in section] == []


def test_the_map_names_every_subpackage_and_its_modules() -> None:
    packages: list[str] = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"][
        "setuptools"
    ]["packages"]
    nested = [p for p in packages if p not in PACKAGE_DIRS]
    assert nested
    for package in nested:
        root = max((r for r in PACKAGE_DIRS if package.startswith(r + ".")), key=len)
        parts = package.removeprefix(root + ".").split(".")
        # A subpackage is mapped in its top folder's section (lab/experiments/ for
        # lab/experiments/rate_sweep/), by its folder's name and its modules' names.
        section = _section(f"{PACKAGE_DIRS[root]}/{parts[0]}")
        folder = REPO / PACKAGE_DIRS[root] / Path(*parts)
        names = [f"`{parts[-1]}/`"] if len(parts) > 1 else []
        names += [f"`{p.name}`" for p in sorted(folder.glob("*.py")) if not p.name.startswith("_")]
        assert [n for n in names if n not in section] == [], package


def test_the_map_gives_the_module_of_every_subcommand() -> None:
    for name, (module, _) in cli._PARTS.items():
        assert re.search(rf"\| `glassbox {name}[ `].*\| `{re.escape(module)}` \|", MAP), name


def test_the_map_names_every_module_the_tests_share() -> None:
    shared = sorted(p.name for p in (REPO / "tests").glob("*.py") if p.name != "__init__.py")
    section = MAP[MAP.index("## The tests") : MAP.index("## What is generated")]
    assert [m for m in shared if f"`{m}`" not in section] == []
