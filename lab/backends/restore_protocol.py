"""How the Kubernetes backend changes a Deployment's args and always gets them back.

Pure functions over plain data (annotations, args, container names); lab/backends/kubernetes.py
reads the Deployment, calls these, and sends the JSON patches they build.

- What is patched: one container's `args`, by flag name, in a JSON patch (RFC 6902)
  guarded by `test` operations on the container's name and its current args, so a
  concurrent edit is refused, not overwritten. vLLM's flags in `command` are refused:
  the lab never changes `command`.
- The record: every patch that puts the lab's args in place writes, in the same atomic
  patch, the annotation `ANNOTATION` with the original args, so the Deployment is never
  patched without a record of how it was. The patch that puts them back removes it.
- Restore: after a run, the original args and no record. After a killed run, the
  record's original args, but only while the container still runs the original or the
  lab's args: anything else is someone's edit since, and is left alone.
- Idempotence: the restore of a leftover is guarded by the record's text (a second
  restore finds none); a patch retried after its first try went through is recognised by
  what it left (`patch_went_through`), not patched twice.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from vllm_glassbox.lab.backends.args import flag_value
from vllm_glassbox.lab.backends.backend import FlagOverrides

ANNOTATION = "lab.vllm-glassbox/original-args"
"""On the Deployment while the lab's args may be in place: JSON `{"container", "args"
(the original), "patched" (what the lab set)}`."""
# The annotation as a JSON pointer: `/` in a key is written `~1` (RFC 6901).
_ANNOTATION_PATH = "/metadata/annotations/" + ANNOTATION.replace("~", "~0").replace("/", "~1")

Operation = dict[str, Any]
"""One JSON patch operation: {"op", "path", "value"?}."""


class KubernetesError(RuntimeError):
    """The Deployment could not be changed, rolled out or reached; the message says why."""


# -- the container and its args ----------------------------------------------------------


def container_index(where: str, names: Sequence[str], wanted: str | None) -> int:
    """The index of the vLLM container among the pod template's `names`: the one named
    `wanted`, else the only one."""
    if wanted is None:
        if len(names) != 1:
            raise KubernetesError(
                f"{where} has {len(names)} containers ({', '.join(names)}): say which one runs vLLM"
            )
        return 0
    if wanted in names:
        return names.index(wanted)
    raise KubernetesError(f"{where} has no container {wanted!r} (has: {', '.join(names)})")


def patchable_args(where: str, container: str, args: Sequence[str]) -> list[str]:
    """The container's args, when the lab can change vLLM's flags in them by name."""
    if not args:
        raise KubernetesError(
            f"{where}: container {container!r} has no args; the lab changes "
            "vLLM's flags in args (e.g. command: [vllm, serve], args: [MODEL, --flag, ...])"
        )
    if len(args) <= 3 and any(" --" in a for a in args):
        raise KubernetesError(
            f"{where}: container {container!r} runs vLLM from one shell "
            "string; give vLLM's flags as separate args so they can be changed by name"
        )
    return list(args)


def set_in_command(command: Sequence[str], name: str) -> bool:
    """Whether vLLM's flag `name` is given in a container's `command`."""
    if not command:
        return False
    # A command starts with a program, never with a model: read what follows it (or
    # follows `serve`) the way `vllm serve` reads its arguments.
    program = list(command).index("serve") + 1 if "serve" in command else 1
    return flag_value(["serve", *command[program:]], name) is not None


def refuse_flags_in_command(
    where: str, container: str, command: Sequence[str], overrides: FlagOverrides
) -> None:
    """KubernetesError when an override is a flag that `command` sets."""
    for name in overrides:
        if set_in_command(command, name):
            raise KubernetesError(
                f"{where}: {name} is set in container {container!r}'s command, "
                "which the lab does not change; move vLLM's flags to its args"
            )


def served_model_name(args: Sequence[str]) -> str:
    """What requests put in "model": the first --served-model-name, else the model."""
    names = flag_value(args, "--served-model-name")
    if names:
        return names.split()[0]
    model = flag_value(args, "--model")
    if model:
        return model
    raise KubernetesError(
        "cannot tell the served model name: the container's args have no "
        "--served-model-name, --model or positional model"
    )


# -- the record --------------------------------------------------------------------------


@dataclass(frozen=True)
class Record:
    """What the annotation says: the container, its original args, the lab's args."""

    container: str
    original: list[str]
    patched: list[str]
    raw: str  # the annotation's text, to guard a patch with a `test`


def record_of(annotations: Mapping[str, str] | None) -> Record | None:
    """The lab's record among a Deployment's `annotations`, or None; KubernetesError if it
    is unreadable."""
    raw = (annotations or {}).get(ANNOTATION)
    if raw is None:
        return None
    try:
        data = json.loads(raw)
        original, patched = data["args"], data["patched"]
        lists = isinstance(original, list) and isinstance(patched, list)
        if not lists or not all(isinstance(a, str) for a in [*original, *patched]):
            raise TypeError("args are not lists of strings")
        record = Record(str(data["container"]), original, patched, raw)
    except (ValueError, KeyError, TypeError) as e:
        raise KubernetesError(
            f"annotation {ANNOTATION} is not the lab's record ({e}); "
            "remove it by hand once the args are right"
        ) from None
    return record


def write_record(
    annotations: Mapping[str, str] | None, container: str, original: list[str], patched: list[str]
) -> list[Operation]:
    """The operations that write the record onto a Deployment with `annotations`."""
    value = json.dumps({"container": container, "args": original, "patched": patched})
    if annotations is None:  # a JSON patch cannot add a member to a missing object
        return [{"op": "add", "path": "/metadata/annotations", "value": {ANNOTATION: value}}]
    return [{"op": "add", "path": _ANNOTATION_PATH, "value": value}]


def remove_record(annotations: Mapping[str, str] | None) -> list[Operation]:
    """The operations that remove the record, if the Deployment has one."""
    return [{"op": "remove", "path": _ANNOTATION_PATH}] if ANNOTATION in (annotations or {}) else []


# -- the patches -------------------------------------------------------------------------


def args_patch(
    index: int, container: str, current: list[str], args: list[str], record: list[Operation]
) -> list[Operation]:
    """The JSON patch that changes the container at `index` from `current` to `args`, with
    the `record` operations in the same atomic patch. Refused by the API server (422)
    when the container is no longer `container` or its args no longer `current`."""
    path = f"/spec/template/spec/containers/{index}"
    body: list[Operation] = [
        {"op": "test", "path": f"{path}/name", "value": container},
        {"op": "test", "path": f"{path}/args", "value": current},
        *record,
    ]
    if args != current:
        body.append({"op": "replace", "path": f"{path}/args", "value": args})
    return body


def patch_went_through(
    annotations: Mapping[str, str] | None,
    current: list[str],
    args: list[str],
    record: list[Operation],
) -> bool:
    """Whether a Deployment now running `current` with `annotations` is what a patch to
    `args` with the `record` operations leaves (its retry fails its `test`: check)."""
    if current != args:
        return False
    value = (annotations or {}).get(ANNOTATION)
    for op in record:
        if op["op"] == "remove":
            return value is None
        if op["op"] == "add":
            added = op["value"] if op["path"] == _ANNOTATION_PATH else op["value"][ANNOTATION]
            return bool(value == added)
    return True


def restore_record_ops(
    annotations: Mapping[str, str] | None, current: list[str], original: list[str]
) -> list[Operation] | None:
    """After a run: the record operations of the patch that puts `original` back (it
    removes the record), or None when the args are the original and no record is left."""
    unrecord = remove_record(annotations)
    return unrecord if current != original or unrecord else None


def leftover_container(where: str, record: Record, wanted: str | None) -> str:
    """The container whose args a leftover `record` is for; KubernetesError when the plan
    names another container."""
    if wanted is not None and wanted != record.container:
        raise KubernetesError(
            f"{where}: the lab's record is for container {record.container!r}, "
            f"not {wanted!r}; restore it with a plan naming that container"
        )
    return record.container


def leftover_record_ops(where: str, record: Record, current: list[str]) -> list[Operation]:
    """After a killed run: the record operations of the patch that puts `record.original`
    back, guarded by the record's text. KubernetesError when the container's `current`
    args are neither the original nor the lab's: someone changed them since."""
    if current not in (record.original, record.patched):
        raise KubernetesError(
            f"{where}: container {record.container!r}'s args changed since an "
            f"interrupted run of the lab patched them; not overwriting them. The "
            f"original args were: {json.dumps(record.original)}. Remove the annotation "
            f"{ANNOTATION} once the args are as they should be"
        )
    guard = {"op": "test", "path": _ANNOTATION_PATH, "value": record.raw}
    return [guard, {"op": "remove", "path": _ANNOTATION_PATH}]
