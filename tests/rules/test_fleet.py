"""The rules in a real Prometheus scraping two teams that serve the same model under the
same jobs: vLLM's pages and the exporter's (tests/fleet.py, built from the real captures),
in namespaces team-0 and team-1, both pods under pressure (a full pool, requests waiting,
preemptions, decoding far below the peak bandwidth). Each record keeps the teams apart;
each alert names its namespace, in its labels and its description. The SLO rules of
FLEET_SLO too: an objective of every namespace per namespace, one of team-0 only for
team-0 only.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from vllm_glassbox.core import slo
from vllm_glassbox.dashboards import queries as q
from vllm_glassbox.dashboards.grafana import TimeRange, substitute
from vllm_glassbox.lab.backends.prometheus_process import PrometheusProcess
from vllm_glassbox.rules import slo_rule_file_text

from tests.fleet import Fleet, plan_pods, serve
from tests.realstack import prometheus_query, wait_until
from tests.rules.test_rules import RECORD_RULES, RULE_FILES

pytestmark = [pytest.mark.prometheus, pytest.mark.slow]

TEAMS = {"team-0", "team-1"}
# No start of the model happened before the exporters' current one: no baseline yet.
NO_DATA_YET = {"namespace_model_name:glassbox_startup_seconds_previous:max7d"}
# The fleet's pods are single servers without a KV connector: the prefill/decode pair's
# records have no series here (alerts/tests/disaggregation_rules_test.yaml feeds them).
NOT_A_PAIR = {
    "namespace_model_name:vllm_consumer_prompt_tokens_computed:rate5m",
    "namespace_model_name:vllm_consumer_prompt_tokens_transferred:ratio_rate5m",
    "namespace_model_name:vllm_kv_transfer_bandwidth_bytes_per_second:rate5m",
    "namespace_model_name:vllm_kv_transfer_bytes:rate5m",
    "namespace_model_name:vllm_kv_transfer_expirations:rate5m",
    "namespace_model_name:vllm_kv_transfer_failures:rate5m",
}
# No price of a GPU hour in the fleet (its exporters run without --gpu-hour-price, and no
# OpenCost), and no GPU (no dcgm-exporter): the cost and DCGM records have no series here
# (alerts/tests/cost_and_gpu_test.yaml feeds them; tests/rules/test_dcgm_fixtures.py reads
# dcgm-exporter's real pages).
NOT_PRICED = {
    "namespace_model_name:gpu_hourly_cost:sum",
    "namespace_model_name:vllm_cost_idle:ratio_avg1h",
    "namespace_model_name:vllm_cost_per_million_generated_tokens:rate5m",
    "namespace_model_name:vllm_cost_per_million_prompt_tokens:rate5m",
    "namespace_model_name:vllm_cost_unused_pool:hourly_avg1h",
    "namespace_model_name:vllm_cost_unused_pool:ratio_avg1h",
    "namespace_pod:opencost_gpu_hourly_cost:sum",
    "node:opencost_gpu_hourly_cost:max",
}
NOT_ON_A_GPU = {
    "namespace_model_name:dcgm_dram_active:avg",
    "namespace_model_name:dcgm_dram_active_beyond_weight_reads:avg",
    "namespace_model_name:dcgm_sm_active:avg",
    "namespace_pod:dcgm_fb_bytes:sum",
    "namespace_pod:dcgm_fb_used_bytes:sum",
    "namespace_pod:dcgm_power_usage_watts:sum",
}
ABSENT = NO_DATA_YET | NOT_A_PAIR | NOT_PRICED | NOT_ON_A_GPU
# The conditions hold from the first scrapes; `for:` keeps them pending meanwhile.
PENDING = {"VLLMPreemptionStorm", "VLLMKVCacheSaturated", "VLLMDecodeBandwidthLow"}
# Both teams serve model-0: one objective for each namespace, one for team-0's only.
FLEET_SLO = {
    "objectives": [
        {"name": "every-e2e", "sli": "e2e", "threshold": "60s", "target": "95%"},
        {"name": "team-0-ttft", "namespace": "team-0", "sli": "ttft", "threshold": "250ms",
         "target": "99%"},
    ]
}  # fmt: skip


@pytest.fixture(scope="module")
def prometheus(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    pods = plan_pods(2, namespaces=2, models=1, pressure_every=1)
    assert {p.namespace for p in pods} == TEAMS and len({p.model for p in pods}) == 1
    with serve(Fleet(pods)) as serving:
        work = tmp_path_factory.mktemp("prometheus")
        slo_rules = work / "fleet-slo.rules.yaml"
        slo_rules.write_text(slo_rule_file_text(slo.parse(FLEET_SLO, "fleet"), "fleet", []))
        config = {
            "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
            "rule_files": [str(p) for p in RULE_FILES] + [str(slo_rules)],
            "scrape_configs": serving.scrape_configs("1s", "900ms"),
        }
        with PrometheusProcess(work, config) as process:
            yield process.url


def _series(url: str, expr: str) -> list[dict[str, str]]:
    return [r["metric"] for r in prometheus_query(url, expr)]


def _active_alerts(url: str) -> list[dict[str, Any]]:
    r = httpx.get(url + "/api/v1/alerts", timeout=10)
    r.raise_for_status()
    alerts: list[dict[str, Any]] = r.json()["data"]["alerts"]
    return alerts


@pytest.mark.parametrize("record", sorted(set(RECORD_RULES) - ABSENT))
def test_each_record_has_one_series_per_namespace(prometheus: str, record: str) -> None:
    wait_until(
        lambda: {s.get("namespace") for s in _series(prometheus, record)} == TEAMS,
        f"{record} shown for both namespaces",
    )
    series = _series(prometheus, record)
    # One per namespace (and per position for the positional record), never merged.
    keys = [tuple(sorted((k, v) for k, v in s.items() if k != "__name__")) for s in series]
    assert len(keys) == len(set(keys))
    per_team = {
        team: sorted(str(s.get("position", "")) for s in series if s["namespace"] == team)
        for team in TEAMS
    }
    assert per_team["team-0"] == per_team["team-1"], series


def test_records_without_data_are_only_those_with_no_history(prometheus: str) -> None:
    wait_until(
        lambda: bool(_series(prometheus, "namespace_job_model_name:vllm_engine_steps:rate5m")),
        "rules evaluated",
    )
    assert set(RECORD_RULES) >= ABSENT
    for record in sorted(ABSENT):
        assert _series(prometheus, record) == [], record


def test_sums_per_namespace_are_each_teams_own(prometheus: str) -> None:
    """Each team's record equals the sum over its own pod only: nothing of the other."""
    record = "namespace_job_model_name:vllm_num_requests_running:sum"
    raw = "sum by (namespace) (vllm:num_requests_running)"
    wait_until(lambda: len(_series(prometheus, record)) == 2, "running requests recorded")
    rules = {
        r["metric"]["namespace"]: float(r["value"][1]) for r in prometheus_query(prometheus, record)
    }
    direct = {
        r["metric"]["namespace"]: float(r["value"][1]) for r in prometheus_query(prometheus, raw)
    }
    assert rules == direct
    assert rules["team-0"] != rules["team-1"]  # two loads: a merge would show


