"""Inputs the fuzzers found interesting, replayed: the parsers keep their contract.

`scripts/fuzz.sh` fuzzes the page parser and the log parser against
tests/parser_contract.py (only clean, reasoned errors; only finite numbers out). Every
input it made fail, and the hand-made cases of the same kind, is kept under
tests/fixtures/fuzz/<target>/ and replayed here; the named tests below say what each
taught.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from vllm_glassbox.core.cold_start import latest_start
from vllm_glassbox.core.derive import (
    STARTUP_STAGES,
    kv_cache_blocks,
    kv_cache_capacity_tokens,
    startup_stages,
)
from vllm_glassbox.core.errors import ScrapeError
from vllm_glassbox.core.snapshot import EngineKey, Snapshot

from tests.fixtures import FIXTURES
from tests.parser_contract import MAX_MESSAGE, check_log, check_page, check_page_every_way

KEPT = FIXTURES / "fuzz"
PAGES = sorted((KEPT / "page").iterdir())
LOGS = sorted((KEPT / "log").iterdir())


@pytest.mark.parametrize("path", PAGES, ids=[p.name for p in PAGES])
def test_kept_page_is_read_or_refused_with_a_reason_in_every_grammar(path: Path) -> None:
    check_page_every_way(path.read_bytes())


@pytest.mark.parametrize("path", LOGS, ids=[p.name for p in LOGS])
def test_kept_log_is_read_without_an_error_and_with_finite_facts(path: Path) -> None:
    check_log(path.read_bytes())


FOUND_PAGES = [p for p in PAGES if p.name.startswith("found-")]
FOUND_LOGS = [p for p in LOGS if p.name.startswith("found-")]


@pytest.mark.parametrize("path", FOUND_PAGES, ids=[p.name for p in FOUND_PAGES])
def test_a_page_the_fuzzer_kept_keeps_its_outcome(path: Path) -> None:
    """The smallest input the fuzz run found for each outcome (read, or each reason it
    reached), named found-<outcome>-<sha1>: a change that reclassifies it shows here."""
    outcome = path.name.split("-", 1)[1].rsplit("-", 1)[0]
    result = check_page(path.read_bytes())
    got = "not-utf8" if result is None else "read" if isinstance(result, Snapshot) else None
    if isinstance(result, ScrapeError):
        got = result.reason
    assert got == outcome


@pytest.mark.parametrize("path", FOUND_LOGS, ids=[p.name for p in FOUND_LOGS])
def test_a_log_the_fuzzer_kept_still_gives_its_fact(path: Path) -> None:
    """The smallest input the fuzz run found that sets each startup fact, named
    found-<fact>-<sha1>: a field of the startup facts, or a stage of the latest start."""
    fact = path.name.split("-", 1)[1].rsplit("-", 1)[0]
    facts = check_log(path.read_bytes())
    if fact in STARTUP_STAGES:
        start = latest_start(path.read_bytes().decode("utf-8", "replace"))
        assert start is not None and fact in startup_stages(start).by_stage()
    else:
        assert getattr(facts, fact) not in (None, {}, 0)


def test_a_duplicate_series_is_named_in_a_bounded_message() -> None:
    # Found by the page fuzzer: the message printed the whole label set, so a page with
    # long labels put kilobytes into one log line at every failing poll.
    refused = check_page((KEPT / "page" / "duplicate-series-with-many-labels.txt").read_bytes())
    assert isinstance(refused, ScrapeError) and refused.reason == "duplicate_series"
    assert "vllm:num_requests_running{" in str(refused)
    assert len(str(refused)) <= MAX_MESSAGE


def test_absurd_numbers_in_cache_config_labels_are_unknown_not_a_crash() -> None:
    # num_gpu_blocks="1e400" raised OverflowError out of the parser (a bug, not a reason);
    # a negative block size made a negative pool. Both are now unknown.
    snapshot = check_page((KEPT / "page" / "cache-config-absurd-numbers.txt").read_bytes())
    assert isinstance(snapshot, Snapshot)
    cache = snapshot.cache_for(EngineKey("m", "0"))
    assert cache is not None
    assert kv_cache_blocks(cache) is None and cache.block_size is None
    assert kv_cache_capacity_tokens(cache) is None
    assert cache.gpu_memory_utilization is None


def test_log_numbers_that_do_not_parse_are_no_facts() -> None:
    # "1.2.3 GiB" matched [0-9.]+ and float() raised ValueError out of the log follower,
    # which the poll did not expect: that poll published glassbox_target_up 0.
    facts = check_log((KEPT / "log" / "numbers-that-are-not-numbers.log").read_bytes())
    assert facts.weights_by_rank == {}
    assert facts.kv_cache_memory_bytes is None
    assert facts.max_concurrency is None


def test_log_numbers_of_thousands_of_digits_are_no_facts() -> None:
    # 5,000 digits: int() refuses more than 4,300 (ValueError); 400 digits: float() gives
    # inf, which would have been published as glassbox_kv_cache_memory_bytes +Inf.
    facts = check_log((KEPT / "log" / "numbers-with-thousands-of-digits.log").read_bytes())
    assert facts.kv_cache_tokens is None
    assert facts.kv_cache_memory_bytes is None
    assert facts.weights_by_rank == {}
    assert facts.vllm_version is not None and len(facts.vllm_version) <= 64
