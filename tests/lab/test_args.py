"""vLLM's args changed by flag name: tables of forms, then a check against vLLM's own parser."""

from __future__ import annotations

import argparse
from typing import Any

import pytest
from vllm_glassbox.lab.backends.args import REMOVE, SHORT_ALIASES, apply_overrides, flag_value
from vllm_glassbox.lab.backends.backend import FlagOverrides

SPEC = '{"method":"ngram","num_speculative_tokens":5,"prompt_lookup_max":4,"prompt_lookup_min":1}'

# (what it shows, original args, overrides, expected args)
CASES: list[tuple[str, list[str], dict[str, Any], list[str]]] = [
    (
        "no override keeps every arg",
        ["/m", "--port", "8000", "--enforce-eager"],
        {},
        ["/m", "--port", "8000", "--enforce-eager"],
    ),
    (
        "'--flag value' is replaced in place",
        ["--model", "/m", "--max-model-len", "2048", "--port", "8000"],
        {"--max-model-len": "4096"},
        ["--model", "/m", "--max-model-len", "4096", "--port", "8000"],
    ),
    (
        "'--flag=value' keeps its form",
        ["/m", "--max-model-len=2048", "--port=8000"],
        {"--max-model-len": "4096"},
        ["/m", "--max-model-len=4096", "--port=8000"],
    ),
    (
        "an underscore spelling in the args is the same flag",
        ["/m", "--max_model_len", "2048", "--port", "8000"],
        {"--max-model-len": "4096"},
        ["/m", "--max-model-len", "4096", "--port", "8000"],
    ),
    (
        "an underscore spelling in the override is the same flag",
        ["/m", "--max-model-len", "2048"],
        {"--max_model_len": "4096"},
        ["/m", "--max_model_len", "4096"],
    ),
    (
        "a missing flag is added at the end as --flag=value",
        ["/m", "--port", "8000"],
        {"--gpu-memory-utilization": "0.2"},
        ["/m", "--port", "8000", "--gpu-memory-utilization=0.2"],
    ),
    (
        "a missing flag without value is added bare",
        ["/m", "--port", "8000"],
        {"--enforce-eager": None},
        ["/m", "--port", "8000", "--enforce-eager"],
    ),
    (
        "a flag without value is removed, its neighbours stay",
        ["/m", "--enforce-eager", "--max-model-len", "2048"],
        {"--enforce-eager": REMOVE},
        ["/m", "--max-model-len", "2048"],
    ),
    (
        "a flag is removed with its value",
        ["/m", "--gpu-memory-utilization", "0.9", "--port", "8000"],
        {"--gpu-memory-utilization": REMOVE},
        ["/m", "--port", "8000"],
    ),
    (
        "removing an absent flag changes nothing",
        ["/m", "--port", "8000"],
        {"--enforce-eager": REMOVE},
        ["/m", "--port", "8000"],
    ),
    (
        "a flag without value gets a value",
        ["/m", "--enforce-eager", "--port", "8000"],
        {"--enforce-eager": "true"},
        ["/m", "--enforce-eager=true", "--port", "8000"],
    ),
    (
        "a flag with a value becomes a flag without value",
        ["/m", "--max-num-seqs", "8", "--port", "8000"],
        {"--max-num-seqs": None},
        ["/m", "--max-num-seqs", "--port", "8000"],
    ),
    (
        "--speculative-config's JSON is replaced whole",
        ["/m", "--speculative-config", SPEC, "--port", "8000"],
        {"--speculative-config": '{"method":"ngram","num_speculative_tokens":3}'},
        [
            "/m",
            "--speculative-config",
            '{"method":"ngram","num_speculative_tokens":3}',
            "--port",
            "8000",
        ],
    ),
    (
        "--speculative-config given as dotted keys is replaced by one JSON value",
        [
            "/m",
            "--speculative-config.method",
            "ngram",
            "--port",
            "8000",
            "--speculative-config.num_speculative_tokens=5",
        ],
        {"--speculative-config": SPEC},
        ["/m", "--speculative-config", SPEC, "--port", "8000"],
    ),
    (
        "removing --speculative-config removes its dotted keys too",
        ["/m", "--speculative-config.method=ngram", "--speculative-config", SPEC, "-tp", "1"],
        {"--speculative-config": REMOVE},
        ["/m", "-tp", "1"],
    ),
    (
        "'vllm serve MODEL': --model replaces the positional model",
        ["vllm", "serve", "/m", "--enforce-eager"],
        {"--model": "/n"},
        ["vllm", "serve", "/n", "--enforce-eager"],
    ),
    (
        "'vllm serve MODEL': other flags leave the model alone",
        ["vllm", "serve", "/m", "--max-model-len", "2048"],
        {"--max-model-len": "1024"},
        ["vllm", "serve", "/m", "--max-model-len", "1024"],
    ),
    (
        "a positional model first (entrypoint vllm serve) is the model",
        ["/m", "--port", "8000"],
        {"--model": "/n"},
        ["/n", "--port", "8000"],
    ),
    (
        "'--model X' is replaced as a flag",
        ["--port", "8000", "--model", "/m"],
        {"--model": "/n"},
        ["--port", "8000", "--model", "/n"],
    ),
    (
        "a positional model and a stray --model: one model is left",
        ["vllm", "serve", "/m", "--model", "/x", "--port", "1"],
        {"--model": "/n"},
        ["vllm", "serve", "/n", "--port", "1"],
    ),
    (
        "'python -m module' is a program, not a model",
        ["python3", "-m", "vllm.entrypoints.openai.api_server", "--model", "/m"],
        {"--port": "9000"},
        ["python3", "-m", "vllm.entrypoints.openai.api_server", "--model", "/m", "--port=9000"],
    ),
    (
        "--no-flag is the same setting as --flag",
        ["/m", "--no-enable-prefix-caching", "--port", "1"],
        {"--enable-prefix-caching": None},
        ["/m", "--enable-prefix-caching", "--port", "1"],
    ),
    (
        "removing --flag also removes --no-flag",
        ["/m", "--no-enable-prefix-caching"],
        {"--enable-prefix-caching": REMOVE},
        ["/m"],
    ),
    (
        "a short alias is the same flag as its long name",
        ["/m", "-tp", "2", "-q", "awq"],
        {"--tensor-parallel-size": "1", "--quantization": REMOVE},
        ["/m", "--tensor-parallel-size", "1"],
    ),
    ("-sc is --speculative-config", ["/m", "-sc", SPEC], {"--speculative-config": REMOVE}, ["/m"]),
    (
        "-O3 is --optimization-level",
        ["/m", "-O3", "--port", "1"],
        {"--optimization-level": "0"},
        ["/m", "--optimization-level=0", "--port", "1"],
    ),
    (
        "duplicates collapse into the first occurrence (vLLM took the last)",
        ["/m", "--max-model-len", "1", "--port", "2", "--max_model_len=3"],
        {"--max-model-len": "4"},
        ["/m", "--max-model-len", "4", "--port", "2"],
    ),
    (
        "every value of a multi-value flag is replaced",
        ["/m", "--served-model-name", "a", "b", "--port", "1"],
        {"--served-model-name": "c"},
        ["/m", "--served-model-name", "c", "--port", "1"],
    ),
    (
        "a negative number is a value, not a flag",
        ["/m", "--seed", "-1", "--port", "1"],
        {"--seed": "7"},
        ["/m", "--seed", "7", "--port", "1"],
    ),
    (
        "a value that looks like a flag is glued with '='",
        ["/m", "--hf-overrides", "x", "--port", "1"],
        {"--hf-overrides": "-weird"},
        ["/m", "--hf-overrides=-weird", "--port", "1"],
    ),
    (
        "new flags go before '--' and what follows it is left alone",
        ["/m", "--port", "1", "--", "--enforce-eager"],
        {"--max-model-len": "8", "--enforce-eager": REMOVE},
        ["/m", "--port", "1", "--max-model-len=8", "--", "--enforce-eager"],
    ),
    (
        "unknown short flags and their values keep their place",
        ["/m", "-x", "v", "--port", "1"],
        {"--port": "2"},
        ["/m", "-x", "v", "--port", "2"],
    ),
    (
        "several overrides at once keep the order of everything else",
        [
            "vllm",
            "serve",
            "/m",
            "--quantization",
            "awq",
            "--gpu-memory-utilization=0.9",
            "--enforce-eager",
            "--port",
            "8000",
        ],
        {
            "--gpu-memory-utilization": "0.2",
            "--quantization": REMOVE,
            "--enforce-eager": REMOVE,
            "--speculative-config": SPEC,
        },
        [
            "vllm",
            "serve",
            "/m",
            "--gpu-memory-utilization=0.2",
            "--port",
            "8000",
            f"--speculative-config={SPEC}",
        ],
    ),
]


