"""Weights belong to a model: a model change at the same target never prices the new
model with the old model's weights.

The real `Poller` reads a sequence of captured pages (tests/fixtures/metrics) through a
stand-in for its HTTP edge, while vLLM's log grows the way vLLM writes it: a start is
appended before the pages of the process it started. The logs are real captures
(tests/fixtures/logs) put one after the other, so each file here is ASSEMBLED, not
captured as one. The models:

- "qwen" AWQ: the H200 kv-pressure server (logs/cuda-0.24.0-h200-kv-pressure.log,
  `Model loading took 5.38 GiB`, checkpoint .../qwen7b-awq; pages h200/flood-*.txt);
- "qwen" BF16: the H200 BF16 server of the same session, served under the same name
  (logs/cuda-0.24.0-h200-bf16.log, 14.29 GiB, checkpoint .../qwen7b; h200/bf16-idle.txt);
- "q": the MoE server at TP=2 on two H200s (logs/cuda-0.24.0-h200x2-moe-tp2.log, one
  rank logs 28.46 GiB of two shards; h200x2/moe-tp2-*.txt).

Two captures of differently named models exist ("qwen", "q"), so no page's label is
rewritten. Every expected value is worked out here from the pages' raw counters.
"""

from __future__ import annotations

import dataclasses
import json
import logging
from pathlib import Path

import pytest
from vllm_glassbox.core.errors import ScrapeError
from vllm_glassbox.core.fetch import Fetcher
from vllm_glassbox.core.units import GIB
from vllm_glassbox.exporter.service import ExporterConfig, Poller

from tests.fixtures import log, page

H200 = 4.8e12  # bytes/s, the datasheet's
AWQ = 5.38 * GIB  # "Model loading took 5.38 GiB memory" (kv-pressure log)
BF16 = 14.29 * GIB  # "Model loading took 14.29 GiB memory" (bf16 log)
MOE = 2 * 28.46 * GIB  # rank 0 of tensor_parallel_size=2 logs its shard: 28.46 GiB

# Raw counters of the pages (generation_tokens_total, iteration_tokens_total_count).
FLOOD = {  # "qwen" AWQ, one process (process_start_time_seconds 1.79602431044e9)
    "cuda-0.24.0-h200/flood-filling.txt": (47373, 1498),
    "cuda-0.24.0-h200/flood-preempting.txt": (64068, 2037),
    "cuda-0.24.0-h200/flood-preempting-later.txt": (77478, 2580),
}
MOE_PAGES = {  # "q", process_start_time_seconds 1.796119699e9
    "cuda-0.24.0-h200x2/moe-tp2-idle.txt": (0, 0),
    "cuda-0.24.0-h200x2/moe-tp2-after-4x128.txt": (512, 130),
}
FLAG = "glassbox_input_unrecognised"
PER_TOKEN = "glassbox_weight_bytes_per_output_token"


class Pages(Fetcher):
    """/metrics from the pages queued by the test, one a poll; a fixed /version."""

    def __init__(self) -> None:
        self.queue: list[str] = []

    def get_text(self, path: str, timeout_seconds: float | None = None) -> str:
        if path == "/version":
            return json.dumps({"version": "0.24.0"})
        if path != "/metrics":
            raise ScrapeError("http_status", f"{path}: HTTP 404")
        return self.queue.pop(0)

    def close(self) -> None:
        pass


class Target:
    """One vLLM address the exporter polls every 10 s, and the log vLLM writes there."""

    def __init__(self, tmp_path: Path, with_log: bool = True, **options: object) -> None:
        self.log = tmp_path / "vllm.log"  # assembled from captured logs, start by start
        self.log.write_text("")
        self.now = 1000.0
        self.pages = Pages()
        config = dataclasses.replace(
            ExporterConfig(
                target="http://vllm.invalid:8000",
                interval_seconds=10.0,
                window_seconds=60.0,
                peak_bandwidth=H200,
                vllm_log=str(self.log) if with_log else None,
            ),
            **options,
        )
        self.poller = Poller(config, fetcher=self.pages, clock=lambda: self.now)

    def start(self, log_name: str) -> None:
        """vLLM (re)starts: the captured log of that start is appended."""
        with self.log.open("a") as f:
            f.write(log(log_name))

    def poll(self, page_name: str) -> None:
        self.pages.queue.append(page(page_name))
        assert self.poller.poll_once()
        self.now += 10.0

    def value(self, name: str, **labels: str) -> float | None:
        for family in self.poller.published:
            for sample in family.samples:
                if sample.name == name and all(
                    sample.labels.get(k) == v for k, v in labels.items()
                ):
                    return float(sample.value)
        return None

    def flags(self) -> set[tuple[str, str]]:
        return {
            (s.labels["source"], s.labels["shape"])
            for f in self.poller.published
            for s in f.samples
            if s.name == FLAG
        }


