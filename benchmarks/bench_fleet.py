"""What the rules and the dashboards cost a Prometheus at fleet size, in one run per size.

    flock /work/heavy.lock .venv/bin/python benchmarks/bench_fleet.py
    .venv/bin/python benchmarks/bench_fleet.py --pods 100,300,1000 --engines 1,8 --warmup 330

For each size, a fleet simulator (tests/fleet.py: one process, one loopback port, two
pages per pod — vLLM's, a real vLLM 0.32 capture whose counters move as under load, and
the exporter's, the real exporter's exposition of such pages) is scraped by Debian's
Prometheus loading alerts/*.yaml, every SCRAPE interval, rules every EVALUATION
interval. After a warm-up (by default until the rules' 5-minute windows are full), it
prints:

  series      per pod: vLLM's and the exporter's; the recording rules' series in all;
              Prometheus' head series
  memory      Prometheus' resident memory (process_resident_memory_bytes), and its Go heap
  scrape      scrape_duration_seconds per job: median and max over the targets, sampled
  rules       prometheus_rule_group_last_duration_seconds per group, sampled every few
              seconds over the measuring period: median and max, and the max as a share
              of the group's interval (the target: under a tenth)
  dashboards  every query of every dashboard (panels, annotations, variables) as Grafana
              sends it with every variable on "All", over the range that holds data,
              REPEATS times each: median and max per query; the slowest named

With `--ruler vmalert` the same fleet goes through VictoriaMetrics' parts instead (Debian's
1.79, as a team running them would: vmagent scrapes every SCRAPE interval and remote-writes
to the single-node store, vmalert evaluates alerts/*.yaml against it every EVALUATION
interval and writes the records back), and the same numbers come from their own pages:
each group's evaluations (vmalert_iteration_duration_seconds, one per evaluation, and
vmalert_iteration_missed_total: evaluations skipped because the previous one overran),
the three processes' memory and cores, the scrape durations vmagent stored, and the
dashboards' queries sent to the store. `--ruler prometheus,vmalert` runs one after the
other on the same machine, for figures side by side.

The machine is what it is (often shared and busy): the load average before and after is
printed with the numbers, and every number is given with its spread.
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from vllm_glassbox import rules  # noqa: E402
from vllm_glassbox.core import slo  # noqa: E402
from vllm_glassbox.core.prometheus import Prometheus, PrometheusError  # noqa: E402
from vllm_glassbox.dashboards import catalog  # noqa: E402
from vllm_glassbox.dashboards.grafana import (  # noqa: E402
    panels_of,
    substitute,
    time_range,
)
from vllm_glassbox.lab.backends.prometheus_process import PrometheusProcess  # noqa: E402

from tests.alertmanager import webhooks  # noqa: E402
from tests.fleet import EXPORTER_JOB, VLLM_JOB, Fleet, plan_pods, serve  # noqa: E402
from tests.victoria import VictoriaMetrics, VMAgent, VMAlert  # noqa: E402

RULE_FILES = sorted(str(p) for p in (REPO / "alerts").glob("*.yaml"))
# VictoriaMetrics' defaults, where the test helpers change them (tests/victoria.py).
STORE_DEFAULTS = ("-search.latencyOffset=30s", "-search.disableCache=false")


@dataclass
class Spread:
    values: list[float] = field(default_factory=list)

    def add(self, value: float) -> None:
        self.values.append(value)

    @property
    def median(self) -> float:
        return statistics.median(self.values) if self.values else float("nan")

    @property
    def max(self) -> float:
        return max(self.values) if self.values else float("nan")

    def ms(self) -> str:
        return f"{self.median * 1000:.1f} ms (max {self.max * 1000:.1f})"


@dataclass
class Result:
    pods: int
    engines: int
    series_per_pod: dict[str, float] = field(default_factory=dict)
    recorded_series: int = 0
    head_series: int = 0
    rss: Spread = field(default_factory=Spread)
    heap: Spread = field(default_factory=Spread)
    scrape: dict[str, Spread] = field(default_factory=dict)
    scrape_max: dict[str, Spread] = field(default_factory=dict)
    rule_groups: dict[str, Spread] = field(default_factory=dict)
    group_interval: dict[str, float] = field(default_factory=dict)
    group_evaluated: dict[str, float] = field(default_factory=dict)
    queries: dict[str, Spread] = field(default_factory=dict)
    load: tuple[float, float] = (0.0, 0.0)
    # Cores used over the measuring period: Prometheus' own, the simulator's (this process).
    prometheus_cores: float = 0.0
    simulator_cores: float = 0.0
    ruler: str = "prometheus"
    # With vmalert: each process' resident memory and cores (the store, vmagent, vmalert),
    # and each group's evaluations skipped because the one before overran.
    process_rss: dict[str, Spread] = field(default_factory=dict)
    process_cores: dict[str, float] = field(default_factory=dict)
    missed: dict[str, float] = field(default_factory=dict)
    # Dashboard queries the server refused, with its message.
    query_errors: dict[str, str] = field(default_factory=dict)
    # With --slo: its rules, the objective series they record, and what summing samples
    # over time costs this Prometheus (seconds per sample, a probe on the raw series).
    slo_rules: tuple[int, int, int] = (0, 0, 0)  # records, alerts, groups
    slo_series: int = 0
    seconds_per_sample: float = 0.0


def own_metrics(url: str) -> dict[str, list[tuple[str, float]]]:
    """Prometheus' own /metrics: name -> [(labels, value)] (a plain split: its own page)."""
    out: dict[str, list[tuple[str, float]]] = {}
    for line in httpx.get(url + "/metrics", timeout=30).text.splitlines():
        if not line or line.startswith("#"):
            continue
        series, _, value = line.rpartition(" ")
        name, _, labels = series.partition("{")
        out.setdefault(name, []).append((labels.rstrip("}"), float(value)))
    return out


