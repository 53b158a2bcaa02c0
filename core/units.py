"""Parsing of what people type in flags: durations, byte rates, HOST:PORT addresses, the
base URLs of servers; and the one binary unit glassbox speaks in."""

from __future__ import annotations

import math
import re
from urllib.parse import urlparse

#: Bytes in a GiB (vLLM's "GB" in its log is this too).
GIB = 1024**3

_DURATION = re.compile(r"^\s*([0-9]*\.?[0-9]+)\s*(ms|s|m|h)?\s*$")
_SCALE = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, None: 1.0}


def parse_duration(text: str | float | int) -> float:
    """'500ms', '5s', '1m', '2h' or plain seconds ('5', 2.5) -> seconds (> 0)."""
    if isinstance(text, bool):
        raise ValueError(f"not a duration: {text!r}")
    if isinstance(text, int | float):
        seconds = float(text)
    else:
        m = _DURATION.match(text)
        if m is None:
            raise ValueError(f"not a duration: {text!r} (use e.g. 500ms, 5s, 1m or 2.5)")
        seconds = float(m.group(1)) * _SCALE[m.group(2)]
    if not math.isfinite(seconds) or seconds <= 0:
        raise ValueError(f"duration must be positive: {text!r}")
    return seconds


def parse_positive_number(text: str | float | int) -> float:
    """A positive finite number, plain or scientific ('864e9')."""
    try:
        value = float(text)
    except (TypeError, ValueError):
        raise ValueError(f"not a number: {text!r}") from None
    if not math.isfinite(value) or value <= 0:
        raise ValueError(f"must be a positive number: {text!r}")
    return value


def parse_host_port(text: str) -> tuple[str, int]:
    """'HOST:PORT' -> (host, port) to listen on: '[::]:9400' -> ('::', 9400), and an empty
    host ':9400' -> ('0.0.0.0', 9400)."""
    host, _, port = text.rpartition(":")
    if not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ValueError(f"{text!r} is not HOST:PORT")
    return host.strip("[]") or "0.0.0.0", int(port)


def base_url_problems(url: str) -> list[str]:
    """Why `url` cannot be a server's base URL (empty when it can): an http(s) URL with a
    host, and no credentials in it (they would show in logs and messages)."""
    try:
        parsed = urlparse(url)
        parsed.port  # noqa: B018 (raises ValueError for a port that is no number)
    except ValueError:
        return [f"{url!r} is not an http(s) URL"]
    if parsed.scheme not in ("http", "https") or not parsed.hostname:
        return [f"{url!r} is not an http(s) URL"]
    if parsed.username is not None or parsed.password is not None:
        return ["no credentials in the URL (they would show in logs)"]
    return []
