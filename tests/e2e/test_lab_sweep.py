"""The rate sweep against the real vLLM CPU build, started with an API key: two steps of
`vllm bench serve` (the real benchmark), the lab's polls, the exporter beside the server.

One server for the module (the lab starts it, as for any phase), about three minutes on
two busy cores. The key comes from the environment, as a plan names it; the server is
started with it (vLLM's VLLM_API_KEY, what --api-key sets), every part of the lab
presents it, and it appears in no file the run writes.
"""

from __future__ import annotations

import secrets
from pathlib import Path
from typing import Any

import httpx
import pytest
from vllm_glassbox.lab.backends.backend import Deployed
from vllm_glassbox.lab.backends.server_process import free_port
from vllm_glassbox.lab.cli import make_backend
from vllm_glassbox.lab.experiments.rate_sweep import KV_POOL, TPOT_AGREEMENT, RateSweepResult
from vllm_glassbox.lab.plan import parse_plan
from vllm_glassbox.lab.progress import Progress
from vllm_glassbox.lab.report import write_outputs
from vllm_glassbox.lab.runner import Lab, run_lab
from vllm_glassbox.lab.sidecar import ExporterBeside
from vllm_glassbox.lab.telemetry import Observer, Segment
from vllm_glassbox.lab.vllm.credentials import open_api_key

pytestmark = [pytest.mark.vllm, pytest.mark.slow]

INPUT, OUTPUT = 32, 300
PLAN: dict[str, Any] = {
    "name": "sweep-e2e",
    "api_key": {"env": "GLASSBOX_E2E_API_KEY"},
    "target": {
        "local": {
            "args": [
                "--model",
                "tiny:small",
                "--served-model-name",
                "tiny",
                "--max-model-len",
                "2048",
                # 4,096 tokens: 12 requests of 332 tokens fit at once.
                "--kv-cache-memory-bytes",
                "12582912",
                "--enforce-eager",
            ],
            "tiny_models": {
                "small": {
                    "hidden_size": 640,
                    "num_layers": 6,
                    "num_heads": 10,
                    "num_kv_heads": 2,
                    "intermediate_size": 1792,
                }
            },
        }
    },
    "phases": [
        {
            "kind": "rate-sweep",
            # 4 requests, then 18 in 0.6 s, as fast as the fastest machine serves them: 18
            # requests of 3 blocks against 32 blocks, so the pool runs out and vLLM preempts
            # (a request needs 300 decode steps, far longer than the 0.6 s of arrivals).
            "rates": [0.5, 30],
            "arrivals": "constant",
            "step_duration": "0.6s",
            "min_requests": 4,
            "input_len": INPUT,
            "output_len": OUTPUT,
            "goodput": {"ttft": "2s", "tpot": "200ms"},
            "poll": "1s",
            "step_timeout": "5m",
        }
    ],
}


class GuardCheck(Observer):
    """At the server's start: refused without the key, served with it."""

    def __init__(self, key: str) -> None:
        self.key = key
        self.codes: dict[str, int] = {}

    def server_ready(self, segment: Segment, deployed: Deployed) -> None:
        body = {"model": "tiny", "prompt": "hi", "max_tokens": 1}
        url = deployed.url + "/v1/completions"
        self.codes["without"] = httpx.post(url, json=body, timeout=60).status_code
        wrong = {"Authorization": "Bearer not-the-key"}
        self.codes["wrong"] = httpx.post(url, json=body, headers=wrong, timeout=60).status_code
        right = {"Authorization": f"Bearer {self.key}"}
        self.codes["with"] = httpx.post(url, json=body, headers=right, timeout=60).status_code


def test_a_sweep_against_a_real_vllm_started_with_an_api_key(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    key = "sk-glassbox-" + secrets.token_hex(12)
    monkeypatch.setenv("GLASSBOX_E2E_API_KEY", key)
    PLAN["target"]["local"]["model_cache"] = str(tmp_path / "models")
    plan = parse_plan(PLAN)
    assert plan.api_key is not None
    api_key = open_api_key(plan.api_key)
    out = tmp_path / "out"
    guard = GuardCheck(key)
    with Progress() as progress:
        # What `glassbox lab run` builds: the backend that starts vLLM with the key, the
        # lab that presents it, the exporter beside the server with it in a token file.
        backend = make_backend(plan, "local", out, None, progress.note, api_key)
        beside = ExporterBeside(free_port(), bearer_token_file=api_key.file)
        lab = Lab(backend, progress, [guard, beside], api_key=api_key, out_dir=out)
        try:
            results = run_lab(plan, lab)
        finally:
            beside.close()
            api_key.close()
    write_outputs(results, out)

    assert guard.codes == {"without": 401, "wrong": 401, "with": 200}
    (phase,) = results.phases
    assert phase.status == "ok", phase.error
    sweep = phase.body
    assert isinstance(sweep, RateSweepResult)
    low, high = sweep.steps
    for step, requests in ((low, 4), (high, 18)):
        assert step.client is not None and step.server is not None
        assert (step.requests, step.client.completed, step.client.failed) == (requests, requests, 0)
        assert step.bench_file is not None and (out / step.bench_file).is_file()
        # The client's TPOT and the counters' measure the same decode steps.
        assert step.tpot_difference is not None
        assert abs(step.tpot_difference) <= TPOT_AGREEMENT, step.tpot_note
        assert step.server.tokens_per_engine_step is not None
        assert step.server.tokens_per_engine_step >= 1.0
        assert step.server.weight_read_bandwidth is not None
        assert step.server.weight_read_bandwidth > 0
    assert low.client is not None and low.client.arrival_rate is not None
    # 18 requests of 332 tokens into a 4,096-token pool at once: vLLM's counter proves the
    # pool ran out. The polls sample the gauge: requests grow in lockstep and several can
    # be preempted in one step, so a poll may see the pool well below full; each sample is
    # still a fraction, and the polls that saw a queue saw blocks held.
    assert high.server is not None and high.server.preemptions > 0
    assert high.limit == KV_POOL
    high_points = [p for p in sweep.timeline if p.step == high.index]
    usage = [p.kv_cache_usage for p in high_points if p.kv_cache_usage is not None]
    assert usage and all(0 <= u <= 1 for u in usage)
    assert high.server.peak_kv_cache_usage == max(usage)
    assert all((p.kv_cache_usage or 0) > 0 for p in high_points if (p.waiting or 0) > 0)
    # The exporter beside the server read it with the key's file, and its headroom series
    # is in the timeline beside the lab's.
    assert [e.values.get("glassbox_target_up") for e in results.exporter] == [1.0]
    assert any(p.exporter_headroom_requests is not None for p in sweep.timeline)
    first = sweep.forecast.first_preemption_at
    assert first is not None and [p.step for p in sweep.timeline if p.t == first] == [1]
    # Some forecast of the lab's was present at the polls (their judgement: report.md).
    assert any(c.polls_seen for c in sweep.forecast.checks if c.source == "lab")

    report = (out / "report.md").read_text()
    assert "**The knee.**" in report and "**The first preemption.**" in report
    assert (out / "plots" / "rate-sweep-sweep.png").is_file()
    # The key is in no file the run wrote: report, results, benchmark JSON and logs,
    # vLLM's log.
    written = [p for p in out.rglob("*") if p.is_file()]
    assert any(p.suffix == ".log" for p in written) and (out / "results.json") in written
    assert not [p for p in written if key.encode() in p.read_bytes()]
