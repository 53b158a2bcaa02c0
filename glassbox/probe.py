"""`glassbox probe`: is each exporter up and reading its vLLM? (the chart's `helm test`)

    glassbox probe --exporter URL [--exporter URL ...] [--vllm URL ...]

Each exporter must serve /metrics with `glassbox_build_info` and `glassbox_target_up 1`
(its last poll of vLLM succeeded); each vLLM must answer /health with 200. Prints one line
per check; exit 0 when all pass, 1 otherwise. Reads with the exporter's fetcher (a hard
deadline and a byte cap per request).
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence

from prometheus_client.parser import text_string_to_metric_families
from vllm_glassbox.exporter.errors import ScrapeError
from vllm_glassbox.exporter.fetch import fetch_once
from vllm_glassbox.helptext import examples
from vllm_glassbox.units import base_url_problems


def exporter_problem(text: str) -> str | None:
    """Why an exporter's /metrics page does not show a working exporter; None if it does."""
    samples = {
        s.name: s.value for family in text_string_to_metric_families(text) for s in family.samples
    }
    if "glassbox_build_info" not in samples:
        return "no glassbox_build_info: not a glassbox exporter"
    up = samples.get("glassbox_target_up")
    if up is None:
        return "no glassbox_target_up"
    if up != 1:
        return "glassbox_target_up is 0: the exporter cannot read vLLM (its log says why)"
    return None


def check_exporter(url: str, timeout: float) -> str | None:
    try:
        text = fetch_once(url, "/metrics", timeout)
    except ScrapeError as e:
        return str(e)
    try:
        return exporter_problem(text)
    except ValueError as e:
        return f"not exposition text: {e}"


def check_vllm(url: str, timeout: float) -> str | None:
    try:
        fetch_once(url, "/health", timeout)
    except ScrapeError as e:
        return str(e)
    return None


def main(argv: Sequence[str], prog: str = "glassbox probe") -> int:
    parser = argparse.ArgumentParser(
        prog=prog,
        description="Check that glassbox exporters are up and read their vLLM; exit 0 when "
        "every check passes, 1 otherwise.",
        **examples(
            "glassbox probe --exporter http://127.0.0.1:9400",
            "glassbox probe --exporter http://llm-glassbox:9400 --vllm http://llm-vllm:8000",
        ),
    )
    parser.add_argument(
        "--exporter", action="append", default=[], metavar="URL", help="an exporter's base URL"
    )
    parser.add_argument(
        "--vllm", action="append", default=[], metavar="URL", help="a vLLM server's base URL"
    )
    parser.add_argument("--timeout", type=float, default=10.0, metavar="SECONDS")
    args = parser.parse_args(list(argv))
    if not args.exporter and not args.vllm:
        parser.error("give at least one --exporter or --vllm")
    problems = [
        f"--{flag}: {problem}"
        for flag, urls in (("exporter", args.exporter), ("vllm", args.vllm))
        for url in urls
        for problem in base_url_problems(url)
    ]
    if not 0 < args.timeout < float("inf"):
        problems.append(f"--timeout: must be a positive number of seconds: {args.timeout}")
    if problems:
        parser.error("invalid flags:\n" + "\n".join(problems))
    checks = [(f"exporter {u}", check_exporter, u) for u in args.exporter]
    checks += [(f"vllm {u}", check_vllm, u) for u in args.vllm]
    failed = 0
    for label, check, url in checks:
        problem = check(url, args.timeout)
        print(f"{label}: {'ok' if problem is None else 'FAILED: ' + problem}")
        failed += problem is not None
    return 1 if failed else 0
