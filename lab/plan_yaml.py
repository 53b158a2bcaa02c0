"""Reading a plan's untyped YAML data with paths, for the plan and every experiment kind.

A `Node` is a mapping of the plan at a path (`phases[1].variants[0]`); every read
records a problem with its path instead of raising, so that one `PlanError` can list
them all. The converters check one value each and say what it must be; `read_flags`,
`read_request` and `unique` read the shapes every phase kind shares.

Flags are given by name; their YAML values mean:

    "--max-model-len": 2048          -> --max-model-len 2048
    "--enforce-eager": null | true   -> --enforce-eager (a flag without value)
    "--gpu-memory-utilization": false  -> remove the flag
    "--speculative-config": {method: ngram, ...}  -> compact JSON
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

from vllm_glassbox.core.units import parse_duration
from vllm_glassbox.lab.backends.backend import REMOVE, FlagOverrides, FlagValue

_FLAG_NAME = re.compile(r"^--[a-z0-9]+(?:-[a-z0-9]+)*$")

T = TypeVar("T")
MISSING = object()


class Node:
    """A mapping of the plan at `path`; every read records problems instead of raising."""

    def __init__(self, data: object, path: str, problems: list[str]) -> None:
        self.path = path
        self.problems = problems
        self.seen: set[str] = set()
        if isinstance(data, Mapping):
            self.data: Mapping[str, object] = data
        else:
            self.data = {}
            if data is not None:
                self.problem("", f"must be a mapping, not {kind_name(data)}")

    def at(self, key: str | int) -> str:
        if isinstance(key, int):
            return f"{self.path}[{key}]"
        return f"{self.path}.{key}" if self.path else key

    def problem(self, key: str | int, message: str) -> None:
        where = self.at(key) if key != "" else self.path or "plan"
        self.problems.append(f"{where}: {message}")

    def raw(self, key: str) -> object:
        self.seen.add(key)
        return self.data.get(key, MISSING)

    def get(self, key: str, convert: Callable[[object], T], default: T | object = MISSING) -> T:
        """`convert(value)`, or the default when absent; a missing required key is a problem."""
        value = self.raw(key)
        if value is MISSING or value is None:
            if default is MISSING:
                self.problem(key, "required")
                return None  # type: ignore[return-value]  # only read after problems are raised
            return default  # type: ignore[return-value]
        try:
            return convert(value)
        except (TypeError, ValueError) as e:
            self.problem(key, str(e))
            return default if default is not MISSING else None  # type: ignore[return-value]

    def child(self, key: str) -> Node:
        value = self.raw(key)
        return Node(None if value is MISSING else value, self.at(key), self.problems)

    def items(self, key: str) -> list[Node]:
        value = self.raw(key)
        if value is MISSING or value is None:
            return []
        if not isinstance(value, list):
            self.problem(key, f"must be a list, not {kind_name(value)}")
            return []
        return [Node(v, f"{self.at(key)}[{i}]", self.problems) for i, v in enumerate(value)]

    def each(self, key: str, read: Callable[[Node], T]) -> list[T]:
        """`read` of every mapping in the list at `key`, each checked for unknown keys."""
        out = []
        for item in self.items(key):
            out.append(read(item))
            item.done()
        return out

    def done(self) -> None:
        for key in self.data:
            if key not in self.seen:
                known = ", ".join(sorted(self.seen))
                self.problem(str(key), f"unknown key (known here: {known})")


def kind_name(value: object) -> str:
    return {dict: "a mapping", list: "a list", str: "a string", bool: "a boolean"}.get(
        type(value), type(value).__name__
    )


# --- converters: one value each -----------------------------------------------------------


def text(value: object) -> str:
    if not isinstance(value, str) or not value.strip():
        raise ValueError(f"must be a non-empty string, not {value!r}")
    return value


def positive_int(value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ValueError(f"must be a positive whole number, not {value!r}")
    return value


def count(value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"must be a whole number ≥ 0, not {value!r}")
    return value


def non_negative(value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not value >= 0:
        raise ValueError(f"must be a number ≥ 0, not {value!r}")
    return float(value)


def positive_number(value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
        raise ValueError(f"must be a number > 0, not {value!r}")
    return float(value)


def ratio(value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value < 1:
        raise ValueError(f"must be a number between 0 and 1 (0.1 is 10 %), not {value!r}")
    return float(value)


def fraction(value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value <= 1:
        raise ValueError(f"must be a number in (0, 1], not {value!r}")
    return float(value)


def duration(value: object) -> float:
    if not isinstance(value, str | int | float) or isinstance(value, bool):
        raise ValueError(f"not a duration: {value!r} (use e.g. 500ms, 5s, 1m or 2.5)")
    return parse_duration(value)


def boolean(value: object) -> bool:
    if not isinstance(value, bool):
        raise ValueError(f"must be true or false, not {value!r}")
    return value


def request_fields(value: object, reserved: set[str]) -> dict[str, Any]:
    """A mapping of completion request fields, none of them `reserved` (set elsewhere)."""
    if not isinstance(value, Mapping) or not all(isinstance(k, str) for k in value):
        raise ValueError(f"must be a mapping of request fields, not {value!r}")
    clash = sorted(reserved & set(value))
    if clash:
        raise ValueError(f"{', '.join(clash)} cannot be set here (use the phase's own keys)")
    return dict(value)


def _extra(value: object) -> dict[str, Any]:
    """A phase's extra request fields (its own keys set the rest)."""
    return request_fields(value, {"model", "prompt", "max_tokens", "temperature", "stream"})