def _label(labels: str, key: str) -> str:
    for part in labels.split('",'):
        k, _, v = part.partition('="')
        if k.strip() == key:
            return v.rstrip('"')
    return ""


def dashboard_queries() -> Iterator[tuple[str, str, str]]:
    """(where, kind, expr) of every query the dashboards send: panels' targets
    ("range" or "instant"), annotations ("range"), variables ("label_values")."""
    for board in (catalog.as_json(d) for d in catalog.dashboards()):
        uid = board["uid"]
        for panel in panels_of(board):
            for target in panel.get("targets", []):
                kind = "instant" if target.get("instant") else "range"
                yield f"{uid} / {panel['title']} / {target['refId']}", kind, target["expr"]
        for annotation in board["annotations"]["list"]:
            if "expr" in annotation:
                yield f"{uid} / annotation {annotation['name']}", "range", annotation["expr"]
        for variable in board["templating"]["list"]:
            if variable.get("type") != "datasource":
                yield f"{uid} / variable {variable['name']}", "label_values", variable["query"]


def run_query(
    client: Prometheus, http: httpx.Client, kind: str, expr: str, start: float, end: float
) -> float:
    """Seconds Prometheus took to answer (wall, over loopback)."""
    names = ["datasource", "cluster", "namespace", "job", "pod", "model_name", "engine"]
    span = time_range(start, end, SCRAPE_SECONDS)
    expr = substitute(expr, names, span)
    began = time.perf_counter()
    if kind == "range":
        client.query_range(expr, span.start, span.end, span.step)
    elif kind == "instant":
        client.query(expr, span.end)
    else:  # label_values(selector, label), as Grafana asks the label values API
        selector, _, label = expr.removeprefix("label_values(").removesuffix(")").rpartition(",")
        r = http.get(
            f"/api/v1/label/{label.strip()}/values",
            params={"match[]": selector, "start": span.start, "end": span.end},
        )
        r.raise_for_status()
    return time.perf_counter() - began


