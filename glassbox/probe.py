"""`glassbox probe`: is each exporter up and reading its vLLM? (the chart's `helm test`)

    glassbox probe --exporter URL [--exporter URL ...] [--vllm URL ...]
                   [--ca-file FILE] [--username-file FILE --password-file FILE]
                   [--vllm-api-key-file FILE]

Each exporter must serve /metrics with `glassbox_build_info` and `glassbox_target_up 1`
(its last poll of vLLM succeeded); each vLLM must answer /health with 200 and, given its
API key, /v1/models with 200 (vLLM accepts the key). An https exporter is trusted by
--ca-file and read with the basic-auth credentials in the files given. Prints one line
per check; exit 0 when all pass, 1 otherwise. Reads with the exporter's fetcher (a hard
deadline and a byte cap per request); no credential is ever printed.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from functools import partial

from vllm_glassbox.core.errors import ScrapeError
from vllm_glassbox.core.fetch import TargetCredentials, fetch_once
from vllm_glassbox.core.helptext import examples
from vllm_glassbox.core.own_page import ExporterPage
from vllm_glassbox.core.units import base_url_problems


def exporter_problem(text: str) -> str | None:
    """Why an exporter's /metrics page does not show a working exporter; None if it does
    (ValueError when the text is not exposition text)."""
    page = ExporterPage.parse(text)
    if not page.has("glassbox_build_info"):
        return "no glassbox_build_info: not a glassbox exporter"
    if page.target_up is None:
        return "no glassbox_target_up"
    if not page.target_up:
        return "glassbox_target_up is 0: the exporter cannot read vLLM (its log says why)"
    return None


def check_exporter(
    url: str, timeout: float, credentials: TargetCredentials | None = None
) -> str | None:
    try:
        text = fetch_once(url, "/metrics", timeout, credentials)
    except ScrapeError as e:
        return str(e)
    try:
        return exporter_problem(text)
    except ValueError as e:
        return f"not exposition text: {e}"


def check_vllm(url: str, timeout: float, api_key_file: str | None = None) -> str | None:
    try:
        fetch_once(url, "/health", timeout)
    except ScrapeError as e:
        return str(e)
    if api_key_file is None:
        return None
    try:  # /health and /metrics are open; vLLM checks the key on /v1 only
        fetch_once(url, "/v1/models", timeout, TargetCredentials(bearer_token_file=api_key_file))
    except ScrapeError as e:
        return f"with the API key of {api_key_file}: {e}"
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
    parser.add_argument("--ca-file", metavar="FILE", help="CA to trust for https exporters")
    parser.add_argument("--username-file", metavar="FILE", help="basic auth towards exporters")
    parser.add_argument("--password-file", metavar="FILE", help="its password")
    parser.add_argument(
        "--vllm-api-key-file", metavar="FILE", help="vLLM's API key: /v1/models must accept it"
    )
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
    if bool(args.username_file) != bool(args.password_file):
        problems.append("--username-file and --password-file go together")
    if problems:
        parser.error("invalid flags:\n" + "\n".join(problems))
    exporter_credentials = TargetCredentials(
        ca_file=args.ca_file, username_file=args.username_file, password_file=args.password_file
    )
    checks = [
        (f"exporter {u}", partial(check_exporter, u, args.timeout, exporter_credentials))
        for u in args.exporter
    ]
    checks += [
        (f"vllm {u}", partial(check_vllm, u, args.timeout, args.vllm_api_key_file))
        for u in args.vllm
    ]
    failed = 0
    for label, check in checks:
        problem = check()
        print(f"{label}: {'ok' if problem is None else 'FAILED: ' + problem}")
        failed += problem is not None
    return 1 if failed else 0
