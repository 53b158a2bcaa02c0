"""The layers of the package, kept by its imports (read from the source, not run).

Every package stands on `core/` (vLLM's pages and logs read, and every derived number),
which stands on nothing of the project. `explain/` and `dashboards/` stand on the core; the
sidecar (`exporter/`) on the core and on explain (its findings); the lab on all of those;
the `glassbox` command and the benchmarks on everything. `ARROWS` says which package may
import which, once; an import the table does not allow is refused with its file and line,
at run time or for types alike.

Inside the lab, layers again: `lab/backends/` (where vLLM runs) and `lab/vllm/` (the talk
to vLLM) at the bottom; the modules every kind shares at the lab's top level
(`results.py`, `analysis.py`, …) and `lab/experiments/base.py` and `pool_acts.py` above
them; one package per experiment kind above those; and at the top the run's assembly
(`cli`, `demo`, `launch`, `runner`, `plan`, `report`, `sidecar`, `telemetry`). An import
that points upwards, or from one kind into another, is refused.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
#: Each folder of the package and its import name; `benchmarks/` is read as a package too.
FOLDERS = {
    "glassbox": "vllm_glassbox",
    "core": "vllm_glassbox.core",
    "exporter": "vllm_glassbox.exporter",
    "explain": "vllm_glassbox.explain",
    "dashboards": "vllm_glassbox.dashboards",
    "lab": "vllm_glassbox.lab",
    "benchmarks": "benchmarks",
}

#: Which package may import which (itself always): the one table of the house's arrows.
ARROWS: dict[str, set[str]] = {
    "core": set(),
    "explain": {"core"},
    "dashboards": {"core"},
    "exporter": {"core", "explain"},
    "lab": {"core", "explain", "dashboards", "exporter"},
    "glassbox": {"core", "explain", "dashboards", "exporter", "lab"},
    "benchmarks": {"core", "explain", "dashboards", "exporter", "lab", "glassbox"},
}

#: The run's assembly: what puts the layers below together into a run.
ASSEMBLY = ("cli", "demo", "launch", "runner", "plan", "report", "sidecar", "telemetry")
KINDS = sorted(p.parent.name for p in (REPO / "lab" / "experiments").glob("*/__init__.py"))


def module_of(path: Path) -> str:
    """The import name of a source file (`lab/backends/local.py` -> ….lab.backends.local)."""
    rel = path.relative_to(REPO)
    parts = [FOLDERS[rel.parts[0]], *rel.parts[1:-1]]
    if path.stem != "__init__":
        parts.append(path.stem)
    return ".".join(parts)


def package(module: str) -> str:
    """Which of `ARROWS`' packages a module is in (`vllm_glassbox` itself: glassbox)."""
    parts = module.split(".")
    if parts[0] == "benchmarks":
        return "benchmarks"
    if len(parts) > 1 and parts[1] in ARROWS and parts[1] != "glassbox":
        return parts[1]
    return "glassbox"


def layer(module: str) -> str:
    """Where a module of the lab sits (backends, vllm, shared, experiments, registry,
    kind:NAME, assembly); outside the lab, its package."""
    if package(module) != "lab":
        return package(module)
    rest = module.split(".")[2:]
    if not rest:
        return "shared"  # the lab package's own __init__
    if rest[0] in ASSEMBLY:
        return "assembly"
    if rest[0] in ("backends", "vllm"):
        return rest[0]
    if rest[0] == "experiments":
        if len(rest) == 1:
            return "registry"  # experiments/__init__.py lists the kinds
        return f"kind:{rest[1]}" if rest[1] in KINDS else "experiments"
    return "shared"


#: The lab's layers; a kind's is "kind:NAME".
LAB = {"assembly", "shared", "registry", "experiments", "backends", "vllm"}
#: Where the lab reaches the sidecar: the exporter run beside each server.
LAB_TO_EXPORTER = {"assembly"}


