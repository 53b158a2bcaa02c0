"""The README's demo section (scripts/showcase.py): written from a real demo run's
output, and checked here against what docs/demo/ keeps of that run."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parent.parent


def _showcase() -> ModuleType:
    spec = importlib.util.spec_from_file_location("showcase", ROOT / "scripts" / "showcase.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


showcase = _showcase()


def test_the_readme_section_is_what_docs_demo_keeps_of_the_run() -> None:
    assert showcase.main(["--check"]) == 0
    kept = json.loads((ROOT / "docs" / "demo" / "showcase.json").read_text())
    picture = ROOT / kept["picture"]
    assert picture.read_bytes().startswith(b"\x89PNG\r\n\x1a\n")
    readme = (ROOT / "README.md").read_text()
    assert f"]({kept['picture']})" in readme
    # Near the top: before the first section a newcomer would scroll past.
    assert readme.index(showcase.BEGIN) < readme.index("## What is inside")
    assert [line.split("**")[1] for line in kept["summary"]] == [
        "quantization",
        "kv-pressure",
        "spec-decode",
    ]


def test_the_summary_is_the_reports_own_bullets() -> None:
    report = "# r\n\n## Summary\n\n- **a**: one.\n- **b**: two.\n\n## a\n\n- not this\n"
    assert showcase.summary_lines(report) == ["**a**: one.", "**b**: two."]
    with pytest.raises(ValueError, match="no '## Summary'"):
        showcase.summary_lines("# r\n")


def test_the_times_and_the_machine_are_read_as_the_demo_wrote_them() -> None:
    timing = showcase.read_timing("setup_seconds 45\ndemo_seconds 453\nstatus 0\n")
    assert timing == {"setup_seconds": 45, "demo_seconds": 453, "status": 0}
    cpuinfo = "model name\t: AMD EPYC\nflags\t\t: fpu sse avx512f avx512bw\n"
    assert showcase.machine(cpuinfo, 2) == "2 cores of an AMD EPYC with AVX-512"
    assert "without AVX-512" in showcase.machine("flags : fpu avx2\n", 2)


def test_a_readme_without_the_markers_is_named() -> None:
    with pytest.raises(ValueError, match="lacks the markers"):
        showcase.replace_section("# README\n", "section")
