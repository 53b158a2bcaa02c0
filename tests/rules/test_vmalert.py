"""The rules on a live VictoriaMetrics stack — vmagent scrapes, VictoriaMetrics stores,
vmalert evaluates every rule file in alerts/ unchanged and writes its records back —
beside a Prometheus that holds the very same samples and evaluates the same files.

vmagent scrapes the fleet simulator (tests/fleet.py: vLLM's pages and the exporter's,
every pod a target with the labels a ServiceMonitor gives) and remote-writes each sample
to both stores, so the engines differ in nothing but themselves. Two teams' pods have
HISTORY_SECONDS of pages written into both stores before scraping starts (what the same
scraper would have read: the rules' 5-minute windows are full from the first live
evaluation); the pod of a third namespace, NEW, appears when scraping starts, as a new pod
does, so its windows fill while the tests run.

Records: every sample vmalert writes is compared with Prometheus' value of the same
rule's expression at the same instant. Alerts: the alerts that the pods' conditions make
active on Prometheus are active on vmalert, with the same labels and annotations.
"""

from __future__ import annotations

import math
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
from tests.alertmanager import webhooks
from tests.fleet import Fleet, Pod, serve
from tests.realstack import prometheus_query, wait_until
from tests.victoria import VictoriaMetrics, VMAgent, VMAlert, dry_run

pytestmark = [pytest.mark.victoriametrics, pytest.mark.prometheus, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]
RULE_FILES = sorted((REPO / "alerts").glob("*.yaml"))


def _records() -> dict[str, dict[str, Any]]:
    return {
        rule["record"]: rule
        for path in RULE_FILES
        for group in yaml.safe_load(path.read_text())["groups"]
        for rule in group["rules"]
        if "record" in rule
    }


RECORDS = _records()

SCRAPE_SECONDS = 2.0
# vmalert evaluates this far in the past, so that every sample scraped before the instant
# is searchable: a sample of a known series is within a second, but a new series' first
# samples took 6 to 9 s here (VictoriaMetrics registers it in its index first; its own
# -search.latencyOffset, 30 s by default, covers that). vmalert stamps each record with the
# instant it asked about, t - 20 s, which is what Prometheus is asked for.
LOOKBACK_SECONDS = 20.0
HISTORY_SECONDS = 330.0  # the 5-minute windows full when scraping starts
NEW = "team-new"
PODS = [
    Pod(0, "team-0", "model-0", load=1.0, under_pressure=True, bandwidth_utilization=0.25),
    Pod(1, "team-0", "model-0", load=0.5, under_pressure=False, bandwidth_utilization=0.7,
        target_down=True),
    Pod(2, "team-1", "model-0", load=1.5, under_pressure=True, bandwidth_utilization=0.25),
    Pod(3, NEW, "model-0", load=1.0, under_pressure=True, bandwidth_utilization=0.25),
]  # fmt: skip


@dataclass
class Stack:
    prometheus: str
    store: VictoriaMetrics
    vmalert: VMAlert
    live_since: float


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    work = tmp_path_factory.mktemp("vmstack")
    fleet = Fleet(PODS, started=time.time() - HISTORY_SECONDS)
    config = {
        "global": {"evaluation_interval": "1s"},
        "rule_files": [str(p) for p in RULE_FILES],
    }
    with (
        serve(fleet) as serving,
        webhooks() as hooks,
        VictoriaMetrics(work / "victoria-metrics") as store,
        PrometheusProcess(
            work / "prometheus", config, flags=["--web.enable-remote-write-receiver"]
        ) as prometheus,
    ):
        established = [p for p in PODS if p.namespace != NEW]
        history = serving.history(time.time() - fleet.started, SCRAPE_SECONDS, established)
        for url in (store.write_url, prometheus.url + "/api/v1/write"):
            remote_write.write(url, history)
        scrape = f"{SCRAPE_SECONDS:g}s"
        with (
            VMAgent(
                work / "vmagent",
                serving.scrape_configs(scrape, scrape),
                [store.write_url, prometheus.url + "/api/v1/write"],
            ),
            VMAlert(
                work / "vmalert",
                RULE_FILES,
                store.url,
                [hooks.url("vmalert")],
                flags=[f"-datasource.lookback={LOOKBACK_SECONDS:g}s"],
            ) as vmalert,
        ):
            yield Stack(prometheus.url, store, vmalert, time.time())


