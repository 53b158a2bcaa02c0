"""The exporter against the real vLLM CPU build: its values equal a hand computation.

The value under test always comes from the exporter's /metrics (or from Prometheus
scraping it); the expected value is computed here, by hand, from vLLM's own raw counters
read independently (prometheus_client's parser on vLLM's page, or PromQL `increase()`
over vLLM's series in Prometheus). Never from the derivation core.

(a) A plain vLLM (no speculation), started once for this module, the exporter polling
    it every 0.5 s: decode timing, tokens per pass and per step, steps/s, the KV pool,
    weights from safetensors and KV tokens from vLLM's log.
(b) The session `stack` (ngram speculation; Prometheus scrapes vLLM and the exporter):
    the speculative series at `stack.spec_compare_at`.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import dataclasses
import functools
import os
import re
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families
from vllm_glassbox.core.fetch import Fetcher, fetch_once
from vllm_glassbox.core.own_page import ExporterPage
from vllm_glassbox.core.snapshot import FILTERED_PAGE_PATH, read_snapshot
from vllm_glassbox.exporter.service import ExporterConfig, Poller, make_server
from vllm_glassbox.lab.backends.server_process import ServerProcess
from vllm_glassbox.lab.backends.tinymodel import TinyModelSpec, generate

from tests.realstack import RealStack
from tests.vllm_pause import held

pytestmark = pytest.mark.vllm

MODEL = "tiny"
INTERVAL = 0.5
WINDOW = 60.0
REL = 0.01  # "equal within 1 %"

Samples = dict[str, list[tuple[dict[str, str], float]]]


def _parse(text: str) -> Samples:
    out: Samples = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out.setdefault(s.name, []).append((s.labels, s.value))
    return out


@dataclass
class Page:
    """One read of a /metrics page, parsed by prometheus_client (not by glassbox)."""

    samples: Samples
    at: float  # unix time the read completed
    text: str

    @classmethod
    def get(cls, url: str) -> Page:
        text = httpx.get(url + "/metrics", timeout=10).text
        return cls(_parse(text), time.time(), text)

    def polled_since(self, t: float) -> bool:
        """An exporter's page: its latest poll succeeded and started after unix time t."""
        return ExporterPage.parse(self.text).polled_since(t)

    def value(self, name: str, **labels: str) -> float | None:
        for have, v in self.samples.get(name, []):
            if all(have.get(k) == want for k, want in labels.items()):
                return v
        return None

    def vllm(self, name: str) -> float:
        v = self.value(name, model_name=MODEL, engine="0")
        assert v is not None, f"vLLM's page has no {name}"
        return v

    def labels(self, name: str) -> dict[str, str]:
        (labels, _), *_ = self.samples[name]
        return labels


# --- (a) a plain vLLM, the exporter polling it ------------------------------------------


@dataclass
class Plain:
    vllm: ServerProcess
    exporter_url: str
    model_dir: Path
    exporter_started: float  # unix

    def exporter(self) -> Page:
        return Page.get(self.exporter_url)

    def raw(self) -> Page:
        return Page.get(self.vllm.url)


@pytest.fixture(scope="module")
def plain(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Plain]:
    work = tmp_path_factory.mktemp("exporter-e2e")
    model_dir = generate(TinyModelSpec("tiny-e2e"), work / "models")
    vllm = ServerProcess(
        [
            "--model", str(model_dir), "--served-model-name", MODEL,
            "--max-model-len", "2048", "--kv-cache-memory-bytes", "8388608",
            "--enforce-eager",  # no torch.compile: a minute less to start
        ],
        log_path=work / "vllm.log",
    )  # fmt: skip
    with vllm:
        vllm.wait_ready()
        poller = Poller(
            ExporterConfig(
                target=vllm.url,
                interval_seconds=INTERVAL,
                window_seconds=WINDOW,
                timeout_seconds=2.0,
                model_dir=str(model_dir),
                vllm_log=str(vllm.log_path),
            )
        )
        server = make_server(poller, "127.0.0.1", 0)
        stop = threading.Event()
        polling = threading.Thread(target=poller.run, args=(stop,), daemon=True)
        started = time.time()
        polling.start()
        threading.Thread(target=server.serve_forever, daemon=True).start()
        try:
            yield Plain(vllm, f"http://127.0.0.1:{server.server_address[1]}", model_dir, started)
        finally:
            stop.set()
            server.shutdown()
            server.server_close()
            polling.join(timeout=5)
            poller.fetcher.close()


