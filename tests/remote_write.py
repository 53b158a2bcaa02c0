"""Prometheus' remote write, for writing the same samples into Prometheus and VictoriaMetrics.

Samples written this way are exactly what a scraper would have sent — stale markers
included, which neither promtool's series nor a text import can carry — so two stores
hold identical data and any difference in what they answer is their query engines'.

The body is the protocol's `WriteRequest` (prompb/remote.proto: `timeseries` = 1; a
`TimeSeries` has `labels` = 1, `samples` = 2; a `Label` `name` = 1, `value` = 2; a
`Sample` `value` = 1 as a double, `timestamp` = 2 in milliseconds), encoded by hand
(a few fields need no protobuf compiler), then snappy's block format with the whole body
as literals: valid snappy that any decoder reads, uncompressed (loopback needs no
compression).
"""

from __future__ import annotations

import struct
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import httpx
import yaml
from vllm_glassbox.lab.backends.prometheus_process import PrometheusProcess

# Prometheus' stale marker: a NaN with this exact bit pattern (pkg/value/value.go).
STALE_NAN: float = struct.unpack("<d", struct.pack("<Q", 0x7FF0000000000002))[0]

Sample = tuple[float, float]  # (unix seconds, value)
Series = tuple[Mapping[str, str], Sequence[Sample]]  # (labels with __name__, samples)


def _varint(n: int) -> bytes:
    out = bytearray()
    n &= 2**64 - 1  # int64 as protobuf writes it: two's complement, ten bytes when negative
    while True:
        low, n = n & 0x7F, n >> 7
        out.append(low | (0x80 if n else 0))
        if not n:
            return bytes(out)


def _length_delimited(field: int, payload: bytes) -> bytes:
    return _varint(field << 3 | 2) + _varint(len(payload)) + payload


def _sample(seconds: float, value: float) -> bytes:
    millis = round(seconds * 1000)
    return b"\x09" + struct.pack("<d", value) + b"\x10" + _varint(millis)  # fields 1, 2


def write_request(series: Iterable[Series]) -> bytes:
    """The protobuf `WriteRequest` of `series`, labels sorted by name as the protocol asks."""
    body = bytearray()
    for labels, samples in series:
        encoded = b"".join(
            _length_delimited(
                1, _length_delimited(1, k.encode()) + _length_delimited(2, v.encode())
            )
            for k, v in sorted(labels.items())
        )
        encoded += b"".join(_length_delimited(2, _sample(t, v)) for t, v in samples)
        body += _length_delimited(1, encoded)
    return bytes(body)


def snappy_block(data: bytes) -> bytes:
    """`data` in snappy's block format, as literals of at most 64 KiB each."""
    out = bytearray(_varint(len(data)))
    for start in range(0, len(data), 65536):
        chunk = data[start : start + 65536]
        n = len(chunk) - 1
        if n < 60:
            out.append(n << 2)
        elif n < 256:
            out += bytes([60 << 2, n])
        else:
            out += bytes([61 << 2]) + struct.pack("<H", n)
        out += chunk
    return bytes(out)


def write(url: str, series: Iterable[Series], batch: int = 2000) -> None:
    """POST `series` to a remote-write endpoint (`.../api/v1/write`), `batch` series a
    request; an HTTP error raises."""
    pending = list(series)
    with httpx.Client(timeout=60, trust_env=False) as client:
        for start in range(0, len(pending), batch):
            r = client.post(
                url,
                content=snappy_block(write_request(pending[start : start + batch])),
                headers={
                    "Content-Encoding": "snappy",
                    "Content-Type": "application/x-protobuf",
                    "X-Prometheus-Remote-Write-Version": "0.1.0",
                },
            )
            r.raise_for_status()


# The flags a Prometheus needs for history_then_scrapes.
RECEIVING = ("--web.enable-remote-write-receiver", "--web.enable-lifecycle")


def history_then_scrapes(
    prometheus: PrometheusProcess, history: Iterable[Series], scrape_configs: list[Any]
) -> None:
    """`history` written into a running Prometheus that scrapes nothing yet (started with
    RECEIVING), then `scrape_configs` loaded (its configuration rewritten and reloaded):
    its own scrapes continue the history. The other way round its first scrapes could
    come first, and Prometheus refuses older samples of a series than it holds."""
    write(prometheus.url + "/api/v1/write", history)
    prometheus.config["scrape_configs"] = scrape_configs
    prometheus.config_path.write_text(yaml.safe_dump(prometheus.config))
    httpx.post(prometheus.url + "/-/reload", timeout=60, trust_env=False).raise_for_status()
