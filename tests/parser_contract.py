"""What the page parser and the log parser promise for ANY input: the fuzzers' oracle.

`scripts/fuzz_parsers.py` feeds these two functions with inputs atheris mutates from the
captured pages and logs; `tests/core/test_parser_contract.py` replays the inputs it kept. A
violation is an `AssertionError` (or any exception other than the ones allowed here).

- The page parser (`read_snapshot`, the path a poll takes after the fetch) either returns
  a Snapshot whose numbers are all finite, or raises `ScrapeError` whose reason is one of
  ERROR_REASONS and whose message is a short line (it goes into a log line); by every
  content type a page can come with (`CONTENT_TYPES`: none, text 0.0.4, OpenMetrics 1.0
  and 2.0), so both grammars are fuzzed with every input. Where it reads the page and
  prometheus_client's parser of that grammar reads it too, the samples are the same.
- The log parser (`read_facts`, and `StartupFacts.feed` line by line as the follower
  does) never raises, whatever the log holds, and every fact it returns is a usable
  number: finite, not negative.

Both call only the public functions, so whatever is added behind them is covered too.
"""

from __future__ import annotations

import dataclasses
import math

from vllm_glassbox.core.cold_start import read_cold_starts
from vllm_glassbox.core.derive import (
    kv_cache_blocks,
    kv_cache_capacity_tokens,
    startup_stages,
    weights_from_log,
)
from vllm_glassbox.core.errors import ERROR_REASONS, ScrapeError
from vllm_glassbox.core.snapshot import WANTED_SAMPLES, Snapshot, read_snapshot
from vllm_glassbox.core.startup_log import StartupFacts, read_facts
from vllm_glassbox.core.textformat import OPENMETRICS, TEXT, Limits, Samples, read_page

# Small limits, so that the fuzzer reaches the cardinality checks with small inputs.
PAGE_LIMITS = Limits(max_series_per_metric=8, max_label_value_length=64)
MAX_MESSAGE = 400
CONTENT_TYPES = (
    None,
    "text/plain; version=0.0.4; charset=utf-8",
    "application/openmetrics-text; version=1.0.0; charset=utf-8",
    "application/openmetrics-text; version=2.0.0; charset=utf-8",
)


def check_page_every_way(data: bytes) -> Snapshot | ScrapeError | None:
    """`check_page` under every content type; the outcome of the page without one."""
    outcomes = [check_page(data, content_type) for content_type in CONTENT_TYPES]
    return outcomes[0]


def check_page(data: bytes, content_type: str | None = None) -> Snapshot | ScrapeError | None:
    """Run one page through the parser; None when the bytes are not UTF-8 (the fetcher
    refuses those itself, as reason `decode`)."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        return None
    try:
        snapshot = read_snapshot(text, PAGE_LIMITS, content_type)
        _check_oracle(text, content_type)
    except ScrapeError as e:
        assert e.reason in ERROR_REASONS, e.reason
        message = str(e)
        assert message and "\n" not in message, repr(message)
        assert len(message) <= MAX_MESSAGE, f"{len(message)}-character message"
        return e
    for key, sample in snapshot.engines.items():
        for name, value in {**sample.counters, **sample.gauges}.items():
            assert math.isfinite(value), (key, name, value)
    if snapshot.process_start_time is not None:
        assert math.isfinite(snapshot.process_start_time)
    for cache in snapshot.cache.values():
        for value in (kv_cache_blocks(cache), cache.block_size, kv_cache_capacity_tokens(cache)):
            assert value is None or value >= 0, cache
    return snapshot


def _oracle(text: str, fmt: str) -> Samples | None:
    """The wanted samples as prometheus_client's parser of `fmt` reads them; None where it
    refuses the page (it is laxer than the grammars in places, stricter in others)."""
    from prometheus_client.openmetrics.parser import text_string_to_metric_families as om
    from prometheus_client.parser import text_string_to_metric_families as text_parser

    out: Samples = {}
    try:
        for family in (text_parser if fmt == TEXT else om)(text):
            for sample in family.samples:
                if sample.name in WANTED_SAMPLES and sample.value is not None:
                    labels = tuple(sorted(sample.labels.items()))
                    out.setdefault(sample.name, {})[labels] = float(sample.value)
    except Exception:  # any refusal of the oracle's: it does not apply here
        return None
    return out


def _check_oracle(text: str, content_type: str | None) -> None:
    """Where prometheus_client also reads a text or OpenMetrics 1.0 page, its samples are
    glassbox's."""
    page = read_page(text, WANTED_SAMPLES, PAGE_LIMITS, content_type)
    if page.format not in (TEXT, OPENMETRICS) or page.composite:
        return
    expected = _oracle(text, page.format)
    if expected is not None:
        assert page.samples == expected, (page.samples, expected)


def _assert_usable(facts: StartupFacts) -> None:
    for field in dataclasses.fields(facts):
        value = getattr(facts, field.name)
        values = value.values() if isinstance(value, dict) else [value]
        for v in values:
            if isinstance(v, int | float) and not isinstance(v, bool):
                assert math.isfinite(v) and v >= 0, (field.name, v)
    shards = (facts.tensor_parallel or 1) * (facts.pipeline_parallel or 1)
    weights = weights_from_log(facts.weights_by_engine(), shards)
    assert weights is None or (math.isfinite(weights) and weights >= 0), weights


def check_log(data: bytes) -> StartupFacts:
    """Run one log through the parsers, whole and line by line; they must never raise, and
    every start's stages are finite and not negative."""
    text = data.decode("utf-8", "replace")  # as LogFollower decodes
    whole = read_facts(text)
    _assert_usable(whole)
    for start in read_cold_starts(text):
        for stage, seconds in startup_stages(start).by_stage().items():
            assert math.isfinite(seconds) and seconds >= 0, (stage, seconds)
    facts = StartupFacts()
    for line in text.split("\n"):
        facts = facts.feed(line)
        _assert_usable(facts)
    return whole
