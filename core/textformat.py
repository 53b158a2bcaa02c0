"""Targeted, strict reading of Prometheus text exposition (format 0.0.4).

vLLM's page is mostly histogram buckets we never use. Rather than parse every line
(prometheus_client's parser does, in Python), we let the regex engine find the lines of
the sample names we want and validate those strictly; the rest of the page only has to
look like exposition text (a cheap whole-page shape check). Anything wrong raises
`ScrapeError` with a stable `reason`, which the exporter turns into
`glassbox_scrape_errors_total{reason}`.
"""

from __future__ import annotations

import functools
import itertools
import math
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

from vllm_glassbox.core.errors import ScrapeError

Labels = tuple[tuple[str, str], ...]
"""Label pairs sorted by name: hashable, so a series is (name, labels)."""


@dataclass(frozen=True)
class Limits:
    max_series_per_metric: int = 512
    max_label_value_length: int = 2048


DEFAULT_LIMITS = Limits()

Samples = dict[str, dict[Labels, float]]
"""sample name -> labels -> value."""

# The value is an unrolled loop, not (?:[^"\\]|\\.)*: that form costs the regex engine
# ~200 bytes of backtracking state per character (a 3 MB label value took 560 MiB).
_LABEL_PAIR = re.compile(
    r'\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*=\s*"([^"\\\n]*(?:\\.[^"\\\n]*)*)"\s*(,|$)'
)
_VALUE_PART = re.compile(r"\s+(\S+)(?:\s+-?[0-9]+)?\s*$")
# A line of exposition text starts with a comment, a metric name, or is empty.
# Line starts are found by the "\n" before them, which the regex engine finds with a fast
# literal scan; a MULTILINE "^" is tried at every character (five times slower).
_NOT_A_LINE = r"(?![#a-zA-Z_:]|\s*$)"
_BAD_FIRST_LINE = re.compile(_NOT_A_LINE, re.MULTILINE)
_BAD_NEXT_LINE = re.compile("\n" + _NOT_A_LINE, re.MULTILINE)
_ESCAPES = {"\\\\": "\\", '\\"': '"', "\\n": "\n"}


def _unescape(value: str) -> str:
    if "\\" not in value:
        return value
    return re.sub(r'\\[\\"n]', lambda m: _ESCAPES[m.group(0)], value)


#: A page's label sets are the same from one poll to the next: each is parsed once and
#: then looked up (a poll of an 8-engine page parses ~180 of them). Bounded in entries
#: and in the length of what is kept, so a page that changes every label costs memory
#: of at most about 4 MiB and the same time as without the cache. Keyed by the text and
#: the one limit that applies (an int: hashing a `Limits` ran Python code for each line).
_LABELS_CACHED = 2048
_LABELS_CACHED_LENGTH = 2048


def _parse_labels(text: str, max_value_length: int) -> Labels:
    if len(text) <= _LABELS_CACHED_LENGTH:
        return _parse_labels_cached(text, max_value_length)
    return _parse_labels_uncached(text, max_value_length)


@functools.lru_cache(maxsize=_LABELS_CACHED)
def _parse_labels_cached(text: str, max_value_length: int) -> Labels:
    return _parse_labels_uncached(text, max_value_length)


def _parse_labels_uncached(text: str, max_value_length: int) -> Labels:
    pairs: list[tuple[str, str]] = []
    pos = 0
    while pos < len(text):
        m = _LABEL_PAIR.match(text, pos)
        if m is None:
            raise ScrapeError("parse", f"malformed labels {text[:80]!r}")
        value = _unescape(m.group(2))
        if len(value) > max_value_length:
            raise ScrapeError(
                "cardinality",
                f"label {m.group(1)} has a {len(value)}-character value (limit {max_value_length})",
            )
        pairs.append((m.group(1), value))
        pos = m.end()
        if m.group(3) == "" and pos < len(text):
            raise ScrapeError("parse", f"malformed labels {text[:80]!r}")
    names = [k for k, _ in pairs]
    if len(set(names)) != len(names):
        raise ScrapeError("parse", f"repeated label name in {text[:80]!r}")
    return tuple(sorted(pairs))


def _parse_value(text: str) -> float:
    # Python's float() also takes digit separators ("1_000"); Prometheus does not.
    if "_" in text:
        raise ScrapeError("parse", f"value {text[:40]!r} is not a number")
    try:
        value = float(text)
    except ValueError:
        raise ScrapeError("parse", f"value {text[:40]!r} is not a number") from None
    if not math.isfinite(value):
        raise ScrapeError("invalid_value", f"value is {text}")
    return value


def _bad_line_start(text: str) -> int | None:
    """Offset of the first line that is not exposition text, if any."""
    if _BAD_FIRST_LINE.match(text):
        return 0
    m = _BAD_NEXT_LINE.search(text)
    return None if m is None else m.start() + 1


