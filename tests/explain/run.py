"""`glassbox explain` run in this process, as a person runs it: its exit status, and
what it wrote to stdout and stderr."""

from __future__ import annotations

import contextlib
import io
from collections.abc import Sequence
from dataclasses import dataclass

from vllm_glassbox.explain.cli import main


@dataclass(frozen=True)
class Ran:
    status: int
    out: str
    err: str


def explain(args: Sequence[str]) -> Ran:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            status = main(list(args))
        except SystemExit as e:  # argparse's usage errors
            status = int(e.code or 0)
    return Ran(status, out.getvalue(), err.getvalue())
