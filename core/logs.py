"""One logging set-up for every subcommand: logfmt or JSON lines on stderr.

`--log-format logfmt` (the default) writes lines that logfmt parsers read (Loki's
`| logfmt`, Fluent Bit's logfmt parser): `key=value` pairs, a value quoted when it holds
a space, `=`, `"` or a control character, with `\\"`, `\\\\` and `\\n` escaped inside. `--log-format
json` writes one JSON object a line. Both carry `ts` (RFC 3339, UTC, milliseconds),
`level`, `logger` and `msg`, then `exc` when an exception is logged.
"""

from __future__ import annotations

import argparse
import json
import logging
import time

LEVELS = ("debug", "info", "warning", "error")
FORMATS = ("logfmt", "json")


def add_log_flags(parser: argparse.ArgumentParser, default_level: str) -> None:
    parser.add_argument("--log-level", default=default_level, choices=LEVELS)
    parser.add_argument(
        "--log-format",
        default="logfmt",
        choices=FORMATS,
        help="logfmt (key=value) or json lines on stderr (default %(default)s)",
    )


def set_up_logging(level: str, log_format: str = "logfmt") -> None:
    handler = logging.StreamHandler()
    handler.setFormatter(JsonFormatter() if log_format == "json" else LogfmtFormatter())
    logging.basicConfig(level=level.upper(), handlers=[handler], force=True)
    quiet_libraries(level)


#: Libraries that log every request they make at `info` (httpx: a line per poll, the whole
#: URL of the filtered page, about 2 KB): heard from at `warning` unless `--log-level debug`.
CHATTY_LIBRARIES = ("httpx", "httpcore")


def quiet_libraries(level: str) -> None:
    for name in CHATTY_LIBRARIES:
        logging.getLogger(name).setLevel(logging.NOTSET if level == "debug" else logging.WARNING)


def record_fields(record: logging.LogRecord) -> dict[str, str]:
    """The fields of one line, in order."""
    fields = {
        "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
        + f".{int(record.msecs):03d}Z",
        "level": record.levelname.lower(),
        "logger": record.name,
        "msg": record.getMessage(),
    }
    if record.exc_info:
        fields["exc"] = logging.Formatter().formatException(record.exc_info)
    return fields


def logfmt_value(value: str) -> str:
    """A value as logfmt writes it: bare when it can be, else quoted and escaped."""
    if value and not any(c in value for c in ' ="\\') and value.isprintable():
        return value
    escaped = (
        value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n").replace("\r", "\\r")
    )
    escaped = "".join(c if c.isprintable() or c == " " else f"\\u{ord(c):04x}" for c in escaped)
    return f'"{escaped}"'


class LogfmtFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        return " ".join(f"{k}={logfmt_value(v)}" for k, v in record_fields(record).items())


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        return json.dumps(record_fields(record), ensure_ascii=False)
