"""The remote-write encoding the engine comparisons write their samples with, against bytes
worked out by hand from prompb/remote.proto and snappy's format description."""

from __future__ import annotations

import math
import struct

from tests.remote_write import STALE_NAN, snappy_block, write_request


def test_one_sample_is_encoded_as_the_protocol_lays_it_out() -> None:
    label = b"\x0a\x08__name__" + b"\x12\x02up"  # Label{name: 1, value: 2}
    sample = b"\x09" + struct.pack("<d", 1.0) + b"\x10\xe8\x07"  # value 1.0, timestamp 1000 ms
    series = b"\x0a" + bytes([len(label)]) + label + b"\x12" + bytes([len(sample)]) + sample
    expected = b"\x0a" + bytes([len(series)]) + series
    assert write_request([({"__name__": "up"}, [(1.0, 1.0)])]) == expected


def test_labels_are_sorted_by_name_and_a_stale_marker_keeps_its_bits() -> None:
    body = write_request([({"job": "vllm", "__name__": "up"}, [(0.0, STALE_NAN)])])
    assert body.index(b"__name__") < body.index(b"job")
    assert struct.pack("<Q", 0x7FF0000000000002) in body
    assert math.isnan(STALE_NAN)


def test_snappy_block_is_the_length_then_literals() -> None:
    assert snappy_block(b"abc") == b"\x03" + bytes([2 << 2]) + b"abc"
    long = bytes(300)
    # 300 as a varint (0xac 0x02), then a literal whose length - 1 (299) takes 2 bytes.
    assert snappy_block(long) == b"\xac\x02" + bytes([61 << 2]) + struct.pack("<H", 299) + long
    many = bytes(70000)  # two literals: 65,536 and 4,464 bytes
    block = snappy_block(many)
    assert block.count(bytes([61 << 2]) + struct.pack("<H", 65535)) == 1
    assert len(block) == 3 + 3 + 65536 + 3 + 4464
