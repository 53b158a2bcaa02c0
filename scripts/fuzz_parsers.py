#!/usr/bin/env python3
"""Coverage-guided fuzzing (atheris) of the page parser and the log parser.

    scripts/fuzz.sh [SECONDS]                      both targets, SECONDS each (default 600)
    .venv/bin/python scripts/fuzz_parsers.py page|log CORPUS_DIR [libFuzzer flags...]

The oracle is tests/parser_contract.py: only clean, reasoned errors (ScrapeError with a
known reason for a page; nothing at all for a log), and only finite numbers out; a page
is read under every content type (none, text 0.0.4, OpenMetrics 1.0 and 2.0), so each
input is fuzzed through both grammars, and where prometheus_client's parser of the
grammar reads it too, its samples must be glassbox's. The corpus starts from the captured
pages and logs in tests/fixtures/ (text pages, and the Rust front end's OpenMetrics ones),
plus the inputs kept as regression cases (tests/fixtures/fuzz/), and a dictionary of the
names and phrases the parsers look for, so mutations reach the interesting paths quickly.
A crash or a slow input (libFuzzer's -timeout) is written to CORPUS_DIR/../crashes/; keep
it under tests/fixtures/fuzz/<target>/ once fixed, and tests/core/test_parser_contract.py
replays it.

Not part of CI: it runs for minutes and needs the `fuzz` extra (atheris).
"""

from __future__ import annotations

import sys
from pathlib import Path

import atheris

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

# String comparisons steer mutations. (Atheris' "RegEx" hook is left off: its pattern
# proxy does not take match()'s `pos` argument, which the page parser uses; the
# dictionary below gives the regexes' literals instead.)
atheris.enabled_hooks.add("str")
with atheris.instrument_imports(include=["vllm_glassbox", "tests.parser_contract"]):
    from vllm_glassbox.core.snapshot import WANTED_SAMPLES

    from tests.parser_contract import check_log, check_page_every_way

FIXTURES = REPO / "tests" / "fixtures"
SEED_BYTES = 64 * 1024  # libFuzzer's -max_len below: longer seeds are cut to this

PAGE_WORDS = [
    *sorted(WANTED_SAMPLES),
    "# TYPE ",
    "# HELP ",
    " counter",
    " histogram",
    " gauge",
    "_bucket",
    "_created",
    'le="+Inf"',
    'engine="0"',
    'model_name="m"',
    'pid="1"',
    'position="0"',
    'num_gpu_blocks="32"',
    'block_size="16"',
    'kv_cache_size_tokens="512"',
    "NaN",
    "+Inf",
    "-Inf",
    "1e308",
    "0x1p3",
    "\\n",
    '\\"',
    "\\\\",
    "{",
    "}",
    "=",
    ",",
    " 1700000000000",
    # OpenMetrics 1.0 and 2.0
    "# EOF",
    "\n# EOF\n",
    "# UNIT ",
    " # {",
    'trace_id="abc"} ',
    " 1700000000.123",
    " st@",
    " {count:",
    ",sum:",
    ",bucket:[",
    "_created",
    "_total",
]
LOG_WORDS = [
    "(EngineCore_DP0 pid=7) ",
    "INFO 01-01 00:00:00 [x.py:1] ",
    "Model loading took ",
    "Loading model weights took ",
    " GiB",
    " GB",
    " memory",
    " and ",
    " seconds",
    "Available KV cache memory: ",
    "GPU KV cache size: ",
    "CPU KV cache size: ",
    " tokens",
    "Maximum concurrency for ",
    " tokens per request: ",
    "x",
    "Loading weights took ",
    "vLLM API server version ",
    "vLLM server version ",
    "█     version ",
    ", serving model ",
    "\x1b[0;36m",
    "1,234,567",
    "0.5",
    "99999999999999999999999999999999999999",
]


def write_dictionary(words: list[str], path: Path) -> None:
    """libFuzzer's dictionary format: one quoted token a line, bytes as \\xNN escapes."""

    def quoted(word: str) -> str:
        return "".join(
            chr(b) if 0x20 <= b < 0x7F and b not in (0x22, 0x5C) else f"\\x{b:02x}"
            for b in word.encode()
        )

    path.write_text("".join(f'"{quoted(w)}"\n' for w in words))


def seed(corpus: Path, target: str) -> None:
    """Put the fixtures and the kept regression cases into the corpus (cut to max_len)."""
    sources = {
        "page": sorted((FIXTURES / "metrics").rglob("*.txt")),
        "log": sorted((FIXTURES / "logs").glob("*.log")),
    }[target]
    kept = sorted((FIXTURES / "fuzz" / target).glob("*"))
    for path in [*sources, *kept]:
        data = path.read_bytes()
        for i in range(0, max(len(data), 1), SEED_BYTES):  # long pages: each slice a seed
            name = f"seed-{path.parent.name}-{path.name}-{i // SEED_BYTES}"
            (corpus / name).write_bytes(data[i : i + SEED_BYTES])


def main() -> None:
    if len(sys.argv) < 3 or sys.argv[1] not in ("page", "log"):
        sys.exit(__doc__)
    target, corpus = sys.argv[1], Path(sys.argv[2])
    corpus.mkdir(parents=True, exist_ok=True)
    seed(corpus, target)
    crashes = corpus.parent / "crashes"
    crashes.mkdir(exist_ok=True)
    dictionary = corpus.parent / f"{target}.dict"
    write_dictionary(PAGE_WORDS if target == "page" else LOG_WORDS, dictionary)
    check = check_page_every_way if target == "page" else check_log
    argv = [
        sys.argv[0],
        str(corpus),
        f"-dict={dictionary}",
        f"-artifact_prefix={crashes}/{target}-",
        f"-max_len={SEED_BYTES}",
        "-timeout=10",  # an input that takes seconds is a finding (regex backtracking)
        "-rss_limit_mb=2048",
        "-print_final_stats=1",
        *sys.argv[3:],
    ]
    atheris.Setup(argv, lambda data: check(data))
    atheris.Fuzz()


if __name__ == "__main__":
    main()
