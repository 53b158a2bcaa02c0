"""The price of one GPU hour, as people give it (`--gpu-hour-price`, the chart's
`cost.gpuHourPrice`): one price for every GPU, or one per GPU model and per node pool.

    3.5                       every GPU hour costs 3.5
    3.5/h, 3.5/hour           the same, the unit said
    H200=3.5,A100=1.8         by GPU model (the names of --gpu, core/gpus.py)
    pool:gpu-large=4.1,L4=0.7 by node pool (--node-pool), and by model

Prices have no currency: the cost series are in the unit the price is in. A price that is
negative, no number, or a rate per another unit than the hour (`3.5/min`, `per_second`) is
refused with a message naming the value; so is a map without a price for the GPU model or
node pool the server runs on.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass

from vllm_glassbox.core.gpus import gpu_model_keys

POOL_PREFIX = "pool:"

# A rate's unit after the number: "/h", " per hour", "_per_hour", "/gpu-hour" …
_UNIT = re.compile(r"^\s*(?:/|per[\s_-]*)\s*(?:gpu[\s_-]*)?(?P<unit>[a-z]+)\s*$", re.IGNORECASE)
_HOUR = {"h", "hr", "hrs", "hour", "hours"}
_OTHER_UNITS = {
    "s": "second",
    "sec": "second",
    "second": "second",
    "seconds": "second",
    "m": "minute",
    "min": "minute",
    "mins": "minute",
    "minute": "minute",
    "minutes": "minute",
    "d": "day",
    "day": "day",
    "days": "day",
    "month": "month",
    "mo": "month",
    "year": "year",
    "y": "year",
}
_NUMBER = re.compile(r"^\s*(?P<number>[+-]?(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?)(?P<rest>.*)$")


@dataclass(frozen=True)
class GpuHourPrices:
    """Prices of one GPU hour: one for every GPU (`every`), or by GPU model (keys
    normalized, `core/gpus.py`) and by node pool."""

    every: float | None = None
    by_gpu: Mapping[str, float] | None = None
    by_pool: Mapping[str, float] | None = None
    text: str = ""  # as given, for messages

    def for_server(self, gpu: str | None, pool: str | None) -> float:
        """The price of one GPU hour of a server on GPU model `gpu` in node pool `pool`:
        the pool's price first, then the model's, then the one price."""
        if pool is not None and self.by_pool and pool in self.by_pool:
            return self.by_pool[pool]
        by_gpu = self.by_gpu or {}
        for key in gpu_model_keys(gpu) if gpu is not None else ():
            if key in by_gpu:
                return by_gpu[key]
        if self.every is not None:
            return self.every
        wanted = []
        if pool is not None:
            wanted.append(f"node pool {pool!r}")
        if gpu is not None:
            wanted.append(f"GPU model {gpu!r}")
        if not wanted:
            raise ValueError(
                f"{self.text!r} prices GPU models or node pools: say which this server runs "
                "on (--gpu, --node-pool)"
            )
        raise ValueError(f"{self.text!r} has no price for {' or '.join(wanted)}")


def parse_rate(text: str) -> float:
    """One price of a GPU hour: a number, optionally with its unit (`/h`, `per hour`);
    refused when negative, not a number, or per another unit than the hour."""
    m = _NUMBER.match(text)
    unit_only = _UNIT.match(text.replace("_", " ", 1)) if m is None else None
    if unit_only is not None and unit_only["unit"].lower() in _OTHER_UNITS:
        per = _OTHER_UNITS[unit_only["unit"].lower()]
        raise ValueError(f"{text!r} is a rate per {per}: give the price of one GPU hour")
    if m is None:
        raise ValueError(f"{text!r} is not a price (a number, e.g. 3.5 or 3.5/h)")
    rest = m["rest"].strip()
    if rest:
        unit = _UNIT.match(rest)
        name = unit["unit"].lower() if unit else None
        if name in _OTHER_UNITS:
            raise ValueError(
                f"{text!r} is a price per {_OTHER_UNITS[name]}: give the price of one GPU hour"
            )
        if name not in _HOUR:
            raise ValueError(f"{text!r} is not a price of one GPU hour (e.g. 3.5 or 3.5/h)")
    value = float(m["number"])
    if not math.isfinite(value):
        raise ValueError(f"{text!r} is not a finite price")
    if value < 0:
        raise ValueError(f"{text!r} is negative: a GPU hour costs 0 or more")
    return value


def parse_gpu_hour_prices(text: str | float | int) -> GpuHourPrices:
    """`3.5`, or `H200=3.5,A100=1.8,pool:spot=1.1`; every problem refused, naming the value."""
    if isinstance(text, bool):
        raise ValueError(f"{text!r} is not a price")
    if isinstance(text, int | float):
        return GpuHourPrices(every=parse_rate(repr(float(text))), text=str(text))
    spec = text.strip()
    if not spec:
        raise ValueError("an empty price: give the price of one GPU hour, e.g. 3.5")
    if "=" not in spec:
        return GpuHourPrices(every=parse_rate(spec), text=spec)
    by_gpu: dict[str, float] = {}  # as spelled
    by_datasheet: dict[str, float] = {}  # by the datasheet table's name of that spelling
    by_pool: dict[str, float] = {}
    for item in spec.split(","):
        name, sep, price = item.partition("=")
        name = name.strip()
        if not sep or not name:
            raise ValueError(f"{item.strip()!r} in {spec!r} is not NAME=PRICE")
        try:
            value = parse_rate(price)
        except ValueError as e:
            raise ValueError(f"{name}: {e}") from None
        if name.lower().startswith(POOL_PREFIX):
            pool = name[len(POOL_PREFIX) :].strip()
            if not pool or pool in by_pool:
                raise ValueError(f"{name!r} in {spec!r}: a node pool named once")
            by_pool[pool] = value
        else:
            keys = gpu_model_keys(name)
            if not keys or keys[0] in by_gpu:
                raise ValueError(f"{name!r} in {spec!r}: a GPU model named once")
            by_gpu[keys[0]] = value
            by_datasheet.update(dict.fromkeys(keys[1:], value))
    # A model's own spelling wins over another spelling's datasheet name.
    by_gpu = {**by_datasheet, **by_gpu}
    return GpuHourPrices(by_gpu=by_gpu or None, by_pool=by_pool or None, text=spec)
