"""A page is read only when it is whole: its end proven by HTTP, its engines complete.

A vLLM page cut at a line boundary is valid exposition text, so nothing in the text
itself says it is short; read as whole, a data-parallel page cut between the engines'
`vllm:cache_config_info` lines doubled engine 0's KV pool. Two guards, each tested here:

- the fetch (a real loopback server serving a captured page): a body read until the
  connection closed, with no `Content-Length`, chunked encoding, gzip trailer or `# EOF`
  to prove its end, is refused as `truncated`; a `Content-Length` or chunked body cut
  short is refused by httpx (`connect`); a framed page is read;
- the page's content (pure, no HTTP): data-parallel pages cut at every line boundary
  are either refused or publish only values equal to the whole page's.
"""

from __future__ import annotations

import gzip
import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families
from vllm_glassbox.core.errors import ScrapeError
from vllm_glassbox.core.fetch import Fetcher
from vllm_glassbox.core.snapshot import WANTED_SAMPLES, read_snapshot
from vllm_glassbox.exporter.service import ExporterConfig, Poller, make_registry

from tests.exporter.test_exposition_golden import Clock
from tests.fixtures import page
from tests.misbehaving import Behaviour, Misbehaving

DP2_CAPTURED = "cpu-0.32/dp2-after-2x64.txt"  # the real vLLM CPU build, two engines
WEIGHTS = 6955520.0  # the captured tiny model's bytes
PEAK_BANDWIDTH = 20e9


def _lines(text: str) -> list[str]:
    return text.splitlines(keepends=True)


def _cut_before(text: str, prefix: str, nth: int = 0) -> str:
    """`text` up to (not including) the `nth` line starting with `prefix`: a cut at a
    line boundary, so the rest is valid exposition text."""
    lines = _lines(text)
    at = [i for i, line in enumerate(lines) if line.startswith(prefix)][nth]
    return "".join(lines[:at])


# The worst cut of the captured page: between the two engines' cache_config_info lines.
ENGINE_1_CACHE = "vllm:cache_config_info{"


# --- the fetch: what proves a page's end ------------------------------------------------


