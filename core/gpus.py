"""Peak memory bandwidth of one GPU, from vendor datasheets, by the names people and
nvidia-smi / rocm-smi give (`--gpu`, a lab plan's `peak_bandwidth`)."""

from __future__ import annotations

import re

#: Peak memory bandwidth, bytes/s, from vendor datasheets.
GPU_MEMORY_BANDWIDTH: dict[str, float] = {
    "T4": 320e9,
    "L4": 300e9,
    "A10": 600e9,
    "A10G": 600e9,
    "L40": 864e9,
    "L40S": 864e9,
    "RTX4090": 1008e9,
    "RTX6000ADA": 960e9,
    "A6000": 768e9,
    "V100": 900e9,
    "A100-40GB": 1555e9,
    "A100-80GB": 2039e9,
    "A100-80GB-PCIE": 1935e9,
    "H100-PCIE": 2.0e12,
    "H100-SXM": 3.35e12,
    "H100-NVL": 3.9e12,
    "H200": 4.8e12,
    "GH200": 4.0e12,
    "B200": 8.0e12,
    "MI250X": 3.2e12,
    "MI300X": 5.3e12,
    "MI325X": 6.0e12,
}


# Other spellings, including what nvidia-smi / rocm-smi print, by their normalized form.
_GPU_ALIASES = {
    "A100": "A100-40GB",
    "A10080G": "A100-80GB",
    "A100SXM440GB": "A100-40GB",
    "A100SXM480GB": "A100-80GB",
    "A100PCIE40GB": "A100-40GB",
    "A100PCIE80GB": "A100-80GB",
    "H100": "H100-SXM",
    "H10080GBHBM3": "H100-SXM",
    "H100SXM580GB": "H100-SXM",
    "RTX6000ADAGENERATION": "RTX6000ADA",
    "RTXA6000": "A6000",
    "TESLAT4": "T4",
    "TESLAV100SXM216GB": "V100",
    "TESLAV100SXM232GB": "V100",
}


def _normalize(name: str) -> str:
    """Upper case, vendor prefix and punctuation gone: "NVIDIA A100 80GB" -> "A10080GB"."""
    key = re.sub(r"[^A-Z0-9]", "", name.upper())
    for prefix in ("NVIDIA", "AMD", "INSTINCT", "GEFORCE"):
        key = key.removeprefix(prefix)
    return key


def _datasheet_name(name: str) -> str:
    """The table's name of a GPU by any of its spellings ("" when unknown)."""
    table = {_normalize(k): k for k in GPU_MEMORY_BANDWIDTH}
    key = _normalize(name)
    return table.get(key) or _GPU_ALIASES.get(key, "")


def gpu_model_keys(name: str) -> tuple[str, ...]:
    """The keys a GPU model is known by (a price by model, core/prices.py): its spelling
    normalized and, where the datasheet table knows it, the table's name normalized
    ("NVIDIA H100 80GB HBM3" and "H100" both reach "H100SXM")."""
    keys = [_normalize(name)]
    known = _datasheet_name(name)
    if known and _normalize(known) not in keys:
        keys.append(_normalize(known))
    return tuple(k for k in keys if k)


def gpu_bandwidth(name: str) -> float:
    key = _datasheet_name(name)
    if key not in GPU_MEMORY_BANDWIDTH:
        known = ", ".join(sorted(GPU_MEMORY_BANDWIDTH))
        raise ValueError(f"unknown GPU {name!r}; known: {known} (or give --gpu-memory-bandwidth)")
    return GPU_MEMORY_BANDWIDTH[key]
