"""Targeted, strict reading of a metrics page: Prometheus text 0.0.4 and OpenMetrics 1.0.

vLLM's page is mostly histogram buckets we never use. Rather than parse every line
(prometheus_client's parser does, in Python), we let the regex engine find the lines of
the sample names we want and validate those strictly, by the grammar of the page; the rest
of the page only has to be lines of that grammar (a cheap whole-page shape check).
Anything wrong raises `ScrapeError` with a stable `reason`, which the exporter turns into
`glassbox_scrape_errors_total{reason}`.

The grammar is the content type's (vLLM's Python server answers `text/plain; version=0.0.4`,
its Rust front end `application/openmetrics-text; version=1.0.0` whatever is asked), else
what the page shows: a last line `# EOF`, or `# UNIT` lines, make it OpenMetrics. The two
differ where it matters here: OpenMetrics ends with `# EOF` (a page without it, or with
one before its end, is refused: nothing of it is read), its timestamps are seconds and
may have a fraction (text: integer milliseconds), a sample may carry an exemplar after
` # `, fields are separated by exactly one space, label sets have no spaces and no
trailing comma, and no line is blank or a comment of another kind. OpenMetrics 2.0 (a
release candidate) writes a histogram as one composite value (`name{...} {count:...,
sum:...,bucket:[...]}`) with no `_sum` or `_count` lines: such a family of the ones read
is named (`Page.composite`) and its samples are absent, whatever the page's grammar.
What is not checked on the lines glassbox does not read: metadata's names and order, a
family's samples being together, histogram buckets' order; nor OpenMetrics' rules of
meaning that Prometheus does not enforce when it scrapes (which samples may carry an
exemplar, integer counts).
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

#: The grammars a page is read by.
TEXT = "text-0.0.4"
OPENMETRICS = "openmetrics-1.0"
OPENMETRICS_2 = "openmetrics-2.0"
FORMAT_NAMES = {
    TEXT: "Prometheus text 0.0.4",
    OPENMETRICS: "OpenMetrics 1.0",
    OPENMETRICS_2: "OpenMetrics 2.0",
}


@dataclass(frozen=True)
class Limits:
    max_series_per_metric: int = 512
    max_label_value_length: int = 2048


DEFAULT_LIMITS = Limits()

Samples = dict[str, dict[Labels, float]]
"""sample name -> labels -> value."""


@dataclass(frozen=True)
class Page:
    """What was read of one page: the wanted samples, the grammar it was read by, and the
    histogram families among the wanted ones written as OpenMetrics 2.0 composite values
    (their `_sum`, `_count` and `_bucket` samples absent)."""

    samples: Samples
    format: str
    composite: frozenset[str] = frozenset()


# The value is an unrolled loop, not (?:[^"\\]|\\.)*: that form costs the regex engine
# ~200 bytes of backtracking state per character (a 3 MB label value took 560 MiB).
_LABEL_PAIR = re.compile(
    r'\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*=\s*"([^"\\\n]*(?:\\.[^"\\\n]*)*)"\s*(,|$)'
)
# OpenMetrics: no spaces, and only the three escapes.
_OM_LABEL_PAIR = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="([^"\\\n]*(?:\\[\\"n][^"\\\n]*)*)"(,|$)')
_VALUE_PART = re.compile(r"\s+(\S+)(?:\s+(\S+))?\s*$")
_TEXT_TIMESTAMP = re.compile(r"-?[0-9]+")
# A line of exposition text starts with a comment, a metric name, or is empty; a line of
# OpenMetrics with metadata or a metric name (the `# EOF` line is cut off before).
# Line starts are found by the "\n" before them, which the regex engine finds with a fast
# literal scan; a MULTILINE "^" is tried at every character (five times slower).
_NOT_A_LINE = r"(?![#a-zA-Z_:]|\s*$)"
_BAD_FIRST_LINE = re.compile(_NOT_A_LINE, re.MULTILINE)
_BAD_NEXT_LINE = re.compile("\n" + _NOT_A_LINE, re.MULTILINE)
_NOT_AN_OM_LINE = r"(?!# (?:HELP|TYPE|UNIT) |[a-zA-Z_:]|\Z)"
_OM_BAD_FIRST_LINE = re.compile(_NOT_AN_OM_LINE)
_OM_BAD_NEXT_LINE = re.compile("\n" + _NOT_AN_OM_LINE)
_BAD_LINES = {
    True: (_BAD_FIRST_LINE, _BAD_NEXT_LINE),
    False: (_OM_BAD_FIRST_LINE, _OM_BAD_NEXT_LINE),
}
_ESCAPES = {"\\\\": "\\", '\\"': '"', "\\n": "\n"}
_EOF = "# EOF"
#: Suffixes of a histogram's samples: a wanted `_sum` or `_count` names its family.
_HISTOGRAM_SAMPLES = ("_sum", "_count", "_bucket")


def _unescape(value: str) -> str:
    if "\\" not in value:
        return value
    return re.sub(r'\\[\\"n]', lambda m: _ESCAPES[m.group(0)], value)


# --- which grammar ---------------------------------------------------------------------


def page_format(text: str, content_type: str | None = None) -> str:
    """The grammar of a page: its content type's, else what the page shows."""
    if content_type:
        media, _, params = content_type.partition(";")
        media = media.strip().lower()
        if media == "application/openmetrics-text":
            version = _parameter(params, "version") or "1.0.0"
            if version in ("1.0.0", "0.0.1"):
                return OPENMETRICS
            if version.startswith("2."):
                return OPENMETRICS_2
            raise ScrapeError(
                "parse", f"OpenMetrics version {version[:20]!r}: glassbox reads 1.0.0 and 2.0.0"
            )
        if media == "text/plain":
            return TEXT
        # Another type (an error page's text/html, none): by what the page shows.
    if ends_with_eof(text) or text.startswith("# UNIT ") or "\n# UNIT " in text:
        return OPENMETRICS
    return TEXT