@pytest.mark.parametrize("alert", sorted(PENDING))
def test_each_alert_names_its_namespace_in_labels_and_description(
    prometheus: str, alert: str
) -> None:
    def mine() -> list[dict[str, Any]]:
        return [a for a in _active_alerts(prometheus) if a["labels"]["alertname"] == alert]

    wait_until(
        lambda: {a["labels"].get("namespace") for a in mine()} == TEAMS,
        f"{alert} in both namespaces",
    )
    for active in mine():
        team = active["labels"]["namespace"]
        assert f"namespace {team})" in active["annotations"]["description"], active


@pytest.mark.parametrize(
    "expr",
    [q.SERVERS, q.OFF_BANDWIDTH_COUNT, q.PREEMPTING_COUNT, q.OUT_OF_HEADROOM_COUNT],
    ids=["servers", "off bandwidth", "preempting", "out of headroom"],
)
def test_fleet_dashboard_counts_one_server_under_pressure_in_each_namespace(
    prometheus: str, expr: str
) -> None:
    now = time.time()
    names = ["cluster", "namespace", "job", "pod", "model_name", "engine"]
    sent = substitute(expr, names, TimeRange(now - 300, now, 15.0, 1.0))

    def counted() -> dict[str, float]:
        return {
            r["metric"]["namespace"]: float(r["value"][1])
            for r in prometheus_query(prometheus, sent)
        }

    wait_until(lambda: counted() == {"team-0": 1.0, "team-1": 1.0}, f"{sent} per namespace")


