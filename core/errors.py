"""Why a poll of vLLM fails: one exception with a stable reason, from the fetch (a refused
connection, a deadline, a byte cap) to the page (not exposition text, a NaN, too many
series). The exporter counts each reason in `glassbox_scrape_errors_total{reason}`;
`plain_reason` words an error for such a message, never quoting a secret.
"""

from __future__ import annotations

#: Every reason a poll can fail; the exporter pre-creates a counter for each.
ERROR_REASONS = (
    "connect",  # refused, reset, DNS
    "timeout",  # the per-poll deadline passed
    "slow",  # answered, but after the poll interval: vLLM is busy, not down (values used)
    "http_status",  # anything but 200
    "too_large",  # the decoded body passed the byte cap
    "decode",  # bad gzip or bad UTF-8
    "truncated",  # the page's end is not proven, or it is missing what a whole page has
    "parse",  # not exposition text
    "invalid_value",  # NaN or ±Inf where a count or a ratio must be
    "duplicate_series",  # the same series twice
    "cardinality",  # too many series in one family, or an absurd label value
    "no_vllm_metrics",  # a valid page with nothing of vLLM on it
    "internal",  # an unexpected error in the exporter itself (a bug: its log has the trace)
)


class ScrapeError(Exception):
    """A poll of vLLM that failed: no answer, or a page that cannot be used. `reason` is
    one of ERROR_REASONS."""

    def __init__(self, reason: str, message: str, refused: bool = False) -> None:
        assert reason in ERROR_REASONS, reason
        super().__init__(message)
        self.reason = reason
        # Nothing listened at the target's port: its process is gone (or restarting).
        self.refused = refused


def plain_reason(error: Exception) -> str:
    """An OSError's plain words (`No such file or directory`), else the error's text."""
    return str(error.strerror if isinstance(error, OSError) and error.strerror else error)