def forbidden(importer: str, imported: str) -> str | None:
    """Why `importer` may not import `imported`; None when it may."""
    mine, theirs = package(importer), package(imported)
    if imported == "vllm_glassbox" or imported.startswith("vllm_glassbox.__"):
        return None  # the package root: its version, nothing else
    if mine != theirs and theirs not in ARROWS[mine]:
        return f"{mine}/ never imports {theirs}/"
    if mine == "lab" and theirs == "exporter" and layer(importer) not in LAB_TO_EXPORTER:
        return "only the run's assembly starts the sidecar"
    if mine != "lab" or theirs != "lab":
        return None
    mine, theirs = layer(importer), layer(imported)
    kind = theirs.startswith("kind:")
    if mine in ("backends", "vllm") and (theirs in LAB - {mine} or kind):
        return f"lab/{mine}/ imports nothing of the lab outside itself"
    if mine.startswith("kind:"):
        if theirs in ("assembly", "registry"):
            return "a kind never imports the run's assembly"
        if kind and theirs != mine:
            return "a kind never imports a sibling kind"
    if mine in ("shared", "experiments") and (theirs in ("assembly", "registry") or kind):
        return "what the kinds share never imports the run or a kind"
    return None


@dataclass(frozen=True)
class Import:
    where: str  # path:line
    importer: str
    imported: str


def imports_of(path: Path) -> Iterator[Import]:
    """Every import of the package a file makes, at any depth (lazy ones too)."""
    importer = module_of(path)
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module:
            # `from vllm_glassbox.lab import findings` imports the module findings.
            names = [f"{node.module}.{a.name}" for a in node.names]
        for name in names:
            if name.startswith(("vllm_glassbox.", "benchmarks.")):
                yield Import(f"{path.relative_to(REPO)}:{node.lineno}", importer, name)


def sources() -> list[Path]:
    return sorted(p for folder in FOLDERS for p in (REPO / folder).rglob("*.py"))


def test_every_import_of_the_package_points_down_its_layers() -> None:
    wrong = [
        f"{i.where}: {i.imported} ({why})"
        for path in sources()
        for i in imports_of(path)
        if (why := forbidden(i.importer, i.imported))
    ]
    assert wrong == []


@pytest.mark.parametrize(
    ("importer", "imported", "refused"),
    [
        ("lab.backends.local", "lab.plan.Plan", True),
        ("lab.backends.local", "lab.backends.args.flag_value", False),
        ("lab.experiments.rate_sweep.run", "lab.experiments.kv_pressure.judge", True),
        ("lab.experiments.rate_sweep.run", "lab.experiments.pool_acts", False),
        ("lab.experiments.rate_sweep.run", "lab.runner", True),
        ("lab.experiments.base", "lab.experiments.kv_pressure", True),
        ("lab.results", "lab.report", True),
        ("lab.vllm.client", "lab.results", True),
        ("core.derive", "lab.results", True),
        ("core.derive", "dashboards.panels", True),
        ("core.derive", "exporter.history", True),
        ("core.slo", "explain.scene", True),
        ("explain.from_exporter", "exporter.exposition", True),
        ("explain.diagnoses", "core.derive", False),
        ("exporter.scene", "explain.scene", False),
        ("dashboards.catalog", "explain.render", True),
        ("lab.analysis", "exporter.service", True),
        ("lab.sidecar", "exporter.service", False),
        ("lab.report", "explain.render", False),
        ("lab.runner", "lab.experiments.kv_pressure", False),
    ],
)
def test_the_rule_refuses_an_import_up_the_layers_or_across_kinds(
    importer: str, imported: str, refused: bool
) -> None:
    why = forbidden(f"vllm_glassbox.{importer}", f"vllm_glassbox.{imported}")
    assert (why is not None) is refused


def test_every_folder_of_the_lab_has_a_layer() -> None:
    lab = REPO / "lab"
    folders = sorted(p.parent.relative_to(lab).as_posix() for p in lab.rglob("__init__.py"))
    assert {layer(module_of(lab / f / "__init__.py")) for f in folders} == {
        "shared",
        "backends",
        "vllm",
        "registry",
        *(f"kind:{k}" for k in KINDS),
    }