def _parameter(params: str, name: str) -> str | None:
    for param in params.split(";"):
        key, _, value = param.partition("=")
        if key.strip().lower() == name:
            return value.strip().strip('"')
    return None


def ends_with_eof(text: str) -> bool:
    """Whether the text's last line is OpenMetrics' `# EOF`, which only a whole page has."""
    return text in (_EOF, _EOF + "\n") or text.endswith(("\n" + _EOF, "\n" + _EOF + "\n"))


def _body(text: str, fmt: str) -> str:
    """The page's lines to read: an OpenMetrics page without its `# EOF` line (refused
    when it has none), a text page whole; refused where a `# EOF` line is not the last."""
    early = ("\n" + text).find("\n" + _EOF + "\n")
    if early != -1 and early + len(_EOF) + 1 < len(text):
        raise ScrapeError(
            "parse",
            f"`# EOF` at line {_line_of(text, early)} is not the page's last line "
            "(two pages joined?)",
        )
    if fmt == TEXT:
        if text and not text.endswith("\n"):
            raise ScrapeError("parse", "page does not end with a newline (truncated?)")
        return text
    if not ends_with_eof(text):
        raise ScrapeError(
            "truncated",
            f"{FORMAT_NAMES[fmt]} page without `# EOF` as its last line (cut short?)",
        )
    return text[: text.rfind(_EOF)]


def _bad_line_start(text: str, fmt: str) -> int | None:
    """Offset of the first line that is not a line of the grammar, if any."""
    first, later = (
        (_BAD_FIRST_LINE, _BAD_NEXT_LINE)
        if fmt == TEXT
        else (_OM_BAD_FIRST_LINE, _OM_BAD_NEXT_LINE)
    )
    if first.match(text):
        return 0
    m = later.search(text)
    return None if m is None else m.start() + 1


# --- labels and values -----------------------------------------------------------------

#: A page's label sets are the same from one poll to the next: each is parsed once and
#: then looked up (a poll of an 8-engine page parses ~180 of them). Bounded in entries
#: and in the length of what is kept, so a page that changes every label costs memory
#: of at most about 4 MiB and the same time as without the cache. Keyed by the text, the
#: one limit that applies (an int: hashing a `Limits` ran Python code for each line) and
#: the grammar's strictness.
_LABELS_CACHED = 2048
_LABELS_CACHED_LENGTH = 2048


def _parse_labels(text: str, max_value_length: int, strict: bool = False) -> Labels:
    if len(text) <= _LABELS_CACHED_LENGTH:
        return _parse_labels_cached(text, max_value_length, strict)
    return _parse_labels_uncached(text, max_value_length, strict)


