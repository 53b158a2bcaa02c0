"""The Kubernetes backend's patch/restore protocol (lab/backends/restore_protocol.py), as pure
functions: each patch is applied to a Deployment manifest by the double's JSON patch
(tests/k8s_double.py), as the API server would apply it; no server runs."""

from __future__ import annotations

import json
from typing import Any

import pytest
from vllm_glassbox.lab.backends.restore_protocol import (
    ANNOTATION,
    KubernetesError,
    Record,
    args_patch,
    container_index,
    leftover_container,
    leftover_record_ops,
    patch_went_through,
    patchable_args,
    record_of,
    refuse_flags_in_command,
    remove_record,
    restore_record_ops,
    served_model_name,
    set_in_command,
    write_record,
)

from tests.k8s_double import PatchError, deployment_manifest, json_patch
from tests.k8s_lab import ORIGINAL

WHERE = "deployment lab/vllm"
ANNOTATION_PATH = "/metadata/annotations/lab.vllm-glassbox~1original-args"
PATCHED = [*ORIGINAL[:5], "--kv-cache-memory-bytes", "8388608", "--enforce-eager"]
VLLM = 1  # the vLLM container's index, after the exporter sidecar


def _deployment(**annotations: str) -> dict[str, Any]:
    manifest = deployment_manifest(args=ORIGINAL, sidecars=["exporter"])
    if annotations:
        manifest["metadata"]["annotations"] = dict(annotations)
    return manifest


def _annotations(manifest: dict[str, Any]) -> dict[str, str] | None:
    return manifest["metadata"].get("annotations")


def _args(manifest: dict[str, Any]) -> list[str]:
    return list(manifest["spec"]["template"]["spec"]["containers"][VLLM]["args"])


def _patched_by_the_lab(**annotations: str) -> dict[str, Any]:
    """A Deployment after the lab's first patch (the run may then be killed)."""
    before = _deployment(**annotations)
    record = write_record(_annotations(before), "vllm", ORIGINAL, PATCHED)
    patched: dict[str, Any] = json_patch(
        before, args_patch(VLLM, "vllm", ORIGINAL, PATCHED, record)
    )
    return patched


# -- the record --------------------------------------------------------------------------


def test_the_first_patch_adds_the_annotations_map_when_the_deployment_has_none() -> None:
    ops = write_record(None, "vllm", ORIGINAL, PATCHED)

    value = json.dumps({"container": "vllm", "args": ORIGINAL, "patched": PATCHED})
    assert ops == [{"op": "add", "path": "/metadata/annotations", "value": {ANNOTATION: value}}]
    after = json_patch(_deployment(), ops)
    assert record_of(_annotations(after)) == Record("vllm", ORIGINAL, PATCHED, value)


def test_the_record_joins_the_annotations_already_there() -> None:
    before = _deployment(**{"deployment.kubernetes.io/revision": "7"})

    ops = write_record(_annotations(before), "vllm", ORIGINAL, PATCHED)

    assert [(op["op"], op["path"]) for op in ops] == [("add", ANNOTATION_PATH)]
    after = _annotations(json_patch(before, ops))
    assert after is not None and after["deployment.kubernetes.io/revision"] == "7"
    assert json.loads(after[ANNOTATION]) == {
        "container": "vllm", "args": ORIGINAL, "patched": PATCHED,
    }  # fmt: skip


def test_removing_the_record_leaves_other_annotations_and_is_nothing_without_one() -> None:
    recorded = _patched_by_the_lab(**{"deployment.kubernetes.io/revision": "7"})

    ops = remove_record(_annotations(recorded))

    assert ops == [{"op": "remove", "path": ANNOTATION_PATH}]
    assert _annotations(json_patch(recorded, ops)) == {"deployment.kubernetes.io/revision": "7"}
    assert remove_record({"deployment.kubernetes.io/revision": "7"}) == []
    assert remove_record(None) == []


def test_without_the_annotation_there_is_no_record() -> None:
    assert record_of(None) is None
    assert record_of({"deployment.kubernetes.io/revision": "7"}) is None


@pytest.mark.parametrize(
    ("raw", "why"),
    [
        ("{not json", "Expecting property name"),
        (json.dumps({"container": "vllm", "args": ORIGINAL}), "'patched'"),
        (json.dumps({"container": "vllm", "args": "--x 1", "patched": []}), "not lists"),
        (json.dumps({"container": "vllm", "args": [1], "patched": []}), "not lists"),
    ],
    ids=["not JSON", "no patched args", "args a string", "args not strings"],
)
def test_an_annotation_that_is_not_the_labs_record_is_refused_with_why(raw: str, why: str) -> None:
    with pytest.raises(KubernetesError) as refused:
        record_of({ANNOTATION: raw})
    message = str(refused.value)
    assert message.startswith(f"annotation {ANNOTATION} is not the lab's record (")
    assert why in message and message.endswith("remove it by hand once the args are right")


# -- the patches -------------------------------------------------------------------------