@pytest.mark.parametrize(
    ("args", "overrides", "expected"), [c[1:] for c in CASES], ids=[c[0] for c in CASES]
)
def test_apply_overrides(args: list[str], overrides: FlagOverrides, expected: list[str]) -> None:
    before = list(args)
    assert apply_overrides(args, overrides) == expected
    assert args == before  # the input is not changed


def test_applying_the_same_overrides_twice_changes_nothing_more() -> None:
    args = ["vllm", "serve", "/m", "--max_model_len", "2048", "-tp", "2", "--enforce-eager"]
    overrides = {
        "--max-model-len": "4096",
        "--tensor-parallel-size": "1",
        "--enforce-eager": REMOVE,
        "--kv-cache-memory-bytes": "8388608",
    }
    once = apply_overrides(args, overrides)
    assert apply_overrides(once, overrides) == once


BAD_OVERRIDES: list[tuple[dict[str, Any], str]] = [
    ({"max-model-len": "1"}, "'max-model-len' is not a long flag name"),
    ({"-tp": "1"}, "'-tp' is not a long flag name"),
    ({"--": "1"}, "'--' is not a long flag name"),
    ({"--max model len": "1"}, "'--max model len' is not a long flag name"),
    ({"--port=1": None}, "'--port=1' is not a long flag name"),
    ({"--no-": None}, "'--no-' is not a long flag name"),
    (
        {"--speculative-config.method": "ngram"},
        "'--speculative-config.method': dotted keys are not supported; override the whole "
        "--speculative-config",
    ),
    ({"--max-model-len": 2048}, "'--max-model-len': value must be a string, None"),
    ({"--enforce-eager": True}, "'--enforce-eager': value must be a string, None"),
    ({"--no-enforce-eager": "1"}, "'--no-enforce-eager' is a negation and takes no value"),
    ({"--model": REMOVE}, "'--model': the model cannot be removed"),
    ({"--model": None}, "'--model': the model cannot be removed or left without a value"),
    (
        {"--max-model-len": "1", "--max_model_len": "2"},
        "'--max-model-len' and '--max_model_len' set the same thing",
    ),
    (
        {"--enforce-eager": None, "--no-enforce-eager": None},
        "'--enforce-eager' and '--no-enforce-eager' set the same thing",
    ),
]