@functools.lru_cache(maxsize=_LABELS_CACHED)
def _parse_labels_cached(text: str, max_value_length: int, strict: bool) -> Labels:
    return _parse_labels_uncached(text, max_value_length, strict)


def _parse_labels_uncached(text: str, max_value_length: int, strict: bool) -> Labels:
    pairs: list[tuple[str, str]] = []
    pair = _OM_LABEL_PAIR if strict else _LABEL_PAIR
    pos = 0
    while pos < len(text):
        m = pair.match(text, pos)
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
        last = pos >= len(text)
        if (m.group(3) == "" and not last) or (strict and last and m.group(3) == ","):
            raise ScrapeError("parse", f"malformed labels {text[:80]!r}")
    names = [k for k, _ in pairs]
    if len(set(names)) != len(names):
        raise ScrapeError("parse", f"repeated label name in {text[:80]!r}")
    return tuple(sorted(pairs))


def _number(text: str, what: str = "value") -> float:
    # Python's float() also takes digit separators ("1_000"); Prometheus does not.
    if "_" in text:
        raise ScrapeError("parse", f"{what} {text[:40]!r} is not a number")
    try:
        return float(text)
    except ValueError:
        raise ScrapeError("parse", f"{what} {text[:40]!r} is not a number") from None


def _parse_value(text: str) -> float:
    value = _number(text)
    if not math.isfinite(value):
        raise ScrapeError("invalid_value", f"value is {text}")
    return value


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


# --- the page --------------------------------------------------------------------------


def parse_samples(
    text: str,
    wanted: Iterable[str],
    limits: Limits = DEFAULT_LIMITS,
    content_type: str | None = None,
) -> Samples:
    """The samples of the `wanted` sample names found on the page (`read_page`)."""
    return read_page(text, wanted, limits, content_type).samples


def read_page(
    text: str,
    wanted: Iterable[str],
    limits: Limits = DEFAULT_LIMITS,
    content_type: str | None = None,
) -> Page:
    """Read the samples of the `wanted` sample names on the page, by its grammar.

    `wanted` holds exposed sample names (`vllm:generation_tokens_total`,
    `vllm:inter_token_latency_seconds_sum`, ...). Timestamps and exemplars are dropped.
    """
    fmt = page_format(text, content_type)
    body = _body(text, fmt)
    bad = _bad_line_start(body, fmt)
    if bad is not None:
        snippet = body[bad : bad + 40]
        raise ScrapeError("parse", f"not exposition text ({FORMAT_NAMES[fmt]}): {snippet!r}")

    names = frozenset(wanted)
    families = frozenset(
        n[: -len(suffix)] for n in names for suffix in _HISTOGRAM_SAMPLES if n.endswith(suffix)
    )
    if not names:
        return Page({}, fmt)
    samples: Samples = {}
    composite: set[str] = set()
    finders = tuple(sorted(names | families, key=len, reverse=True))
    for line in _wanted_lines(body, finders):
        name, rest = line.group(1, 2)
        try:
            if name in families and _is_composite(rest):
                composite.add(name)
                continue
            if name not in names:
                continue  # a family's line of another shape: not one read
            labels, value = _parse_sample_rest(rest, limits.max_label_value_length, fmt)
        except ScrapeError as e:
            # Line numbers are only worth counting when something is wrong.
            where = f"line {_line_of(body, line.start(1))}"
            raise ScrapeError(*_cut_short(e, rest, fmt, content_type, where)) from None
        series = samples.setdefault(name, {})
        if labels in series or len(series) >= limits.max_series_per_metric:
            _refuse_series(name, labels, series, limits, _line_of(body, line.start(1)))
        series[labels] = value
    for family in composite:
        for suffix in _HISTOGRAM_SAMPLES:
            samples.pop(family + suffix, None)
    return Page(samples, fmt, frozenset(composite))


def _refuse_series(
    name: str, labels: Labels, series: dict[Labels, float], limits: Limits, line: int
) -> None:
    """Raise for a series seen twice, or one more than a family may have."""
    if labels in series:
        shown = ",".join(f"{k}={v!r}" for k, v in labels)
        shown = shown if len(shown) <= 120 else shown[:117] + "..."
        raise ScrapeError("duplicate_series", f"line {line}: {name}{{{shown}}} repeats")
    raise ScrapeError("cardinality", f"{name} has more than {limits.max_series_per_metric} series")


