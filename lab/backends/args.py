"""vLLM's command-line arguments, changed by flag name, never by position.

A phase asks for "the original args, with --gpu-memory-utilization 0.2 and without
--enforce-eager". The original args come from a Deployment or a plan and may be written
in any form vLLM's parser accepts, so this module reads them the way vLLM does:

- `--flag=value`, `--flag value`, `--flag` (no value) and `--flag v1 v2` (several values);
- `--flag_name` is `--flag-name` (vLLM turns underscores into dashes before the first `.`);
- `--no-flag` sets the same thing as `--flag` (vLLM's boolean flags come in pairs);
- vLLM's short aliases (`-tp 2`, `-sc '{...}'`, `-O3`) name the same thing as the long flag;
- `--speculative-config.method ngram` (a dotted key) is part of `--speculative-config`;
- the model: `vllm serve MODEL ...`, a positional `MODEL` first (an image whose entrypoint
  is `vllm serve`), or `--model MODEL`; `python -m vllm.entrypoints... --model M` works too.

A token that is not a flag belongs to the flag before it, except the positional model,
which vLLM documents as the first argument (`vllm serve <model> [options]`). Every other
token keeps its place; an overridden flag keeps the place of its first occurrence and
its later duplicates go, and a new flag is added at the end as `--flag=value`.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from vllm_glassbox.lab.backends.backend import REMOVE, FlagOverrides, FlagValue, _Remove

# vLLM's short options and the long flag each stands for (vLLM 0.32's parser; a test
# checks this table against the installed vLLM).
SHORT_ALIASES: Mapping[str, str] = {
    "-asc": "api-server-count",
    "-q": "quantization",
    "-pp": "pipeline-parallel-size",
    "-n": "nnodes",
    "-r": "node-rank",
    "-tp": "tensor-parallel-size",
    "-dcp": "decode-context-parallel-size",
    "-pcp": "prefill-context-parallel-size",
    "-dp": "data-parallel-size",
    "-dpn": "data-parallel-rank",
    "-dpr": "data-parallel-start-rank",
    "-dpl": "data-parallel-size-local",
    "-dpa": "data-parallel-address",
    "-dpp": "data-parallel-rpc-port",
    "-dpb": "data-parallel-backend",
    "-dph": "data-parallel-hybrid-lb",
    "-dpe": "data-parallel-external-lb",
    "-dpm": "data-parallel-multi-port-external-lb",
    "-ep": "enable-expert-parallel",
    "-sc": "speculative-config",
    "-dc": "diffusion-config",
    "-cc": "compilation-config",
    "-ac": "attention-config",
}
_OPTIMIZATION = "optimization-level"  # -O3, -O=3, -O 3
_MODEL = "model"

_FLAG_NAME = re.compile(r"--[A-Za-z0-9][A-Za-z0-9_-]*")
_NEGATIVE_NUMBER = re.compile(r"-\.?\d")


def _is_flag(token: str) -> bool:
    return token.startswith("-") and token != "-" and not _NEGATIVE_NUMBER.match(token)


def _dest(long_name: str) -> str:
    """`--max_model_len` -> `max-model-len`; `--no-enforce-eager` -> `enforce-eager`."""
    key = long_name[2:].replace("_", "-")
    return key.removeprefix("no-")


@dataclass(frozen=True)
class _Occurrence:
    """One place in the args that sets a flag: tokens args[start:end]."""

    start: int
    end: int
    dest: str
    values: tuple[str, ...]  # the inline value (after '=') first, then separate tokens
    inline: bool  # written as --flag=value
    negated: bool = False  # --no-flag
    sub_key: str | None = None  # --speculative-config.method: "method"
    positional: bool = False  # the positional model


def _model_position(args: Sequence[str]) -> tuple[int, int | None]:
    """(index of the first option, index of the positional model or None)."""
    if not args or _is_flag(args[0]):
        return 0, None
    leading = 0
    while leading < len(args) and not _is_flag(args[leading]):
        leading += 1
    if "serve" in args[:leading]:  # vllm serve [MODEL] ...
        after = args.index("serve") + 1
        return after, (after if after < leading else None)
    if len(args) >= 3 and args[1] == "-m" and not _is_flag(args[2]):  # python -m module
        return 3, None
    return 0, 0  # the image's entrypoint is `vllm serve`: the args start with the model


def _scan(args: Sequence[str]) -> list[_Occurrence]:
    """Every occurrence of a flag vLLM would see, in order (up to a `--`)."""
    first, model = _model_position(args)
    found: list[_Occurrence] = []
    if model is not None:
        found.append(_Occurrence(model, model + 1, _MODEL, (args[model],), False, positional=True))
    i = first if model is None else max(first, model + 1)
    while i < len(args) and args[i] != "--":
        token = args[i]
        end = i + 1
        while end < len(args) and args[end] != "--" and not _is_flag(args[end]):
            end += 1
        if _is_flag(token):
            name, eq, inline = token.partition("=")
            separate = tuple(args[i + 1 : end])
            values = ((inline,) if eq else ()) + separate
            if name.startswith("--"):
                key, dot, sub_key = name.partition(".")
                found.append(
                    _Occurrence(
                        i,
                        end,
                        _dest(key),
                        values,
                        bool(eq),
                        negated=key[2:].replace("_", "-").startswith("no-"),
                        sub_key=sub_key if dot else None,
                    )
                )
            elif name.startswith("-O") and name != "-O" and not eq:
                found.append(_Occurrence(i, end, _OPTIMIZATION, (name[2:], *separate), True))
            elif name == "-O" or name in SHORT_ALIASES:
                dest = _OPTIMIZATION if name == "-O" else SHORT_ALIASES[name]
                found.append(_Occurrence(i, end, dest, values, bool(eq)))
        i = end
    return found


def _check_name(name: str) -> str:
    if not isinstance(name, str):
        raise ValueError(f"flag name {name!r} is not a string")
    if "." in name and _FLAG_NAME.fullmatch(name.partition(".")[0]):
        raise ValueError(
            f"flag {name!r}: dotted keys are not supported; "
            f"override the whole {name.partition('.')[0]} with a JSON value"
        )
    if not _FLAG_NAME.fullmatch(name) or name in ("--no-", "--no_"):
        raise ValueError(
            f"flag {name!r} is not a long flag name: expected '--' then letters, digits, "
            "'-' or '_' (e.g. '--max-model-len')"
        )
    return _dest(name)


def _checked(overrides: FlagOverrides) -> dict[str, tuple[str, FlagValue]]:
    """dest -> (flag as the caller wrote it, value); raises ValueError naming the flag."""
    checked: dict[str, tuple[str, FlagValue]] = {}
    for name, value in overrides.items():
        dest = _check_name(name)
        if dest in checked:
            raise ValueError(f"flags {checked[dest][0]!r} and {name!r} set the same thing")
        if not (value is None or isinstance(value, str | _Remove)):
            raise ValueError(
                f"flag {name!r}: value must be a string, None (a flag without value) or "
                f"REMOVE, not {type(value).__name__} {value!r}"
            )
        if isinstance(value, str) and name[2:].replace("_", "-").startswith("no-"):
            raise ValueError(f"flag {name!r} is a negation and takes no value (got {value!r})")
        if dest == _MODEL and not isinstance(value, str):
            raise ValueError(f"flag {name!r}: the model cannot be removed or left without a value")
        checked[dest] = (name, value)
    return checked


def _render(name: str, value: str | None, like: _Occurrence | None) -> list[str]:
    if value is None:
        return [name]
    if like is not None and like.positional:
        return [value]
    separate = like is not None and not like.inline and bool(like.values)
    # A value that looks like a flag must stay glued to its name.
    return [name, value] if separate and not _is_flag(value) else [f"{name}={value}"]


def apply_overrides(args: Sequence[str], overrides: FlagOverrides) -> list[str]:
    """`args` with each flag of `overrides` set, added or removed (see the module doc)."""
    wanted = _checked(overrides)
    occurrences: dict[str, list[_Occurrence]] = {}
    for occurrence in _scan(args):
        occurrences.setdefault(occurrence.dest, []).append(occurrence)

    replaced: dict[int, list[str]] = {}  # start index -> tokens that take the span's place
    spans: dict[int, int] = {}  # start index -> end index of each span that changes
    added: list[str] = []
    for dest, (name, value) in wanted.items():
        present = occurrences.get(dest, [])
        if isinstance(value, _Remove):
            for occurrence in present:
                spans[occurrence.start], replaced[occurrence.start] = occurrence.end, []
            continue
        if not present:
            added += _render(name, value, None)
            continue
        first, *later = present
        spans[first.start], replaced[first.start] = first.end, _render(name, value, first)
        for occurrence in later:
            spans[occurrence.start], replaced[occurrence.start] = occurrence.end, []

    out: list[str] = []
    i = 0
    while i < len(args):
        if args[i] == "--" and added:  # options end here: new flags go before
            out += added
            added = []
        if i in spans:
            out += replaced[i]
            i = spans[i]
        else:
            out.append(args[i])
            i += 1
    return out + added


def flag_value(args: Sequence[str], name: str) -> str | None:
    """The value vLLM would take for `name` from `args`, as text; None when not set.

    A flag without value gives ""; several values are joined by spaces; `--model` also
    finds a positional model; dotted keys (`--speculative-config.method x`) are merged
    into one JSON object, as vLLM does (it then prefers them over a plain JSON value).
    """
    dest = _check_name(name)
    present = [o for o in _scan(args) if o.dest == dest]
    dotted = [o for o in present if o.sub_key is not None]
    if dotted:
        merged: dict[str, Any] = {}
        for occurrence in dotted:
            *path, leaf = (occurrence.sub_key or "").split(".")
            node = merged
            for key in path:
                node = node.setdefault(key, {})
            raw = " ".join(occurrence.values)
            try:
                node[leaf] = json.loads(raw)
            except json.JSONDecodeError:
                node[leaf] = raw
        return json.dumps(merged)
    if not present:
        return None
    last = present[-1]
    if last.negated != name[2:].replace("_", "-").startswith("no-"):
        return None  # --no-flag after --flag (or the other way round): not set
    return " ".join(last.values)


__all__ = ["REMOVE", "SHORT_ALIASES", "apply_overrides", "flag_value"]