def _split_labels(rest: str) -> tuple[str, str]:
    """Split '{a="x",b="}"} 1' into ('a="x",b="}"', ' 1'), honouring quotes."""
    # Usual case, at C speed: no backslash before the first "}" that has an even number
    # of quotes before it (so it is outside them).
    close = rest.find("}")
    while close != -1:
        head = rest[1:close]
        if "\\" in head:
            break  # escapes: walk character by character below
        if head.count('"') % 2 == 0:
            return head, rest[close + 1 :]
        close = rest.find("}", close + 1)
    in_quotes = False
    escaped = False
    for i, ch in enumerate(rest):
        if escaped:
            escaped = False
        elif ch == "\\":
            escaped = True
        elif ch == '"':
            in_quotes = not in_quotes
        elif ch == "}" and not in_quotes:
            return rest[1:i], rest[i + 1 :]
    raise ScrapeError("parse", "unterminated label set")


def parse_samples(text: str, wanted: Iterable[str], limits: Limits = DEFAULT_LIMITS) -> Samples:
    """Return the samples of the `wanted` sample names found on the page.

    `wanted` holds exposed sample names (`vllm:generation_tokens_total`,
    `vllm:inter_token_latency_seconds_sum`, ...). Timestamps are dropped.
    """
    if text and not text.endswith("\n"):
        raise ScrapeError("parse", "page does not end with a newline (truncated?)")
    bad = _bad_line_start(text)
    if bad is not None:
        snippet = text[bad : bad + 40]
        raise ScrapeError("parse", f"not exposition text: {snippet!r}")

    names = tuple(sorted(set(wanted), key=len, reverse=True))
    if not names:
        return {}
    samples: Samples = {}
    max_value_length = limits.max_label_value_length
    for line in _wanted_lines(text, names):
        name, rest = line.group(1, 2)
        try:
            labels, value = _parse_sample_rest(rest, max_value_length)
        except ScrapeError as e:
            # Line numbers are only worth counting when something is wrong.
            raise ScrapeError(e.reason, f"line {_line_of(text, line.start(1))}: {e}") from None
        series = samples.setdefault(name, {})
        if labels in series:
            shown = ",".join(f"{k}={v!r}" for k, v in labels)
            shown = shown if len(shown) <= 120 else shown[:117] + "..."
            raise ScrapeError(
                "duplicate_series",
                f"line {_line_of(text, line.start(1))}: {name}{{{shown}}} repeats",
            )
        if len(series) >= limits.max_series_per_metric:
            raise ScrapeError(
                "cardinality", f"{name} has more than {limits.max_series_per_metric} series"
            )
        series[labels] = value
    return samples


@functools.lru_cache(maxsize=8)
def _finders(names: tuple[str, ...]) -> tuple[re.Pattern[str], re.Pattern[str]]:
    """Regexes for the lines of `names`: the first line of a page, and any later line.

    The names are one trie (`vllm:` then `i` then `nter_token_…` or `teration_…`), so
    that at each line the engine compares each character once, not every name in turn:
    most lines of a page are histogram buckets that share a wanted name's prefix.
    """
    line = "(" + _trie_pattern(names) + r")(?=[{ \t])([^\n]*)"
    return re.compile(line), re.compile("\n" + line)


def _trie_pattern(words: Iterable[str]) -> str:
    """A regex matching exactly `words`, their common prefixes factored out."""
    by_first: dict[str, list[str]] = {}
    ends = False
    for word in words:
        if word:
            by_first.setdefault(word[0], []).append(word[1:])
        else:
            ends = True
    branches = []
    for first, rests in sorted(by_first.items()):
        if len(rests) == 1:
            branches.append(re.escape(first + rests[0]))
        else:
            branches.append(re.escape(first) + _trie_pattern(rests))
    if ends:
        branches.append("")  # a word ends here (another continues): the shorter last
    if len(branches) == 1:
        return branches[0]
    return "(?:" + "|".join(branches) + ")"


def _wanted_lines(text: str, names: tuple[str, ...]) -> Iterator[re.Match[str]]:
    """The match of each line of `names`: group 1 the sample name, which starts the line,
    group 2 the rest of the line."""
    first, later = _finders(names)
    m = first.match(text)
    return itertools.chain(() if m is None else (m,), later.finditer(text))


def _parse_sample_rest(rest: str, max_value_length: int) -> tuple[Labels, float]:
    labels: Labels = ()
    if rest.startswith("{"):
        label_text, rest = _split_labels(rest)
        labels = _parse_labels(label_text, max_value_length)
    vm = _VALUE_PART.fullmatch(rest)
    if vm is None:
        raise ScrapeError("parse", f"malformed sample {rest[:60]!r}")
    return labels, _parse_value(vm.group(1))


def _line_of(text: str, offset: int) -> int:
    return text.count("\n", 0, offset) + 1
