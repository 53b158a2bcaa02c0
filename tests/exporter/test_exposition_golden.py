"""The exporter's whole /metrics output over sequences of vLLM pages, against golden files.

`Poller` (exporter/service.py) is driven with the fixture pages through a stand-in for
its HTTP edge and an injected clock, then rendered by prometheus_client exactly as the
server renders it. Fetching itself (deadlines, byte caps, gzip) is tested against a real
loopback server elsewhere; here only the pages matter.
"""

from __future__ import annotations

import dataclasses
import json
import re
import shutil
import subprocess
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families
from vllm_glassbox.core.errors import ScrapeError
from vllm_glassbox.core.fetch import Fetcher
from vllm_glassbox.core.gpus import gpu_bandwidth
from vllm_glassbox.exporter.service import ExporterConfig, Poller, make_registry
from vllm_glassbox.lab.backends.tinymodel import TinyModelSpec, _config, write_safetensors

from tests.fixtures import LOGS, page
from tests.golden import GOLDEN, check_golden, family_of, strip_volatile


class PageSequence(Fetcher):
    """Serves /metrics from a list of pages (or errors) in order, and a fixed /version.
    Like a proxy that passes /metrics only, it has no filtered page: one page a poll."""

    def __init__(self, pages: list[str | ScrapeError], version: str) -> None:
        self.pages = list(pages)
        self.version = version

    def get_text(self, path: str, timeout_seconds: float | None = None) -> str:
        if path == "/version":
            return json.dumps({"version": self.version})
        if path != "/metrics":
            raise ScrapeError("http_status", f"{path}: HTTP 404")
        item = self.pages.pop(0)
        if isinstance(item, ScrapeError):
            raise item
        return item

    def close(self) -> None:
        pass


@dataclass
class Clock:
    now: float = 1000.0

    def __call__(self) -> float:
        return self.now


def render(
    config: ExporterConfig, polls: list[str | ScrapeError], version: str, interval: float = 10.0
) -> str:
    """Poll each page `interval` seconds apart, then render what a scrape would get."""
    clock = Clock()
    poller = Poller(config, fetcher=PageSequence(polls, version), clock=clock)
    for _ in polls:
        poller.poll_once()
        clock.now += interval
    return strip_volatile(generate_latest(make_registry(poller)).decode())


def config(**overrides: Any) -> ExporterConfig:
    base = ExporterConfig(
        target="http://vllm.invalid:8000", interval_seconds=10.0, window_seconds=60.0
    )
    return dataclasses.replace(base, **overrides)


L40S = gpu_bandwidth("L40S")
H200 = gpu_bandwidth("H200")
TINY_WEIGHTS = float(TinyModelSpec("tiny-capture").parameter_count() * 2)
TRUNCATED = page("cpu-0.32/plain-after-3x64.txt")[:20000]


def multiprocess(name: str) -> str:
    """A page as vLLM's multiprocess mode shows it: no process_* series."""
    return re.sub(r"^process_.*\n", "", page(name), flags=re.MULTILINE)


@pytest.fixture(scope="module")
def tiny_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The captured model's checkpoint files (config and safetensors; no tokenizer needed)."""
    spec = TinyModelSpec("tiny-capture")
    directory = tmp_path_factory.mktemp("tiny-capture")
    (directory / "config.json").write_text(json.dumps(_config(spec)))
    write_safetensors(directory / "model.safetensors", spec.tensor_shapes())
    return directory