def _answer(h: Any, raw: bytes, headers: list[tuple[str, str]]) -> None:
    h.send_response(200)
    h.send_header("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
    for name, value in headers:
        h.send_header(name, value)
    h.send_header("Connection", "close")
    h.end_headers()
    h.wfile.write(raw)


def _serving(text: str, frame: Callable[[Any, bytes], None], version: str = "0.32.0") -> Behaviour:
    """`text` at every path but /version (which answers with a Content-Length), framed
    by `frame`."""

    def run(h: Any) -> None:
        if h.path.startswith("/version"):
            raw = json.dumps({"version": version}).encode()
            _answer(h, raw, [("Content-Length", str(len(raw)))])
        else:
            frame(h, text.encode())

    return run


def with_length(h: Any, raw: bytes) -> None:
    _answer(h, raw, [("Content-Length", str(len(raw)))])


def close_delimited(h: Any, raw: bytes) -> None:
    """No Content-Length, no chunked encoding: the body is whatever came before the close."""
    _answer(h, raw, [])


def close_delimited_gzip(h: Any, raw: bytes) -> None:
    _answer(h, gzip.compress(raw), [("Content-Encoding", "gzip")])


def chunked(terminated: bool) -> Callable[[Any, bytes], None]:
    """Chunks of 4 KiB; `terminated` False stops before the `0` chunk (a cut at a chunk
    boundary, which is also a line boundary of the page here)."""

    def frame(h: Any, raw: bytes) -> None:
        lines = _lines(raw.decode())
        pieces, piece = [], ""
        for line in lines:  # chunks end at line boundaries: the cut is one too
            piece += line
            if len(piece) >= 4096:
                pieces.append(piece.encode())
                piece = ""
        if piece:
            pieces.append(piece.encode())
        body = b"".join(b"%x\r\n%s\r\n" % (len(p), p) for p in pieces)
        _answer(h, body + (b"0\r\n\r\n" if terminated else b""), [("Transfer-Encoding", "chunked")])

    return frame


def _fetch(target: Misbehaving) -> str:
    fetcher = Fetcher(target.url, 30.0)
    try:
        return fetcher.get_text("/metrics")
    finally:
        fetcher.close()


def _fetch_error(target: Misbehaving) -> ScrapeError:
    with pytest.raises(ScrapeError) as caught:
        _fetch(target)
    return caught.value


@pytest.fixture
def target() -> Iterator[Misbehaving]:
    with Misbehaving() as t:
        yield t


@pytest.mark.slow
def test_a_page_with_a_content_length_is_read_whole(target: Misbehaving) -> None:
    whole = page(DP2_CAPTURED)
    target.behave(_serving(whole, with_length))
    assert _fetch(target) == whole


@pytest.mark.slow
def test_a_chunked_page_with_its_terminator_is_read_whole(target: Misbehaving) -> None:
    whole = page(DP2_CAPTURED)
    target.behave(_serving(whole, chunked(terminated=True)))
    assert _fetch(target) == whole


@pytest.mark.slow
def test_a_chunked_page_cut_before_its_terminator_is_refused_by_httpx(
    target: Misbehaving,
) -> None:
    target.behave(_serving(page(DP2_CAPTURED), chunked(terminated=False)))
    error = _fetch_error(target)
    assert error.reason == "connect"
    assert "incomplete chunked read" in str(error)


@pytest.mark.slow
def test_a_close_delimited_page_is_refused_even_whole_as_its_end_is_unproven(
    target: Misbehaving,
) -> None:
    target.behave(_serving(page(DP2_CAPTURED), close_delimited))
    error = _fetch_error(target)
    assert error.reason == "truncated"
    assert "no Content-Length, chunked encoding or `# EOF`" in str(error)


@pytest.mark.slow
def test_a_close_delimited_page_ending_in_openmetrics_eof_is_read(target: Misbehaving) -> None:
    text = page(DP2_CAPTURED) + "# EOF\n"
    target.behave(_serving(text, close_delimited))
    assert _fetch(target) == text


@pytest.mark.slow
def test_a_close_delimited_gzip_page_is_proven_whole_by_its_trailer(target: Misbehaving) -> None:
    whole = page(DP2_CAPTURED)
    target.behave(_serving(whole, close_delimited_gzip))
    assert _fetch(target) == whole


# --- the poll: a refused page is data ----------------------------------------------------


def _scrape(poller: Poller) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    text = generate_latest(make_registry(poller)).decode()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def _value(
    scrape: dict[tuple[str, tuple[tuple[str, str], ...]], float], name: str, **labels: str
) -> float | None:
    return scrape.get((name, tuple(sorted(labels.items()))))


def _engine_series(scrape: dict[tuple[str, tuple[tuple[str, str], ...]], float]) -> set[str]:
    return {name for name, labels in scrape if "engine" in dict(labels)}


@pytest.mark.slow
def test_a_page_cut_between_the_engines_on_a_close_delimited_answer_fails_the_poll(
    target: Misbehaving,
) -> None:
    whole = page(DP2_CAPTURED)
    cut = _cut_before(whole, ENGINE_1_CACHE, nth=1)
    assert cut.endswith("\n") and read_snapshot(whole).cache  # a cut at a line boundary
    poller = Poller(ExporterConfig(target=target.url, timeout_seconds=30.0))
    try:
        target.behave(_serving(whole, with_length))
        assert poller.poll_once()
        up = _scrape(poller)
        engine_0 = {"model_name": "tiny", "engine": "0"}
        assert _value(up, "glassbox_kv_cache_blocks", **engine_0) == 128.0
        assert _value(up, "glassbox_kv_cache_capacity_tokens", **engine_0) == 16384.0

        target.behave(_serving(cut, close_delimited))
        assert not poller.poll_once()
        down = _scrape(poller)
    finally:
        poller.fetcher.close()
    assert poller.failing is not None and poller.failing.startswith("truncated: /metrics")
    assert _value(down, "glassbox_target_up") == 0.0
    assert _value(down, "glassbox_scrape_errors_total", reason="truncated") == 1.0
    others = {
        labels: v
        for (name, labels), v in down.items()
        if name == "glassbox_scrape_errors_total" and dict(labels)["reason"] != "truncated"
    }
    assert set(others.values()) == {0.0}
    assert _engine_series(down) == set(), "vLLM-derived series published from a cut page"
    assert _value(down, "glassbox_vllm_info", version="0.32.0") is None


@pytest.mark.slow
def test_the_same_cut_page_is_refused_by_its_content_even_with_an_honest_length(
    target: Misbehaving,
) -> None:
    """A proxy that cut the page and then framed what it had: the engines disagree."""
    cut = _cut_before(page(DP2_CAPTURED), ENGINE_1_CACHE, nth=1)
    poller = Poller(ExporterConfig(target=target.url, timeout_seconds=30.0))
    try:
        target.behave(_serving(cut, with_length))
        assert not poller.poll_once()
        down = _scrape(poller)
    finally:
        poller.fetcher.close()
    assert poller.failing is not None
    assert "engine '1' lacks cache_config_info that another engine has" in poller.failing
    assert _value(down, "glassbox_target_up") == 0.0
    assert _value(down, "glassbox_scrape_errors_total", reason="truncated") == 1.0
    assert _engine_series(down) == set()


# --- the page's content: data-parallel pages cut at every line boundary ---------------


class OnePage(Fetcher):
    """Serves `current` at every path but /version (the filtered page and the whole)."""

    def __init__(self) -> None:
        self.current = ""

    def get_text(self, path: str, timeout_seconds: float | None = None) -> str:
        if path == "/version":
            raise ScrapeError("http_status", "/version: HTTP 404")
        return self.current

    def close(self) -> None:
        pass


Published = dict[tuple[str, tuple[tuple[str, str], ...]], float]
# Self-observation that differs by design between a refused poll and a read one.
VOLATILE = {
    "glassbox_scrape_errors_total",
    "glassbox_last_scrape_success_timestamp_seconds",
    "glassbox_target_up",
    "glassbox_finding_info",  # a refused poll is a finding: glassbox cannot read vLLM
}


def _published(poller: Poller) -> Published:
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in poller.published
        for s in family.samples
        if s.name not in VOLATILE
    }


