"""One rule per number: the lab and the exporter compute every shared number alike.

The lab measures with the derivation core and the weights and layout resolution
(`core/derive/`, `core/weights.py`, `core/layout.py`) and never loads the
exporter's service or its page (`exporter/exposition.py`); given the same
vLLM log, page and checkpoint, the lab's startup facts and the exporter's series agree.
"""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import pytest
from vllm_glassbox.core import derive
from vllm_glassbox.core import snapshot as s
from vllm_glassbox.core.snapshot import read_snapshot
from vllm_glassbox.exporter.history import History
from vllm_glassbox.exporter.service import ExporterConfig, Poller
from vllm_glassbox.lab.analysis import checkpoint_weights, segment_values, startup_facts
from vllm_glassbox.lab.backends.tinymodel import TinyModelSpec, _config, write_safetensors
from vllm_glassbox.lab.compared import COMPARED_NAMES
from vllm_glassbox.lab.experiments.quantization.judge import bandwidth as quantization_bandwidth
from vllm_glassbox.lab.experiments.rate_sweep.views import server_view
from vllm_glassbox.lab.vllm.client import increase

from tests.core.test_cuda_h200x2_captures import _moe_config
from tests.exporter.test_exposition_golden import PageSequence
from tests.fixtures import LOGS, log, page


def test_the_lab_loads_the_core_and_nothing_of_the_sidecar() -> None:
    code = (
        "import sys\n"
        "import vllm_glassbox.lab.analysis, vllm_glassbox.lab.runner\n"
        "import vllm_glassbox.lab.vllm.client\n"
        "print(sorted(m for m in sys.modules if m.startswith('vllm_glassbox.')))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120
    )
    loaded = done.stdout.strip()
    assert "core.weights" in loaded and "core.derive" in loaded
    assert "vllm_glassbox.exporter" not in loaded


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    spec = TinyModelSpec("tiny-capture")
    directory = tmp_path_factory.mktemp("tiny-capture")
    (directory / "config.json").write_text(json.dumps(_config(spec)))
    write_safetensors(directory / "model.safetensors", spec.tensor_shapes())
    return directory


def _exporter(log_name: str, pages: list[str], model_dir: str | None = None) -> Poller:
    poller = Poller(
        ExporterConfig(
            target="http://vllm.invalid", vllm_log=str(LOGS / log_name), model_dir=model_dir
        ),
        fetcher=PageSequence([page(p) for p in pages], "0"),
    )
    for _ in pages:
        poller.poll_once()
    return poller


@pytest.mark.parametrize(
    ("log_name", "page_name", "with_checkpoint"),
    [
        ("cuda-0.24.0-tp2.log", "cuda-0.24.0-tp2/idle.txt", False),  # weights from the log
        ("cpu-0.32-dp2-startup.log", "cpu-0.32/dp2-idle.txt", True),  # from the checkpoint
        ("v0.11.0-dp2.log", "v0.11.0-dp2/before.txt", True),  # the log wins; blocks × size
    ],
)
def test_the_lab_and_the_exporter_resolve_weights_and_the_pool_alike(
    log_name: str, page_name: str, with_checkpoint: bool, checkpoint: Path
) -> None:
    model_dir = str(checkpoint) if with_checkpoint else None
    poller = _exporter(log_name, [page_name], model_dir)
    snapshot = read_snapshot(page(page_name))
    lab = startup_facts(
        log(log_name), snapshot, "m", 1.0, checkpoint=lambda: checkpoint_weights(model_dir)
    )
    exported = poller.weights()
    assert exported is not None
    assert (lab.weights_bytes, lab.weights_source) == (exported.bytes, exported.source)
    cache = snapshot.cache_for(next(iter(snapshot.engines)))
    logged = poller.log_follower.facts.kv_cache_tokens if poller.log_follower else None
    assert lab.kv_cache_tokens == derive.kv_cache_capacity_tokens(cache, logged)
    assert lab.kv_cache_blocks == derive.kv_cache_blocks(cache)


