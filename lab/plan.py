"""A lab plan: where vLLM runs and which experiments to run against it.

`parse_plan` is a pure function from the YAML's data to typed, frozen dataclasses. It
checks the whole plan before anything is started and raises one `PlanError` that lists
every problem with its path (`phases[1].variants[0].model: required`).

Each phase kind has the parameters of the article's run as defaults (SPEC §1); a plan
overrides any of them. Flags are given by name; their YAML values mean:

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
from pathlib import Path
from typing import Any, TypeVar

import yaml
from vllm_glassbox.exporter.weights import gpu_bandwidth
from vllm_glassbox.lab.backend import REMOVE, FlagOverrides, FlagValue
from vllm_glassbox.lab.tinymodel import PRECISIONS, VOCAB_SIZE, TinyModelSpec
from vllm_glassbox.units import parse_duration

KINDS = ("quantization", "kv-pressure", "spec-decode")
TINY_PREFIX = "tiny:"

# The article's run (SPEC §1): the defaults of each phase kind.
QUANTIZATION_PROMPT = "Kubernetes is"
KV_PRESSURE_PROMPT = "Write an extremely long and detailed essay, number {i}."
SPEC_DECODE_PROMPT = " ".join(["1 2 3 4 5"] * 10)
SPECULATIVE_CONFIG = "--speculative-config"
NGRAM_CONFIG = {
    "method": "ngram",
    "num_speculative_tokens": 5,
    "prompt_lookup_max": 4,
    "prompt_lookup_min": 1,
}

#: Largest random checkpoint a plan may ask to write; bigger models use vLLM's dummy loader.
MAX_CHECKPOINT_BYTES = 4 * 1024**3

_FLAG_NAME = re.compile(r"^--[a-z0-9]+(?:-[a-z0-9]+)*$")
_PHASE_NAME = re.compile(r"^[a-z0-9][a-z0-9_.-]*$")


class PlanError(ValueError):
    """Every problem of a plan, each as `path: message`."""

    def __init__(self, problems: list[str], source: str = "plan") -> None:
        self.problems = problems
        self.source = source
        super().__init__(f"{source}: {len(problems)} problem(s):\n  " + "\n  ".join(problems))


# --- the plan's types -------------------------------------------------------------------


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


@dataclass(frozen=True)
class Variant:
    name: str
    model: str
    flags: FlagOverrides
    fit: bool  # a point the TPOT-vs-weights line is fitted through


@dataclass(frozen=True)
class QuantizationPhase:
    name: str
    flags: FlagOverrides
    request: Request
    variants: tuple[Variant, ...]
    warmup: int  # unmeasured requests after each server start
    requests: int  # measured requests per variant and round (TPOT: their median)
    rounds: int  # every variant started and measured once per round, the order reversed
    tolerance: float  # a predicted variant within this error ratio is on the line
    kind: str = "quantization"

    def order(self) -> list[tuple[int, Variant]]:
        """(round, variant) in the order they run: A B C, C B A, A B C…, so that a drift
        of the machine over the run does not land on one variant."""
        out: list[tuple[int, Variant]] = []
        for r in range(self.rounds):
            out += [(r, v) for v in (self.variants if r % 2 == 0 else self.variants[::-1])]
        return out


@dataclass(frozen=True)
class KvPressurePhase:
    name: str
    model: str | None
    flags: FlagOverrides
    request: Request  # prompt may contain {i}, the request's index
    concurrency: int
    poll_seconds: float
    timeout_seconds: float
    saturation: float  # KV usage from which the pool counts as full
    warmup: int  # short requests before the flood, so one-time costs do not delay it
    kind: str = "kv-pressure"


@dataclass(frozen=True)
class SpecRun:
    label: str
    extra: Mapping[str, Any]
    baseline: bool  # the run the others' speed-up is measured against
    speculation: bool = True  # False: on a server started without --speculative-config


@dataclass(frozen=True)
class SpecDecodePhase:
    name: str
    model: str | None
    flags: FlagOverrides
    request: Request
    runs: tuple[SpecRun, ...]
    requests: int  # measured requests per run (TPOT: their median)
    kind: str = "spec-decode"

    @property
    def baseline(self) -> SpecRun:
        return next(r for r in self.runs if r.baseline)

    @property
    def flags_without_speculation(self) -> FlagOverrides:
        """The phase's flags for the runs without speculation (a server of their own)."""
        return {**self.flags, SPECULATIVE_CONFIG: REMOVE}