def _run(pages: list[str], seconds_apart: float = 20.0) -> list[tuple[bool, Published]]:
    """Poll the pages in order: whether each poll read its page, and what it published."""
    clock = Clock()
    config = ExporterConfig(
        target="http://vllm.invalid:8000",
        weights_bytes=WEIGHTS,
        peak_bandwidth=PEAK_BANDWIDTH,
    )
    fetcher = OnePage()
    poller = Poller(config, fetcher=fetcher, clock=clock)
    out = []
    for text in pages:
        fetcher.current = text
        out.append((poller.poll_once(), _published(poller)))
        clock.now += seconds_apart
    return out


@dataclass(frozen=True)
class Pair:
    name: str
    before: str
    after: str
    model_name: str
    engine_0_blocks: float  # the whole page's
    engine_0_capacity_tokens: float


PAIRS = [
    # Synthesized in v0.11.0's format: num_gpu_blocks summed over the engines (7168),
    # no kv_cache_size_tokens, so the pool is num_gpu_blocks / engines × block_size.
    Pair(
        "v0.11.0-dp2",
        "v0.11.0-dp2/before.txt",
        "v0.11.0-dp2/after.txt",
        "Qwen/Qwen2.5-7B-Instruct-AWQ",
        3584.0,
        57344.0,
    ),
    # Captured: the vLLM CPU build 0.32, and the CUDA build 0.24 on two H200s.
    Pair(
        "cpu-0.32-dp2", "cpu-0.32/dp2-idle.txt", "cpu-0.32/dp2-after-2x64.txt", "tiny", 128, 16384
    ),
    Pair(
        "cuda-0.24.0-h200x2-dp2",
        "cuda-0.24.0-h200x2/dp2-idle.txt",
        "cuda-0.24.0-h200x2/dp2-after-4x128.txt",
        "q",
        3625.0,
        58000.0,
    ),
]


