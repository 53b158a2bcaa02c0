"""Starting a command as a parent without job control does: with SIGINT ignored.

A shell script's `cmd &`, nohup and many CI runners start their children with SIGINT
ignored, and a Python started that way never raises KeyboardInterrupt unless it sets a
handler itself. Tests that send SIGINT start the process this way, so they check that
the program handles SIGINT whatever it inherited, and do not depend on how the test
runner itself was started.
"""

from __future__ import annotations

from collections.abc import Sequence


def with_sigint_ignored(argv: Sequence[str]) -> list[str]:
    """`argv` run through `sh`, which ignores SIGINT before exec'ing it (inherited)."""
    return ["sh", "-c", 'trap "" INT; exec "$@"', "sh", *argv]
