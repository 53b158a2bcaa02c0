"""The dashboards on a remote-write store: Prometheus in agent mode scrapes the fleet and
remote-writes every sample to VictoriaMetrics, where vmalert writes the records; a
Prometheus server scrapes the same fleet and evaluates the same rule files, as a team's
own Prometheus does; every query of every dashboard answers the same from both.

The fleet simulator (tests/fleet.py) serves vLLM's pages and the exporter's, each pod a
target with the labels a ServiceMonitor gives; HISTORY_SECONDS of the same pages are
written into both stores first, so the windows are full when scraping starts. Every pod
is under pressure, so no gauge moves: the two scrapers read the pages at instants a
second or two apart, which counters growing evenly do not show and moving gauges would.
The queries are those `glassbox dashboards snapshot` sends (variables on "All",
Grafana's intervals, tables as instant queries at the range's end), over a stretch both
scrapers and both rule engines have covered: every panel gets the same series from both,
with the same values at every step.
"""

from __future__ import annotations

import math
import re
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import promql_parser
import pytest
from vllm_glassbox.core.prometheus import Prometheus
from vllm_glassbox.dashboards import catalog
from vllm_glassbox.dashboards.grafana import TimeRange
from vllm_glassbox.dashboards.panel_data import PanelData, Series, TargetData, query_dashboard
from vllm_glassbox.lab.backends.prometheus_process import PrometheusProcess

from tests import remote_write
from tests.alertmanager import webhooks
from tests.fleet import Fleet, Pod, serve
from tests.realstack import prometheus_query, wait_until
from tests.victoria import VictoriaMetrics, VMAlert

pytestmark = [pytest.mark.victoriametrics, pytest.mark.prometheus, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]
RULE_FILES = sorted((REPO / "alerts").glob("*.yaml"))
SCRAPE_SECONDS = 2.0
HISTORY_SECONDS = 330.0  # the 5-minute windows full when scraping starts
COMPARED_SECONDS = 20.0  # of live data, once both engines have recorded over it
PODS = [
    Pod(0, "team-0", "model-0", load=1.0, under_pressure=True, bandwidth_utilization=0.25),
    Pod(1, "team-0", "model-1", load=0.5, under_pressure=True, bandwidth_utilization=0.7),
    Pod(2, "team-1", "model-0", load=1.5, under_pressure=True, bandwidth_utilization=0.6),
]
# A scrape's timestamp is when it began, the page's values are those of when the fleet
# rendered it: up to JITTER_SECONDS later on a loaded machine. Counters that grow evenly
# in time are uneven by that much in the samples, and each scraper's samples differently,
# so over a window of W seconds a rate may be 2 x JITTER / W apart between the stores: 4 %
# over Grafana's shortest $__rate_interval here (8 s), 0.1 % over the rules' 5 minutes
# (a record's value carries its rule's window).
JITTER_SECONDS = 0.15
RULE_WINDOW_SECONDS = 300.0


@dataclass
class Stores:
    prometheus: str
    victoria_metrics: str
    live_since: float


@pytest.fixture(scope="module")
def stores(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stores]:
    work = tmp_path_factory.mktemp("remote-write")
    fleet = Fleet(PODS, started=time.time() - HISTORY_SECONDS)
    scrape = f"{SCRAPE_SECONDS:g}s"
    with serve(fleet) as serving, webhooks() as hooks:
        scrape_configs = serving.scrape_configs(scrape, scrape)
        reference = {
            "global": {"evaluation_interval": "1s"},
            "rule_files": [str(p) for p in RULE_FILES],
        }
        agent = {
            "scrape_configs": scrape_configs,
            "remote_write": [{"url": "", "queue_config": {"batch_send_deadline": "1s"}}],
        }
        with VictoriaMetrics(work / "victoria-metrics") as store:
            agent["remote_write"][0]["url"] = store.write_url
            # The history before either scrapes: the agent's first scrape continues it in
            # VictoriaMetrics, the server's own in Prometheus.
            prometheus = PrometheusProcess(
                work / "prometheus", reference, flags=remote_write.RECEIVING
            )
            history = serving.history(time.time() - fleet.started, SCRAPE_SECONDS)
            remote_write.write(store.write_url, history)
            with prometheus:
                remote_write.history_then_scrapes(prometheus, history, scrape_configs)
                with (
                    PrometheusProcess(work / "agent", agent, agent=True),
                    VMAlert(work / "vmalert", RULE_FILES, store.url, [hooks.url("vmalert")]),
                ):
                    yield Stores(prometheus.url, store.url, time.time())