def _complete(url: str, prompt: str, max_tokens: int) -> dict[str, Any]:
    body = {
        "model": MODEL,
        "prompt": prompt,
        "max_tokens": max_tokens,
        "temperature": 0,
        "ignore_eos": True,
    }
    r = httpx.post(url + "/v1/completions", json=body, timeout=600)
    r.raise_for_status()
    result: dict[str, Any] = r.json()
    return result


@dataclass
class Workload:
    before: Page
    after: Page
    exporter: Page  # read once the exporter has polled the final counters


def _wait_for_poll_after(plain: Plain, t: float, seconds: float = 120.0) -> Page:
    """The exporter's page once it has completed a poll that started after unix time t."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        page = plain.exporter()
        if page.polled_since(t):
            return page
        time.sleep(0.1)
    raise AssertionError(f"the exporter did not poll after {t}")


@pytest.fixture(scope="module")
def workload(plain: Plain) -> Workload:
    """Three rounds of 4 concurrent requests, bracketed by raw reads of vLLM's counters.

    vLLM is idle before and after, so every poll of the exporter before the requests
    read `before`'s counters and every poll after them reads `after`'s: its window
    (60 s, longer than all of this) holds exactly this workload.
    """
    before = plain.raw()
    _wait_for_poll_after(plain, before.at)  # the window starts on the idle counters
    with concurrent.futures.ThreadPoolExecutor(max_workers=4) as pool:
        for _ in range(3):
            prompts = [f"The cache pool holds blocks of tokens, number {i}" for i in range(4)]
            list(pool.map(lambda p: _complete(plain.vllm.url, p, 48), prompts))
    # vLLM records the last outputs' stats just after answering: wait until they are in.
    generated = before.vllm("vllm:generation_tokens_total") + 12 * 48
    finished = before.vllm("vllm:e2e_request_latency_seconds_count") + 12
    after = _wait_for_raw(
        plain,
        lambda page: (
            page.vllm("vllm:generation_tokens_total") >= generated
            and page.vllm("vllm:e2e_request_latency_seconds_count") >= finished
        ),
    )
    exporter = _wait_for_poll_after(plain, after.at)
    assert plain.raw().vllm("vllm:generation_tokens_total") == after.vllm(
        "vllm:generation_tokens_total"
    ), "vLLM's counters moved after the workload"
    return Workload(before, after, exporter)


def _wait_for_raw(plain: Plain, accept: Callable[[Page], bool], seconds: float = 120.0) -> Page:
    """vLLM's own page, once it satisfies `accept`."""
    deadline = time.monotonic() + seconds
    while True:
        page = plain.raw()
        if accept(page):
            return page
        assert time.monotonic() < deadline, "vLLM's counters never reached the workload's"
        time.sleep(0.2)


def _delta(w: Workload, name: str) -> float:
    return w.after.vllm(name) - w.before.vllm(name)


def _exported(page: Page, name: str) -> float:
    v = page.value(name, model_name=MODEL, engine="0")
    assert v is not None, f"the exporter publishes no {name}"
    return v


def test_decode_timing_equals_hand_computation_from_raw_counters(workload: Workload) -> None:
    generated = _delta(workload, "vllm:generation_tokens_total")
    first_tokens = _delta(workload, "vllm:time_to_first_token_seconds_count")
    itl_sum = _delta(workload, "vllm:inter_token_latency_seconds_sum")
    itl_count = _delta(workload, "vllm:inter_token_latency_seconds_count")
    assert generated == 12 * 48 and first_tokens == 12

    tpot = itl_sum / (generated - first_tokens)
    itl = itl_sum / itl_count
    e = workload.exporter
    assert _exported(e, "glassbox_time_per_output_token_seconds") == pytest.approx(tpot, rel=REL)
    assert _exported(e, "glassbox_inter_token_latency_seconds") == pytest.approx(itl, rel=REL)


def test_tokens_per_forward_pass_is_one_without_speculation(workload: Workload) -> None:
    generated = _delta(workload, "vllm:generation_tokens_total")
    first_tokens = _delta(workload, "vllm:time_to_first_token_seconds_count")
    itl_count = _delta(workload, "vllm:inter_token_latency_seconds_count")
    by_hand = (generated - first_tokens) / itl_count
    assert by_hand == 1.0
    exported = _exported(workload.exporter, "glassbox_tokens_per_forward_pass")
    assert exported == pytest.approx(by_hand, rel=REL)