def per_token(weights: float, before: tuple[int, int], after: tuple[int, int]) -> float:
    """weights × Δ engine steps / Δ generation tokens, by hand."""
    return weights * (after[1] - before[1]) / (after[0] - before[0])


QWEN = {"model_name": "qwen", "engine": "0"}
Q = {"model_name": "q", "engine": "0"}
FLOOD_SPAN = (
    FLOOD["cuda-0.24.0-h200/flood-filling.txt"],
    FLOOD["cuda-0.24.0-h200/flood-preempting-later.txt"],
)
MOE_SPAN = tuple(MOE_PAGES.values())
# After a restart the new process's counters count from zero (a reset), so a window over
# the restart holds all of them: Δ from (0, 0) to the last flood page.
FROM_RESTART = ((0, 0), FLOOD["cuda-0.24.0-h200/flood-preempting-later.txt"])


def test_flag_weights_price_the_first_model_and_not_the_next_one(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    target = Target(tmp_path, with_log=False, weights_bytes=AWQ)
    for name in FLOOD:
        target.poll(name)
    # 5.38 GiB × 1082 steps / 30,105 tokens = 207,618,906 bytes per token.
    assert target.value(PER_TOKEN, **QWEN) == pytest.approx(per_token(AWQ, *FLOOD_SPAN))
    assert target.value(PER_TOKEN, **QWEN) == pytest.approx(2.07619e8, rel=1e-5)
    assert target.value("glassbox_model_weights_bytes") == AWQ
    assert target.flags() == set()

    caplog.set_level(logging.WARNING, logger="glassbox.exporter")
    for name in MOE_PAGES:  # vLLM now serves "q": another model at the same address
        target.poll(name)
    # The batch is read as before; what needs the weights is absent, and flagged.
    assert target.value("glassbox_tokens_per_engine_step", **Q) == pytest.approx(512 / 130)
    assert target.value(PER_TOKEN, **Q) is None  # before: 5.38 GiB × 130 / 512 = 1.467e9
    assert target.value("glassbox_weight_read_bandwidth_bytes_per_second", **Q) is None
    assert target.value("glassbox_memory_bandwidth_utilization_ratio", **Q) is None
    assert target.value("glassbox_model_weights_bytes") is None
    assert target.value("glassbox_model_weights_info") is None
    assert target.value("glassbox_decode_floor_seconds") is None
    assert target.flags() == {("page", "weights_of_another_model")}
    told = [r.getMessage() for r in caplog.records if "weights_of_another_model" in r.getMessage()]
    assert len(told) == 1  # one line over two polls
    assert "model_name=qwen" in told[0] and "model_name=q" in told[0]


def test_weights_follow_the_log_to_the_next_model(tmp_path: Path) -> None:
    target = Target(tmp_path)
    target.start("cuda-0.24.0-h200-kv-pressure.log")
    for name in FLOOD:
        target.poll(name)
    assert target.value(PER_TOKEN, **QWEN) == pytest.approx(per_token(AWQ, *FLOOD_SPAN))
    assert target.value("glassbox_model_weights_info", source="log") == 1.0

    target.start("cuda-0.24.0-h200x2-moe-tp2.log")  # vLLM restarted with "q"
    for name in MOE_PAGES:
        target.poll(name)
    # 56.92 GiB × 130 steps / 512 tokens = 15.52e9 bytes per token.
    assert target.value(PER_TOKEN, **Q) == pytest.approx(per_token(MOE, *MOE_SPAN))
    assert target.value(PER_TOKEN, **Q) == pytest.approx(1.55181e10, rel=1e-5)
    assert target.value("glassbox_model_weights_bytes") == pytest.approx(MOE)
    assert target.value("glassbox_model_weights_info", source="log") == 1.0
    # Per GPU at TP=2: 56.92 GiB / 2 / (5.79397 s / 508 steps) = 2.679e12 B/s.
    bandwidth = MOE / 2 / (5.79397069700002 / 508)
    assert target.value("glassbox_weight_read_bandwidth_bytes_per_second", **Q) == pytest.approx(
        bandwidth
    )
    assert target.flags() == set()


def test_the_log_gives_the_new_checkpoints_weights_under_the_same_served_name(
    tmp_path: Path,
) -> None:
    target = Target(tmp_path)
    target.start("cuda-0.24.0-h200-bf16.log")
    target.poll("cuda-0.24.0-h200/bf16-idle.txt")
    assert target.value("glassbox_model_weights_bytes") == pytest.approx(BF16)
    # Restarted as "qwen" again, the AWQ checkpoint (a new process_start_time).
    target.start("cuda-0.24.0-h200-kv-pressure.log")
    for name in FLOOD:
        target.poll(name)
    assert target.value("glassbox_model_weights_bytes") == pytest.approx(AWQ)
    # 5.38 GiB × 2580 / 77,478 = 192.4e6 bytes per token.
    assert target.value(PER_TOKEN, **QWEN) == pytest.approx(per_token(AWQ, *FROM_RESTART))
    assert target.value("glassbox_model_load_bytes_per_second") == pytest.approx(AWQ / 0.675017)
    assert target.flags() == set()


def test_flag_weights_of_the_old_checkpoint_are_not_used_after_a_restart_into_another(
    tmp_path: Path,
) -> None:
    # --weights-bytes of the BF16 model, and a log: the AWQ start names another checkpoint.
    target = Target(tmp_path, weights_bytes=BF16)
    target.start("cuda-0.24.0-h200-bf16.log")
    target.poll("cuda-0.24.0-h200/bf16-idle.txt")
    assert target.value("glassbox_model_weights_info", source="flag") == 1.0
    target.start("cuda-0.24.0-h200-kv-pressure.log")
    for name in FLOOD:
        target.poll(name)
    # The log gives the AWQ weights: the flag was of the BF16 checkpoint only.
    # Before: 14.29 GiB × 2580 / 77,478 = 510.9e6 bytes per token, 2.66 × the truth.
    assert target.value("glassbox_model_weights_info", source="log") == 1.0
    assert target.value(PER_TOKEN, **QWEN) == pytest.approx(per_token(AWQ, *FROM_RESTART))


def test_a_checkpoint_the_flag_is_not_of_leaves_the_weight_series_absent_and_flagged(
    tmp_path: Path,
) -> None:
    # The CPU build logs no weights line: the log names the checkpoint, not its bytes.
    # Its start is rewritten to another checkpoint path (ASSEMBLED: the demo serves every
    # variant as "tiny"), appended as vLLM restarts.
    cpu = "cpu-0.32/"
    target = Target(tmp_path, weights_bytes=6955520.0)
    target.start("cpu-0.32-plain-startup.log")
    target.poll(cpu + "plain-idle.txt")
    target.poll(cpu + "plain-after-1x64.txt")
    tiny = {"model_name": "tiny", "engine": "0"}
    # One token per engine step: 6,955,520 × 64 / 64.
    assert target.value(PER_TOKEN, **tiny) == pytest.approx(6955520.0)
    other = log("cpu-0.32-spec-startup.log").replace("models/tiny-capture", "models/tiny-int8")
    with target.log.open("a") as f:
        f.write(other)
    target.poll(cpu + "spec-idle.txt")
    target.poll(cpu + "spec-after-1x256.txt")
    # The window spans the restart: 64 + 256 tokens in 64 + 53 engine steps.
    assert target.value("glassbox_tokens_per_engine_step", **tiny) == pytest.approx(320 / 117)
    assert target.value(PER_TOKEN, **tiny) is None  # before: 6,955,520 × 117 / 320 = 2.54e6
    assert target.value("glassbox_model_weights_bytes") is None
    assert target.flags() == {("log", "weights_of_another_model")}


def test_a_restart_the_log_does_not_show_yet_gives_no_weights_until_it_does(
    tmp_path: Path,
) -> None:
    target = Target(tmp_path)
    target.start("cuda-0.24.0-h200-bf16.log")
    target.poll("cuda-0.24.0-h200/bf16-idle.txt")
    names = list(FLOOD)
    target.poll(names[0])  # a new process; its start not in the log yet
    assert target.value("glassbox_model_weights_bytes") is None  # not the BF16's 14.29 GiB
    assert target.flags() == {("log", "weights_of_another_model")}
    target.start("cuda-0.24.0-h200-kv-pressure.log")
    target.poll(names[1])
    assert target.value("glassbox_model_weights_bytes") == pytest.approx(AWQ)
    # From zero at the restart: 5.38 GiB × 2037 / 64,068.
    assert target.value(PER_TOKEN, **QWEN) == pytest.approx(AWQ * 2037 / 64068)
    assert target.flags() == set()


def test_without_a_log_a_restart_under_the_same_name_keeps_the_flags_weights(
    tmp_path: Path,
) -> None:
    # Nothing the exporter reads says the checkpoint changed: the flag still counts (the
    # limit docs/exporter.md states; give --vllm-log to see a new checkpoint).
    target = Target(tmp_path, with_log=False, weights_bytes=AWQ)
    target.poll("cuda-0.24.0-h200/bf16-idle.txt")
    for name in FLOOD:
        target.poll(name)
    assert target.value(PER_TOKEN, **QWEN) == pytest.approx(per_token(AWQ, *FROM_RESTART))
    assert target.flags() == set()