def test_vmalert_accepts_every_rule_file_unchanged() -> None:
    result = dry_run(RULE_FILES)
    assert result.returncode == 0, result.stdout + result.stderr


# Records whose value differs between the engines while a series' first window fills
# (a new pod's first 5 minutes): a rate that is not a ratio. Prometheus extrapolates the
# increase it saw by at most half a scrape and divides by the whole window, so it reads low
# (a fifth after one minute); MetricsQL divides the increase by the span it has, the
# slope. Neither engine can compute the other's, so the rules stay; they agree once the
# window is full, and ratios (both rates read alike) agree from the start (docs/fleet.md).
WHILE_THE_WINDOW_FILLS = {
    "namespace_job_model_name:vllm_engine_steps:rate5m",
    "namespace_job_model_name:vllm_generation_tokens:rate5m",
    "namespace_job_model_name:vllm_num_preemptions:rate5m",
    "namespace_job_model_name_le:vllm_time_to_first_token_seconds_bucket:rate5m",
    "namespace_model_name_source:vllm_prompt_tokens_by_source:rate5m",
}
WINDOW_SECONDS = 300.0
# Records of an hour's subquery at 1-minute steps: for a pod that appeared minutes ago the
# engines take different steps of its first minutes (Prometheus only steps on the minute's
# grid, MetricsQL looks back from the instant too), so the new pod's series is compared
# once a whole hour is in it, never within a run of the suite; the established pods' are
# compared exactly.
HOUR_SUBQUERIES = {
    "namespace_model_name:vllm_cost_idle:ratio_avg1h",
    "namespace_model_name:vllm_cost_unused_pool:ratio_avg1h",
}
# A scrape's timestamp is when it began, the page's values those of when the fleet rendered
# it, up to ~150 ms later on a loaded machine: counters that grow evenly in time are uneven
# by that much in the samples, and the two engines read different samples of a window
# (MetricsQL the one before it too): 2 x 0.15 s over 5 minutes. Measured on a quiet
# machine: 2e-6.
RELATIVE_TOLERANCE = 1e-3
EVALUATIONS_COMPARED = 3

Key = tuple[tuple[str, str], ...]


def _key(labels: dict[str, str]) -> Key:
    return tuple(sorted((k, v) for k, v in labels.items() if k != "__name__"))


def vmalert_records(stack: Stack, record: str) -> dict[float, dict[Key, float]]:
    """What vmalert wrote for `record` since scraping began: instant -> series -> value."""
    out: dict[float, dict[Key, float]] = {}
    for labels, points in stack.store.export(record, stack.live_since, time.time() + 60):
        for t, v in points:
            if v is not None:
                out.setdefault(round(t, 3), {})[_key(labels)] = v
    return out


def prometheus_values(stack: Stack, expr: str, at: float) -> dict[Key, float]:
    return {
        _key(r["metric"]): float(r["value"][1])
        for r in prometheus_query(stack.prometheus, expr, at)
    }


@pytest.fixture(scope="module")
def settled(stack: Stack) -> Stack:
    """The stack once vmalert has written a few evaluations, of instants after every pod
    was scraped, of every record that Prometheus has an answer for."""

    scraped = stack.live_since + 2 * SCRAPE_SECONDS  # every pod, the new one too

    def enough() -> bool:
        return all(
            len([at for at in comparable(stack, record) if at > scraped]) >= EVALUATIONS_COMPARED
            for record, rule in RECORDS.items()
            if prometheus_values(stack, rule["expr"], time.time())
        )

    wait_until(enough, "every record written by vmalert", timeout_seconds=180)
    return stack


def _namespace(key: Key) -> str:
    return dict(key).get("namespace", "")


def comparable(stack: Stack, record: str) -> dict[float, dict[Key, float]]:
    """What vmalert wrote for `record`, from the first instant it wrote the new pod's series
    where Prometheus has one now: a new series is searchable in VictoriaMetrics seconds
    after its first samples, later on a busy machine than the lookback allows for."""
    written = vmalert_records(stack, record)
    now = prometheus_values(stack, RECORDS[record]["expr"], time.time())
    if record in HOUR_SUBQUERIES or not any(_namespace(k) == NEW for k in now):
        return written  # (the hour's subqueries: the new pod is not compared)
    first = min(
        (at for at, series in written.items() if any(_namespace(k) == NEW for k in series)),
        default=math.inf,
    )
    return {at: series for at, series in written.items() if at >= first}


