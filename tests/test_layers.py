"""The layers of the package, kept by its imports (read from the source, not run).

The lab is laid out in layers: `lab/backends/` (where vLLM runs) and `lab/vllm/` (the
talk to vLLM) at the bottom, beside the exporter they use; the modules every kind shares
at the lab's top level (`results.py`, `analysis.py`, …) and `lab/experiments/base.py` and
`pool_acts.py` above them; one package per experiment kind above those; and at the top
the run's assembly (`cli`, `demo`, `launch`, `runner`, `plan`, `report`, `sidecar`,
`telemetry`), which imports everything. An import that points upwards, or from one kind
into another, is refused here with the file and line that makes it.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
FOLDERS = {"glassbox": "vllm_glassbox", "exporter": "vllm_glassbox.exporter"}
FOLDERS |= {"lab": "vllm_glassbox.lab", "dashboards": "vllm_glassbox.dashboards"}

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


def layer(module: str) -> str:
    """Where a module of the package sits: exporter, dashboards, glassbox, or one of the
    lab's layers (backends, vllm, shared, experiments, registry, kind:NAME, assembly)."""
    parts = module.split(".")
    if parts[:2] in (["vllm_glassbox", "exporter"], ["vllm_glassbox", "dashboards"]):
        return parts[1]
    if parts[:2] != ["vllm_glassbox", "lab"]:
        return "glassbox"
    rest = parts[2:]
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


def forbidden(importer: str, imported: str) -> str | None:
    """Why `importer` may not import `imported`; None when it may."""
    mine, theirs = layer(importer), layer(imported)
    kind = theirs.startswith("kind:")
    if mine == "exporter" and (theirs == "dashboards" or theirs in LAB or kind):
        return "the exporter never imports the lab or the dashboards"
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
            if name.startswith("vllm_glassbox."):
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
        ("exporter.derive", "lab.results", True),
        ("exporter.derive", "dashboards.panels", True),
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
