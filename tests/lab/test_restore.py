"""The lab never loses a Deployment's configuration, even when it is killed.

Through the real `kubernetes` client against the API double (tests/k8s_double.py): the
original args are recorded on the Deployment in the same atomic patch as the lab's
first change; `restore_leftover()` (`glassbox lab restore`, and the start of every run)
puts them back after a run killed with SIGKILL in the middle of each phase kind.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from vllm_glassbox.lab.backends.backend import restoring
from vllm_glassbox.lab.backends.kubernetes import KubernetesError
from vllm_glassbox.lab.backends.restore_protocol import ANNOTATION

from tests.k8s_double import FakeCluster, wait_until
from tests.k8s_lab import ORIGINAL, SMALL_POOL, backend_for, write_kubeconfig

pytestmark = pytest.mark.slow  # starts servers or processes and waits for them

REPO = Path(__file__).resolve().parents[2]


def record(cluster: FakeCluster) -> dict[str, Any] | None:
    raw = cluster.deployment["metadata"].get("annotations", {}).get(ANNOTATION)
    return None if raw is None else dict(json.loads(raw))


# -- the record, through the backend -------------------------------------------------------


def test_while_patched_the_deployment_records_the_original_args_and_restore_removes_it(
    cluster: FakeCluster,
) -> None:
    backend = backend_for(cluster)
    backend.deploy(SMALL_POOL)
    patched = cluster.current_args
    assert record(cluster) == {"container": "vllm", "args": ORIGINAL, "patched": patched}

    backend.deploy({"--max-model-len": "1024"})  # the next phase: the record follows
    assert record(cluster) == {
        "container": "vllm", "args": ORIGINAL, "patched": cluster.current_args,
    }  # fmt: skip

    backend.restore()
    assert cluster.current_args == ORIGINAL
    assert record(cluster) is None
    assert cluster.deployment["metadata"]["annotations"] == {}


def test_other_annotations_are_left_alone() -> None:
    with FakeCluster(list(ORIGINAL)) as cluster:
        cluster.deployment["metadata"]["annotations"] = {"deployment.kubernetes.io/revision": "7"}
        backend = backend_for(cluster)
        backend.deploy(SMALL_POOL)
        annotations = cluster.deployment["metadata"]["annotations"]
        assert annotations["deployment.kubernetes.io/revision"] == "7" and ANNOTATION in annotations
        backend.restore()
        assert cluster.deployment["metadata"]["annotations"] == {
            "deployment.kubernetes.io/revision": "7"
        }


def test_a_killed_runs_args_are_put_back_by_the_next_backend(cluster: FakeCluster) -> None:
    backend_for(cluster).deploy(SMALL_POOL)  # ... and the lab dies here: no restore()
    assert cluster.current_args != ORIGINAL

    said = backend_for(cluster).restore_leftover()

    assert said is not None and "an interrupted run had left its args" in said
    assert cluster.current_args == ORIGINAL and record(cluster) is None
    wait_until(cluster.rolled_out)
    # Guarded by the container, the args it read and the record it acted on; atomic.
    name, args, guard, remove, replace = cluster.patches[-1]
    assert [name["op"], args["op"], guard["op"]] == ["test"] * 3
    assert json.loads(guard["value"])["args"] == ORIGINAL
    assert remove == {
        "op": "remove",
        "path": "/metadata/annotations/lab.vllm-glassbox~1original-args",
    }
    assert replace["value"] == ORIGINAL


def test_a_new_deploy_restores_a_leftover_before_its_own_patch(cluster: FakeCluster) -> None:
    backend_for(cluster).deploy({"--max-model-len": "1024"})  # killed afterwards
    notes: list[str] = []
    with restoring(backend_for(cluster, log=notes.append)) as backend:
        backend.deploy(SMALL_POOL)
        # The new phase starts from the original args, not from the leftover's.
        assert cluster.current_args == [*ORIGINAL[:5], "--kv-cache-memory-bytes", "8388608",
                                        "--enforce-eager"]  # fmt: skip
    assert any("interrupted run" in n for n in notes)
    assert cluster.current_args == ORIGINAL and record(cluster) is None
    replaced = [op["value"] for p in cluster.patches for op in p if op["op"] == "replace"]
    assert replaced[1] == ORIGINAL  # the leftover restored before the new patch


def test_without_a_record_restore_leftover_changes_nothing(cluster: FakeCluster) -> None:
    assert backend_for(cluster).restore_leftover() is None
    assert cluster.patches == []


def test_args_someone_changed_since_are_not_overwritten(cluster: FakeCluster) -> None:
    backend_for(cluster).deploy(SMALL_POOL)  # killed afterwards; then someone edits by hand
    theirs = [*ORIGINAL, "--max-num-seqs", "4"]
    cluster.deployment["spec"]["template"]["spec"]["containers"][1]["args"] = list(theirs)

    refused = r"changed since an interrupted run .* not overwriting them\. The original args were"
    with pytest.raises(KubernetesError, match=refused):
        backend_for(cluster).restore_leftover()
    assert cluster.current_args == theirs and record(cluster) is not None


def test_a_record_that_is_not_the_labs_is_refused(cluster: FakeCluster) -> None:
    cluster.deployment["metadata"]["annotations"] = {ANNOTATION: "{not json"}
    with pytest.raises(KubernetesError, match="is not the lab's record"):
        backend_for(cluster).restore_leftover()
    assert cluster.patches == []


def test_a_rollout_that_never_becomes_ready_names_vllms_complaint_and_is_restored(
    cluster: FakeCluster,
) -> None:
    cluster.progress_deadline = 0.3
    with pytest.raises(KubernetesError) as failed, restoring(backend_for(cluster)) as backend:
        backend.deploy({"--max-model-length": "4096"})
    message = str(failed.value)
    assert "rollout of the patched args failed" in message and "CrashLoopBackOff" in message
    assert "last log lines: usage: vllm serve [model_tag] [options] | vllm serve: error: " \
           "unrecognized arguments: --max-model-length" in message  # fmt: skip
    assert cluster.current_args == ORIGINAL and record(cluster) is None
    wait_until(cluster.rolled_out)


# -- the real `glassbox lab` killed with SIGKILL -------------------------------------------

PHASES: dict[str, dict[str, Any]] = {
    "quantization": {"kind": "quantization", "flags": SMALL_POOL,
                     "variants": [{"name": "small", "model": "/models/tiny-small"}]},
    "kv-pressure": {"kind": "kv-pressure", "concurrency": 2, "max_tokens": 16},
    "spec-decode": {"kind": "spec-decode", "max_tokens": 16},
}  # fmt: skip


def write_plan(tmp_path: Path, cluster: FakeCluster, phases: list[dict[str, Any]]) -> Path:
    plan = {
        "name": "killed",
        "target": {"kubernetes": {
            "namespace": cluster.namespace, "deployment": cluster.name,
            "container": cluster.container, "url": cluster.service_url,
            "rollout_timeout": "60s",
        }},
        "phases": phases,
    }  # fmt: skip
    path = tmp_path / "plan.yaml"
    path.write_text(yaml.safe_dump(plan))
    return path


def lab_env(tmp_path: Path, cluster: FakeCluster) -> dict[str, str]:
    kubeconfig = write_kubeconfig(tmp_path / "kubeconfig", cluster)
    env = {k: v for k, v in os.environ.items() if not k.startswith("KUBERNETES_")}
    return {**env, "KUBECONFIG": str(kubeconfig), "PYTHONPATH": str(REPO)}


def glassbox_lab(*args: str) -> list[str]:
    return [sys.executable, "-m", "vllm_glassbox", "lab", *args]


def run_lab(tmp_path: Path, cluster: FakeCluster, plan: Path, out: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        glassbox_lab("run", str(plan), "--out", str(tmp_path / out)),
        env=lab_env(tmp_path, cluster), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True,
    )  # fmt: skip


def kill_when(process: subprocess.Popen[str], condition: Any) -> None:
    try:
        wait_until(lambda: condition() or process.poll() is not None, timeout=60)
        assert process.poll() is None, process.communicate()
        process.send_signal(signal.SIGKILL)
    finally:
        process.kill()
        process.communicate()
    assert process.returncode == -signal.SIGKILL


def in_workload(cluster: FakeCluster) -> bool:
    return "/v1/completions" in cluster.service_requests


@pytest.mark.parametrize("kind", list(PHASES))
@pytest.mark.parametrize("during", ["rollout", "workload"])
def test_a_lab_killed_in_any_phase_is_undone_by_glassbox_lab_restore(
    tmp_path: Path, cluster: FakeCluster, kind: str, during: str
) -> None:
    if during == "rollout":
        cluster.ready_after = None  # the phase's pod never becomes ready
    lab = run_lab(tmp_path, cluster, write_plan(tmp_path, cluster, [PHASES[kind]]), "out")
    kill_when(lab, (lambda: len(cluster.patches) == 1) if during == "rollout"
              else (lambda: in_workload(cluster)))  # fmt: skip
    assert cluster.current_args != ORIGINAL
    assert record(cluster) == {"container": "vllm", "args": ORIGINAL,
                               "patched": cluster.current_args}  # fmt: skip

    restore = subprocess.run(
        glassbox_lab("restore", str(write_plan(tmp_path, cluster, [PHASES[kind]]))),
        env=lab_env(tmp_path, cluster), capture_output=True, text=True, timeout=120,
    )  # fmt: skip

    assert restore.returncode == 0, restore.stderr
    assert "the original args are put back and rolled out" in restore.stdout
    assert cluster.current_args == ORIGINAL and record(cluster) is None
    assert cluster.rolled_out()


def test_a_lab_killed_while_restoring_leaves_nothing_to_restore(
    tmp_path: Path, cluster: FakeCluster
) -> None:
    plan = write_plan(tmp_path, cluster, [PHASES["kv-pressure"]])
    lab = run_lab(tmp_path, cluster, plan, "out")
    try:
        wait_until(lambda: in_workload(cluster), timeout=60)
        cluster.ready_after = None  # the restored pod never becomes ready: the lab waits
        lab.send_signal(signal.SIGTERM)
    except BaseException:
        lab.kill()
        raise
    kill_when(lab, lambda: len(cluster.patches) == 2)  # the restore's patch went through

    restore = subprocess.run(glassbox_lab("restore", str(plan)), env=lab_env(tmp_path, cluster),
                             capture_output=True, text=True, timeout=120)  # fmt: skip
    assert restore.returncode == 0, restore.stderr
    assert "no record of an interrupted run" in restore.stdout
    assert cluster.current_args == ORIGINAL and record(cluster) is None


def test_a_new_run_first_restores_what_a_killed_run_left_and_reports_a_bad_flag(
    tmp_path: Path, cluster: FakeCluster
) -> None:
    lab = run_lab(tmp_path, cluster, write_plan(tmp_path, cluster, [PHASES["spec-decode"]]), "a")
    kill_when(lab, lambda: in_workload(cluster))
    killed_with = cluster.current_args
    assert killed_with != ORIGINAL

    cluster.progress_deadline = 0.5
    bad = {"kind": "kv-pressure", "name": "bad-flag", "flags": {"--max-model-length": "4096"}}
    second = run_lab(tmp_path, cluster, write_plan(tmp_path, cluster, [bad]), "b")
    _, stderr = second.communicate(timeout=120)

    assert second.returncode == 1, stderr
    assert cluster.current_args == ORIGINAL and record(cluster) is None
    replaced = [op["value"] for p in cluster.patches for op in p if op["op"] == "replace"]
    assert replaced[1] == ORIGINAL  # first the leftover, then the bad flag, then the restore
    assert "--max-model-length=4096" in replaced[2] and replaced[3] == ORIGINAL
    results = json.loads((tmp_path / "b" / "results.json").read_text())
    assert results["notes"][0].startswith("deployment lab/vllm: an interrupted run had left")
    [phase] = results["phases"]
    assert phase["status"] == "failed"
    assert "unrecognized arguments: --max-model-length" in phase["error"]
    report = (tmp_path / "b" / "report.md").read_text()
    assert "vllm serve: error: unrecognized arguments: --max-model-length" in report
    assert "an interrupted run had left its args" in report