def _series_key(series: Series) -> tuple[tuple[str, str], ...]:
    return tuple(sorted(series.labels.items()))


def _windows(expr: str) -> list[float]:
    found: list[float] = []

    def visit(node: object) -> bool:
        if isinstance(node, promql_parser.MatrixSelector):
            found.append(node.range.total_seconds())
        return True

    promql_parser.walk(promql_parser.parse(expr), visit)
    return found


def tolerance(expr: str) -> float:
    """How far the two stores' answers to `expr` may be apart: the scrapers' jitter over its
    shortest window (a record's, if it has none of its own), and for an increase() one
    scrape interval's growth (MetricsQL counts from the last sample before the window,
    Prometheus extrapolates the samples inside it to the window's edges)."""
    window = min(_windows(expr), default=RULE_WINDOW_SECONDS)
    growth = SCRAPE_SECONDS / window if "increase(" in expr else 0.0
    return 2 * JITTER_SECONDS / window + growth


def differences(theirs: TargetData, mine: TargetData) -> list[str]:
    if (theirs.error is None) != (mine.error is None):
        return [f"Prometheus: {theirs.error}; VictoriaMetrics: {mine.error}"]
    expected = {_series_key(s): s for s in theirs.series}
    got = {_series_key(s): s for s in mine.series}
    if set(expected) != set(got):
        return [f"series: Prometheus {sorted(expected)}, VictoriaMetrics {sorted(got)}"]
    allowed = tolerance(theirs.expr)
    out = []
    for key, series in expected.items():
        points = dict(zip(got[key].times, got[key].values, strict=True))
        for t, value in zip(series.times, series.values, strict=True):
            other = points.get(t)
            same = other is not None and (
                (math.isnan(value) and math.isnan(other))
                or math.isclose(value, other, rel_tol=allowed, abs_tol=1e-9)
            )
            if not same:
                out.append(f"{dict(key)} at {t}: Prometheus {value}, VictoriaMetrics {other}")
    return out


@pytest.fixture(scope="module")
def panels(stores: Stores) -> list[tuple[PanelData, PanelData]]:
    """Each panel's data from Prometheus and from VictoriaMetrics, over COMPARED_SECONDS of
    live data, the range's ends on the step's grid (VictoriaMetrics aligns them so)."""
    # Every window of the first compared step inside live scraping: Prometheus starts
    # scraping when its configuration is reloaded after the history, a few seconds' gap,
    # and a window that begins in a gap reads low on Prometheus (as a new series' does).
    start = math.ceil(stores.live_since + 20 + 4 * SCRAPE_SECONDS)
    end = start + COMPARED_SECONDS
    wait_until(
        lambda: (
            time.time() > end + SCRAPE_SECONDS
            and bool(prometheus_query(stores.victoria_metrics, "vllm:num_requests_running", end))
        ),
        "the compared stretch scraped and stored",
        timeout_seconds=120,
    )
    span = TimeRange(start, end, SCRAPE_SECONDS, SCRAPE_SECONDS)
    with (
        Prometheus(stores.prometheus) as prometheus,
        Prometheus(stores.victoria_metrics) as victoria_metrics,
    ):
        return [
            pair
            for board in (catalog.as_json(d) for d in catalog.dashboards())
            for pair in zip(
                query_dashboard(board, prometheus, span),
                query_dashboard(board, victoria_metrics, span),
                strict=True,
            )
        ]


def test_every_dashboard_query_answers_the_same_from_the_store_as_from_prometheus(
    panels: list[tuple[PanelData, PanelData]],
) -> None:
    # The fleet's pods are single servers without a KV connector or adapters, with no price
    # of a GPU hour and no GPU (no dcgm-exporter): the prefill/decode dashboard and the
    # cost and GPU panels are compared too, but not counted among those with data.
    targets = [
        t
        for theirs, _ in panels
        if theirs.dashboard_uid != "glassbox-disaggregation"
        for t in theirs.targets
        if not re.search(r"cost|dcgm|DCGM_", t.expr)
    ]
    with_data = [t for t in targets if t.has_data]
    # Most queries have data here (not the lab's phases, nor alerts that wait minutes).
    assert len(with_data) >= 0.75 * len(targets), (len(with_data), len(targets))
    found = []
    for theirs, mine in panels:
        for target, other in zip(theirs.targets, mine.targets, strict=True):
            for difference in differences(target, other):
                found.append(
                    f"{theirs.dashboard_uid} / {theirs.title} / {target.ref_id}: {difference}"
                )
    assert not found, "\n".join(found[:40])
