"""Every `--help` ends with examples: `examples(...)` gives a parser its epilog."""

from __future__ import annotations

import argparse
from typing import Any


class _KeepExamples(argparse.HelpFormatter):
    """Wraps prose as argparse does; keeps the indented example lines as written."""

    def _fill_text(self, text: str, width: int, indent: str) -> str:
        prose, _, rest = text.partition("\n")
        if not rest:
            return super()._fill_text(text, width, indent)
        return super()._fill_text(prose, width, indent) + "\n" + rest


def examples(*commands: str) -> dict[str, Any]:
    """Keyword arguments of ArgumentParser/add_parser: an epilog listing `commands`."""
    return {
        "epilog": "examples:\n" + "\n".join(f"  {c}" for c in commands),
        "formatter_class": _KeepExamples,
    }
