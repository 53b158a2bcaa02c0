"""One logging set-up for every subcommand: logfmt-style lines on stderr."""

from __future__ import annotations

import argparse
import logging

LEVELS = ("debug", "info", "warning", "error")


def add_log_level_flag(parser: argparse.ArgumentParser, default: str) -> None:
    parser.add_argument("--log-level", default=default, choices=LEVELS)


def set_up_logging(level: str) -> None:
    logging.basicConfig(
        level=level.upper(),
        format="ts=%(asctime)s level=%(levelname)s logger=%(name)s msg=%(message)s",
    )