def test_where_the_log_and_the_page_differ_both_take_the_page() -> None:
    # The TP=2 log says 1,313,328 tokens; the single-GPU page says 3,584 blocks of 16.
    snapshot = read_snapshot(page("v0.11.0-single/idle.txt"))
    lab = startup_facts(log("v0.11.0-tp2.log"), snapshot, "m", 1.0)
    assert lab.kv_cache_tokens == 3584 * 16  # the lab took the log's number before
    cache = snapshot.cache["0"]
    assert (
        derive.kv_cache_capacity_tokens(dataclasses.replace(cache, num_gpu_blocks_total=None), 7)
        == 7
    )


def test_the_lab_and_the_exporter_sum_data_parallel_engines_alike() -> None:
    before, after = (
        read_snapshot(page("cpu-0.32/dp2-idle.txt")),
        read_snapshot(page("cpu-0.32/dp2-after-2x64.txt")),
    )
    history = History(60.0, 10)
    history.add(before, 0.0)
    history.add(after, 10.0)
    windowed = derive.engines_together(history.increases().values(), 10.0)
    lab = increase(before, after, 10.0)
    assert lab == windowed
    assert (lab[s.GENERATION_TOKENS], lab[s.ITL_COUNT], lab.seconds) == (128, 126, 10.0)


def test_the_lab_and_the_exporter_agree_on_every_compared_series_of_a_mixture_of_experts(
    tmp_path: Path,
) -> None:
    # The Qwen3-30B-A3B-shaped model on two H200s (TP=2): the weight-based series read the
    # active weights, on the exporter's page and in the lab's numbers beside it.
    (tmp_path / "config.json").write_text(json.dumps(_moe_config()))
    peak = 4.8e12
    pages = ["cuda-0.24.0-h200x2/moe-tp2-idle.txt", "cuda-0.24.0-h200x2/moe-tp2-after-4x128.txt"]
    poller = Poller(
        ExporterConfig(
            target="http://vllm.invalid",
            vllm_log=str(LOGS / "cuda-0.24.0-h200x2-moe-tp2.log"),
            model_dir=str(tmp_path),
            peak_bandwidth=peak,
        ),
        fetcher=PageSequence([page(p) for p in pages], "0.24.0"),
    )
    for _ in pages:
        poller.poll_once()
    exported = {
        sample.name: sample.value for family in poller.published for sample in family.samples
    }

    idle, after = (read_snapshot(page(p)) for p in pages)
    startup = startup_facts(
        log("cuda-0.24.0-h200x2-moe-tp2.log"),
        idle,
        "q",
        1.0,
        checkpoint=lambda: checkpoint_weights(str(tmp_path)),
    )
    d = increase(idle, after, 10.0)
    lab = segment_values(d, startup, peak)

    assert startup.active_weights_bytes == exported["glassbox_model_active_weights_bytes"]
    for name in COMPARED_NAMES:
        assert lab[name] is not None or name == "glassbox_spec_decode_acceptance_ratio", name
        assert lab[name] == pytest.approx(exported.get(name)), name
    # The active weights (≈ 6.7 GB of 61 GB), each GPU reading its half per decode step.
    step = d[s.ITL_SUM] / d[s.ITL_COUNT]
    bandwidth = lab["glassbox_weight_read_bandwidth_bytes_per_second"]
    assert bandwidth == pytest.approx(startup.active_weights_bytes / (2 * step))
    assert startup.weights_bytes is not None
    assert startup.active_weights_bytes < startup.weights_bytes / 8
    # The experiments' own bandwidth figures (the quantization phase's variant, the rate
    # sweep's step) read the same context: the active weights, not the whole model.
    variant = quantization_bandwidth(d, startup, peak)
    assert variant.weight_read_bytes_per_second == pytest.approx(bandwidth)
    assert variant.utilization == pytest.approx(
        exported["glassbox_memory_bandwidth_utilization_ratio"]
    )
    step_view = server_view(d, [], startup, peak)
    assert step_view.weight_read_bandwidth == pytest.approx(bandwidth)
