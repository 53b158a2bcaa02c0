"""The derivation core is one package of concern modules, and every public name of every
module is the package's: `derive.X` finds whatever function a concern defines."""

from __future__ import annotations

import ast
import pkgutil
from pathlib import Path

import pytest
from vllm_glassbox.core import derive

PACKAGE = Path(derive.__file__).parent
CONCERNS = sorted(m.name for m in pkgutil.iter_modules([str(PACKAGE)]))


def defined_in(module: str) -> list[str]:
    """The public names a concern module defines itself (not those it imports)."""
    tree = ast.parse((PACKAGE / f"{module}.py").read_text())
    names: list[str] = []
    for node in tree.body:
        if isinstance(node, ast.FunctionDef | ast.ClassDef):
            names.append(node.name)
        elif isinstance(node, ast.Assign):
            names += [t.id for t in node.targets if isinstance(t, ast.Name)]
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names.append(node.target.id)
    return [n for n in names if not n.startswith("_")]


@pytest.mark.parametrize("module", CONCERNS)
def test_every_public_name_of_a_concern_is_the_packages(module: str) -> None:
    concern = __import__(f"{derive.__name__}.{module}", fromlist=["_"])
    names = defined_in(module)
    assert names, f"{module} defines nothing"
    for name in names:
        assert name in derive.__all__, f"derive/__init__.py does not export {module}.{name}"
        assert getattr(derive, name) is getattr(concern, name)


def test_no_name_is_defined_by_two_concerns() -> None:
    everywhere = [name for module in CONCERNS for name in defined_in(module)]
    assert sorted(everywhere) == sorted(set(everywhere))
    assert sorted(everywhere) == sorted(derive.__all__)


@pytest.mark.parametrize("module", CONCERNS)
def test_a_concern_imports_modules_of_the_package_not_the_package(module: str) -> None:
    """Importing `vllm_glassbox.core.derive` itself from a concern would be a circle."""
    tree = ast.parse((PACKAGE / f"{module}.py").read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            imported = [f"{node.module}.{a.name}" for a in node.names] + [str(node.module)]
        elif isinstance(node, ast.Import):
            imported = [a.name for a in node.names]
        else:
            continue
        assert derive.__name__ not in imported, f"{module}: {ast.unparse(node)}"
