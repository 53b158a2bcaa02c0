"""One rule per number: a finding computes nothing itself.

The diagnoses (explain/diagnoses/, one module each) state numbers only as figures read
from a source or computed by a function of the derivation core (core/derive/). Two
checks keep it so: no module of the package has arithmetic at all (read from its syntax
tree), and `core` refuses any function that is not the core's.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
from vllm_glassbox.core import derive
from vllm_glassbox.explain import diagnoses
from vllm_glassbox.explain.findings import core

#: Every module of the diagnoses' package: the diagnoses, their registry, what they share.
MODULES = sorted(Path(diagnoses.__file__).parent.glob("*.py"))
#: Calls that compute a number (max and min only select among figures, so they stay).
ARITHMETIC_CALLS = {"sum", "round", "abs", "pow", "divmod", "fsum", "prod", "mean", "fmean"}
#: Operators on numbers (| is not one: `Reading | None` is a type).
OPERATORS = (ast.Add, ast.Sub, ast.Mult, ast.Div, ast.FloorDiv, ast.Mod, ast.Pow, ast.MatMult)


def arithmetic_in(source: str) -> list[str]:
    """Every place in `source` that computes a number: an arithmetic operator, an
    augmented assignment, a call to a summing or rounding function, anything of math."""
    found = []
    for node in ast.walk(ast.parse(source)):
        where = f"line {getattr(node, 'lineno', '?')}"
        operator = getattr(node, "op", None)
        if (isinstance(node, ast.BinOp | ast.AugAssign) and isinstance(operator, OPERATORS)) or (
            isinstance(node, ast.UnaryOp) and isinstance(operator, ast.USub)
        ):
            found.append(f"{where}: {ast.unparse(node)}")
        elif isinstance(node, ast.Call):
            name = ast.unparse(node.func)
            if name.split(".")[-1] in ARITHMETIC_CALLS or name.startswith(("math.", "statistics.")):
                found.append(f"{where}: {ast.unparse(node)}")
        elif isinstance(node, ast.Import | ast.ImportFrom):
            names = [a.name for a in node.names] + [getattr(node, "module", "") or ""]
            if {"math", "statistics", "numpy"} & set(names):
                found.append(f"{where}: {ast.unparse(node)}")
    return found


def test_every_diagnosis_has_its_module_read_by_the_check() -> None:
    read = {p.stem for p in MODULES}
    assert {d.__name__ for d in diagnoses.DIAGNOSES} <= read
    assert {"common", "registry", "__init__"} <= read


@pytest.mark.parametrize("module", MODULES, ids=lambda p: p.name)
def test_the_diagnoses_compute_no_number_themselves(module: Path) -> None:
    assert arithmetic_in(module.read_text()) == []


@pytest.mark.parametrize(
    "line",
    [
        "x = share.value * 100",
        "x = a - b",
        "total += stage",
        "x = sum(values)",
        "x = round(v, 2)",
        "x = math.floor(v)",
        "import math",
        "x = -v",
    ],
)
def test_the_check_catches_a_number_computed_by_hand(line: str) -> None:
    assert arithmetic_in(line) != []


def test_the_check_lets_selection_and_comparison_pass() -> None:
    source = "best = max(stages, key=lambda n: stages[n].value)\nok = fill.value >= 0.95"
    assert arithmetic_in(source) == []


def test_core_takes_only_the_derivation_cores_functions() -> None:
    assert core(derive.share_of, 1.0, 4.0, unit="ratio") is not None
    with pytest.raises(TypeError, match="derivation core"):
        core(lambda a, b: a / b, 1.0, 4.0, unit="ratio")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="derivation core"):
        core(max, 1.0, 4.0, unit="ratio")