def scenarios(checkpoint: Path) -> dict[str, str]:
    cpu = "cpu-0.32/"
    return {
        # Three requests of 64 tokens, weights from the checkpoint's safetensors headers.
        "cpu-0.32-plain": render(
            config(model_dir=str(checkpoint)),
            [
                page(cpu + p)
                for p in ("plain-idle.txt", "plain-after-1x64.txt", "plain-after-3x64.txt")
            ],
            "0.32.0",
        ),
        # Speculation, then the flood; a 30 s window holds the flood only.
        "cpu-0.32-spec-flood": render(
            config(
                window_seconds=30.0,
                weights_bytes=TINY_WEIGHTS,
                peak_bandwidth=20e9,
                vllm_log=str(LOGS / "cpu-0.32-spec-startup.log"),
            ),
            [
                page(cpu + p)
                for p in (
                    "spec-idle.txt",
                    "spec-after-1x256.txt",
                    "spec-after-2x256.txt",
                    "flood-mid.txt",
                    "flood-after.txt",
                )
            ],
            "0.32.0",
        ),
        # The article's run in v0.11.0's format: weights and KV memory from its log.
        "v0.11.0-single": render(
            config(vllm_log=str(LOGS / "v0.11.0-tp2.log"), peak_bandwidth=L40S),
            [page("v0.11.0-single/" + p) for p in ("idle.txt", "after-spec.txt")],
            "0.11.0",
        ),
        "v0.11.0-dp2": render(
            config(weights_bytes=5.59e9, peak_bandwidth=L40S),
            [page("v0.11.0-dp2/before.txt"), page("v0.11.0-dp2/after.txt")],
            "0.11.0",
        ),
        # Two data-parallel engines, each logging its full copy: the weights count once.
        "v0.11.0-dp2-log": render(
            config(vllm_log=str(LOGS / "v0.11.0-dp2.log"), peak_bandwidth=L40S),
            [page("v0.11.0-dp2/before.txt"), page("v0.11.0-dp2/after.txt")],
            "0.11.0",
        ),
        # The real CUDA capture at TP=2: one rank's shard in the log, the whole model out.
        "cuda-0.24.0-tp2": render(
            config(vllm_log=str(LOGS / "cuda-0.24.0-tp2.log"), peak_bandwidth=H200),
            [page("cuda-0.24.0-tp2/idle.txt")] * 2,
            "0.24.0",
        ),
        # The real CPU build at TP=2: the layout from its log, weights from the checkpoint.
        "cpu-0.32-tp2": render(
            config(
                model_dir=str(checkpoint),
                vllm_log=str(LOGS / "cpu-0.32-tp2-startup.log"),
                peak_bandwidth=20e9,
            ),
            [page(cpu + p) for p in ("tp2-idle.txt", "tp2-after-2x64.txt")],
            "0.32.0",
        ),
        # The real CPU build with two data-parallel engines, one 64-token request each.
        "cpu-0.32-dp2": render(
            config(
                model_dir=str(checkpoint),
                vllm_log=str(LOGS / "cpu-0.32-dp2-startup.log"),
                peak_bandwidth=20e9,
            ),
            [page(cpu + p) for p in ("dp2-idle.txt", "dp2-after-2x64.txt")],
            "0.32.0",
        ),
        # A restart in multiprocess mode (no process start time): only counters show it.
        "restart-multiprocess": render(
            config(weights_bytes=TINY_WEIGHTS),
            [multiprocess(cpu + p) for p in ("spec-after-2x256.txt", "plain-after-3x64.txt")],
            "0.32.0",
        ),
        # Nothing moved between the two polls: no windowed ratio, only the KV pool.
        "v0.11.0-2api": render(config(), [page("v0.11.0-2api/after.txt")] * 2, "0.11.0"),
        # Two good polls, then a truncated page: down, counted, derived series gone.
        "target-down": render(
            config(model_dir=str(checkpoint)),
            [
                page(cpu + "plain-idle.txt"),
                page(cpu + "plain-after-1x64.txt"),
                TRUNCATED,
                ScrapeError("connect", "/metrics: ConnectError: refused"),
            ],
            "0.32.0",
        ),
        # ... and back: the window spans the failed polls.
        "target-recovered": render(
            config(model_dir=str(checkpoint)),
            [
                page(cpu + "plain-idle.txt"),
                page(cpu + "plain-after-1x64.txt"),
                TRUNCATED,
                page(cpu + "plain-after-3x64.txt"),
            ],
            "0.32.0",
        ),
        # vLLM restarted without speculation: one restart, no negative or spiking values.
        "target-restarted": render(
            config(weights_bytes=TINY_WEIGHTS),
            [
                page(cpu + p)
                for p in (
                    "spec-after-1x256.txt",
                    "spec-after-2x256.txt",
                    "plain-idle.txt",
                    "plain-after-1x64.txt",
                )
            ],
            "0.32.0",
        ),
    }


@pytest.fixture(scope="module")
def outputs(tiny_checkpoint: Path) -> dict[str, str]:
    return scenarios(tiny_checkpoint)


NAMES = [
    "cpu-0.32-plain",
    "cpu-0.32-spec-flood",
    "v0.11.0-single",
    "v0.11.0-dp2",
    "v0.11.0-dp2-log",
    "cuda-0.24.0-tp2",
    "cpu-0.32-tp2",
    "cpu-0.32-dp2",
    "restart-multiprocess",
    "v0.11.0-2api",
    "target-down",
    "target-recovered",
    "target-restarted",
]


def test_every_scenario_has_a_golden_file(outputs: dict[str, str]) -> None:
    assert sorted(outputs) == sorted(NAMES)


@pytest.mark.parametrize("name", NAMES)
def test_exporter_output_matches_golden(
    name: str, outputs: dict[str, str], update_golden: bool
) -> None:
    check_golden(name, outputs[name], update_golden)


def _samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def _value(text: str, name: str, **labels: str) -> float | None:
    return _samples(text).get((name, tuple(sorted(labels.items()))))


TINY = {"model_name": "tiny", "engine": "0"}
TP2 = {"tensor_parallel": "2", "pipeline_parallel": "1", "data_parallel": "1"}