Phase = QuantizationPhase | KvPressurePhase | SpecDecodePhase


@dataclass(frozen=True)
class LocalTarget:
    """vLLM as a child process: its base args, and tiny models generated on demand."""

    args: tuple[str, ...]
    tiny_models: Mapping[str, TinyModelSpec]
    model_cache: Path
    startup_timeout_seconds: float
    env: Mapping[str, str] = field(default_factory=dict)  # for the server process
    exporter: bool = False  # run `glassbox exporter` beside each server (its series: report)


@dataclass(frozen=True)
class KubernetesTarget:
    """vLLM as a Deployment whose container args are patched per phase."""

    namespace: str
    deployment: str
    container: str
    url: str  # the Service, as reachable from the lab
    rollout_timeout_seconds: float


@dataclass(frozen=True)
class GrafanaTarget:
    url: str
    token_env: str  # name of the environment variable holding the API token


@dataclass(frozen=True)
class PeakBandwidth:
    """Where the peak memory bandwidth of the hardware comes from (bytes/s)."""

    bytes_per_second: float | None  # None: measured by a copy benchmark when the run starts
    source: str  # "the plan", "the H200 datasheet", "measure"

    @property
    def measure(self) -> bool:
        return self.bytes_per_second is None


@dataclass(frozen=True)
class Plan:
    name: str
    description: str
    local: LocalTarget | None
    kubernetes: KubernetesTarget | None
    grafana: GrafanaTarget | None
    phases: tuple[Phase, ...]
    peak_bandwidth: PeakBandwidth | None = None

    @property
    def server_starts(self) -> int:
        """How many times a run starts vLLM (the costly part of a run)."""
        starts = 0
        for phase in self.phases:
            if isinstance(phase, QuantizationPhase):
                starts += len(phase.variants) * phase.rounds
            elif isinstance(phase, SpecDecodePhase):
                starts += len({r.speculation for r in phase.runs})
            else:
                starts += 1
        return starts

    @property
    def backends(self) -> list[str]:
        return [n for n, t in (("kubernetes", self.kubernetes), ("local", self.local)) if t]


# --- reading untyped YAML data with paths ------------------------------------------------

T = TypeVar("T")
_MISSING = object()


class _Node:
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
                self.problem("", f"must be a mapping, not {_kind(data)}")

    def at(self, key: str | int) -> str:
        if isinstance(key, int):
            return f"{self.path}[{key}]"
        return f"{self.path}.{key}" if self.path else key

    def problem(self, key: str | int, message: str) -> None:
        where = self.at(key) if key != "" else self.path or "plan"
        self.problems.append(f"{where}: {message}")

    def raw(self, key: str) -> object:
        self.seen.add(key)
        return self.data.get(key, _MISSING)

    def get(self, key: str, convert: Callable[[object], T], default: T | object = _MISSING) -> T:
        """`convert(value)`, or the default when absent; a missing required key is a problem."""
        value = self.raw(key)
        if value is _MISSING or value is None:
            if default is _MISSING:
                self.problem(key, "required")
                return None  # type: ignore[return-value]  # only read after problems are raised
            return default  # type: ignore[return-value]
        try:
            return convert(value)
        except (TypeError, ValueError) as e:
            self.problem(key, str(e))
            return default if default is not _MISSING else None  # type: ignore[return-value]

    def child(self, key: str) -> _Node:
        value = self.raw(key)
        return _Node(None if value is _MISSING else value, self.at(key), self.problems)

    def items(self, key: str) -> list[_Node]:
        value = self.raw(key)
        if value is _MISSING or value is None:
            return []
        if not isinstance(value, list):
            self.problem(key, f"must be a list, not {_kind(value)}")
            return []
        return [_Node(v, f"{self.at(key)}[{i}]", self.problems) for i, v in enumerate(value)]

    def done(self) -> None:
        for key in self.data:
            if key not in self.seen:
                known = ", ".join(sorted(self.seen))
                self.problem(str(key), f"unknown key (known here: {known})")


def _kind(value: object) -> str:
    return {dict: "a mapping", list: "a list", str: "a string", bool: "a boolean"}.get(
        type(value), type(value).__name__
    )


