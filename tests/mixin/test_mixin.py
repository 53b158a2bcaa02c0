"""The monitoring mixin (mixin/) rendered by jsonnet against the files it is built from:
every group of every rule file in alerts/ and every dashboard of dashboards/generated/,
unchanged by default, with the labels of `glassbox rules --aggregation-labels` when its
_config asks for them; its generated copies in sync with the sources; and the
consumption examples of docs/fleet.md rendering."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from vllm_glassbox import rules

REPO = Path(__file__).resolve().parents[2]
MIXIN = REPO / "mixin"
SYNC = REPO / "scripts" / "sync-mixin.py"
RULE_FILES = sorted((REPO / "alerts").glob("*.yaml"))
DASHBOARDS = sorted((REPO / "dashboards" / "generated").glob("*.json"))


def jsonnet(code: str, *search: Path) -> Any:
    """`code` evaluated, importing from mixin/ and `search` (jsonnet: the right-most wins)."""
    exe = shutil.which("jsonnet")
    if exe is None:
        pytest.fail("jsonnet is missing: scripts/setup.sh installs Debian's jsonnet package")
    paths = [arg for p in (MIXIN, *search) for arg in ("-J", str(p))]
    result = subprocess.run([exe, *paths, "-e", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def mixin(config: str = "{}") -> dict[str, Any]:
    rendered: dict[str, Any] = jsonnet(
        f"local m = (import 'mixin.libsonnet') + {{ _config+:: {config} }};"
        " { rules: m.prometheusRules, alerts: m.prometheusAlerts, dashboards: m.grafanaDashboards }"
    )
    return rendered


def groups_of(paths: list[Path]) -> dict[str, dict[str, Any]]:
    return {g["name"]: g for p in paths for g in yaml.safe_load(p.read_text())["groups"]}


def _only_records(group: dict[str, Any]) -> bool:
    return all("record" in rule for rule in group["rules"])


def test_the_copies_in_the_mixin_match_their_sources() -> None:
    result = subprocess.run(
        [sys.executable, str(SYNC), "--check"], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr + "\n(run scripts/sync-mixin.py)"


def test_by_default_it_renders_every_group_and_dashboard_unchanged() -> None:
    rendered = mixin()
    shipped = groups_of(RULE_FILES)
    recording = {g["name"]: g for g in rendered["rules"]["groups"]}
    alerting = {g["name"]: g for g in rendered["alerts"]["groups"]}
    assert not set(recording) & set(alerting)
    assert {**recording, **alerting} == shipped
    assert set(recording) == {name for name, g in shipped.items() if _only_records(g)}
    assert rendered["dashboards"] == {p.name: json.loads(p.read_text()) for p in DASHBOARDS}


def test_aggregation_labels_give_what_glassbox_rules_writes(tmp_path: Path) -> None:
    assert (
        rules.main(
            ["--aggregation-labels", "cluster", "--out", str(tmp_path), *map(str, RULE_FILES)]
        )
        == 0
    )
    rendered = mixin("{ aggregationLabels: ['cluster'] }")
    groups = {g["name"]: g for g in rendered["rules"]["groups"] + rendered["alerts"]["groups"]}
    generated = groups_of(sorted(tmp_path.glob("*.yaml")))
    assert groups == generated
    assert groups != groups_of(RULE_FILES)


def test_the_exporter_selector_replaces_the_job_convention_only() -> None:
    rendered = mixin("""{ glassboxExporterSelector: 'job="glassbox-exporter"' }""")
    exprs = [r["expr"] for g in rendered["alerts"]["groups"] for r in g["rules"]]
    changed = [e for e in exprs if 'job="glassbox-exporter"' in e]
    assert changed and not any(".*glassbox.*" in e for e in exprs)
    shipped = [r["expr"] for g in groups_of(RULE_FILES).values() for r in g["rules"]]
    assert len(changed) == len([e for e in shipped if 'job=~".*glassbox.*"' in e])


def test_a_new_rule_file_and_dashboard_are_in_the_mixin_once_synced(tmp_path: Path) -> None:
    for folder in ("alerts", "dashboards/generated"):
        shutil.copytree(REPO / folder, tmp_path / folder)
    (tmp_path / "alerts" / "glassbox-slo.yaml").write_text(
        yaml.safe_dump(
            {"groups": [{"name": "glassbox.slo", "rules": [{"record": "a:b:c", "expr": "up"}]}]}
        )
    )
    (tmp_path / "dashboards/generated/glassbox-new.json").write_text('{"uid": "new"}\n')
    result = subprocess.run(
        [sys.executable, str(SYNC), "--repo", str(tmp_path)], capture_output=True, text=True
    )
    assert result.returncode == 0, result.stderr
    shutil.copy(MIXIN / "mixin.libsonnet", tmp_path / "mixin" / "mixin.libsonnet")
    names, dashboard = jsonnet(
        "local m = import 'mixin.libsonnet';"
        " [[g.name for g in m.prometheusRules.groups], m.grafanaDashboards['glassbox-new.json']]",
        tmp_path / "mixin",
    )
    assert "glassbox.slo" in names and dashboard == {"uid": "new"}


def _doc_examples() -> list[str]:
    text = (REPO / "docs" / "fleet.md").read_text()
    return re.findall(r"```jsonnet\n(.*?)```", text, flags=re.S)


def test_the_docs_examples_render_a_prometheus_rule_and_dashboards(tmp_path: Path) -> None:
    examples = _doc_examples()
    assert examples, "docs/fleet.md shows how to consume the mixin"
    vendor = tmp_path / "vendor"
    vendor.mkdir()
    (vendor / "vllm-glassbox-mixin").symlink_to(MIXIN)
    kinds = []
    for example in examples:
        rendered = jsonnet(example, vendor)
        objects = rendered.values() if isinstance(rendered, dict) else rendered
        kinds += [o["kind"] for o in objects]
        for o in objects:
            if o["kind"] == "PrometheusRule":
                assert {g["name"] for g in o["spec"]["groups"]} == set(groups_of(RULE_FILES))
    assert "PrometheusRule" in kinds and "GrafanaDashboard" in kinds


def test_native_histograms_give_what_glassbox_rules_writes(tmp_path: Path) -> None:
    out = ["--histograms", "native", "--out", str(tmp_path), *map(str, RULE_FILES)]
    assert rules.main(out) == 0
    rendered = mixin("{ histograms: 'native' }")
    groups = {g["name"]: g for g in rendered["rules"]["groups"] + rendered["alerts"]["groups"]}
    assert groups == groups_of(sorted(tmp_path.glob("*.yaml")))
    assert groups != groups_of(RULE_FILES)