def test_plain_output_states_one_token_per_forward_pass(outputs: dict[str, str]) -> None:
    text = outputs["cpu-0.32-plain"]
    assert _value(text, "glassbox_target_up") == 1.0
    assert _value(text, "glassbox_tokens_per_forward_pass", **TINY) == 1.0
    assert _value(text, "glassbox_model_weights_bytes") == TINY_WEIGHTS
    assert _value(text, "glassbox_model_weights_info", source="safetensors") == 1.0
    assert _value(text, "glassbox_kv_cache_capacity_tokens", **TINY) == 16384
    assert _value(text, "glassbox_vllm_info", version="0.32.0") == 1.0
    assert "glassbox_spec_decode_acceptance_ratio{" not in text  # absent, not 0


def test_v0_11_output_takes_weights_from_the_log(outputs: dict[str, str]) -> None:
    text = outputs["v0.11.0-single"]
    engine = {"model_name": "Qwen/Qwen2.5-7B-Instruct-AWQ", "engine": "0"}
    assert _value(text, "glassbox_model_weights_info", source="log") == 1.0
    weights = _value(text, "glassbox_model_weights_bytes")
    assert weights == pytest.approx(2 * 2.6037 * 1024**3)
    assert _value(text, "glassbox_tokens_per_forward_pass", **engine) == 255 / 43
    # The log's engine-config line says TP=2: each GPU reads half the weights.
    assert _value(text, "glassbox_parallel_info", **TP2) == 1.0
    assert _value(text, "glassbox_decode_floor_seconds") == pytest.approx(weights / (2 * L40S))
    assert _value(text, "glassbox_kv_cache_capacity_tokens", **engine) == 3584 * 16


def test_target_down_keeps_serving_self_metrics_only(outputs: dict[str, str]) -> None:
    text = outputs["target-down"]
    assert _value(text, "glassbox_target_up") == 0.0
    assert _value(text, "glassbox_scrape_errors_total", reason="parse") == 1.0
    assert _value(text, "glassbox_scrape_errors_total", reason="connect") == 1.0
    derived = [
        f
        for f in {family_of(line) for line in text.splitlines()}
        if f.startswith(("glassbox_tokens", "glassbox_kv_", "glassbox_time_"))
    ]
    assert derived == []
    # Facts about the model do not depend on vLLM being up.
    assert _value(text, "glassbox_model_weights_bytes") == TINY_WEIGHTS


def test_recovery_brings_the_derived_series_back(outputs: dict[str, str]) -> None:
    text = outputs["target-recovered"]
    assert _value(text, "glassbox_target_up") == 1.0
    assert _value(text, "glassbox_scrape_errors_total", reason="parse") == 1.0
    assert _value(text, "glassbox_tokens_per_forward_pass", **TINY) == 1.0


def test_restart_is_counted_and_values_stay_sane(outputs: dict[str, str]) -> None:
    text = outputs["target-restarted"]
    assert _value(text, "glassbox_target_restarts_total") == 1.0
    samples = _samples(text)
    assert all(v >= 0 for v in samples.values())
    tokens_per_pass = _value(text, "glassbox_tokens_per_forward_pass", **TINY)
    assert tokens_per_pass is not None and 1.0 < tokens_per_pass < 6.0


def test_dp2_output_has_both_engines(outputs: dict[str, str]) -> None:
    text = outputs["v0.11.0-dp2"]
    model = "Qwen/Qwen2.5-7B-Instruct-AWQ"
    for engine in ("0", "1"):
        blocks = _value(text, "glassbox_kv_cache_blocks", model_name=model, engine=engine)
        assert blocks == 3584
    assert _value(text, "glassbox_tokens_per_forward_pass", model_name=model, engine="1") == 1.0


def _glassbox_only(text: str) -> str:
    return "".join(
        line for line in text.splitlines(keepends=True) if family_of(line).startswith("glassbox_")
    )


@pytest.mark.prometheus
def test_promtool_finds_nothing_to_lint_in_the_glassbox_series(
    outputs: dict[str, str],
) -> None:
    promtool = shutil.which("promtool")
    assert promtool is not None, "promtool is missing (scripts/setup.sh installs it)"
    # Also the golden files themselves, so a hand-edited golden cannot slip by.
    texts = {**outputs, **{p.name: p.read_text() for p in sorted(GOLDEN.glob("*.prom"))}}
    for name, text in texts.items():
        result = subprocess.run(
            [promtool, "check", "metrics"],
            input=_glassbox_only(text),
            capture_output=True,
            text=True,
            timeout=30,
        )
        assert (result.returncode, result.stdout + result.stderr) == (0, ""), name


