"""A security policy scan of the rendered chart: checkov's Kubernetes checks, offline, on
every ci/ values file. Every failure must be one that helm/security-skips.yaml names
and justifies for that object, and every skip there must still be needed."""

from __future__ import annotations

import fnmatch
import json
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.chart_render import REPO, ci_values, render

pytestmark = pytest.mark.slow  # starts servers or processes and waits for them

CHECKOV = REPO / ".tools" / "checkov" / "bin" / "checkov"
SKIPS = REPO / "helm" / "security-skips.yaml"


def _skips() -> dict[str, dict[str, Any]]:
    skips: dict[str, dict[str, Any]] = yaml.safe_load(SKIPS.read_text())
    return skips


def _scan(folder: Path) -> list[dict[str, Any]]:
    if not CHECKOV.exists():
        pytest.fail(f"{CHECKOV} is missing: scripts/setup.sh installs checkov there")
    # --skip-download: no call to the vendor's API; the checks ship with the package.
    run = subprocess.run(
        [str(CHECKOV), "-d", str(folder), "--framework", "kubernetes", "--quiet",
         "--compact", "--skip-download", "--output", "json"],
        capture_output=True, text=True,
    )  # fmt: skip
    assert run.returncode in (0, 1), run.stderr[-2000:]
    reports = json.loads(run.stdout)
    reports = reports if isinstance(reports, list) else [reports]
    assert all(r["summary"]["parsing_errors"] == 0 for r in reports)
    assert sum(r["summary"]["passed"] for r in reports) > 0
    return [f for r in reports for f in r["results"]["failed_checks"]]


def test_every_skip_says_why_and_names_objects() -> None:
    for check, skip in _skips().items():
        assert set(skip) == {"objects", "why"}, check
        assert len(skip["why"]) > 40 and skip["objects"], check


def test_the_rendered_chart_passes_the_security_scan_but_for_the_justified_skips(
    tmp_path: Path,
) -> None:
    for name, (values, oldest) in ci_values().items():
        manifests = render(values, kube_version=max(oldest, "1.30.0")).manifests
        (tmp_path / name).write_text(yaml.safe_dump_all(manifests))
    skips = _skips()
    unjustified, used = [], set()
    for failure in _scan(tmp_path):
        kind, _namespace, name = failure["resource"].split(".", 2)
        obj = f"{kind}/{name}"
        skip = skips.get(failure["check_id"])
        if skip and any(fnmatch.fnmatch(obj, pattern) for pattern in skip["objects"]):
            used.add(failure["check_id"])
        else:
            unjustified.append(
                f"{failure['check_id']} {failure['check_name']}: {obj} ({failure['file_path']})"
            )
    assert unjustified == []
    assert set(skips) - used == set(), "skips that no longer match any failure"