def test_engine_steps_equal_hand_computation_from_raw_counters(
    plain: Plain, workload: Workload
) -> None:
    generated = _delta(workload, "vllm:generation_tokens_total")
    steps = _delta(workload, "vllm:iteration_tokens_total_count")
    e = workload.exporter
    per_step = _exported(e, "glassbox_tokens_per_engine_step")
    assert per_step == pytest.approx(generated / steps, rel=REL)
    # Four requests at a time may share engine steps (more than one token per step); on
    # a saturated machine they can also reach vLLM one after another: never below one.
    assert per_step >= 1.0

    # The window spans real polls: never more than the exporter has run, nor the window.
    covered = _exported(e, "glassbox_window_covered_seconds")
    latest = e.value("glassbox_last_scrape_success_timestamp_seconds") or 0.0
    assert 0 < covered <= min(WINDOW, latest - plain.exporter_started)
    rate = _exported(e, "glassbox_engine_steps_per_second")
    assert rate == pytest.approx(steps / covered, rel=REL)


def test_kv_pool_capacity_equals_cache_config_of_vllm(plain: Plain, workload: Workload) -> None:
    cache = workload.after.labels("vllm:cache_config_info")
    blocks, block_size = int(cache["num_gpu_blocks"]), int(cache["block_size"])
    assert blocks * block_size == int(cache["kv_cache_size_tokens"]) == 4096
    e = workload.exporter
    assert _exported(e, "glassbox_kv_cache_blocks") == blocks
    assert _exported(e, "glassbox_kv_cache_block_size_tokens") == block_size
    assert _exported(e, "glassbox_kv_cache_capacity_tokens") == blocks * block_size


class _Recording(Fetcher):
    """The exporter's own fetcher, keeping the last /metrics page it read."""

    last_page = ""

    def get_text(self, path: str, timeout_seconds: float | None = None) -> str:
        text = super().get_text(path, timeout_seconds)
        if path.startswith("/metrics"):  # the whole page, or the filtered one
            self.last_page = text
        return text


def test_kv_used_tokens_equal_usage_times_capacity_while_requests_hold_blocks(
    plain: Plain, workload: Workload
) -> None:
    """While requests hold KV blocks, each poll's used tokens are the usage on the very
    page it read times the pool: an exporter of its own polls vLLM held still with the
    requests in flight (tests/vllm_pause.py), so the page holds the blocks however late it
    comes, and vLLM runs 0.2 s between two polls, however late the test comes back."""
    cache = workload.after.labels("vllm:cache_config_info")
    capacity = int(cache["num_gpu_blocks"]) * int(cache["block_size"])
    url = plain.vllm.url
    fetcher = _Recording(url, timeout_seconds=30.0)
    poller = Poller(ExporterConfig(target=url, timeout_seconds=30.0), fetcher=fetcher)
    checked: list[tuple[float, float]] = []  # (usage, used tokens) of polls that saw blocks held
    polls: list[str] = []  # what each poll came to: its usage, or why it failed
    try:
        # 3 x 1,900 tokens overflow the 4,096-token pool: blocks stay held for ~1,900 steps.
        with concurrent.futures.ThreadPoolExecutor(max_workers=3) as pool:
            with held(plain.vllm) as hold:
                prompts = [f"Write a long essay {i}" for i in range(3)]
                running = [pool.submit(_complete, url, p, 1900) for p in prompts]
                while not all(r.done() for r in running) and len(checked) < 5:
                    hold.run(0.2)  # then vLLM holds still for the poll
                    if not poller.poll_once():
                        polls.append(f"failed: {poller.failing}")
                        continue
                    text = fetcher.last_page
                    page = Page(_parse(text), time.time(), text)
                    usage = page.vllm("vllm:kv_cache_usage_perc")
                    polls.append(f"{usage:.3f}")
                    if usage > 0:
                        published = {s.name: s.value for f in poller.published for s in f.samples}
                        checked.append((usage, published["glassbox_kv_cache_used_tokens"]))
            for r in running:
                r.result()
    finally:
        fetcher.close()
    print(f"{len(checked)} polls with blocks held: (usage, used tokens) {checked}")
    assert len(checked) == 5, f"the requests ended before five polls saw them: {polls}"
    for usage, used in checked:
        assert used == pytest.approx(usage * capacity, rel=REL)