def test_a_patch_is_guarded_by_the_container_and_its_args_and_carries_the_record() -> None:
    record = write_record(None, "vllm", ORIGINAL, PATCHED)

    body = args_patch(VLLM, "vllm", ORIGINAL, PATCHED, record)

    path = "/spec/template/spec/containers/1"
    assert body == [
        {"op": "test", "path": f"{path}/name", "value": "vllm"},
        {"op": "test", "path": f"{path}/args", "value": ORIGINAL},
        *record,
        {"op": "replace", "path": f"{path}/args", "value": PATCHED},
    ]
    after = json_patch(_deployment(), body)
    assert _args(after) == PATCHED
    assert record_of(_annotations(after)) is not None


def test_a_patch_that_leaves_the_args_has_no_replace() -> None:
    recorded = _patched_by_the_lab()
    unrecord = remove_record(_annotations(recorded))

    body = args_patch(VLLM, "vllm", PATCHED, PATCHED, unrecord)

    assert [op["op"] for op in body] == ["test", "test", "remove"]
    assert _args(json_patch(recorded, body)) == PATCHED


def test_a_patch_is_refused_when_someone_changed_the_args_since_they_were_read() -> None:
    theirs = _deployment()
    theirs["spec"]["template"]["spec"]["containers"][VLLM]["args"] = [*ORIGINAL, "--x", "1"]
    record = write_record(None, "vllm", ORIGINAL, PATCHED)
    body = args_patch(VLLM, "vllm", ORIGINAL, PATCHED, record)

    with pytest.raises(PatchError, match="test failed at '/spec/template/spec/containers/1/args'"):
        json_patch(theirs, body)


def test_a_patch_is_refused_when_another_container_took_the_index() -> None:
    swapped = _deployment()
    containers = swapped["spec"]["template"]["spec"]["containers"]
    containers.reverse()  # vLLM is now at 0, the exporter at 1
    body = args_patch(VLLM, "vllm", ORIGINAL, PATCHED, [])

    with pytest.raises(PatchError, match="test failed at '/spec/template/spec/containers/1/name'"):
        json_patch(swapped, body)


def test_a_patch_that_went_through_is_recognised_by_its_args_and_record() -> None:
    before = _deployment()
    record = write_record(None, "vllm", ORIGINAL, PATCHED)
    after = json_patch(before, args_patch(VLLM, "vllm", ORIGINAL, PATCHED, record))

    assert patch_went_through(_annotations(after), _args(after), PATCHED, record)
    # Not through: the args are still the old ones, or the record is another run's.
    assert not patch_went_through(_annotations(before), _args(before), PATCHED, record)
    another_runs = write_record(None, "vllm", ORIGINAL, [*PATCHED, "--x", "1"])[0]["value"]
    assert not patch_went_through(another_runs, PATCHED, PATCHED, record)


def test_a_restore_that_went_through_is_recognised_by_the_records_absence() -> None:
    recorded = _patched_by_the_lab()
    unrecord = remove_record(_annotations(recorded))
    restored = json_patch(recorded, args_patch(VLLM, "vllm", PATCHED, ORIGINAL, unrecord))

    assert _args(restored) == ORIGINAL
    assert patch_went_through(_annotations(restored), ORIGINAL, ORIGINAL, unrecord)
    assert not patch_went_through(_annotations(recorded), ORIGINAL, ORIGINAL, unrecord)


# -- restore after a run -----------------------------------------------------------------


def test_restore_after_a_run_puts_the_original_back_and_removes_the_record() -> None:
    recorded = _patched_by_the_lab()

    ops = restore_record_ops(_annotations(recorded), PATCHED, ORIGINAL)

    assert ops == [{"op": "remove", "path": ANNOTATION_PATH}]
    restored = json_patch(recorded, args_patch(VLLM, "vllm", PATCHED, ORIGINAL, ops))
    assert _args(restored) == ORIGINAL and record_of(_annotations(restored)) is None


def test_restore_with_the_original_args_and_a_record_only_removes_the_record() -> None:
    # Someone put the args back by hand; the record is still there.
    recorded = _patched_by_the_lab()
    recorded["spec"]["template"]["spec"]["containers"][VLLM]["args"] = list(ORIGINAL)

    assert restore_record_ops(_annotations(recorded), ORIGINAL, ORIGINAL) == [
        {"op": "remove", "path": ANNOTATION_PATH}
    ]


def test_restore_has_nothing_to_do_with_the_original_args_and_no_record() -> None:
    others = {"deployment.kubernetes.io/revision": "7"}
    assert restore_record_ops(None, ORIGINAL, ORIGINAL) is None
    assert restore_record_ops(others, ORIGINAL, ORIGINAL) is None


def test_restore_without_a_record_still_puts_the_original_args_back() -> None:
    assert restore_record_ops(None, PATCHED, ORIGINAL) == []


# -- restore after a killed run ----------------------------------------------------------


