"""glassbox's alerts through a real Alertmanager (Debian's 0.25), routed as the example of
docs/fleet/alertmanager.yml and as the chart's AlertmanagerConfig routes them.

Prometheus (scraping the fleet simulator itself) and vmalert (over vmagent and
VictoriaMetrics) evaluate every rule file and send to two Alertmanagers: one runs the
documented file, the other what the Prometheus Operator makes of the chart rendered for
team-a and for team-b (tests/alertmanager.py stands in for the operator). Every receiver is
a webhook on loopback. Each team hears of its own namespace only, grouped by namespace and
model, with the inhibitions applied and the runbook links as the rules give them.

Routing is under test here, not timing: the rule files are loaded with their `for:`
removed, so that the fleet's conditions fire at once (promtool and the vmalert replay
test the durations), and the Alertmanagers' group_wait and group_interval are one second.

The fleet, with five minutes of history so that every window is full:
  team-a  a pod preempting at a full pool, decoding at a quarter of the peak bandwidth:
          VLLMPreemptionStorm pages, VLLMKVCacheSaturated is inhibited by it,
          VLLMDecodeBandwidthLow goes to the team's channel
  team-b  a pod whose exporter cannot read vLLM (GlassboxTargetDown; that exporter's
          VLLMDecodeBandwidthLow is inhibited), a pod whose vLLM restarts
          (VLLMTargetRestarted), and an exporter Prometheus cannot scrape
          (GlassboxExporterAbsent)
  team-c  no team's route: the documented file's platform receiver
"""

from __future__ import annotations

import copy
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from vllm_glassbox.lab.backends.prometheus_process import PrometheusProcess

from tests import remote_write
from tests.alertmanager import Alertmanager, Webhooks, operator_config, webhooks
from tests.chart_render import render
from tests.fleet import EXPORTER_JOB, Fleet, Pod, serve
from tests.realstack import wait_until
from tests.rules.test_rules import github_anchor, runbook_sections
from tests.victoria import VictoriaMetrics, VMAgent, VMAlert

pytestmark = [pytest.mark.victoriametrics, pytest.mark.prometheus, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]
RULE_FILES = sorted((REPO / "alerts").glob("*.yaml"))
EXAMPLE = REPO / "docs" / "fleet" / "alertmanager.yml"
SCRAPE_SECONDS = 2.0
HISTORY_SECONDS = 330.0
PODS = [
    Pod(0, "team-a", "model-0", load=1.0, under_pressure=True, bandwidth_utilization=0.25),
    Pod(1, "team-b", "model-0", load=1.0, under_pressure=False, bandwidth_utilization=0.25,
        target_down=True),
    Pod(2, "team-b", "model-1", load=1.0, under_pressure=False, bandwidth_utilization=0.7,
        restart_after=HISTORY_SECONDS + 5),
    Pod(3, "team-c", "model-0", load=1.0, under_pressure=True, bandwidth_utilization=0.7),
]  # fmt: skip
UNSCRAPABLE = "10.0.0.99:9400"  # an exporter target whose page is not found
TEAMS = ("team-a", "team-b")
# The two Alertmanagers: each receiver's webhook path, by route.
DOCS_RECEIVERS = {
    "platform": "docs/platform",
    "team-a": "docs/team-a",
    "team-a-pager": "docs/team-a/page",
    "team-b": "docs/team-b",
    "team-b-pager": "docs/team-b/page",
}


def without_for(rule_files: list[Path], out: Path) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for path in rule_files:
        document = yaml.safe_load(path.read_text())
        for group in document["groups"]:
            for rule in group["rules"]:
                rule.pop("for", None)
        (out / path.name).write_text(yaml.safe_dump(document, sort_keys=False))
        written.append(out / path.name)
    return written


def fast(config: dict[str, Any]) -> dict[str, Any]:
    """`config` with its routes' timers at a second (routing is under test, not timing)."""
    config = copy.deepcopy(config)
    config["route"].update(group_wait="1s", group_interval="1s", repeat_interval="1h")
    return config


def documented_config(hooks: Webhooks) -> dict[str, Any]:
    config: dict[str, Any] = yaml.safe_load(EXAMPLE.read_text())
    for receiver in config["receivers"]:
        receiver["webhook_configs"] = [{"url": hooks.url(DOCS_RECEIVERS[receiver["name"]])}]
    return fast(config)


