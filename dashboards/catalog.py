"""The dashboards glassbox ships, and their JSON as Grafana imports it.

Each dashboard is a module of this package exposing `dashboard` (a grafanalib Dashboard
with a fixed uid). Its JSON is written sorted and indented (grafanalib's own encoding),
so regenerating from unchanged sources is byte-for-byte a no-op and a diff shows exactly
what a change did.
"""

from __future__ import annotations

import importlib
import io
from pathlib import Path
from typing import Any, cast

from grafanalib._gen import write_dashboard
from grafanalib.core import Dashboard

MODULES = ("overview", "decode", "kv_cache", "spec_decode", "fleet", "slo", "disaggregation")
GENERATED_DIR = Path(__file__).resolve().parent / "generated"


def dashboards() -> list[Dashboard]:
    return [importlib.import_module(f"{__package__}.{name}").dashboard for name in MODULES]


def render(dashboard: Dashboard) -> str:
    """The dashboard as the JSON text that is checked in."""
    out = io.StringIO()
    write_dashboard(dashboard, out)
    return out.getvalue()


def as_json(dashboard: Dashboard) -> dict[str, Any]:
    """The dashboard as Grafana sees it (the parsed JSON), for checks and snapshots."""
    import json

    return cast(dict[str, Any], json.loads(render(dashboard)))


def expected_files() -> dict[str, str]:
    """File name -> content, for every dashboard."""
    files: dict[str, str] = {}
    for d in dashboards():
        if not d.uid:
            raise ValueError(f"dashboard {d.title!r} has no uid")
        name = f"{d.uid}.json"
        if name in files:
            raise ValueError(f"two dashboards share the uid {d.uid!r}")
        files[name] = render(d)
    return files


def drift(directory: Path = GENERATED_DIR) -> list[str]:
    """Files in `directory` that differ from the sources: stale, missing or left over."""
    expected = expected_files()
    present = {p.name for p in directory.glob("*.json")} if directory.is_dir() else set()
    changed = [
        name
        for name, text in expected.items()
        if name not in present or (directory / name).read_text() != text
    ]
    return sorted(changed + sorted(present - expected.keys()))


def write(directory: Path = GENERATED_DIR) -> list[Path]:
    """Write every dashboard's JSON; remove JSON files no source produces any more."""
    directory.mkdir(parents=True, exist_ok=True)
    expected = expected_files()
    for leftover in directory.glob("*.json"):
        if leftover.name not in expected:
            leftover.unlink()
    written = []
    for name, text in expected.items():
        path = directory / name
        if not path.exists() or path.read_text() != text:
            path.write_text(text)
        written.append(path)
    return written
