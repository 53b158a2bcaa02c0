"""The core's packages of concern modules (`core/derive/`, `core/slo/`): every public name
of every module is the package's, so `derive.X` or `slo.X` finds whatever a concern
defines; no name is defined twice; no concern imports its own package."""

from __future__ import annotations

import ast
import importlib
import pkgutil
from pathlib import Path
from types import ModuleType

import pytest
from vllm_glassbox.core import derive, slo

PACKAGES = (derive, slo)
CONCERNS = [
    (package, m.name)
    for package in PACKAGES
    for m in pkgutil.iter_modules([str(Path(str(package.__file__)).parent)])
]


def _id(case: tuple[ModuleType, str]) -> str:
    return f"{case[0].__name__.rsplit('.', 1)[-1]}.{case[1]}"


def source(package: ModuleType, module: str) -> ast.Module:
    return ast.parse((Path(str(package.__file__)).parent / f"{module}.py").read_text())


def defined_in(package: ModuleType, module: str) -> list[str]:
    """The public names a concern module defines itself (not those it imports)."""
    names: list[str] = []
    for node in source(package, module).body:
        if isinstance(node, ast.FunctionDef | ast.ClassDef):
            names.append(node.name)
        elif isinstance(node, ast.Assign):
            for target in node.targets:
                elements = target.elts if isinstance(target, ast.Tuple) else [target]
                names += [t.id for t in elements if isinstance(t, ast.Name)]
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names.append(node.target.id)
    return [n for n in names if not n.startswith("_")]


@pytest.mark.parametrize("case", CONCERNS, ids=_id)
def test_every_public_name_of_a_concern_is_the_packages(case: tuple[ModuleType, str]) -> None:
    package, module = case
    concern = importlib.import_module(f"{package.__name__}.{module}")
    names = defined_in(package, module)
    assert names, f"{module} defines nothing"
    for name in names:
        assert name in package.__all__, f"{package.__name__} does not export {module}.{name}"
        assert getattr(package, name) is getattr(concern, name)


@pytest.mark.parametrize("package", PACKAGES, ids=lambda p: p.__name__)
def test_no_name_is_defined_by_two_concerns(package: ModuleType) -> None:
    everywhere = [name for p, module in CONCERNS if p is package for name in defined_in(p, module)]
    assert sorted(everywhere) == sorted(set(everywhere))
    assert sorted(everywhere) == sorted(package.__all__)


@pytest.mark.parametrize("case", CONCERNS, ids=_id)
def test_a_concern_imports_modules_of_its_package_not_the_package(
    case: tuple[ModuleType, str],
) -> None:
    """Importing the package itself from one of its modules would be a circle."""
    package, module = case
    for node in ast.walk(source(package, module)):
        if isinstance(node, ast.ImportFrom):
            imported = [f"{node.module}.{a.name}" for a in node.names] + [str(node.module)]
        elif isinstance(node, ast.Import):
            imported = [a.name for a in node.names]
        else:
            continue
        assert package.__name__ not in imported, f"{module}: {ast.unparse(node)}"
