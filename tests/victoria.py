"""Debian's VictoriaMetrics (1.79) as child processes on loopback: the single-node store,
vmagent and vmalert, live or replaying history.

Each runs in a work folder of its own (its data, its log, its configuration), serves on a
free loopback port, is waited for until `/health` answers and stopped afterwards
(`ChildProcess`: SIGTERM then SIGKILL, at exit too if a test did not).

What the tests set apart from the defaults, and why:

- the store: `-search.latencyOffset=1s` (default 30 s: queries for the last 30 s are
  answered as of 30 s ago, so vmalert's records and alerts lag Prometheus' by 30 s; the
  tests keep 1 s), `-search.disableCache` (history is written into the past, which the
  response cache would not see), `-retentionPeriod=5y` (replayed cases lie years back),
  `-maxLabelsPerTimeseries=64` (default 30: vLLM 0.32's vllm:cache_config_info has 37
  labels of its own, 41 once scraped, and the store drops those past the 30th in name
  order, `pod` among them).
- vmalert: `-remoteWrite.flushInterval=1s` (5 s), and a notifier always (1.79 refuses to
  start with alerting rules and none).
"""

from __future__ import annotations

import datetime
import json
import subprocess
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, Self

import httpx
import yaml
from vllm_glassbox.lab.backends.server_process import ChildProcess, free_port

# Samples as VictoriaMetrics exports them: (labels with __name__, [(seconds, value)]);
# a stale marker comes back as None.
Exported = tuple[dict[str, str], list[tuple[float, float | None]]]


def _healthy(url: str) -> bool:
    try:
        return httpx.get(url + "/health", timeout=2, trust_env=False).status_code == 200
    except httpx.HTTPError:
        return False


class _Served(ChildProcess):
    """A VictoriaMetrics program serving at `url`, ready once `/health` answers."""

    def __init__(self, name: str, argv: Sequence[str], workdir: Path, port: int | None) -> None:
        self.workdir = workdir
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        super().__init__(
            [*argv, f"-httpListenAddr=127.0.0.1:{self.port}", "-loggerLevel=WARN"],
            workdir / f"{name}.log",
            name=name,
        )

    def start(self, ready_timeout_seconds: float = 60.0) -> Self:
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.prepare()
        super().start()
        try:
            self.wait_for(lambda: _healthy(self.url), ready_timeout_seconds, poll=0.2)
        except BaseException:
            self.stop()
            raise
        return self

    def prepare(self) -> None:
        """Write what the program reads before it starts."""


class VictoriaMetrics(_Served):
    """The single-node store: Prometheus' query API at `url`, remote write at `write_url`."""

    def __init__(self, workdir: Path, port: int | None = None, flags: Sequence[str] = ()) -> None:
        super().__init__(
            "victoria-metrics",
            [
                "victoria-metrics",
                f"-storageDataPath={workdir / 'data'}",
                "-retentionPeriod=5y",
                "-search.latencyOffset=1s",
                "-search.disableCache",
                "-maxLabelsPerTimeseries=64",
                *flags,
            ],
            workdir,
            port,
        )

    @property
    def write_url(self) -> str:
        return self.url + "/api/v1/write"

    def flush(self) -> None:
        """Make everything received so far searchable (it is, within a second, anyway)."""
        httpx.get(self.url + "/internal/force_flush", timeout=30, trust_env=False)

    def query(self, expr: str, at: float, step: float) -> list[tuple[dict[str, str], float]]:
        """`expr` at `at` as MetricsQL evaluates it, a bare selector looking back `step`."""
        r = httpx.get(
            self.url + "/api/v1/query",
            params={"query": expr, "time": at, "step": step},
            timeout=60,
            trust_env=False,
        )
        r.raise_for_status()
        return [
            ({str(k): str(v) for k, v in item["metric"].items()}, float(item["value"][1]))
            for item in r.json()["data"]["result"]
        ]

    def export(self, match: str, start: float, end: float) -> list[Exported]:
        """The raw samples of the series `match` selects between `start` and `end`."""
        r = httpx.get(
            self.url + "/api/v1/export",
            params={"match[]": match, "start": start, "end": end},
            timeout=60,
            trust_env=False,
        )
        r.raise_for_status()
        out = []
        for line in r.text.splitlines():
            item = json.loads(line)
            points = [
                (t / 1000, None if v is None else float(v))
                for t, v in zip(item["timestamps"], item["values"], strict=True)
            ]
            out.append(({str(k): str(v) for k, v in item["metric"].items()}, points))
        return out