# --- the shapes every phase kind reads ----------------------------------------------------


def flag_value(value: object) -> FlagValue:
    """A YAML value as a vLLM flag value (see the module docstring)."""
    if value is None or value is True:
        return None
    if value is False:
        return REMOVE
    if isinstance(value, str):
        return value
    if isinstance(value, int | float):
        return str(value)
    if isinstance(value, dict | list):
        return json.dumps(value, separators=(",", ":"))
    raise ValueError(f"unsupported flag value {value!r}")


def read_flags(node: Node, key: str, defaults: FlagOverrides | None = None) -> dict[str, FlagValue]:
    """`--flag: value` overrides of vLLM's args at `key`, on top of `defaults`."""
    merged: dict[str, FlagValue] = dict(defaults or {})
    value = node.raw(key)
    if value is MISSING or value is None:
        return merged
    if not isinstance(value, Mapping):
        node.problem(key, f"must be a mapping of --flag: value, not {kind_name(value)}")
        return merged
    for name, raw in value.items():
        where = f"{node.at(key)}.{name}"
        if not isinstance(name, str) or not _FLAG_NAME.match(name):
            node.problems.append(
                f"{where}: malformed flag name {name!r} (use --lowercase-with-dashes)"
            )
            continue
        if name == "--model":
            node.problems.append(f"{where}: set the model with the `model` key")
            continue
        try:
            merged[name] = flag_value(raw)
        except ValueError as e:
            node.problems.append(f"{where}: {e}")
    return merged


@dataclass(frozen=True)
class Request:
    """One completion request's body (besides "model")."""

    prompt: str
    max_tokens: int
    temperature: float
    extra: Mapping[str, Any] = field(default_factory=dict)  # repetition_penalty, ignore_eos…

    def body(self, model: str, **format_args: object) -> dict[str, Any]:
        prompt = self.prompt.format(**format_args) if format_args else self.prompt
        return {
            "model": model,
            "prompt": prompt,
            "max_tokens": self.max_tokens,
            "temperature": self.temperature,
            **self.extra,
        }


def read_request(node: Node, prompt: str, max_tokens: int, temperature: float) -> Request:
    """A phase's request: its keys, with the kind's defaults."""
    return Request(
        prompt=node.get("prompt", text, prompt),
        max_tokens=node.get("max_tokens", positive_int, max_tokens),
        temperature=node.get("temperature", non_negative, temperature),
        extra=node.get("extra", _extra, {}),
    )


def unique(node: Node, key: str, names: list[str]) -> None:
    dupes = sorted({n for n in names if n is not None and names.count(n) > 1})
    if dupes:
        node.problem(key, f"duplicate names {dupes}")
