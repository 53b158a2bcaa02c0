"""Targeted, strict reading of Prometheus text exposition (format 0.0.4).

vLLM's page is mostly histogram buckets we never use. Rather than parse every line
(prometheus_client's parser does, in Python), we let the regex engine find the lines of
the sample names we want and validate those strictly; the rest of the page only has to
look like exposition text (a cheap whole-page shape check). Anything wrong raises
`PageError` with a stable `reason`, which the exporter turns into
`glassbox_scrape_errors_total{reason}`.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable
from dataclasses import dataclass

Labels = tuple[tuple[str, str], ...]
"""Label pairs sorted by name: hashable, so a series is (name, labels)."""

#: Every reason a page can be refused; the exporter pre-creates a counter for each.
ERROR_REASONS = (
    "connect",  # refused, reset, DNS
    "timeout",  # the per-poll deadline passed
    "http_status",  # anything but 200
    "too_large",  # the decoded body passed the byte cap
    "decode",  # bad gzip or bad UTF-8
    "parse",  # not exposition text
    "invalid_value",  # NaN or ±Inf where a count or a ratio must be
    "duplicate_series",  # the same series twice
    "cardinality",  # too many series in one family, or an absurd label value
    "no_vllm_metrics",  # a valid page with nothing of vLLM on it
)


class PageError(Exception):
    """A page that cannot be used. `reason` is one of ERROR_REASONS."""

    def __init__(self, reason: str, message: str) -> None:
        assert reason in ERROR_REASONS, reason
        super().__init__(message)
        self.reason = reason


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
_BAD_LINE_START = re.compile(r"^(?![#a-zA-Z_:]|\s*$)", re.MULTILINE)
_ESCAPES = {"\\\\": "\\", '\\"': '"', "\\n": "\n"}


def _unescape(value: str) -> str:
    if "\\" not in value:
        return value
    return re.sub(r'\\[\\"n]', lambda m: _ESCAPES[m.group(0)], value)


def _parse_labels(text: str, limits: Limits) -> Labels:
    pairs: list[tuple[str, str]] = []
    pos = 0
    while pos < len(text):
        m = _LABEL_PAIR.match(text, pos)
        if m is None:
            raise PageError("parse", f"malformed labels {text[:80]!r}")
        value = _unescape(m.group(2))
        if len(value) > limits.max_label_value_length:
            raise PageError(
                "cardinality",
                f"label {m.group(1)} has a {len(value)}-character value "
                f"(limit {limits.max_label_value_length})",
            )
        pairs.append((m.group(1), value))
        pos = m.end()
        if m.group(3) == "" and pos < len(text):
            raise PageError("parse", f"malformed labels {text[:80]!r}")
    names = [k for k, _ in pairs]
    if len(set(names)) != len(names):
        raise PageError("parse", f"repeated label name in {text[:80]!r}")
    return tuple(sorted(pairs))


def _parse_value(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise PageError("parse", f"value {text[:40]!r} is not a number") from None
    if not math.isfinite(value):
        raise PageError("invalid_value", f"value is {text}")
    return value


def _split_labels(rest: str) -> tuple[str, str]:
    """Split '{a="x",b="}"} 1' into ('a="x",b="}"', ' 1'), honouring quotes."""
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
    raise PageError("parse", "unterminated label set")


def parse_samples(text: str, wanted: Iterable[str], limits: Limits = DEFAULT_LIMITS) -> Samples:
    """Return the samples of the `wanted` sample names found on the page.

    `wanted` holds exposed sample names (`vllm:generation_tokens_total`,
    `vllm:inter_token_latency_seconds_sum`, ...). Timestamps are dropped.
    """
    if text and not text.endswith("\n"):
        raise PageError("parse", "page does not end with a newline (truncated?)")
    bad = _BAD_LINE_START.search(text)
    if bad is not None:
        snippet = text[bad.start() : bad.start() + 40]
        raise PageError("parse", f"not exposition text: {snippet!r}")

    names = sorted(set(wanted), key=len, reverse=True)
    if not names:
        return {}
    finder = re.compile(
        "^(" + "|".join(re.escape(n) for n in names) + r")(?=[{ \t])([^\n]*)", re.MULTILINE
    )
    samples: Samples = {}
    for m in finder.finditer(text):
        name, rest = m.group(1), m.group(2)
        try:
            labels, value = _parse_sample_rest(rest, limits)
        except PageError as e:
            # Line numbers are only worth counting when something is wrong.
            raise PageError(e.reason, f"line {_line_of(text, m.start())}: {e}") from None
        series = samples.setdefault(name, {})
        if labels in series:
            raise PageError(
                "duplicate_series", f"line {_line_of(text, m.start())}: {name}{{{labels}}} repeats"
            )
        if len(series) >= limits.max_series_per_metric:
            raise PageError(
                "cardinality", f"{name} has more than {limits.max_series_per_metric} series"
            )
        series[labels] = value
    return samples


def _parse_sample_rest(rest: str, limits: Limits) -> tuple[Labels, float]:
    labels: Labels = ()
    if rest.startswith("{"):
        label_text, rest = _split_labels(rest)
        labels = _parse_labels(label_text, limits)
    vm = _VALUE_PART.fullmatch(rest)
    if vm is None:
        raise PageError("parse", f"malformed sample {rest[:60]!r}")
    return labels, _parse_value(vm.group(1))


def _line_of(text: str, offset: int) -> int:
    return text.count("\n", 0, offset) + 1