def _text(value: object) -> str:
    if not isinstance(value, str) or not value.strip():
        raise ValueError(f"must be a non-empty string, not {value!r}")
    return value


def _positive_int(value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ValueError(f"must be a positive whole number, not {value!r}")
    return value


def _count(value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"must be a whole number ≥ 0, not {value!r}")
    return value


def _non_negative(value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not value >= 0:
        raise ValueError(f"must be a number ≥ 0, not {value!r}")
    return float(value)


def _positive_number(value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
        raise ValueError(f"must be a number > 0, not {value!r}")
    return float(value)


def _ratio(value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value < 1:
        raise ValueError(f"must be a number between 0 and 1 (0.1 is 10 %), not {value!r}")
    return float(value)


def _peak_bandwidth(value: object) -> PeakBandwidth:
    """`measure`, bytes/s (4.8e12), or a GPU of the exporter's datasheet table (H200)."""
    if isinstance(value, str) and value.strip() == "measure":
        return PeakBandwidth(None, "measure")
    if isinstance(value, int | float) and not isinstance(value, bool) and value > 0:
        return PeakBandwidth(float(value), "the plan")
    if isinstance(value, str):
        try:
            return PeakBandwidth(float(value), "the plan")
        except ValueError:
            pass
        try:
            return PeakBandwidth(gpu_bandwidth(value), f"the {value.strip()} datasheet")
        except ValueError as e:
            known = str(e).partition("known: ")[2].partition(" (")[0]
            raise ValueError(
                f"unknown GPU {value!r} (known: {known}); or give bytes per second, or `measure`"
            ) from None
    raise ValueError(f"must be `measure`, bytes per second or a GPU name, not {value!r}")


def _env(value: object) -> dict[str, str]:
    if not isinstance(value, Mapping) or not all(
        isinstance(k, str) and isinstance(v, str | int | float) and not isinstance(v, bool)
        for k, v in value.items()
    ):
        raise ValueError("must map variable names to strings")
    return {k: str(v) for k, v in value.items()}


def _fraction(value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value <= 1:
        raise ValueError(f"must be a number in (0, 1], not {value!r}")
    return float(value)


def _duration(value: object) -> float:
    if not isinstance(value, str | int | float) or isinstance(value, bool):
        raise ValueError(f"not a duration: {value!r} (use e.g. 500ms, 5s, 1m or 2.5)")
    return parse_duration(value)


def _boolean(value: object) -> bool:
    if not isinstance(value, bool):
        raise ValueError(f"must be true or false, not {value!r}")
    return value


def _request_fields(value: object, reserved: set[str]) -> dict[str, Any]:
    if not isinstance(value, Mapping) or not all(isinstance(k, str) for k in value):
        raise ValueError(f"must be a mapping of request fields, not {value!r}")
    clash = sorted(reserved & set(value))
    if clash:
        raise ValueError(f"{', '.join(clash)} cannot be set here (use the phase's own keys)")
    return dict(value)


def _extra(value: object) -> dict[str, Any]:
    """A phase's extra request fields (its own keys set the rest)."""
    return _request_fields(value, {"model", "prompt", "max_tokens", "temperature", "stream"})


def _run_extra(value: object) -> dict[str, Any]:
    """A spec run's request fields: on top of the phase's, the temperature included."""
    return _request_fields(value, {"model", "prompt", "max_tokens", "stream"})


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


def _flags(node: _Node, key: str, defaults: FlagOverrides | None = None) -> dict[str, FlagValue]:
    merged: dict[str, FlagValue] = dict(defaults or {})
    value = node.raw(key)
    if value is _MISSING or value is None:
        return merged
    if not isinstance(value, Mapping):
        node.problem(key, f"must be a mapping of --flag: value, not {_kind(value)}")
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


def _request(node: _Node, prompt: str, max_tokens: int, temperature: float) -> Request:
    return Request(
        prompt=node.get("prompt", _text, prompt),
        max_tokens=node.get("max_tokens", _positive_int, max_tokens),
        temperature=node.get("temperature", _non_negative, temperature),
        extra=node.get("extra", _extra, {}),
    )


# --- phases -------------------------------------------------------------------------------


def _quantization(node: _Node, name: str) -> QuantizationPhase:
    request = _request(node, QUANTIZATION_PROMPT, 128, 0.0)
    variants: list[Variant] = []
    for v in node.items("variants"):
        variants.append(
            Variant(
                name=v.get("name", _text),
                model=v.get("model", _text),
                flags=_flags(v, "flags"),
                fit=v.get("fit", _boolean, False),
            )
        )
        v.done()
    if not variants and node.raw("variants") is not _MISSING:
        node.problem("variants", "needs at least one variant")
    elif node.raw("variants") is _MISSING:
        node.problem("variants", "required")
    _unique(node, "variants", [v.name for v in variants])
    if not any(v.fit for v in variants):  # no point chosen: fit through every variant
        variants = [Variant(v.name, v.model, v.flags, True) for v in variants]
    return QuantizationPhase(
        name=name,
        flags=_flags(node, "flags"),
        request=request,
        variants=tuple(variants),
        warmup=node.get("warmup", _count, 1),
        requests=node.get("requests", _positive_int, 3),
        rounds=node.get("rounds", _positive_int, 1),
        tolerance=node.get("tolerance", _ratio, 0.10),
    )


def _kv_pressure(node: _Node, name: str) -> KvPressurePhase:
    request = _request(node, KV_PRESSURE_PROMPT, 4096, 0.7)
    try:
        request.prompt.format(i=0)
    except (KeyError, IndexError, ValueError) as e:
        node.problem("prompt", f"only {{i}} may be formatted into it ({e!r})")
    return KvPressurePhase(
        name=name,
        model=node.get("model", _text, None),
        flags=_flags(node, "flags", {"--gpu-memory-utilization": "0.20"}),
        request=request,
        concurrency=node.get("concurrency", _positive_int, 32),
        poll_seconds=node.get("poll", _duration, 5.0),
        timeout_seconds=node.get("timeout", _duration, 3600.0),
        saturation=node.get("saturation", _fraction, 0.95),
        warmup=node.get("warmup", _count, 1),
    )


def _spec_decode(node: _Node, name: str) -> SpecDecodePhase:
    request = _request(node, SPEC_DECODE_PROMPT, 256, 0.0)
    runs: list[SpecRun] = []
    for r in node.items("runs"):
        runs.append(
            SpecRun(
                label=r.get("label", _text),
                extra=r.get("extra", _run_extra, {}),
                baseline=r.get("baseline", _boolean, False),
                speculation=r.get("speculation", _boolean, True),
            )
        )
        r.done()
    if node.raw("runs") is _MISSING:
        # The article's two requests with speculation on, and the baseline: the same
        # request on a server without speculation (a run that drafts is no baseline).
        runs = [
            SpecRun("repetition_penalty 1.0", {"repetition_penalty": 1.0}, False),
            SpecRun("model defaults", {}, False),
            SpecRun("no speculation", {"repetition_penalty": 1.0}, True, speculation=False),
        ]
    elif len(runs) < 2:
        node.problem("runs", "needs at least two runs to compare")
    _unique(node, "runs", [r.label for r in runs])
    baselines = [r.label for r in runs if r.baseline]
    if len(baselines) > 1:
        node.problem("runs", f"only one run can be the baseline, not {baselines}")
    elif runs and not baselines:  # compare against the last run
        runs[-1] = SpecRun(runs[-1].label, runs[-1].extra, True, runs[-1].speculation)
    flags = _flags(node, "flags", {SPECULATIVE_CONFIG: flag_value(NGRAM_CONFIG)})
    if flags.get(SPECULATIVE_CONFIG, REMOVE) is REMOVE and any(r.speculation for r in runs):
        node.problem("flags", f"{SPECULATIVE_CONFIG} is needed by the runs with speculation")
    return SpecDecodePhase(
        name=name,
        model=node.get("model", _text, None),
        flags=flags,
        request=request,
        runs=tuple(runs),
        requests=node.get("requests", _positive_int, 3),
    )


def _unique(node: _Node, key: str, names: list[str]) -> None:
    dupes = sorted({n for n in names if n is not None and names.count(n) > 1})
    if dupes:
        node.problem(key, f"duplicate names {dupes}")


_PHASES: dict[str, Callable[[_Node, str], Phase]] = {
    "quantization": _quantization,
    "kv-pressure": _kv_pressure,
    "spec-decode": _spec_decode,
}


# --- targets ------------------------------------------------------------------------------

_TINY_KEYS = {
    "hidden_size": _positive_int,
    "num_layers": _positive_int,
    "num_heads": _positive_int,
    "num_kv_heads": _positive_int,
    "intermediate_size": _positive_int,
    "max_position_embeddings": _positive_int,
    "vocab_size": _positive_int,
}


def _tiny_model(node: _Node, name: str) -> TinyModelSpec | None:
    values: dict[str, Any] = {
        key: node.get(key, convert, None) for key, convert in _TINY_KEYS.items()
    }
    values["repetition_penalty"] = node.get("repetition_penalty", _positive_number, None)
    precision = node.get("precision", _text, "bf16")
    if precision not in PRECISIONS:
        node.problem("precision", f"must be one of {', '.join(PRECISIONS)}, not {precision!r}")
    checkpoint = node.get("checkpoint", _boolean, None)
    node.done()
    spec = TinyModelSpec(
        name,
        precision=precision,
        checkpoint=checkpoint,
        **{k: v for k, v in values.items() if v},
    )
    if spec.hidden_size % spec.num_heads:
        node.problem("num_heads", f"must divide hidden_size {spec.hidden_size}")
    elif spec.num_heads % spec.num_kv_heads:
        node.problem("num_kv_heads", f"must divide num_heads {spec.num_heads}")
    if precision in ("awq", "gptq") and (spec.hidden_size % 128 or spec.intermediate_size % 128):
        node.problem(
            "", f"{precision.upper()} needs hidden_size and intermediate_size divisible by 128"
        )
    if spec.vocab_size < VOCAB_SIZE:
        node.problem("vocab_size", f"must hold the {VOCAB_SIZE}-token tokenizer")
    if checkpoint and precision != "bf16":
        node.problem("checkpoint", f"only BF16 checkpoints are written ({precision}: dummy)")
    elif spec.writes_checkpoint and spec.parameter_count() * 2 > MAX_CHECKPOINT_BYTES:
        node.problem(
            "checkpoint",
            f"would write {spec.parameter_count() * 2 / 1024**3:.1f} GiB of random weights: "
            "set `checkpoint: false` and serve it with --load-format dummy",
        )
    return spec


def _args(node: _Node, key: str) -> tuple[str, ...]:
    value = node.raw(key)
    if value is _MISSING or value is None:
        return ()
    if not isinstance(value, list) or not all(isinstance(a, str | int | float) for a in value):
        node.problem(key, "must be a list of strings, like a container's args")
        return ()
    return tuple(str(a) for a in value)


def _local(node: _Node) -> LocalTarget:
    tiny: dict[str, TinyModelSpec] = {}
    models = node.child("tiny_models")
    for name in list(models.data):
        if not isinstance(name, str) or not _PHASE_NAME.match(name):
            models.problem(str(name), "model names are lowercase letters, digits, - _ .")
            continue
        spec = _tiny_model(models.child(name), name)
        if spec is not None:
            tiny[name] = spec
    args = _args(node, "args")
    for i, arg in enumerate(args):
        ref = arg.split("=", 1)[-1]
        if ref.startswith(TINY_PREFIX) and ref[len(TINY_PREFIX) :] not in tiny:
            node.problem("args", f"[{i}] names {ref!r}, which target.local.tiny_models lacks")
    target = LocalTarget(
        args=args,
        tiny_models=tiny,
        model_cache=Path(
            node.get("model_cache", _text, "~/.cache/vllm-glassbox/models")
        ).expanduser(),
        startup_timeout_seconds=node.get("startup_timeout", _duration, 900.0),
        env=node.get("env", _env, {}),
        exporter=node.get("exporter", _boolean, False),
    )
    node.done()
    return target


def _kubernetes(node: _Node) -> KubernetesTarget:
    target = KubernetesTarget(
        namespace=node.get("namespace", _text),
        deployment=node.get("deployment", _text),
        container=node.get("container", _text),
        url=node.get("url", _url),
        rollout_timeout_seconds=node.get("rollout_timeout", _duration, 1800.0),
    )
    node.done()
    return target


def _url(value: object) -> str:
    text = _text(value)
    if not re.match(r"^https?://[^/\s]+", text):
        raise ValueError(f"must be an http(s) URL, not {text!r}")
    return text.rstrip("/")


def _grafana(node: _Node) -> GrafanaTarget:
    target = GrafanaTarget(
        url=node.get("url", _url),
        token_env=node.get("token_env", _text, "GLASSBOX_GRAFANA_TOKEN"),
    )
    node.done()
    return target


# --- the plan -----------------------------------------------------------------------------


def parse_plan(data: object, source: str = "plan") -> Plan:
    """Validate a whole plan (the YAML's data); raise PlanError listing every problem."""
    problems: list[str] = []
    root = _Node(data, "", problems)
    name = root.get("name", _text, "plan")
    description = root.get("description", str, "")
    target = root.child("target")
    local = _local(target.child("local")) if target.raw("local") is not _MISSING else None
    kubernetes = (
        _kubernetes(target.child("kubernetes"))
        if target.raw("kubernetes") is not _MISSING
        else None
    )
    target.done()
    if local is None and kubernetes is None and root.raw("target") is not _MISSING:
        target.problem("", "needs a local or a kubernetes section")
    elif root.raw("target") is _MISSING:
        root.problem("target", "required")
    grafana = _grafana(root.child("grafana")) if root.raw("grafana") is not _MISSING else None
    peak = root.get("peak_bandwidth", _peak_bandwidth, None)

    phases: list[Phase] = []
    names: list[str] = []
    for i, node in enumerate(root.items("phases")):
        kind = node.get("kind", str, None)
        if kind is None:
            continue
        if kind not in _PHASES:
            node.problem("kind", f"unknown kind {kind!r} (known: {', '.join(KINDS)})")
            continue
        default_name = kind if kind not in names else f"{kind}-{i + 1}"
        phase_name = node.get("name", _text, default_name)
        if not _PHASE_NAME.match(phase_name):
            node.problem("name", f"{phase_name!r}: use lowercase letters, digits, - _ .")
        names.append(phase_name)
        phases.append(_PHASES[kind](node, phase_name))
        node.done()
    if root.raw("phases") is _MISSING:
        root.problem("phases", "required")
    elif root.raw("phases") == []:
        root.problem("phases", "needs at least one phase")
    _unique(root, "phases", names)
    _check_tiny_refs(local, phases, problems)
    root.done()
    if problems:
        raise PlanError(problems, source)
    return Plan(name, description, local, kubernetes, grafana, tuple(phases), peak)


def _check_tiny_refs(local: LocalTarget | None, phases: list[Phase], problems: list[str]) -> None:
    known = set(local.tiny_models) if local else set()
    for i, phase in enumerate(phases):
        refs: list[tuple[str, str]] = []
        if isinstance(phase, QuantizationPhase):
            refs = [(f"variants[{j}].model", v.model) for j, v in enumerate(phase.variants)]
        elif phase.model is not None:
            refs = [("model", phase.model)]
        for where, model in refs:
            if model and model.startswith(TINY_PREFIX) and model[len(TINY_PREFIX) :] not in known:
                problems.append(
                    f"phases[{i}].{where}: {model!r} is not in target.local.tiny_models"
                )


def load_plan(path: Path) -> Plan:
    """Read and validate a plan file (PlanError for unreadable files and bad YAML too)."""
    try:
        text = path.read_text()
    except OSError as e:
        raise PlanError([f"cannot read: {e.strerror or e}"], str(path)) from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise PlanError([f"not valid YAML: {e}"], str(path)) from None
    return parse_plan(data, str(path))


def resolve_plan(name: str) -> Plan:
    """A plan file, else a plan shipped with glassbox by name (`cpu-demo`)."""
    path = Path(name) if Path(name).exists() else packaged_plan(name)
    if path is None:
        raise PlanError([f"no such file or shipped plan: {name}"], name)
    return load_plan(path)


def packaged_plan(name: str) -> Path | None:
    """A plan shipped in lab/plans (`cpu-demo` or `cpu-demo.yaml`), if it exists."""
    stem = name.removesuffix(".yaml")
    if not re.match(r"^[a-z0-9][a-z0-9-]*$", stem):
        return None
    path = Path(__file__).parent / "plans" / f"{stem}.yaml"
    return path if path.exists() else None