@pytest.mark.parametrize(("overrides", "message"), BAD_OVERRIDES, ids=[m for _, m in BAD_OVERRIDES])
def test_bad_overrides_are_refused_naming_the_flag(overrides: FlagOverrides, message: str) -> None:
    with pytest.raises(ValueError) as raised:
        apply_overrides(["/m", "--port", "1"], overrides)
    assert message in str(raised.value)


VALUES: list[tuple[list[str], str, str | None]] = [
    (["/m", "--max-model-len", "2048"], "--max-model-len", "2048"),
    (["/m", "--max_model_len=2048"], "--max-model-len", "2048"),
    (["/m", "--max-model-len", "2048"], "--max_model_len", "2048"),
    (["/m", "--enforce-eager", "--port", "1"], "--enforce-eager", ""),
    (["/m", "--port", "1"], "--enforce-eager", None),
    (["/m", "--port", "1", "--port", "2"], "--port", "2"),
    (["/m", "--enforce-eager", "--no-enforce-eager"], "--enforce-eager", None),
    (["/m", "--no-enforce-eager", "--enforce-eager"], "--enforce-eager", ""),
    (["/m", "--no-enforce-eager"], "--no-enforce-eager", ""),
    (["vllm", "serve", "/m", "--port", "1"], "--model", "/m"),
    (["/m", "--port", "1"], "--model", "/m"),
    (["--port", "1", "--model", "/m"], "--model", "/m"),
    (["python3", "-m", "vllm.entrypoints.openai.api_server", "--port", "1"], "--model", None),
    (["/m", "--served-model-name", "a", "b"], "--served-model-name", "a b"),
    (["/m", "--seed", "-1"], "--seed", "-1"),
    (["/m", "-tp", "2"], "--tensor-parallel-size", "2"),
    (["/m", "--speculative-config", SPEC], "--speculative-config", SPEC),
    (
        [
            "/m",
            "--speculative-config.method",
            "ngram",
            "--speculative-config.num_speculative_tokens=5",
        ],
        "--speculative-config",
        '{"method": "ngram", "num_speculative_tokens": 5}',
    ),
    (["/m", "--port", "1", "--", "--enforce-eager"], "--enforce-eager", None),
]


@pytest.mark.parametrize(("args", "name", "expected"), VALUES)
def test_flag_value(args: list[str], name: str, expected: str | None) -> None:
    assert flag_value(args, name) == expected


def test_flag_value_refuses_a_bad_name() -> None:
    with pytest.raises(ValueError, match="'tp' is not a long flag name"):
        flag_value(["/m"], "tp")