def _cut_short(
    error: ScrapeError, rest: str, fmt: str, content_type: str | None, where: str
) -> tuple[str, str]:
    """An error's reason and message; a page of no stated type that reads as text only
    because its `# EOF` is missing, and shows OpenMetrics on the line, is cut short."""
    if fmt == TEXT and not content_type and error.reason == "parse":
        shown = _openmetrics_on(rest)
        if shown is not None:
            return "truncated", f"{where}: {shown} on a page without `# EOF` (cut short?)"
    return error.reason, f"{where}: {error}"


def _openmetrics_on(rest: str) -> str | None:
    """What on a sample line only OpenMetrics writes, if anything."""
    if " # {" in rest:
        return "an OpenMetrics exemplar"
    vm = _VALUE_PART.fullmatch(rest[rest.rfind("}") + 1 :] if rest.startswith("{") else rest)
    if vm is not None and vm.group(2) is not None and "." in vm.group(2):
        return "a timestamp in seconds (OpenMetrics)"
    return None


def _is_composite(rest: str) -> bool:
    """Whether a histogram family's line holds an OpenMetrics 2.0 composite value."""
    if rest.startswith("{"):
        rest = _split_labels(rest)[1]
    return rest.startswith(" {")


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


def _parse_sample_rest(rest: str, max_value_length: int, fmt: str) -> tuple[Labels, float]:
    labels: Labels = ()
    strict = fmt != TEXT
    if rest.startswith("{"):
        label_text, rest = _split_labels(rest)
        labels = _parse_labels(label_text, max_value_length, strict)
    if strict:
        return labels, _openmetrics_value(rest, max_value_length, fmt)
    vm = _VALUE_PART.fullmatch(rest)
    if vm is None:
        raise ScrapeError("parse", f"malformed sample {rest[:60]!r}")
    if vm.group(2) is not None and not _TEXT_TIMESTAMP.fullmatch(vm.group(2)):
        raise ScrapeError(
            "parse", f"timestamp {vm.group(2)[:40]!r} is not integer milliseconds (text 0.0.4)"
        )
    return labels, _parse_value(vm.group(1))


def _openmetrics_value(rest: str, max_value_length: int, fmt: str) -> float:
    """An OpenMetrics sample's value, after its name and labels: ` value [timestamp]`
    (2.0: and ` st@start`), then an exemplar (2.0: any number of them)."""
    head, hash_, exemplars = rest.partition(" # ")
    tokens = head.split(" ")
    if tokens[0] != "" or not 2 <= len(tokens) <= 4 or "" in tokens[1:]:
        raise ScrapeError("parse", f"malformed sample {rest[:60]!r}")
    stamps = tokens[2:]
    if fmt == OPENMETRICS_2 and stamps and stamps[-1].startswith("st@"):
        _timestamp(stamps.pop()[3:])
    if len(stamps) > 1:
        raise ScrapeError("parse", f"malformed sample {rest[:60]!r}")
    for stamp in stamps:
        _timestamp(stamp)
    value = _parse_value(tokens[1])
    if hash_:
        _exemplars(exemplars, max_value_length, fmt)
    return value


def _timestamp(text: str) -> None:
    if not math.isfinite(_number(text, "timestamp")):
        raise ScrapeError("parse", f"timestamp {text[:40]!r} is not a finite number")


def _exemplars(text: str, max_value_length: int, fmt: str) -> None:
    """Check ` # {labels} value [timestamp]` (after its ` # `); OpenMetrics 2.0 may have
    more, each after its own ` # `."""
    while True:
        if not text.startswith("{"):
            raise ScrapeError("parse", f"malformed exemplar {text[:60]!r}")
        label_text, text = _split_labels(text)
        _parse_labels(label_text, max_value_length, strict=True)
        head, hash_, text = text.partition(" # ")
        tokens = head.split(" ")
        if tokens[0] != "" or len(tokens) not in (2, 3) or "" in tokens[1:]:
            raise ScrapeError("parse", f"malformed exemplar {head[:60]!r}")
        _number(tokens[1], "exemplar value")
        if len(tokens) == 3:
            _timestamp(tokens[2])
        if not hash_:
            return
        if fmt != OPENMETRICS_2:
            raise ScrapeError("parse", "a second exemplar (OpenMetrics 1.0 allows one)")


def _line_of(text: str, offset: int) -> int:
    return text.count("\n", 0, offset) + 1