def _by_namespace(url: str, expr: str) -> dict[str, float]:
    return {r["metric"]["namespace"]: float(r["value"][1]) for r in prometheus_query(url, expr)}


def _by_namespace_at(url: str, expr: str, at: float) -> dict[str, float]:
    result = prometheus_query(url, expr, at)
    return {r["metric"]["namespace"]: float(r["value"][1]) for r in result}


def test_an_objective_of_every_namespace_counts_each_teams_own_requests(prometheus: str) -> None:
    """every-e2e: one series per namespace, each equal to its own vLLM's raw series (the two
    pods' loads differ, 1.74 and 1.59 of the captured pace: tests/fleet.py)."""
    record = 'namespace_job_model_name_slo:glassbox_slo_requests:rate5m{slo="every-e2e"}'
    wait_until(lambda: set(_by_namespace(prometheus, record)) == TEAMS, "every-e2e per team")
    raw = "sum by (namespace) (rate(vllm:e2e_request_latency_seconds_count[5m]))"
    for team in sorted(TEAMS):
        # The record and vLLM's raw series at the record's own evaluation time.
        (when,) = prometheus_query(prometheus, f'timestamp({record[:-1]}, namespace="{team}"}})')
        at = float(when["value"][1])
        recorded = _by_namespace_at(prometheus, record, at)[team]
        assert recorded == pytest.approx(_by_namespace_at(prometheus, raw, at)[team], rel=0.02)
    # The busier team counts more. Not their ratio: while the 5-minute window fills,
    # Prometheus extrapolates each series by up to half its own scrape phase (3.6 % apart
    # on a loaded machine, for loads 9 % apart).
    now = _by_namespace(prometheus, record)
    loads = {p.namespace: p.load for p in plan_pods(2, namespaces=2, models=1, pressure_every=1)}
    busier = max(loads, key=lambda team: loads[team])
    assert max(now, key=lambda team: now[team]) == busier


def test_each_team_missing_an_objective_of_every_namespace_is_paged_on_its_own(
    prometheus: str,
) -> None:
    """The captured busy page's requests took over a minute end to end: every-e2e burns in
    both namespaces, one page each, naming its namespace."""

    def paged() -> list[dict[str, Any]]:
        return [
            a
            for a in _active_alerts(prometheus)
            if a["labels"]["alertname"] == "VLLMSLOFastBurn" and a["state"] == "firing"
        ]

    wait_until(lambda: {a["labels"]["namespace"] for a in paged()} == TEAMS, "a page per team")
    for alert in paged():
        assert alert["labels"]["slo"] == "every-e2e"
        assert f"namespace {alert['labels']['namespace']})" in alert["annotations"]["description"]


def test_an_objective_of_one_namespace_never_counts_another_teams_model(prometheus: str) -> None:
    record = 'namespace_job_model_name_slo:glassbox_slo_requests:rate5m{slo="team-0-ttft"}'
    wait_until(lambda: bool(_by_namespace(prometheus, record)), "team-0-ttft recorded")
    for name in ("requests:rate5m", "error_ratio:rate5m", "error_ratio:rate1h", "target:ratio"):
        series = prometheus_query(
            prometheus, f'namespace_job_model_name_slo:glassbox_slo_{name}{{slo="team-0-ttft"}}'
        )
        assert {s["metric"]["namespace"] for s in series} == {"team-0"}, name