def _differences(got: Published, whole: Published) -> dict[str, tuple[float, float | None]]:
    """Every published value that is not the whole page's (absent there, or another)."""
    return {
        f"{name}{dict(labels)}": (value, whole.get((name, labels)))
        for (name, labels), value in got.items()
        if whole.get((name, labels)) != value
    }


@pytest.mark.parametrize("pair", PAIRS, ids=[p.name for p in PAIRS])
def test_a_dp_page_cut_at_any_line_publishes_the_whole_pages_values_or_none(pair: Pair) -> None:
    """Before (whole), after cut at every line boundary, then after whole again: each
    poll either fails or publishes only values equal to those of the same polls of the
    whole pages; the KV pool of engine 0 never doubles, tokens per forward pass never
    falls below 1, and the whole page after a cut one shows no spike."""
    before, after = page(pair.before), page(pair.after)
    whole = _run([before, after, after])
    assert all(read for read, _ in whole)
    engine_0 = (("engine", "0"), ("model_name", pair.model_name))
    pool = {
        ("glassbox_kv_cache_blocks", engine_0): pair.engine_0_blocks,
        ("glassbox_kv_cache_capacity_tokens", engine_0): pair.engine_0_capacity_tokens,
    }
    assert {key: whole[1][1][key] for key in pool} == pool
    assert _passes(whole[1][1]) and min(_passes(whole[1][1])) >= 1.0

    lines = _lines(after)
    last_read = max(i for i, line in enumerate(lines) if _is_read(line))
    for cut in range(len(lines)):  # every line boundary short of the whole page
        polls = _run([before, "".join(lines[:cut]), after])
        for (_, got), (_, want) in zip(polls[1:], whole[1:], strict=True):
            assert _differences(got, want) == {}, f"cut before line {cut + 1}"
            # Spelled out, though implied: never a doubled pool, never below 1 token a pass.
            assert all(got.get(key, value) == value for key, value in pool.items())
            assert all(v >= 1.0 for v in _passes(got))
        # Refused exactly when the cut takes a line the exporter reads.
        assert polls[1][0] == (cut > last_read), f"cut before line {cut + 1}"
        assert polls[2][0], f"the whole page after the cut before line {cut + 1} was refused"


def _is_read(line: str) -> bool:
    """A sample line of a name the exporter reads."""
    name = line.split("{", 1)[0].split(" ", 1)[0]
    return not line.startswith("#") and name in WANTED_SAMPLES


def _passes(published: Published) -> list[float]:
    return [v for (n, _), v in published.items() if n == "glassbox_tokens_per_forward_pass"]


def test_a_cut_dp_page_at_the_first_poll_never_gives_engine_0_both_pools() -> None:
    """No history to compare with: the engines' agreement alone keeps the pool right."""
    after = page("v0.11.0-dp2/after.txt")
    lines = _lines(after)
    for cut in range(len(lines)):
        try:
            snapshot = read_snapshot("".join(lines[:cut]))
        except ScrapeError as e:
            assert e.reason in ("truncated", "no_vllm_metrics"), (cut, e)
            continue
        for engine, cache in snapshot.cache.items():
            assert cache.engines == 2, f"cut before line {cut + 1}: engine {engine} alone"
            assert cache.num_gpu_blocks_total == 7168