def time_dashboard_queries(
    client: Prometheus, http: httpx.Client, result: Result, first: float, repeats: int
) -> None:
    """Every dashboard query over the range from `first` to now, `repeats` times each."""
    now = time.time()
    for where, kind, expr in dashboard_queries():
        spread = result.queries.setdefault(where, Spread())
        for _ in range(repeats):
            try:
                spread.add(run_query(client, http, kind, expr, first, now))
            except (PrometheusError, httpx.HTTPStatusError) as e:  # refused: named, not timed
                result.query_errors[where] = str(e)[:300]
                break


SCRAPE_SECONDS = 15.0


def slo_rule_files(args: argparse.Namespace, work: Path, result: Result) -> list[str]:
    """The SLO file's rules (glassbox rules --slo), written into the work folder."""
    if not args.slo:
        return []
    objectives = slo.read_slo_file(args.slo)
    path = work / "slo.rules.yaml"
    path.write_text(rules.slo_rule_file_text(objectives, args.slo.name, []))
    groups = slo.rule_groups(objectives)
    all_rules = [r for g in groups for r in g["rules"]]
    records = sum(1 for r in all_rules if "record" in r)
    result.slo_rules = (records, len(all_rules) - records, len(groups))
    return [str(path)]


def measure(args: argparse.Namespace, pods: int, engines: int, work: Path) -> Result:
    result = Result(pods, engines)
    plan = plan_pods(pods, namespaces=max(2, pods // 10), models=4)
    fleet = Fleet(plan, engines)
    scrape = f"{SCRAPE_SECONDS:g}s"
    with serve(fleet, args.port) as serving:
        config = {
            "global": {
                "scrape_interval": scrape,
                "scrape_timeout": "10s",
                "evaluation_interval": args.evaluation_interval,
            },
            "rule_files": RULE_FILES + slo_rule_files(args, work, result),
            "scrape_configs": serving.scrape_configs(scrape, "10s"),
        }
        with (
            PrometheusProcess(work, config, port=args.port + 1) as prometheus,
            Prometheus(prometheus.url, timeout_seconds=120) as client,
            httpx.Client(base_url=prometheus.url, timeout=120) as http,
        ):
            result.load = (os.getloadavg()[0], 0.0)
            wait_every_target_up(client, pods)
            first = time.time()
            print(
                f"  {pods} pods × {engines} engines: every target up; warming up {args.warmup:g} s",
                file=sys.stderr,
            )
            time.sleep(args.warmup)
            began, cpu_began = time.time(), time.process_time()
            prometheus_cpu = own_metrics(prometheus.url)["process_cpu_seconds_total"][0][1]
            end = began + args.measure
            while time.time() < end:
                sample_prometheus(prometheus.url, client, result)
                time.sleep(5)
            spent = time.time() - began
            result.simulator_cores = (time.process_time() - cpu_began) / spent
            prometheus_cpu = (
                own_metrics(prometheus.url)["process_cpu_seconds_total"][0][1] - prometheus_cpu
            )
            result.prometheus_cores = prometheus_cpu / spent
            count_series(client, result, pods)
            if args.slo:
                probe_sum_over_time(client, result)
            time_dashboard_queries(client, http, result, first, args.repeats)
            result.load = (result.load[0], os.getloadavg()[0])
    return result


def measure_vmalert(args: argparse.Namespace, pods: int, engines: int, work: Path) -> Result:
    result = Result(pods, engines, ruler="vmalert")
    plan = plan_pods(pods, namespaces=max(2, pods // 10), models=4)
    fleet = Fleet(plan, engines)
    scrape = f"{SCRAPE_SECONDS:g}s"
    rule_files = [Path(p) for p in RULE_FILES]
    with (
        serve(fleet, args.port) as serving,
        webhooks() as sink,
        VictoriaMetrics(work / "store", port=args.port + 1, flags=STORE_DEFAULTS) as store,
        VMAgent(
            work / "vmagent", serving.scrape_configs(scrape, "10s"), [store.write_url],
            port=args.port + 2,
        ) as agent,
        VMAlert(
            work / "vmalert", rule_files, store.url, [sink.url("alerts")],
            interval=args.evaluation_interval, port=args.port + 3,
        ) as vmalert,
        Prometheus(store.url, timeout_seconds=120) as client,
        httpx.Client(base_url=store.url, timeout=120) as http,
    ):  # fmt: skip
        processes = {"victoria-metrics": store.url, "vmagent": agent.url, "vmalert": vmalert.url}
        result.load = (os.getloadavg()[0], 0.0)
        wait_every_target_up(client, pods)
        first = time.time()
        print(
            f"  {pods} pods × {engines} engines through vmagent and vmalert: every target up; "
            f"warming up {args.warmup:g} s",
            file=sys.stderr,
        )
        time.sleep(args.warmup)
        began, cpu_began = time.time(), time.process_time()
        cpu = {name: _own(url, "process_cpu_seconds_total") for name, url in processes.items()}
        missed = _by_group(vmalert.url, "vmalert_iteration_missed_total")
        evaluated = {
            g: (_by_group(vmalert.url, f"vmalert_iteration_duration_seconds_{k}").get(g, 0.0))
            for g in ("",)
            for k in ("count",)
        }
        counts = _by_group(vmalert.url, "vmalert_iteration_duration_seconds_count")
        sums = _by_group(vmalert.url, "vmalert_iteration_duration_seconds_sum")
        del evaluated
        end = began + args.measure
        while time.time() < end:
            time.sleep(5)
            new_counts = _by_group(vmalert.url, "vmalert_iteration_duration_seconds_count")
            new_sums = _by_group(vmalert.url, "vmalert_iteration_duration_seconds_sum")
            for group, count in new_counts.items():
                done = count - counts.get(group, 0.0)
                if done >= 1:  # each new evaluation's duration (their mean, if several)
                    spent_in = (new_sums[group] - sums.get(group, 0.0)) / done
                    result.rule_groups.setdefault(group, Spread()).add(spent_in)
            counts, sums = new_counts, new_sums
            for name, url in processes.items():
                rss = _own(url, "process_resident_memory_bytes")
                result.process_rss.setdefault(name, Spread()).add(rss)
            sample_scrapes(client, result)
        spent = time.time() - began
        result.simulator_cores = (time.process_time() - cpu_began) / spent
        result.process_cores = {
            name: (_own(url, "process_cpu_seconds_total") - cpu[name]) / spent
            for name, url in processes.items()
        }
        result.missed = {
            group: value - missed.get(group, 0.0)
            for group, value in _by_group(vmalert.url, "vmalert_iteration_missed_total").items()
        }
        result.group_interval = _by_group(vmalert.url, "vmalert_iteration_interval_seconds")
        result.rss = result.process_rss["victoria-metrics"]
        # A query that touches more than 300,000 series fails on the store's defaults
        # (-search.maxUniqueTimeseries): its own status page counts them all, and the series
        # per pod are counted over ten pods.
        count_series(client, result, pods, sample_pods=10)
        status = http.get("/api/v1/status/tsdb")
        status.raise_for_status()
        result.head_series = int(status.json()["data"]["totalSeries"])
        time_dashboard_queries(client, http, result, first, args.repeats)
        result.load = (result.load[0], os.getloadavg()[0])
    return result


def _own(url: str, name: str) -> float:
    """A process' own unlabelled series (memory, CPU) from its /metrics page."""
    return own_metrics(url)[name][0][1]


def _by_group(url: str, name: str) -> dict[str, float]:
    """vmalert's series of `name`, by rule group."""
    return {_label(labels, "group"): value for labels, value in own_metrics(url).get(name, [])}


def sample_prometheus(url: str, client: Prometheus, result: Result) -> None:
    metrics = own_metrics(url)
    evaluated = {
        _label(labels, "rule_group").rpartition(";")[2]: value
        for labels, value in metrics.get(
            "prometheus_rule_group_last_evaluation_timestamp_seconds", []
        )
    }
    for labels, value in metrics.get("prometheus_rule_group_last_duration_seconds", []):
        group = _label(labels, "rule_group").rpartition(";")[2]
        if evaluated.get(group) != result.group_evaluated.get(group):  # a new evaluation
            result.group_evaluated[group] = evaluated.get(group, 0.0)
            result.rule_groups.setdefault(group, Spread()).add(value)
    for labels, value in metrics.get("prometheus_rule_group_interval_seconds", []):
        result.group_interval[_label(labels, "rule_group").rpartition(";")[2]] = value
    result.rss.add(metrics["process_resident_memory_bytes"][0][1])
    result.heap.add(metrics["go_memstats_heap_inuse_bytes"][0][1])
    result.head_series = int(metrics["prometheus_tsdb_head_series"][0][1])
    sample_scrapes(client, result)


def wait_every_target_up(client: Prometheus, pods: int) -> None:
    """Until both targets of every pod have been scraped (10 minutes at most)."""
    deadline = time.monotonic() + 600
    while True:
        up = client.query("count(up == 1)")
        if up and int(float(up[0]["value"][1])) >= 2 * pods:
            return
        if time.monotonic() > deadline:
            raise RuntimeError(f"not every target was scraped: {up}")
        time.sleep(2)


def sample_scrapes(client: Prometheus, result: Result) -> None:
    """The median and the slowest target's last scrape duration, per job."""
    for job in (VLLM_JOB, EXPORTER_JOB):
        median = client.query(f'quantile(0.5, scrape_duration_seconds{{job="{job}"}})')
        worst = client.query(f'max(scrape_duration_seconds{{job="{job}"}})')
        if median and worst:
            result.scrape.setdefault(job, Spread()).add(float(median[0]["value"][1]))
            result.scrape_max.setdefault(job, Spread()).add(float(worst[0]["value"][1]))


def count_series(
    client: Prometheus, result: Result, pods: int, sample_pods: int | None = None
) -> None:
    """Series per pod of each job (over the first `sample_pods` pods, or all), and the
    recording rules' series."""

    def count(expr: str) -> int:
        answer = client.query(f"count({expr})")
        return int(float(answer[0]["value"][1])) if answer else 0

    counted = min(pods, sample_pods or pods)
    some = "" if counted == pods else f', pod=~"vllm-({"|".join(map(str, range(counted)))})"'
    for job in (VLLM_JOB, EXPORTER_JOB):
        result.series_per_pod[job] = count(f'{{job="{job}"{some}}}') / counted
    result.recorded_series = count('{__name__=~".+:.+:.+"}')  # level:metric:operations


# Histograms of vLLM's page whose buckets the probe below sums over time.
PROBED = (
    "vllm:time_to_first_token_seconds_bucket",
    "vllm:e2e_request_latency_seconds_bucket",
    "vllm:inter_token_latency_seconds_bucket",
    "vllm:request_time_per_output_token_seconds_bucket",
    "vllm:request_queue_time_seconds_bucket",
)


def probe_sum_over_time(client: Prometheus, result: Result) -> None:
    """What one more sample costs a sum over time here: the SLO rules' long windows are sums
    over time of their records, full only after days, so their steady cost is about their
    cost now plus their samples then × this. The probe sums the bucket series of a few vLLM
    histograms over 1 and over 7 minutes (samples counted by count_over_time), 3 times
    each: the difference in time over the difference in samples (what each series costs
    whatever its length cancels out)."""
    samples, seconds = {}, {}
    for window in ("1m", "7m"):
        samples[window] = 0.0
        for name in PROBED:
            answer = client.query(f'sum(count_over_time({name}{{job="vllm"}}[{window}]))')
            samples[window] += float(answer[0]["value"][1]) if answer else 0.0
        times = []
        for _ in range(3):
            began = time.perf_counter()
            for name in PROBED:
                client.query(f'count(sum_over_time({name}{{job="vllm"}}[{window}]))')
            times.append(time.perf_counter() - began)
        seconds[window] = statistics.median(times)
    more = samples["7m"] - samples["1m"]
    result.seconds_per_sample = (seconds["7m"] - seconds["1m"]) / more if more else math.nan
    answer = client.query("count(namespace_job_model_name_slo:glassbox_slo_requests:rate5m)")
    result.slo_series = int(float(answer[0]["value"][1])) if answer else 0


# Samples each objective series' windows read once full: the objectives' group at the
# global interval (the 30m to 6h windows over the 5-minute records), the budget group
# every 5 minutes (the hourly means over 1 h, then 1 d, 3 d and the period over them).
def slo_steady_samples(interval_seconds: float, period_days: int = 28) -> tuple[float, float]:
    per_group_a = 2 * sum(w / interval_seconds + 1 for w in (1800, 3600, 7200, 21600))
    per_group_b = 2 * (3600 / interval_seconds + 1) + 2 * sum(
        w / 300 + 1 for w in (86400, 3 * 86400, period_days * 86400)
    )
    return per_group_a, per_group_b


def report(r: Result) -> None:
    print(
        f"\n## {r.pods} pods × {r.engines} engine(s), {r.ruler}   (load average "
        f"{r.load[0]:.1f} before, {r.load[1]:.1f} after)"
    )
    vllm, exporter = r.series_per_pod[VLLM_JOB], r.series_per_pod[EXPORTER_JOB]
    print(
        f"series per pod: vLLM {vllm:.0f}, exporter {exporter:.0f}; recording rules "
        f"{r.recorded_series} in all; series in the store {r.head_series:,}"
    )
    if r.ruler == "vmalert":
        for name, rss in r.process_rss.items():
            print(f"{name} RSS {rss.median / 2**20:,.0f} MiB (max {rss.max / 2**20:,.0f})")
        cores = ", ".join(f"{name} {c:.2f}" for name, c in r.process_cores.items())
        print(f"cores used while measuring: {cores}, the simulator {r.simulator_cores:.2f}")
    else:
        print(
            f"Prometheus RSS {r.rss.median / 2**20:,.0f} MiB (max {r.rss.max / 2**20:,.0f}), "
            f"Go heap in use {r.heap.median / 2**20:,.0f} MiB"
        )
        print(
            f"cores used while measuring: Prometheus {r.prometheus_cores:.2f}, the simulator "
            f"(and this script) {r.simulator_cores:.2f}"
        )
    for job in r.scrape:
        print(
            f"scrape {job}: median target {r.scrape[job].ms()}, slowest target "
            f"{r.scrape_max[job].ms()}"
        )
    print("rule group             last duration: median (max)     max / interval")
    for group, spread in sorted(r.rule_groups.items()):
        interval = r.group_interval.get(group, float("nan"))
        missed = f", {r.missed[group]:.0f} missed" if r.missed.get(group) else ""
        print(
            f"  {group:<28} {spread.ms():<28} {spread.max / interval:6.1%} of {interval:g}s{missed}"
        )
    for where, error in sorted(r.query_errors.items()):
        print(f"  refused: {where}: {error}")
    timed = {where: spread for where, spread in r.queries.items() if spread.values}
    medians = sorted(s.median for s in timed.values())
    worst = sorted(timed.items(), key=lambda kv: kv[1].max, reverse=True)
    print(
        f"dashboard queries: {len(timed)} answered, {len(r.query_errors)} refused; "
        f"median of medians {statistics.median(medians) * 1000:.1f} ms, p95 "
        f"{medians[int(0.95 * (len(medians) - 1))] * 1000:.1f} ms, slowest:"
    )
    for where, spread in worst[:5]:
        print(f"  {spread.ms():<28} {where}")
    over = [w for w, s in timed.items() if s.max >= 2.0]
    print(f"queries at or over 2 s (max of repeats): {len(over)}")
    if r.slo_rules[2]:
        records, alerts, groups = r.slo_rules
        print(
            f"SLO rules: {records} records and {alerts} alerts in {groups} groups; "
            f"{r.slo_series} objective series (objectives × namespace, job and model)"
        )
        interval = r.group_interval.get(next(g for g in r.group_interval if ".slo." in g), 30.0)
        a, b = slo_steady_samples(interval)
        cost = r.seconds_per_sample
        print(
            f"  sum_over_time here: {cost * 1e9:.1f} ns a further sample; once the windows "
            f"are full (days), per evaluation, on top of their cost now: the objectives' "
            f"groups {a * r.slo_series:,.0f} samples (~{a * r.slo_series * cost:.2f} s, all "
            f"four groups, of {interval:g} s), the budget groups {b * r.slo_series:,.0f} "
            f"(~{b * r.slo_series * cost:.2f} s of 300 s)"
        )


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pods", default="100,300,1000", help="comma-separated sizes")
    parser.add_argument("--engines", default="1", help="data-parallel engines per pod, e.g. 1,8")
    parser.add_argument("--evaluation-interval", default="30s")
    parser.add_argument(
        "--warmup", type=float, default=330.0, help="seconds before measuring (5 m windows)"
    )
    parser.add_argument("--measure", type=float, default=150.0, help="seconds of sampling")
    parser.add_argument("--repeats", type=int, default=3, help="runs of each dashboard query")
    parser.add_argument(
        "--port", type=int, default=18300, help="the fleet's; Prometheus (or the store) +1"
    )
    parser.add_argument(
        "--ruler", default="prometheus", help="prometheus, vmalert or both: prometheus,vmalert"
    )
    parser.add_argument(
        "--slo", type=Path, help="an SLO file: its rules (glassbox rules --slo) loaded too"
    )
    args = parser.parse_args(argv)
    sizes = [int(n) for n in args.pods.split(",")]
    engine_counts = [int(n) for n in args.engines.split(",")]
    print(
        f"# fleet benchmark: scrape every {SCRAPE_SECONDS:g}s, rules every "
        f"{args.evaluation_interval}, warm-up {args.warmup:g}s, {os.cpu_count()} CPUs"
    )
    results = []
    rulers = {"prometheus": measure, "vmalert": measure_vmalert}
    for engines in engine_counts:
        for pods in sizes:
            for ruler in args.ruler.split(","):
                with tempfile.TemporaryDirectory(prefix="bench-fleet-") as work:
                    results.append(rulers[ruler](args, pods, engines, Path(work)))
                report(results[-1])
                sys.stdout.flush()
    curve(results)
    return 0


def curve(results: list[Result]) -> None:
    """One line per size: what N pods cost."""
    print("\n## The curve\n")
    print(
        "| pods × engines, ruler | series/pod (vLLM + exporter) | series | store RSS MiB "
        "| slowest rule group, max / interval | dashboard queries p50 / p95 / max |"
    )
    print("| --- | ---: | ---: | ---: | ---: | ---: |")
    for r in results:
        per_pod = r.series_per_pod[VLLM_JOB] + r.series_per_pod[EXPORTER_JOB]
        group, spread = max(r.rule_groups.items(), key=lambda kv: kv[1].max)
        share = spread.max / r.group_interval.get(group, float("nan"))
        timed = [s for s in r.queries.values() if s.values]
        medians = sorted(s.median for s in timed)
        worst = max(s.max for s in timed)
        print(
            f"| {r.pods} × {r.engines}, {r.ruler} | {per_pod:,.0f} | {r.head_series:,} "
            f"| {r.rss.median / 2**20:,.0f} (max {r.rss.max / 2**20:,.0f}) "
            f"| {group} {spread.max * 1000:,.0f} ms, {share:.1%} "
            f"| {medians[len(medians) // 2] * 1000:,.0f} / "
            f"{medians[int(0.95 * (len(medians) - 1))] * 1000:,.0f} / {worst * 1000:,.0f} ms |"
        )


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
