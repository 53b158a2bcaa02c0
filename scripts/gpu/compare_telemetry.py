"""nvidia-smi's memory utilization (and DCGM's DRAM activity, where captured) beside
glassbox's bandwidth figure, for each load `scripts/gpu/telemetry_sweep.py` captured.

    python3 scripts/gpu/compare_telemetry.py DIR --weights-bytes 15.2e9 --gpu H200 \
        [--tensor-parallel-size 1] [--out table.md]

glassbox's figure is the derivation core's `memory_bandwidth_utilization` over the
counters' increase from vllm-before.txt to vllm-after.txt (weights read per decode step
over one GPU's peak); nvidia-smi's `utilization.memory` is the share of time the memory
was read or written, averaged over the load's samples. Every number comes from
core/derive; this script only reads files and writes the table.
"""

from __future__ import annotations

import argparse
import csv
import json
from dataclasses import dataclass
from pathlib import Path

from vllm_glassbox.core import derive
from vllm_glassbox.core.gpus import gpu_bandwidth
from vllm_glassbox.core.snapshot import read_snapshot
from vllm_glassbox.core.textformat import parse_samples


@dataclass(frozen=True)
class Level:
    name: str
    weight_reads: float | None  # glassbox_memory_bandwidth_utilization_ratio
    smi_memory: float | None  # nvidia-smi utilization.memory, as a share
    smi_samples: int
    dram_active: float | None  # DCGM_FI_PROF_DRAM_ACTIVE, where captured
    check: derive.BandwidthCheck | None


def smi_column(path: Path, column: str) -> list[float]:
    """One column of nvidia-smi's CSV (`--format=csv`: a header, then "62 %"-style cells),
    as numbers; rows that cannot be read (a sample cut off at the end) left out."""
    with path.open(newline="") as f:
        rows = list(csv.reader(f, skipinitialspace=True))
    if not rows:
        return []
    header = [h.strip() for h in rows[0]]
    index = next(i for i, h in enumerate(header) if h.split(" [")[0] == column)
    values = []
    for row in rows[1:]:
        if len(row) != len(header) or row[0].startswith("timestamp"):
            continue
        try:
            values.append(float(row[index].strip().split()[0]))
        except (ValueError, IndexError):
            continue
    return values


def dcgm_dram_active(path: Path) -> float | None:
    if not path.exists():
        return None
    name = "DCGM_FI_PROF_DRAM_ACTIVE"
    values = list(parse_samples(path.read_text(), [name]).get(name, {}).values())
    return derive.mean_of(values)


def level_of(directory: Path, weights: float, peak: float, tensor: int) -> Level:
    meta = json.loads((directory / "meta.json").read_text())
    before = read_snapshot((directory / "vllm-before.txt").read_text())
    after = read_snapshot((directory / "vllm-after.txt").read_text())
    seconds = float(meta["after_at"]) - float(meta["before_at"])
    increases = derive.snapshot_increases(before, after, seconds)
    together = derive.engines_together(increases.values(), seconds)
    reads = derive.memory_bandwidth_utilization(together, weights, peak, tensor)
    memory = smi_column(directory / "nvidia-smi.csv", "utilization.memory")
    smi = derive.percent_as_ratio(derive.mean_of(memory))
    dram = dcgm_dram_active(directory / "dcgm.txt")
    check = derive.bandwidth_check(dram if dram is not None else smi, reads)
    return Level(directory.name, reads, smi, len(memory), dram, check)


def _share(value: float | None) -> str:
    return "–" if value is None else f"{value:.2f}"


def table(levels: list[Level]) -> str:
    lines = [
        "| load | glassbox weight reads / peak | nvidia-smi memory utilization | samples "
        "| DCGM DRAM active | gap | verdict |",
        "| --- | ---: | ---: | ---: | ---: | ---: | --- |",
    ]
    for level in levels:
        check = level.check
        gap = "–" if check is None else f"{check.gap:+.2f}"
        verdict = "–" if check is None else check.verdict.replace("_", " ")
        lines.append(
            f"| {level.name} | {_share(level.weight_reads)} | {_share(level.smi_memory)} "
            f"| {level.smi_samples} | {_share(level.dram_active)} | {gap} | {verdict} |"
        )
    return "\n".join(lines) + "\n"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("dir", help="telemetry_sweep.py's --out")
    p.add_argument("--weights-bytes", type=float, required=True)
    p.add_argument("--gpu", required=True, help="for the datasheet peak (e.g. H200)")
    p.add_argument("--tensor-parallel-size", type=int, default=1)
    p.add_argument("--out", help="write the table here (default: print it)")
    args = p.parse_args()
    peak = gpu_bandwidth(args.gpu)
    dirs = sorted(
        (d for d in Path(args.dir).iterdir() if (d / "meta.json").exists()),
        key=lambda d: int(d.name.lstrip("c")) if d.name.lstrip("c").isdigit() else 0,
    )
    text = table([level_of(d, args.weights_bytes, peak, args.tensor_parallel_size) for d in dirs])
    if args.out:
        Path(args.out).write_text(text)
    else:
        print(text, end="")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