@pytest.mark.parametrize("record", sorted(RECORDS))
def test_each_record_vmalert_writes_equals_prometheus_on_the_same_samples(
    settled: Stack, record: str
) -> None:
    written = comparable(settled, record)
    expr = RECORDS[record]["expr"]
    if not written:  # no data on either: the start baseline before any second start
        assert prometheus_values(settled, expr, time.time()) == {}
        return
    for at in sorted(written)[-EVALUATIONS_COMPARED:]:
        mine, theirs = written[at], prometheus_values(settled, expr, at)
        if record in HOUR_SUBQUERIES:
            mine = {k: v for k, v in mine.items() if _namespace(k) != NEW}
            theirs = {k: v for k, v in theirs.items() if _namespace(k) != NEW}
            assert mine, f"{record}: no established pod compared"
        assert sorted(mine) == sorted(theirs), f"{record} at {at}: label sets differ"
        filling = at - settled.live_since < WINDOW_SECONDS - 30
        for key, value in theirs.items():
            if _namespace(key) == NEW and filling and record in WHILE_THE_WINDOW_FILLS:
                # Prometheus reads low, unless nothing grew (a bucket no request reached).
                assert value < 0.9 * mine[key] or value == mine[key] == 0, (
                    record,
                    dict(key),
                    mine[key],
                    value,
                )
            else:
                assert math.isclose(mine[key], value, rel_tol=RELATIVE_TOLERANCE, abs_tol=1e-9), (
                    record,
                    dict(key),
                    mine[key],
                    value,
                )


def test_the_records_that_differ_while_the_window_fills_are_this_fleets_rates() -> None:
    assert set(RECORDS) >= WHILE_THE_WINDOW_FILLS | HOUR_SUBQUERIES
    for record in HOUR_SUBQUERIES:
        assert "[1h:1m]" in RECORDS[record]["expr"], record
    for record in WHILE_THE_WINDOW_FILLS:
        expr = " ".join(RECORDS[record]["expr"].split())
        assert expr.startswith("sum by (") and "/" not in expr and "rate(" in expr, record


# What vmalert adds to the labels of an alert: its group's name.
VMALERT_LABELS = {"alertgroup"}


def _alert_key(alert: dict[str, Any]) -> Key:
    return tuple(sorted((k, v) for k, v in alert["labels"].items() if k not in VMALERT_LABELS))


def _prometheus_alerts(url: str) -> list[dict[str, Any]]:
    r = httpx.get(url + "/api/v1/alerts", timeout=10)
    r.raise_for_status()
    alerts: list[dict[str, Any]] = r.json()["data"]["alerts"]
    return alerts


def test_alerts_active_on_prometheus_are_active_on_vmalert_with_the_same_annotations(
    settled: Stack,
) -> None:
    def both() -> tuple[dict[Key, dict[str, Any]], dict[Key, dict[str, Any]]]:
        return (
            {_alert_key(a): a for a in _prometheus_alerts(settled.prometheus)},
            {_alert_key(a): a for a in settled.vmalert.alerts()},
        )

    pressured = {p.namespace for p in PODS if p.under_pressure}
    wait_until(
        lambda: (
            set(both()[0]) == set(both()[1])
            and {dict(k).get("namespace") for k in both()[0]} >= pressured
        ),
        "the same alerts active on both",
        timeout_seconds=120,
    )
    prometheus, vmalert = both()
    names = {dict(k)["alertname"] for k in prometheus}
    # GlassboxTargetDown's description runs a query (the most frequent failure's reason).
    assert {
        "VLLMPreemptionStorm",
        "VLLMKVCacheSaturated",
        "VLLMDecodeBandwidthLow",
        "GlassboxTargetDown",
    } <= names
    for key, alert in prometheus.items():
        if _namespace(key) != NEW:  # values in a filling window differ (see above)
            assert vmalert[key]["annotations"] == alert["annotations"], dict(key)
