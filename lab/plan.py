"""A lab plan: where vLLM runs and which experiments to run against it.

`parse_plan` is a pure function from the YAML's data to typed, frozen dataclasses. It
checks the whole plan before anything is started and raises one `PlanError` that lists
every problem with its path (`phases[1].variants[0].model: required`).

This module reads the plan's own parts (its name, targets, peak bandwidth) and hands
each phase to its kind's module (`lab/experiments/`), which has the parameters of the
article's run as defaults (SPEC §1); a plan overrides any of them. The YAML reader both
use, and what flag values mean, is `plan_yaml.py`.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from vllm_glassbox.core.gpus import gpu_bandwidth
from vllm_glassbox.core.units import GIB
from vllm_glassbox.lab.backends.targets import TINY_PREFIX, KubernetesTarget, LocalTarget
from vllm_glassbox.lab.backends.tinymodel import PRECISIONS, VOCAB_SIZE, TinyModelSpec
from vllm_glassbox.lab.experiments import KINDS, experiment
from vllm_glassbox.lab.experiments.base import Phase
from vllm_glassbox.lab.plan_yaml import (
    MISSING,
    Node,
    boolean,
    duration,
    positive_int,
    positive_number,
    text,
    unique,
)
from vllm_glassbox.lab.vllm.credentials import ApiKeySource

#: Largest random checkpoint a plan may ask to write; bigger models use vLLM's dummy loader.
MAX_CHECKPOINT_BYTES = 4 * GIB
_PHASE_NAME = re.compile(r"^[a-z0-9][a-z0-9_.-]*$")


class PlanError(ValueError):
    """Every problem of a plan, each as `path: message`."""

    def __init__(self, problems: list[str], source: str = "plan") -> None:
        self.problems = problems
        self.source = source
        super().__init__(f"{source}: {len(problems)} problem(s):\n  " + "\n  ".join(problems))


# --- the plan's types -------------------------------------------------------------------


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
    api_key: ApiKeySource | None = None  # a vLLM started with --api-key

    @property
    def server_starts(self) -> int:
        """How many times a run starts vLLM (the costly part of a run)."""
        return sum(phase.server_starts for phase in self.phases)

    @property
    def backends(self) -> list[str]:
        return [n for n, t in (("kubernetes", self.kubernetes), ("local", self.local)) if t]


# --- targets ------------------------------------------------------------------------------


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


_TINY_KEYS = {
    "hidden_size": positive_int,
    "num_layers": positive_int,
    "num_heads": positive_int,
    "num_kv_heads": positive_int,
    "intermediate_size": positive_int,
    "max_position_embeddings": positive_int,
    "vocab_size": positive_int,
}


def _tiny_model(node: Node, name: str) -> TinyModelSpec | None:
    values: dict[str, Any] = {
        key: node.get(key, convert, None) for key, convert in _TINY_KEYS.items()
    }
    values["repetition_penalty"] = node.get("repetition_penalty", positive_number, None)
    precision = node.get("precision", text, "bf16")
    if precision not in PRECISIONS:
        node.problem("precision", f"must be one of {', '.join(PRECISIONS)}, not {precision!r}")
    checkpoint = node.get("checkpoint", boolean, None)
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
            f"would write {spec.parameter_count() * 2 / GIB:.1f} GiB of random weights: "
            "set `checkpoint: false` and serve it with --load-format dummy",
        )
    return spec


def _args(node: Node, key: str) -> tuple[str, ...]:
    value = node.raw(key)
    if value is MISSING or value is None:
        return ()
    if not isinstance(value, list) or not all(isinstance(a, str | int | float) for a in value):
        node.problem(key, "must be a list of strings, like a container's args")
        return ()
    return tuple(str(a) for a in value)


def _local(node: Node) -> LocalTarget:
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
            node.get("model_cache", text, "~/.cache/vllm-glassbox/models")
        ).expanduser(),
        startup_timeout_seconds=node.get("startup_timeout", duration, 900.0),
        env=node.get("env", _env, {}),
        exporter=node.get("exporter", boolean, False),
    )
    node.done()
    return target


def _kubernetes(node: Node) -> KubernetesTarget:
    target = KubernetesTarget(
        namespace=node.get("namespace", text),
        deployment=node.get("deployment", text),
        container=node.get("container", text),
        url=node.get("url", _url),
        rollout_timeout_seconds=node.get("rollout_timeout", duration, 1800.0),
    )
    node.done()
    return target


def _url(value: object) -> str:
    url = text(value)
    if not re.match(r"^https?://[^/\s]+", url):
        raise ValueError(f"must be an http(s) URL, not {url!r}")
    return url.rstrip("/")


def _grafana(node: Node) -> GrafanaTarget:
    target = GrafanaTarget(
        url=node.get("url", _url),
        token_env=node.get("token_env", text, "GLASSBOX_GRAFANA_TOKEN"),
    )
    node.done()
    return target


_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def _env_name(value: object) -> str:
    name = text(value)
    if not _ENV_NAME.match(name):
        raise ValueError(f"must be an environment variable's name, not {name!r}")
    return name


def _api_key(node: Node) -> ApiKeySource | None:
    """Where the key of a vLLM started with --api-key is: never the key itself."""
    source = ApiKeySource(env=node.get("env", _env_name, None), file=node.get("file", text, None))
    node.done()
    if (source.env is None) == (source.file is None):
        node.problem(
            "", "needs either `env: VARIABLE` or `file: PATH` (the key stays out of the plan)"
        )
        return None
    return source


# --- the plan -----------------------------------------------------------------------------


def parse_plan(data: object, source: str = "plan") -> Plan:
    """Validate a whole plan (the YAML's data); raise PlanError listing every problem."""
    problems: list[str] = []
    root = Node(data, "", problems)
    name = root.get("name", text, "plan")
    description = root.get("description", str, "")
    target = root.child("target")
    local = _local(target.child("local")) if target.raw("local") is not MISSING else None
    kubernetes = (
        _kubernetes(target.child("kubernetes")) if target.raw("kubernetes") is not MISSING else None
    )
    target.done()
    if local is None and kubernetes is None and root.raw("target") is not MISSING:
        target.problem("", "needs a local or a kubernetes section")
    elif root.raw("target") is MISSING:
        root.problem("target", "required")
    grafana = _grafana(root.child("grafana")) if root.raw("grafana") is not MISSING else None
    peak = root.get("peak_bandwidth", _peak_bandwidth, None)
    api_key = _api_key(root.child("api_key")) if root.raw("api_key") is not MISSING else None

    phases: list[Phase] = []
    names: list[str] = []
    for i, node in enumerate(root.items("phases")):
        kind = node.get("kind", str, None)
        if kind is None:
            continue
        kind_of_phase = experiment(kind)
        if kind_of_phase is None:
            node.problem("kind", f"unknown kind {kind!r} (known: {', '.join(KINDS)})")
            continue
        default_name = kind if kind not in names else f"{kind}-{i + 1}"
        phase_name = node.get("name", text, default_name)
        if not _PHASE_NAME.match(phase_name):
            node.problem("name", f"{phase_name!r}: use lowercase letters, digits, - _ .")
        names.append(phase_name)
        phases.append(kind_of_phase.parse(node, phase_name))
        node.done()
    if root.raw("phases") is MISSING:
        root.problem("phases", "required")
    elif root.raw("phases") == []:
        root.problem("phases", "needs at least one phase")
    unique(root, "phases", names)
    _check_tiny_refs(local, phases, problems)
    root.done()
    if problems:
        raise PlanError(problems, source)
    return Plan(name, description, local, kubernetes, grafana, tuple(phases), peak, api_key)


def _check_tiny_refs(local: LocalTarget | None, phases: list[Phase], problems: list[str]) -> None:
    known = set(local.tiny_models) if local else set()
    for i, phase in enumerate(phases):
        for where, model in phase.models():
            if model and model.startswith(TINY_PREFIX) and model[len(TINY_PREFIX) :] not in known:
                problems.append(
                    f"phases[{i}].{where}: {model!r} is not in target.local.tiny_models"
                )


def load_plan(path: Path) -> Plan:
    """Read and validate a plan file (PlanError for unreadable files and bad YAML too)."""
    try:
        # Read from the open file, so that YAML's messages name it ("in plan.yaml, line
        # 3"), not "<unicode string>".
        with path.open(encoding="utf-8") as stream:
            data = yaml.safe_load(stream)
    except OSError as e:
        raise PlanError([f"cannot read: {e.strerror or e}"], str(path)) from None
    except UnicodeDecodeError as e:
        raise PlanError([f"not UTF-8 text: {e.reason}"], str(path)) from None
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
