"""Debian's Prometheus as a child process on loopback, for the demo and the tests.

`scrape_config` is a configuration (pure). `PrometheusProcess` writes one beside its log
in a work folder, starts `prometheus` in a session of its own, waits until it says it is
ready (`/-/ready`) and stops it: SIGTERM, then SIGKILL, as a context manager and at exit
if nobody did (`ChildProcess`). Its TSDB stays in the work folder: a restart keeps the data.

    with PrometheusProcess(work, scrape_config({"vllm": "127.0.0.1:8000"})) as prometheus:
        ...  # prometheus.url
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Self

import yaml
from vllm_glassbox.core.prometheus import Prometheus
from vllm_glassbox.lab.backends.server_process import ChildProcess, free_port


def scrape_config(
    targets: Mapping[str, str],
    interval: str = "1s",
    timeout: str = "900ms",
    rule_files: Sequence[str] = (),
) -> dict[str, Any]:
    """Scraping each job's `host:port` and evaluating `rule_files` every `interval`."""
    return {
        "global": {
            "scrape_interval": interval,
            "scrape_timeout": timeout,
            "evaluation_interval": interval,
        },
        "rule_files": list(rule_files),
        "scrape_configs": [
            {"job_name": job, "static_configs": [{"targets": [hostport]}]}
            for job, hostport in targets.items()
        ],
    }


class PrometheusProcess(ChildProcess):
    """`prometheus` with `config`, its files in `workdir`, serving at `url`. With `agent`,
    in agent mode: it scrapes and remote-writes (`remote_write` in `config`), and keeps
    only its write-ahead log; it answers no query and evaluates no rule."""

    def __init__(
        self,
        workdir: Path,
        config: Mapping[str, Any],
        port: int | None = None,
        tsdb: Path | None = None,
        flags: Sequence[str] = (),
        agent: bool = False,
    ) -> None:
        self.workdir = workdir
        self.config = dict(config)
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.config_path = workdir / "prometheus.yml"
        storage = (
            ["--enable-feature=agent", f"--storage.agent.path={tsdb or workdir / 'wal'}"]
            if agent
            else [f"--storage.tsdb.path={tsdb or workdir / 'tsdb'}"]
        )
        super().__init__(
            [
                "prometheus",
                f"--config.file={self.config_path}",
                *storage,
                f"--web.listen-address=127.0.0.1:{self.port}",
                *flags,
            ],
            workdir / "prometheus.log",
            name="prometheus",
        )

    def start(self, ready_timeout_seconds: float = 120.0) -> Self:
        """Started and ready to answer queries; stopped again if it does not get there."""
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.config_path.write_text(yaml.safe_dump(self.config))
        super().start()
        try:
            with Prometheus(self.url, timeout_seconds=2.0) as client:
                self.wait_for(client.ready, ready_timeout_seconds, poll=0.3)
        except BaseException:
            self.stop()
            raise
        return self
