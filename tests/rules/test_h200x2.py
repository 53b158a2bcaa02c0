"""The project's rules on vLLM 0.24.0's real pages from two H200s at data parallel = 2: a
real Prometheus scrapes vLLM's and the exporter's pages as they were captured, one page a
scrape, in their order (idle, 4 × 128 tokens, the flood filling both pools, the first
preemptions, the storm, after; tests/fixtures/README.md), in one namespace. The records sum
the two engines into one series for the namespace, job and model; the preemption storm's
condition holds for it, as both engines preempted 19 and 17 times.
"""

from __future__ import annotations

import http.server
import threading
from collections.abc import Iterator
from typing import Any

import pytest
from vllm_glassbox.lab.backends.prometheus_process import PrometheusProcess

from tests.fixtures import page
from tests.fleet import EXPORTER_JOB, VLLM_JOB
from tests.realstack import prometheus_query, wait_until
from tests.rules.test_rules import ALERT_RULES, RULE_FILES

pytestmark = [pytest.mark.prometheus, pytest.mark.slow]

NAMESPACE = "team-h200"
STEPS = ("idle", "after-4x128", "flood-005", "flood-006", "flood-008", "flood-013", "after-flood")
PAGES = {
    VLLM_JOB: [page(f"cuda-0.24.0-h200x2/dp2-{s}.txt") for s in STEPS],
    EXPORTER_JOB: [page(f"cuda-0.24.0-h200x2/dp2-{s}.exporter.txt") for s in STEPS],
}


class Replay:
    """Each job's pages, one a scrape, the last one kept once all were served."""

    def __init__(self) -> None:
        self.served = dict.fromkeys(PAGES, 0)
        self.lock = threading.Lock()

    def next_page(self, job: str) -> str:
        with self.lock:
            pages = PAGES[job]
            text = pages[min(self.served[job], len(pages) - 1)]
            self.served[job] += 1
            return text

    def done(self) -> bool:
        with self.lock:
            return all(n > len(PAGES[job]) for job, n in self.served.items())


@pytest.fixture(scope="module")
def prometheus(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    replay = Replay()

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            job = self.path.strip("/")
            if job not in PAGES:
                self.send_error(404)
                return
            body = replay.next_page(job).encode()
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    hostport = f"127.0.0.1:{server.server_address[1]}"

    def job(name: str) -> dict[str, Any]:
        return {
            "job_name": name,
            "scrape_interval": "1s",
            "scrape_timeout": "900ms",
            "metrics_path": f"/{name}",
            "static_configs": [{"targets": [hostport], "labels": {"namespace": NAMESPACE}}],
        }

    config = {
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
        "rule_files": [str(p) for p in RULE_FILES],
        "scrape_configs": [job(VLLM_JOB), job(EXPORTER_JOB)],
    }
    try:
        with PrometheusProcess(tmp_path_factory.mktemp("prometheus"), config) as process:
            wait_until(replay.done, "every captured page scraped")
            yield process.url
    finally:
        server.shutdown()
        server.server_close()


def _one(url: str, expr: str) -> tuple[dict[str, str], float]:
    wait_until(lambda: len(prometheus_query(url, expr)) == 1, f"one series of {expr}")
    [series] = prometheus_query(url, expr)
    return series["metric"], float(series["value"][1])


def test_the_pool_records_sum_both_engines_into_one_series_of_the_namespace(
    prometheus: str,
) -> None:
    labels, capacity = _one(
        prometheus, "namespace_job_model_name:glassbox_kv_cache_capacity_tokens:sum"
    )
    # 58,000 tokens per engine (cache_config_info's kv_cache_size_tokens), two engines.
    assert capacity == 116_000
    assert (labels["namespace"], labels["job"], labels["model_name"]) == (
        NAMESPACE,
        EXPORTER_JOB,
        "q",
    )


def test_the_preemption_record_counts_both_engines_storm(prometheus: str) -> None:
    labels, rate = _one(prometheus, "namespace_job_model_name:vllm_num_preemptions:rate5m")
    assert labels["namespace"] == NAMESPACE and labels["model_name"] == "q"
    assert rate > 0


def test_the_storm_alerts_condition_holds_for_the_data_parallel_server(prometheus: str) -> None:
    # The alert's expression without its `for:` (3 minutes; the replay lasts seconds):
    # both engines preempted ≥ 3 times with a pool ≥ 90 % full and requests waiting.
    labels, _ = _one(prometheus, ALERT_RULES["VLLMPreemptionStorm"]["expr"])
    assert (labels["namespace"], labels["job"], labels["model_name"]) == (
        NAMESPACE,
        VLLM_JOB,
        "q",
    )
    per_engine = prometheus_query(prometheus, "increase(vllm:num_preemptions_total[2m]) >= 3")
    assert sorted(s["metric"]["engine"] for s in per_engine) == ["0", "1"]