def test_the_filtered_page_reads_exactly_as_the_whole_page(
    plain: Plain, workload: Workload
) -> None:
    """vLLM serves only the samples glassbox reads on FILTERED_PAGE_PATH (the
    prometheus_client app it mounts under /metrics, which honours name[]): a page a tenth
    the size, which reads as the whole page does; its counters are idle after the
    workload, so two reads agree (but for the API server's CPU seconds, which its own
    answers spend)."""
    whole = fetch_once(plain.vllm.url, "/metrics", 10.0)
    filtered = fetch_once(plain.vllm.url, FILTERED_PAGE_PATH, 10.0)
    assert len(filtered) < len(whole) / 5
    assert "vllm:iteration_tokens_total_bucket" in whole
    assert "_bucket" not in filtered
    read_whole, read_filtered = read_snapshot(whole), read_snapshot(filtered)
    assert read_whole.process_cpu_seconds is not None
    assert read_filtered.process_cpu_seconds is not None
    assert read_filtered.process_cpu_seconds >= read_whole.process_cpu_seconds
    without_cpu = functools.partial(dataclasses.replace, process_cpu_seconds=None)
    assert without_cpu(read_filtered) == without_cpu(read_whole)
    assert read_filtered.engines  # not an empty page that agrees with nothing


def test_weights_come_from_the_safetensors_headers(plain: Plain, workload: Workload) -> None:
    path = plain.model_dir / "model.safetensors"
    with open(path, "rb") as f:
        (header_length,) = struct.unpack("<Q", f.read(8))
    tensor_bytes = path.stat().st_size - 8 - header_length
    e = workload.exporter
    # vLLM's CPU build logs no "Model loading took ... GiB": the log has no weights to win.
    assert e.value("glassbox_model_weights_info", source="safetensors") == 1.0
    assert e.value("glassbox_model_weights_bytes") == tensor_bytes


def test_kv_tokens_from_vllm_log_equal_the_pool(plain: Plain, workload: Workload) -> None:
    m = re.search(r"KV cache size: ([0-9,]+) tokens", plain.vllm.log_text())
    assert m is not None, "vLLM's log has no KV cache size line"
    logged = int(m.group(1).replace(",", ""))
    cache = workload.after.labels("vllm:cache_config_info")
    assert logged == int(cache["num_gpu_blocks"]) * int(cache["block_size"])
    assert workload.exporter.value("glassbox_kv_cache_logged_capacity_tokens") == logged


# --- (b) speculation, from the session stack's Prometheus -------------------------------


def _one(stack: RealStack, expr: str, at: float) -> float:
    result = stack.query(expr, at=at)
    assert len(result) == 1, f"{expr}: {result}"
    return float(result[0]["value"][1])


def _increase(stack: RealStack, counter: str, at: float) -> float:
    return _one(stack, f'increase({counter}{{job="vllm",model_name="{MODEL}"}}[60s])', at)


def _glassbox(stack: RealStack, name: str, at: float, **labels: str) -> float:
    selector = ",".join(
        ['job="glassbox"', f'model_name="{MODEL}"', *(f'{k}="{v}"' for k, v in labels.items())]
    )
    return _one(stack, f"{name}{{{selector}}}", at)


def test_speculative_series_equal_raw_counter_increases_in_prometheus(
    stack: RealStack,
) -> None:
    at = stack.spec_compare_at
    generated = _increase(stack, "vllm:generation_tokens_total", at)
    first_tokens = _increase(stack, "vllm:time_to_first_token_seconds_count", at)
    decode_steps = _increase(stack, "vllm:inter_token_latency_seconds_count", at)
    drafts = _increase(stack, "vllm:spec_decode_num_drafts_total", at)
    draft_tokens = _increase(stack, "vllm:spec_decode_num_draft_tokens_total", at)
    accepted = _increase(stack, "vllm:spec_decode_num_accepted_tokens_total", at)
    assert drafts > 0 and accepted > 0, "the spec phase drafted nothing"

    per_pass = (generated - first_tokens) / decode_steps
    assert per_pass > 1.0
    expected = {
        "glassbox_tokens_per_forward_pass": per_pass,
        "glassbox_spec_decode_acceptance_ratio": accepted / draft_tokens,
        "glassbox_spec_decode_mean_acceptance_length": 1.0 + accepted / drafts,
        "glassbox_spec_decode_draft_coverage_ratio": drafts / decode_steps,
    }
    for name, want in expected.items():
        assert _glassbox(stack, name, at) == pytest.approx(want, rel=REL), name

    per_position = stack.query(
        'increase(vllm:spec_decode_num_accepted_tokens_per_pos_total{job="vllm"}[60s])', at=at
    )
    assert len(per_position) == 5  # num_speculative_tokens
    for series in per_position:
        position = series["metric"]["position"]
        want = float(series["value"][1]) / drafts
        got = _glassbox(
            stack, "glassbox_spec_decode_position_acceptance_ratio", at, position=position
        )
        assert got == pytest.approx(want, rel=REL, abs=1e-9), f"position {position}"


