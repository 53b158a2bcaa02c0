"""The chart's AlertmanagerConfig: off unless asked for, valid for the Prometheus Operator's
model, refusing receivers it does not define, and the routing of the documented
Alertmanager example (docs/fleet/alertmanager.yml) once the operator has scoped it to the
release's namespace. tests/rules/test_alertmanager.py runs it in a real Alertmanager."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.alertmanager import operator_config
from tests.chart_render import MONITORING_APIS, HelmError, render

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "docs" / "fleet" / "alertmanager.yml"
SERVED = (*MONITORING_APIS, "monitoring.coreos.com/v1alpha1/AlertmanagerConfig")
VALUES: dict[str, Any] = {
    "alertmanagerConfig": {
        "enabled": True,
        "receivers": [
            {"name": "channel", "webhookConfigs": [{"url": "http://router/team"}]},
            {"name": "pager", "webhookConfigs": [{"url": "http://router/team/page"}]},
        ],
        "receiver": "channel",
        "criticalReceiver": "pager",
    }
}


def test_no_alertmanager_config_unless_enabled_and_auto_only_where_the_kind_is_served() -> None:
    assert not render(api_versions=SERVED).of_kind("AlertmanagerConfig")
    auto = {"alertmanagerConfig": {**VALUES["alertmanagerConfig"], "enabled": "auto"}}
    assert render(auto, api_versions=SERVED).of_kind("AlertmanagerConfig")
    assert not render(auto).of_kind("AlertmanagerConfig")


@pytest.mark.slow  # the operator's models take seconds to import
def test_the_operators_model_reads_it_back_with_no_field_lost() -> None:
    from cloudcoil.models.prometheus_operator import v1alpha1

    manifest = render(VALUES).one("AlertmanagerConfig")
    model = v1alpha1.AlertmanagerConfig.model_validate(manifest)
    assert (
        model.model_dump(by_alias=True, exclude_unset=True, mode="json")["spec"]
        == (manifest["spec"])
    )


@pytest.mark.parametrize("key", ["receiver", "criticalReceiver"])
def test_a_receiver_that_is_not_defined_is_refused_by_name(key: str) -> None:
    values = {"alertmanagerConfig": {**VALUES["alertmanagerConfig"], key: "oncall"}}
    with pytest.raises(HelmError, match=f'alertmanagerConfig.{key}: "oncall" is not one of'):
        render(values)


def test_in_the_operators_hands_it_routes_groups_and_inhibits_as_the_documented_example() -> None:
    manifest = render(VALUES, namespace="team-a").one("AlertmanagerConfig")
    base = {"route": {"receiver": "null"}, "receivers": [{"name": "null"}]}
    generated = operator_config(base, [manifest])
    example = yaml.safe_load(EXAMPLE.read_text())
    [team] = [r for r in example["route"]["routes"] if r["matchers"] == ['namespace="team-a"']]
    [route] = generated["route"]["routes"]
    assert route["matchers"][0] == 'namespace="team-a"' and route["continue"]
    assert route["group_by"] == example["route"]["group_by"]
    assert [r["matchers"] for r in route["routes"]] == [r["matchers"] for r in team["routes"]]
    in_namespace = 'namespace="team-a"'
    assert [
        {
            "source_matchers": [m for m in rule["source_matchers"] if m != in_namespace],
            "target_matchers": [m for m in rule["target_matchers"] if m != in_namespace],
            "equal": rule["equal"],
        }
        for rule in generated["inhibit_rules"]
    ] == example["inhibit_rules"]