def chart_config(hooks: Webhooks) -> dict[str, Any]:
    """What the operator generates from the chart installed in each team's namespace, on
    a base whose only route is a receiver that sends nowhere."""
    configs = []
    for team in TEAMS:
        values = {
            "alertmanagerConfig": {
                "enabled": True,
                "receivers": [
                    {"name": "channel", "webhookConfigs": [{"url": hooks.url(f"chart/{team}")}]},
                    {"name": "pager", "webhookConfigs": [{"url": hooks.url(f"chart/{team}/page")}]},
                ],
                "receiver": "channel",
                "criticalReceiver": "pager",
                "groupWait": "1s",
                "groupInterval": "1s",
            }
        }
        configs.append(render(values, namespace=team, name="glassbox").one("AlertmanagerConfig"))
    base = {"route": {"receiver": "null"}, "receivers": [{"name": "null"}]}
    return fast(operator_config(base, configs))


@dataclass
class Stack:
    hooks: Webhooks
    alertmanagers: dict[str, Alertmanager]
    prometheus: str
    vmalert: str


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    work = tmp_path_factory.mktemp("alertmanager")
    rule_files = without_for(RULE_FILES, work / "rules")
    fleet = Fleet(PODS, started=time.time() - HISTORY_SECONDS)
    scrape = f"{SCRAPE_SECONDS:g}s"
    with serve(fleet) as serving, webhooks() as hooks:
        scrape_configs = serving.scrape_configs(scrape, scrape)
        exporters = next(c for c in scrape_configs if c["job_name"] == EXPORTER_JOB)
        exporters["static_configs"].append(
            {
                "targets": [serving.hostport],
                "labels": {
                    "__metrics_path__": "/pods/99/glassbox",
                    "namespace": "team-b",
                    "pod": "vllm-99",
                    "instance": UNSCRAPABLE,
                },
            }
        )
        with (
            Alertmanager(work / "am-docs", documented_config(hooks)) as docs,
            Alertmanager(work / "am-chart", chart_config(hooks)) as chart,
            VictoriaMetrics(work / "victoria-metrics") as store,
        ):
            targets = [docs.url.removeprefix("http://"), chart.url.removeprefix("http://")]
            config = {
                "global": {"evaluation_interval": "1s"},
                "rule_files": [str(p) for p in rule_files],
                "alerting": {"alertmanagers": [{"static_configs": [{"targets": targets}]}]},
            }
            prometheus = PrometheusProcess(
                work / "prometheus", config, flags=remote_write.RECEIVING
            )
            history = serving.history(time.time() - fleet.started, SCRAPE_SECONDS)
            remote_write.write(store.write_url, history)
            with prometheus:
                remote_write.history_then_scrapes(prometheus, history, scrape_configs)
                with (
                    VMAgent(work / "vmagent", scrape_configs, [store.write_url]),
                    VMAlert(
                        work / "vmalert",
                        rule_files,
                        store.url,
                        [docs.url, chart.url],
                        # Alerts identical to Prometheus', which Alertmanager merges.
                        flags=["-disableAlertgroupLabel"],
                    ) as vmalert,
                ):
                    yield Stack(hooks, {"docs": docs, "chart": chart}, prometheus.url, vmalert.url)


def received(hooks: Webhooks, path: str) -> list[dict[str, Any]]:
    """Every firing alert a receiver was sent, each with the group labels of its message."""
    return [
        {**alert, "groupLabels": message["groupLabels"]}
        for message in hooks.received(path)
        for alert in message["alerts"]
        if alert["status"] == "firing"
    ]


def heard(hooks: Webhooks, path: str) -> set[tuple[str, str]]:
    return {
        (a["labels"]["alertname"], a["labels"].get("instance", "")) for a in received(hooks, path)
    }


VLLM_A, EXPORTER_A = "10.0.0.0:8000", "10.0.0.0:9400"
EXPORTER_DOWN, VLLM_RESTARTING = "10.0.0.1:9400", "10.0.0.2:9400"
VLLM_C = "10.0.0.3:8000"
# (receiver path in each Alertmanager) -> what it must hear, and what it must never hear.
EXPECTED = {
    ("docs/team-a/page", "chart/team-a/page"): (
        {("VLLMPreemptionStorm", VLLM_A)},
        {("VLLMKVCacheSaturated", VLLM_A)},
    ),
    ("docs/team-a", "chart/team-a"): (
        {("VLLMDecodeBandwidthLow", EXPORTER_A)},
        {("VLLMKVCacheSaturated", VLLM_A), ("VLLMPreemptionStorm", VLLM_A)},
    ),
    ("docs/team-b", "chart/team-b"): (
        {
            ("GlassboxTargetDown", EXPORTER_DOWN),
            ("VLLMTargetRestarted", VLLM_RESTARTING),
            ("GlassboxExporterAbsent", UNSCRAPABLE),
        },
        {("VLLMDecodeBandwidthLow", EXPORTER_DOWN)},
    ),
}


@pytest.fixture(scope="module")
def delivered(stack: Stack) -> Stack:
    def all_heard() -> bool:
        done = all(
            wanted <= heard(stack.hooks, path)
            for paths, (wanted, _) in EXPECTED.items()
            for path in paths
        )
        return done and ("VLLMPreemptionStorm", VLLM_C) in heard(stack.hooks, "docs/platform")

    wait_until(all_heard, "every expected alert delivered", timeout_seconds=120)
    time.sleep(3 * SCRAPE_SECONDS)  # a few more evaluations and notifications
    return stack