@pytest.mark.parametrize("current", [PATCHED, ORIGINAL], ids=["lab's args", "original args"])
def test_a_leftover_is_put_back_guarded_by_the_records_text(current: list[str]) -> None:
    killed = _patched_by_the_lab()
    killed["spec"]["template"]["spec"]["containers"][VLLM]["args"] = list(current)
    record = record_of(_annotations(killed))
    assert record is not None

    ops = leftover_record_ops(WHERE, record, current)

    assert ops == [
        {"op": "test", "path": ANNOTATION_PATH, "value": record.raw},
        {"op": "remove", "path": ANNOTATION_PATH},
    ]
    restored = json_patch(killed, args_patch(VLLM, "vllm", current, record.original, ops))
    assert _args(restored) == ORIGINAL and record_of(_annotations(restored)) is None


def test_a_leftover_restored_once_is_not_restored_again() -> None:
    killed = _patched_by_the_lab()
    record = record_of(_annotations(killed))
    assert record is not None
    body = args_patch(VLLM, "vllm", PATCHED, ORIGINAL, leftover_record_ops(WHERE, record, PATCHED))
    restored = json_patch(killed, body)

    assert record_of(_annotations(restored)) is None  # the next restore finds nothing to do
    with pytest.raises(PatchError):  # and the same patch sent twice is refused
        json_patch(restored, body)


def test_args_someone_changed_after_a_killed_run_are_not_overwritten() -> None:
    record = record_of(_annotations(_patched_by_the_lab()))
    assert record is not None
    theirs = [*ORIGINAL, "--max-num-seqs", "4"]

    with pytest.raises(KubernetesError) as refused:
        leftover_record_ops(WHERE, record, theirs)

    assert str(refused.value) == (
        f"{WHERE}: container 'vllm''s args changed since an interrupted run of the lab patched "
        f"them; not overwriting them. The original args were: {json.dumps(ORIGINAL)}. Remove "
        f"the annotation {ANNOTATION} once the args are as they should be"
    )


def test_a_leftover_is_for_the_container_it_names() -> None:
    record = Record("vllm", ORIGINAL, PATCHED, "{}")
    assert leftover_container(WHERE, record, None) == "vllm"
    assert leftover_container(WHERE, record, "vllm") == "vllm"
    with pytest.raises(KubernetesError, match="record is for container 'vllm', not 'engine'"):
        leftover_container(WHERE, record, "engine")


# -- the container and its args ----------------------------------------------------------


def test_the_vllm_container_is_the_named_one_or_the_only_one() -> None:
    assert container_index(WHERE, ["exporter", "vllm"], "vllm") == 1
    assert container_index(WHERE, ["vllm"], None) == 0
    with pytest.raises(KubernetesError, match=r"^deployment lab/vllm has 2 containers "
                       r"\(exporter, vllm\): say which one runs vLLM$"):  # fmt: skip
        container_index(WHERE, ["exporter", "vllm"], None)
    with pytest.raises(KubernetesError, match=r"has no container 'engine' \(has: exporter, vllm\)"):
        container_index(WHERE, ["exporter", "vllm"], "engine")


def test_args_are_patchable_only_as_separate_flags() -> None:
    assert patchable_args(WHERE, "vllm", ORIGINAL) == ORIGINAL
    with pytest.raises(KubernetesError, match="container 'vllm' has no args"):
        patchable_args(WHERE, "vllm", [])
    with pytest.raises(KubernetesError, match="runs vLLM from one shell string"):
        patchable_args(WHERE, "vllm", ["-c", "vllm serve /models/tiny --port 8000"])


@pytest.mark.parametrize(
    ("command", "flag", "set_there"),
    [
        (["vllm", "serve", "/models/tiny", "--port", "8000"], "--port", True),
        (["vllm", "serve", "/models/tiny"], "--model", True),  # the positional model
        (["vllm", "serve"], "--model", False),
        (["/entrypoint.sh"], "--model", False),  # a program is not a model
        (["python3", "-m", "vllm.entrypoints.openai.api_server"], "--model", False),
        ([], "--port", False),
    ],
)
def test_a_flag_is_set_in_the_command_only_after_the_program(
    command: list[str], flag: str, set_there: bool
) -> None:
    assert set_in_command(command, flag) is set_there


def test_overriding_a_flag_the_command_sets_is_refused() -> None:
    command = ["vllm", "serve", "/models/tiny"]
    refuse_flags_in_command(WHERE, "vllm", command, {"--max-model-len": "1024"})
    with pytest.raises(KubernetesError, match="--model is set in container 'vllm''s command"):
        refuse_flags_in_command(WHERE, "vllm", command, {"--model": "/models/other"})


@pytest.mark.parametrize(
    ("args", "name"),
    [
        (["/models/tiny", "--served-model-name", "tiny big"], "tiny"),
        (["--model", "/models/tiny"], "/models/tiny"),
        (["/models/tiny", "--port", "8000"], "/models/tiny"),
    ],
)
def test_the_served_model_name_is_the_first_served_name_else_the_model(
    args: list[str], name: str
) -> None:
    assert served_model_name(args) == name


def test_args_without_a_model_have_no_served_model_name() -> None:
    with pytest.raises(KubernetesError, match="cannot tell the served model name"):
        served_model_name(["--port", "8000"])
