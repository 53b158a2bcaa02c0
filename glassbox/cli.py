"""`glassbox` — one command, a subcommand per part of the product."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence

from vllm_glassbox import __version__
from vllm_glassbox.core.helptext import examples

# Each part registers its own flags; imports stay lazy so `glassbox exporter` never
# pays for matplotlib or the Kubernetes client.
_PARTS: dict[str, tuple[str, str]] = {
    "exporter": ("vllm_glassbox.exporter.cli", "Serve derived series next to one vLLM server."),
    "lab": ("vllm_glassbox.lab.cli", "Run the lab's experiments against a real vLLM."),
    "demo": (
        "vllm_glassbox.lab.demo",
        "The whole story on this machine: vLLM on CPU, lab, report.",
    ),
    "dashboards": ("vllm_glassbox.dashboards.cli", "Generate dashboards; snapshot them as PNG."),
    "probe": ("vllm_glassbox.probe", "Check that exporters are up and read their vLLM."),
    "rules": (
        "vllm_glassbox.rules",
        "Write the rule files with more aggregation labels, or an SLO file's rules.",
    ),
    "explain": (
        "vllm_glassbox.explain.cli",
        "Say what vLLM is doing, in words, with the numbers and what would change it.",
    ),
}
# Parts whose libraries come with the `lab` extra (the exporter's image leaves them out).
_LAB_EXTRA = ("lab", "demo", "dashboards")


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = argparse.ArgumentParser(
        prog="glassbox",
        description="Observability that opens vLLM's black box. "
        "`glassbox COMMAND --help` says more about each command.",
        **examples(
            "glassbox exporter --target http://127.0.0.1:8000",
            "glassbox demo",
            "glassbox probe --exporter http://127.0.0.1:9400",
        ),
    )
    parser.add_argument("--version", action="version", version=f"glassbox {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, (_, summary) in _PARTS.items():
        sub.add_parser(name, help=summary, add_help=False)
    if not argv or argv[0] not in _PARTS:
        parser.parse_args(argv or ["--help"])
        return 2
    module_name, summary = _PARTS[argv[0]]
    import importlib

    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as e:
        if argv[0] not in _LAB_EXTRA:
            raise
        print(
            f"glassbox {argv[0]}: needs {e.name!r}, which comes with the lab extra: "
            "pip install 'vllm-glassbox[lab]'",
            file=sys.stderr,
        )
        return 2
    run: Callable[[Sequence[str], str], int] = module.main
    return run(argv[1:], f"glassbox {argv[0]}")