@pytest.mark.parametrize("paths", sorted(EXPECTED), ids=lambda p: " and ".join(p))
def test_each_receiver_hears_what_its_route_takes_and_nothing_inhibited(
    delivered: Stack, paths: tuple[str, str]
) -> None:
    wanted, inhibited = EXPECTED[paths]
    for path in paths:
        got = heard(delivered.hooks, path)
        assert wanted <= got, (path, got)
        assert not got & inhibited, (path, got & inhibited)


@pytest.mark.parametrize("am", ["docs", "chart"])
def test_each_team_hears_only_its_own_namespace(delivered: Stack, am: str) -> None:
    for team in TEAMS:
        for path in (f"{am}/{team}", f"{am}/{team}/page"):
            namespaces = {a["labels"].get("namespace") for a in received(delivered.hooks, path)}
            assert namespaces <= {team}, (path, namespaces)
    # team-c has no route of its own: the documented file's platform receiver takes it, and
    # the chart (installed for team-a and team-b) routes none of it.
    platform = {a["labels"].get("namespace") for a in received(delivered.hooks, "docs/platform")}
    assert platform == {"team-c"}
    assert not received(delivered.hooks, "chart/team-c")


@pytest.mark.parametrize("am", ["docs", "chart"])
def test_alertmanager_shows_the_inhibited_alerts_inhibited_by_their_cause(
    delivered: Stack, am: str
) -> None:
    alerts = delivered.alertmanagers[am].alerts()

    def one(name: str, instance: str) -> dict[str, Any]:
        [alert] = [
            a
            for a in alerts
            if a["labels"]["alertname"] == name and a["labels"].get("instance") == instance
        ]
        return alert

    saturated, storm = one("VLLMKVCacheSaturated", VLLM_A), one("VLLMPreemptionStorm", VLLM_A)
    assert saturated["status"]["inhibitedBy"] == [storm["fingerprint"]]
    blind, down = (
        one("VLLMDecodeBandwidthLow", EXPORTER_DOWN),
        one("GlassboxTargetDown", EXPORTER_DOWN),
    )
    assert blind["status"]["inhibitedBy"] == [down["fingerprint"]]
    assert not one("VLLMDecodeBandwidthLow", EXPORTER_A)["status"]["inhibitedBy"]


def test_every_message_groups_one_namespace_and_model(delivered: Stack) -> None:
    messages = [m for path in delivered.hooks.paths() for m in delivered.hooks.received(path)]
    assert messages
    for message in messages:
        assert set(message["groupLabels"]) <= {"namespace", "model_name"}, message["groupLabels"]
        for alert in message["alerts"]:
            for label, value in message["groupLabels"].items():
                assert alert["labels"].get(label) == value, (
                    message["groupLabels"],
                    alert["labels"],
                )


def test_every_delivered_alert_carries_its_rules_runbook_link(delivered: Stack) -> None:
    rules = {
        rule["alert"]: rule
        for path in RULE_FILES
        for group in yaml.safe_load(path.read_text())["groups"]
        for rule in group["rules"]
        if "alert" in rule
    }
    sections = runbook_sections()
    alerts = [
        a for path in delivered.hooks.paths() for a in received(delivered.hooks, path.lstrip("/"))
    ]
    assert alerts
    for alert in alerts:
        name = alert["labels"]["alertname"]
        url = alert["annotations"]["runbook_url"]
        assert url == rules[name]["annotations"]["runbook_url"]
        assert url.partition("#")[2] == github_anchor(name) in sections


def _counted(url: str, name: str, mentioning: str) -> float:
    """The sum of a counter's series on `url`'s own page whose labels mention `mentioning`."""
    text = httpx.get(url + "/metrics", timeout=10).text
    return sum(
        float(line.rpartition(" ")[2])
        for line in text.splitlines()
        if line.startswith(name + "{") and mentioning in line
    )


def test_prometheus_and_vmalert_both_sent_to_both_alertmanagers_without_errors(
    delivered: Stack,
) -> None:
    for am in delivered.alertmanagers.values():
        address = am.url.removeprefix("http://")
        sent = ("prometheus_notifications_sent_total", "vmalert_alerts_sent_total")
        failed = ("prometheus_notifications_errors_total", "vmalert_alerts_send_errors_total")
        for sender, name, errors in zip(
            (delivered.prometheus, delivered.vmalert), sent, failed, strict=True
        ):
            assert _counted(sender, name, address) > 0, (sender, name, address)
            assert _counted(sender, errors, address) == 0, (sender, errors, address)