# -- against vLLM's own parser (the installed vLLM CPU build; no server is started) ------


@pytest.fixture(scope="module")
def vllm_parser() -> argparse.ArgumentParser:
    cli_args = pytest.importorskip("vllm.entrypoints.launchers.cli_args")
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    parser: argparse.ArgumentParser = cli_args.make_arg_parser(FlexibleArgumentParser())
    return parser


def _parsed(parser: argparse.ArgumentParser, args: list[str]) -> dict[str, Any]:
    return dict(vars(parser.parse_args(args)))


VLLM_CASES: list[tuple[list[str], dict[str, Any], dict[str, Any]]] = [
    # (original args, overrides, every setting that must differ afterwards -> its value)
    (
        [
            "/m",
            "--max_model_len",
            "2048",
            "-tp",
            "2",
            "--enforce-eager",
            "--seed",
            "-1",
            "--served-model-name",
            "a",
            "b",
            "--speculative-config.method",
            "ngram",
        ],
        {
            "--max-model-len": "4096",
            "--tensor-parallel-size": "1",
            "--enforce-eager": REMOVE,
            "--speculative-config": SPEC,
            "--kv-cache-memory-bytes": "8388608",
        },
        {
            "max_model_len": 4096,
            "tensor_parallel_size": 1,
            "enforce_eager": False,
            "speculative_config": {
                "method": "ngram",
                "num_speculative_tokens": 5,
                "prompt_lookup_max": 4,
                "prompt_lookup_min": 1,
            },
            "kv_cache_memory_bytes": 8388608,
        },
    ),
    (
        ["/m", "--no-enable-prefix-caching", "-q", "awq", "--gpu-memory-utilization=0.9"],
        {
            "--enable-prefix-caching": None,
            "--quantization": REMOVE,
            "--model": "/n",
            "--gpu-memory-utilization": "0.2",
        },
        {
            "enable_prefix_caching": True,
            "quantization": None,
            "model_tag": "/n",
            "gpu_memory_utilization": 0.2,
        },
    ),
    (
        ["/m", "-sc", SPEC, "-O3", "--served-model-name", "a", "b", "--port", "8000"],
        {
            "--speculative-config": REMOVE,
            "--optimization-level": "0",
            "--served-model-name": "tiny",
        },
        {"speculative_config": None, "optimization_level": "0", "served_model_name": ["tiny"]},
    ),
]


@pytest.mark.vllm
@pytest.mark.parametrize(("args", "overrides", "changed"), VLLM_CASES)
def test_vllm_sees_exactly_the_overridden_settings_change(
    vllm_parser: argparse.ArgumentParser,
    args: list[str],
    overrides: FlagOverrides,
    changed: dict[str, Any],
) -> None:
    before = _parsed(vllm_parser, args)
    after = _parsed(vllm_parser, apply_overrides(args, overrides))
    assert {k: after[k] for k in after if after[k] != before[k]} == changed


@pytest.mark.vllm
def test_flag_value_reads_what_vllm_reads(vllm_parser: argparse.ArgumentParser) -> None:
    args = [
        "/m",
        "--max_model_len=2048",
        "-tp",
        "2",
        "--seed",
        "-1",
        "--speculative-config.method",
        "ngram",
        "--served-model-name",
        "tiny",
    ]
    parsed = _parsed(vllm_parser, args)
    assert int(flag_value(args, "--max-model-len") or 0) == parsed["max_model_len"]
    assert int(flag_value(args, "--tensor-parallel-size") or 0) == parsed["tensor_parallel_size"]
    assert int(flag_value(args, "--seed") or 0) == parsed["seed"]
    assert flag_value(args, "--model") == parsed["model_tag"]
    assert (flag_value(args, "--served-model-name") or "").split() == parsed["served_model_name"]


@pytest.mark.vllm
def test_short_aliases_and_negations_match_vllms_parser(
    vllm_parser: argparse.ArgumentParser,
) -> None:
    shorts: dict[str, str] = {}
    for action in vllm_parser._actions:
        long_names = [o for o in action.option_strings if o.startswith("--")]
        for option in action.option_strings:
            if not option.startswith("--") and option != "-h":
                shorts[option] = action.dest.replace("_", "-")
        for name in long_names:
            if name.startswith("--no-"):  # --no-X comes with --X and sets the same thing
                assert f"--{name[5:]}" in long_names, name
                assert action.dest.replace("_", "-") == name[5:], name
    assert shorts == dict(SHORT_ALIASES)