# --- a saturated API server -----------------------------------------------------------------
# Last in the module: it starves the module's vLLM (its API server pinned to one core beside
# a busy loop, at the lowest priority, then a flood of streamed requests), and puts it back.


class _RecordingFetcher(Fetcher):
    """The exporter's own fetcher, keeping each page it read and when it came."""

    def __init__(self, url: str, timeout_seconds: float) -> None:
        super().__init__(url, timeout_seconds)
        self.pages: list[tuple[float, str]] = []

    def get_text(self, path: str, timeout_seconds: float | None = None) -> str:
        text = super().get_text(path, timeout_seconds)
        if path != "/version":
            self.pages.append((time.monotonic(), text))
        return text


def _published(poller: Poller, name: str) -> float | None:
    values = [s.value for f in poller.published for s in f.samples if s.name == name]
    return values[0] if values else None


def _raw(text: str, name: str) -> float:
    return sum(v for _, v in _parse(text).get(name, []))


@contextlib.contextmanager
def _starved(api_server: int) -> Iterator[None]:
    """vLLM's API server (every thread) on core 0 at nice 19, beside a busy loop there."""
    tasks = [t.name for t in Path(f"/proc/{api_server}/task").iterdir()]
    pin = ["taskset", "-a", "-p", "-c"]
    subprocess.run([*pin, "0", str(api_server)], check=True, capture_output=True)
    for task in tasks:
        subprocess.run(["renice", "-n", "19", "-p", task], check=True, capture_output=True)
    spinner = subprocess.Popen(["taskset", "-c", "0", sys.executable, "-c", "while True: pass"])
    try:
        yield
    finally:
        spinner.kill()
        spinner.wait()
        cores = f"0-{(os.cpu_count() or 1) - 1}"
        subprocess.run([*pin, cores, str(api_server)], capture_output=True)
        for task in tasks:
            subprocess.run(["renice", "-n", "0", "-p", task], capture_output=True)


def test_a_starved_api_server_is_read_late_not_missed_and_its_rates_use_the_answer_time(
    plain: Plain,
) -> None:
    assert plain.vllm.pid is not None  # the launcher is the API server (one API server)
    fetcher = _RecordingFetcher(plain.vllm.url, 10.0)
    poller = Poller(
        ExporterConfig(
            target=plain.vllm.url, interval_seconds=1.0, window_seconds=300.0, timeout_seconds=10.0
        ),
        fetcher=fetcher,
    )
    body: dict[str, Any] = {"model": MODEL, "prompt": "Write a long essay.", "max_tokens": 192,
            "temperature": 0.7, "ignore_eos": True, "stream": True}  # fmt: skip
    stop = threading.Event()

    def stream(_: int) -> None:
        with httpx.Client(timeout=600) as client:
            while not stop.is_set():
                with client.stream("POST", plain.vllm.url + "/v1/completions", json=body) as r:
                    for _ in r.iter_lines():
                        pass

    polls, answers = 0, []
    with _starved(plain.vllm.pid), concurrent.futures.ThreadPoolExecutor(24) as pool:
        streams = [pool.submit(stream, i) for i in range(24)]
        try:
            while polls < 20:  # 20 polls, a second apart, however long each answer takes
                started = time.monotonic()
                if poller.poll_once():
                    answers.append(time.monotonic() - started)
                polls += 1
                time.sleep(max(0.0, 1.0 - (time.monotonic() - started)))
        finally:
            stop.set()
        for done in streams:
            done.result(timeout=600)
    poller.fetcher.close()

    # A 10 s deadline reads a starved API server (bench_saturation.py: 4.2 s at worst).
    failed = {reason: n for reason, n in poller.errors.items() if n and reason != "slow"}
    assert len(answers) >= 18 and len(answers) == len(fetcher.pages), (failed, answers)
    # Every rate over the pages read equals the raw counters over the times they came
    # (prometheus_client's parser, not glassbox's; the window holds every page).
    (first_at, first), (last_at, last) = fetcher.pages[0], fetcher.pages[-1]
    span = last_at - first_at

    def grown(name: str) -> float:
        return _raw(last, name) - _raw(first, name)

    steps = grown("vllm:iteration_tokens_total_count")
    assert steps > 0, "the flood made no engine step"
    want = {
        "glassbox_engine_steps_per_second": steps / span,
        "glassbox_tokens_per_engine_step": grown("vllm:generation_tokens_total") / steps,
        "glassbox_inter_token_latency_seconds": grown("vllm:inter_token_latency_seconds_sum")
        / grown("vllm:inter_token_latency_seconds_count"),
    }
    for name, value in want.items():
        assert _published(poller, name) == pytest.approx(value, rel=REL), name
