"""Values as Grafana labels them: the units these dashboards use, and value mappings."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any


def _scaled(value: float, steps: Sequence[tuple[float, str]], unit_gap: str = " ") -> str:
    """value in the largest step it reaches, 3 significant digits."""
    magnitude = abs(value)
    factor, suffix = steps[0]
    for f, s in steps:
        if magnitude >= f:
            factor, suffix = f, s
    scaled = value / factor
    text = f"{scaled:.3g}" if abs(scaled) < 1000 else f"{scaled:.0f}"
    return f"{text}{unit_gap}{suffix}".rstrip()


_SI = [(1.0, ""), (1e3, "k"), (1e6, "M"), (1e9, "G"), (1e12, "T")]


def format_value(value: float, unit: str) -> str:
    """A value as Grafana would label it in `unit` (the units these dashboards use)."""
    if not math.isfinite(value):
        return str(value)
    if unit == "s":
        if value == 0:
            return "0 s"
        return _scaled(value, [(1e-9, "ns"), (1e-6, "µs"), (1e-3, "ms"), (1.0, "s")])
    if unit == "percentunit":
        return f"{value * 100:.3g}%"
    if unit == "bytes":
        return _scaled(
            value, [(1, "B"), (1024, "KiB"), (1024**2, "MiB"), (1024**3, "GiB"), (1024**4, "TiB")]
        )
    if unit == "Bps":
        return _scaled(
            value, [(1, "B/s"), (1e3, "kB/s"), (1e6, "MB/s"), (1e9, "GB/s"), (1e12, "TB/s")]
        )
    if abs(value) >= 1e5:
        short = _scaled(value, _SI, unit_gap="")
    elif abs(value) >= 1000 or value == int(value):
        short = f"{value:,.0f}"  # counts as counted: 4,096 tokens, not 4.1k
    else:
        short = f"{value:.3g}"
    if unit.startswith("suffix:"):
        return short + unit.removeprefix("suffix:")
    return short


def mapped(value: float, mappings: Sequence[dict[str, Any]]) -> str | None:
    """Text of a Grafana value mapping that matches `value` exactly, if any."""
    for mapping in mappings:
        if mapping.get("type") != "value":
            continue
        for key, target in mapping.get("options", {}).items():
            try:
                if float(key) == value:
                    return str(target.get("text", key))
            except ValueError:
                continue
    return None