class VMAgent(_Served):
    """vmagent scraping `scrape_configs` (Prometheus' format) and remote-writing every
    sample to each of `write_urls`."""

    def __init__(
        self,
        workdir: Path,
        scrape_configs: Sequence[Mapping[str, Any]],
        write_urls: Sequence[str],
        port: int | None = None,
    ) -> None:
        self.scrape_configs = list(scrape_configs)
        self.config_path = workdir / "vmagent.yml"
        super().__init__(
            "vmagent",
            [
                "vmagent",
                f"-promscrape.config={self.config_path}",
                f"-remoteWrite.tmpDataPath={workdir / 'vmagent-queue'}",
                *(f"-remoteWrite.url={url}" for url in write_urls),
            ],
            workdir,
            port,
        )

    def prepare(self) -> None:
        self.config_path.write_text(yaml.safe_dump({"scrape_configs": self.scrape_configs}))


def _rule_flags(rule_files: Sequence[Path]) -> list[str]:
    return [f"-rule={path}" for path in rule_files]


class VMAlert(_Served):
    """vmalert evaluating `rule_files` against the store at `datasource` every
    `interval`, writing records and alert state back to it, sending alerts to `notifiers`."""

    def __init__(
        self,
        workdir: Path,
        rule_files: Sequence[Path],
        datasource: str,
        notifiers: Sequence[str],
        interval: str = "1s",
        flags: Sequence[str] = (),
        port: int | None = None,
    ) -> None:
        super().__init__(
            "vmalert",
            [
                "vmalert",
                *_rule_flags(rule_files),
                f"-datasource.url={datasource}",
                f"-remoteWrite.url={datasource}",
                "-remoteWrite.flushInterval=1s",
                f"-evaluationInterval={interval}",
                *(f"-notifier.url={url}" for url in notifiers),
                *flags,
            ],
            workdir,
            port,
        )

    def alerts(self) -> list[dict[str, Any]]:
        """Active alerts (pending and firing), as vmalert's API lists them."""
        r = httpx.get(self.url + "/api/v1/alerts", timeout=10, trust_env=False)
        r.raise_for_status()
        alerts: list[dict[str, Any]] = r.json()["data"]["alerts"]
        return alerts


def _rfc3339(seconds: float) -> str:
    return datetime.datetime.fromtimestamp(seconds, datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def replay(
    rule_files: Sequence[Path],
    store: VictoriaMetrics,
    start: float,
    end: float,
    interval: str,
    log_path: Path,
) -> None:
    """vmalert's replay mode: every rule of `rule_files` evaluated at each `interval` from
    `start` to `end` over the store's history, records and alert state (ALERTS,
    ALERTS_FOR_STATE) written back to it. The evaluation step is `-datasource.queryStep`
    (1.79 takes it, not the group's interval, as the step of its range queries)."""
    argv = [
        "vmalert",
        *_rule_flags(rule_files),
        f"-datasource.url={store.url}",
        f"-remoteWrite.url={store.url}",
        f"-evaluationInterval={interval}",
        f"-datasource.queryStep={interval}",
        f"-replay.timeFrom={_rfc3339(start)}",
        f"-replay.timeTo={_rfc3339(end)}",
        "-replay.rulesDelay=0s",
        "-replay.disableProgressBar",
        "-loggerLevel=WARN",
    ]
    with open(log_path, "ab") as log:
        result = subprocess.run(argv, stdout=log, stderr=subprocess.STDOUT, timeout=300)
    if result.returncode != 0:
        raise RuntimeError(
            f"vmalert replay exited with {result.returncode}:\n{log_path.read_text()[-3000:]}"
        )
    store.flush()


def dry_run(rule_files: Sequence[Path]) -> subprocess.CompletedProcess[str]:
    """vmalert's own check of rule files: YAML, MetricsQL, annotation templates."""
    return subprocess.run(
        ["vmalert", "-dryRun", *_rule_flags(rule_files), "-loggerLevel=WARN"],
        capture_output=True,
        text=True,
        timeout=60,
    )


def samples_at(exported: Sequence[Exported], at: float) -> Iterator[tuple[dict[str, str], float]]:
    """Each exported series' sample at exactly `at` (to the millisecond), when it has one
    that is not a stale marker."""
    for labels, points in exported:
        for t, v in points:
            if abs(t - at) < 0.0005 and v is not None:
                yield labels, v