def test_data_parallel_copies_in_the_log_count_once(outputs: dict[str, str]) -> None:
    text = outputs["v0.11.0-dp2-log"]
    assert _value(text, "glassbox_model_weights_info", source="log") == 1.0
    # Both engines log "Model loading took 14.9935 GiB"; summing them said 29.99 GiB.
    assert _value(text, "glassbox_model_weights_bytes") == pytest.approx(14.9935 * 1024**3)
    layout = {"tensor_parallel": "1", "pipeline_parallel": "1", "data_parallel": "2"}
    assert _value(text, "glassbox_parallel_info", **layout) == 1.0


def test_real_tp2_capture_gives_the_whole_model_and_per_gpu_floor(outputs: dict[str, str]) -> None:
    text = outputs["cuda-0.24.0-tp2"]
    weights = _value(text, "glassbox_model_weights_bytes")
    assert weights == pytest.approx(14.32 * 1024**3)  # Worker_TP0's line alone said 7.16 GiB
    assert _value(text, "glassbox_parallel_info", **TP2) == 1.0
    assert _value(text, "glassbox_decode_floor_seconds") == pytest.approx(weights / (2 * H200))
    capacity = _value(text, "glassbox_kv_cache_capacity_tokens", model_name="q", engine="0")
    assert capacity == 4_431_184


def test_cpu_tp2_bandwidth_is_per_gpu(outputs: dict[str, str]) -> None:
    text = outputs["cpu-0.32-tp2"]
    assert _value(text, "glassbox_parallel_info", **TP2) == 1.0
    assert _value(text, "glassbox_model_weights_info", source="safetensors") == 1.0
    per_gpu = _value(text, "glassbox_weight_read_bandwidth_bytes_per_second", **TINY)
    step = _value(text, "glassbox_inter_token_latency_seconds", **TINY)
    assert per_gpu is not None and step is not None
    assert per_gpu == pytest.approx(TINY_WEIGHTS / (2 * step))
    assert _value(text, "glassbox_tokens_per_forward_pass", **TINY) == 1.0


def test_a_restart_seen_only_in_counters_resets_every_counter(outputs: dict[str, str]) -> None:
    text = outputs["restart-multiprocess"]
    assert _value(text, "glassbox_target_restarts_total") == 1.0
    # The new process served 3 × 64 tokens, one per step; resetting only the counters
    # that went down said 2.25 tokens per forward pass.
    assert _value(text, "glassbox_tokens_per_forward_pass", **TINY) == 1.0


def test_cpu_dp2_has_two_engines_of_one_pool_each(outputs: dict[str, str]) -> None:
    text = outputs["cpu-0.32-dp2"]
    # vLLM's engine-config line says data_parallel_size=1 for these independent engines.
    layout = {"tensor_parallel": "1", "pipeline_parallel": "1", "data_parallel": "2"}
    assert _value(text, "glassbox_parallel_info", **layout) == 1.0
    assert _value(text, "glassbox_model_weights_bytes") == TINY_WEIGHTS  # not twice
    for engine in ("0", "1"):
        labels = {"model_name": "tiny", "engine": engine}
        assert _value(text, "glassbox_kv_cache_blocks", **labels) == 128  # 256 summed by vLLM
        assert _value(text, "glassbox_kv_cache_capacity_tokens", **labels) == 16384
        assert _value(text, "glassbox_tokens_per_forward_pass", **labels) == 1.0


def test_the_layout_flags_win_over_the_log(tiny_checkpoint: Path) -> None:
    text = render(
        config(vllm_log=str(LOGS / "cuda-0.24.0-tp2.log"), peak_bandwidth=H200, tensor_parallel=4),
        [page("cuda-0.24.0-tp2/idle.txt")] * 2,
        "0.24.0",
    )
    layout = {"tensor_parallel": "4", "pipeline_parallel": "1", "data_parallel": "1"}
    assert _value(text, "glassbox_parallel_info", **layout) == 1.0
    assert _value(text, "glassbox_model_weights_bytes") == pytest.approx(4 * 7.16 * 1024**3)


class Exploding(PageSequence):
    def get_text(self, path: str, timeout_seconds: float | None = None) -> str:
        raise RuntimeError("a bug in the exporter")


def test_an_unexpected_error_is_counted_as_internal_not_as_vllms_page() -> None:
    stop = threading.Event()
    poller = Poller(config(), fetcher=Exploding([], "0.32.0"), clock=Clock())
    thread = threading.Thread(target=poller.run, args=(stop,))
    thread.start()
    try:
        deadline = time.monotonic() + 30
        while poller.errors["internal"] == 0:
            assert time.monotonic() < deadline
            time.sleep(0.01)
    finally:
        stop.set()
        thread.join()
    assert poller.errors["parse"] == 0  # was counted as parse, which points at vLLM's page
    text = strip_volatile(generate_latest(make_registry(poller)).decode())
    assert (_value(text, "glassbox_scrape_errors_total", reason="internal") or 0) >= 1
    assert _value(text, "glassbox_target_up") == 0.0
