"""scripts/gpu/compare_telemetry.py on a small nvidia-smi CSV written by hand and a pair of
vLLM pages captured on one H200 (tests/fixtures/metrics/cuda-0.24.0-h200/: the kv-pressure
server of the gpu-7b plan, BF16 Qwen2.5-7B, 15,231,233,024 bytes of weights).

The oracle is apart from the core: prometheus_client's parser and plain arithmetic give
the mean decode step; the weights over it over the H200's 4.8 TB/s give the share; the
CSV's 40, 50 and 60 % give nvidia-smi's 0.5.
"""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from types import ModuleType

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.fixtures import METRICS

REPO = Path(__file__).resolve().parents[2]
WEIGHTS = 15_231_233_024.0
PAIR = ("cuda-0.24.0-h200/flood-filling.txt", "cuda-0.24.0-h200/flood-preempting.txt")
SMI = "\n".join(
    [
        "timestamp, name, memory.used [MiB], memory.total [MiB], utilization.gpu [%], "
        "utilization.memory [%], power.draw [W], clocks.current.sm [MHz], "
        "clocks.current.memory [MHz]",
        "2026/12/04 10:00:00.000, NVIDIA H200, 130000 MiB, 143771 MiB, 97 %, 40 %, "
        "610.20 W, 1980 MHz, 2619 MHz",
        "2026/12/04 10:00:00.500, NVIDIA H200, 130000 MiB, 143771 MiB, 98 %, 50 %, "
        "640.10 W, 1980 MHz, 2619 MHz",
        "2026/12/04 10:00:01.000, NVIDIA H200, 130002 MiB, 143771 MiB, 99 %, 60 %, "
        "655.00 W, 1980 MHz, 2619 MHz",
        "2026/12/04 10:00:01.500, NVIDIA H200, 1300",  # the sampler stopped mid-row
        "",
    ]
)


def _script() -> ModuleType:
    path = REPO / "scripts" / "gpu" / "compare_telemetry.py"
    spec = importlib.util.spec_from_file_location("compare_telemetry", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def _itl(text: str) -> tuple[float, float]:
    total = count = 0.0
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "vllm:inter_token_latency_seconds_sum":
                total += sample.value
            elif sample.name == "vllm:inter_token_latency_seconds_count":
                count += sample.value
    return total, count


@pytest.fixture
def captured(tmp_path: Path) -> Path:
    level = tmp_path / "c32"
    level.mkdir()
    for name, page in zip(("vllm-before.txt", "vllm-after.txt"), PAIR, strict=True):
        (level / name).write_text((METRICS / page).read_text())
    (level / "nvidia-smi.csv").write_text(SMI)
    (level / "meta.json").write_text(json.dumps({"before_at": 0.0, "after_at": 30.0}))
    return tmp_path


def test_nvidia_smi_beside_glassbox_by_hand(captured: Path) -> None:
    compare = _script()
    (s0, c0), (s1, c1) = (_itl((METRICS / p).read_text()) for p in PAIR)
    step = (s1 - s0) / (c1 - c0)
    expected = WEIGHTS / step / 4.8e12
    [level] = [compare.level_of(captured / "c32", WEIGHTS, 4.8e12, 1)]
    assert level.weight_reads == pytest.approx(expected)
    assert level.smi_memory == pytest.approx(0.5)
    assert level.smi_samples == 3  # the row cut off at the end is left out
    assert level.dram_active is None
    assert level.check is not None
    assert level.check.gap == pytest.approx(0.5 - expected)
    text = compare.table([level])
    assert f"| c32 | {expected:.2f} | 0.50 | 3 | – |" in text


def test_the_column_is_found_by_its_name_whatever_the_unit(tmp_path: Path) -> None:
    compare = _script()
    path = tmp_path / "smi.csv"
    path.write_text(SMI)
    assert compare.smi_column(path, "utilization.memory") == [40.0, 50.0, 60.0]
    assert compare.smi_column(path, "power.draw") == [610.2, 640.1, 655.0]
