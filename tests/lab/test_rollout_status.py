"""What a Deployment's and its pods' status say (lab/backends/rollout_status.py), on the
`kubernetes` client's objects as the API would return them; no server runs."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from kubernetes import client as k8s
from vllm_glassbox.lab.backends.rollout_status import (
    label_selector,
    newest_pod_running,
    pod_ready,
    pod_summary,
    restarts,
    rollout_problem,
    stalled,
)

from tests.k8s_lab import ORIGINAL


def _deployment(want: int, generation: int, **status: int) -> k8s.V1Deployment:
    return k8s.V1Deployment(
        metadata=k8s.V1ObjectMeta(generation=generation),
        spec=k8s.V1DeploymentSpec(
            replicas=want, selector=k8s.V1LabelSelector(), template=k8s.V1PodTemplateSpec()
        ),
        status=k8s.V1DeploymentStatus(**status),
    )


@pytest.mark.parametrize(
    ("deployment", "problem"),
    [
        (_deployment(1, 3, observed_generation=2, replicas=1, updated_replicas=1,
                     available_replicas=1),
         "the controller has not seen generation 3 yet (observed 2)"),
        (_deployment(2, 3, observed_generation=3, replicas=2, updated_replicas=1,
                     available_replicas=2),
         "1 of 2 replicas run the new template"),
        (_deployment(1, 3, observed_generation=3, replicas=2, updated_replicas=1,
                     available_replicas=1),
         "1 old replicas pending termination"),
        (_deployment(2, 3, observed_generation=3, replicas=2, updated_replicas=2,
                     available_replicas=1),
         "1 of 2 updated replicas are available"),
        (_deployment(2, 3, observed_generation=3, replicas=2, updated_replicas=2,
                     available_replicas=2),
         None),
    ],
)  # fmt: skip
def test_a_rollout_problem_names_the_first_check_of_kubectl_rollout_status_that_fails(
    deployment: k8s.V1Deployment, problem: str | None
) -> None:
    assert rollout_problem(deployment, 3) == problem


def test_label_selector_renders_labels_and_expressions() -> None:
    selector = k8s.V1LabelSelector(
        match_labels={"b": "2", "a": "1"},
        match_expressions=[
            k8s.V1LabelSelectorRequirement(key="tier", operator="In", values=["x", "y"]),
            k8s.V1LabelSelectorRequirement(key="env", operator="NotIn", values=["dev"]),
            k8s.V1LabelSelectorRequirement(key="gpu", operator="Exists"),
            k8s.V1LabelSelectorRequirement(key="old", operator="DoesNotExist"),
        ],
    )
    assert label_selector(selector) == "a=1,b=2,tier in (x,y),env notin (dev),gpu,!old"


def _progressing(reason: str, message: str | None = None) -> k8s.V1DeploymentCondition:
    return k8s.V1DeploymentCondition(
        type="Progressing", status="False", reason=reason, message=message
    )


def test_a_rollout_past_its_progress_deadline_is_stalled_with_the_controllers_words() -> None:
    deployment = _deployment(1, 3, observed_generation=3, replicas=2, updated_replicas=1)
    deployment.status.conditions = [
        _progressing("ProgressDeadlineExceeded", 'ReplicaSet "vllm-abc" has timed out progressing.')
    ]
    assert stalled(deployment, 3) == 'ReplicaSet "vllm-abc" has timed out progressing.'
    # A status the controller wrote before it saw generation 3 is about the last rollout.
    assert stalled(deployment, 4) is None


def test_a_progressing_rollout_is_not_stalled() -> None:
    deployment = _deployment(1, 3, observed_generation=3)
    deployment.status.conditions = [_progressing("ReplicaSetUpdated")]
    assert stalled(deployment, 3) is None
    assert stalled(_deployment(1, 3), 3) is None


def _pod(
    name: str,
    args: list[str],
    *,
    ready: bool = True,
    created: int = 0,
    terminating: bool = False,
    vllm: k8s.V1ContainerStatus | None = None,
) -> k8s.V1Pod:
    return k8s.V1Pod(
        metadata=k8s.V1ObjectMeta(
            name=name,
            creation_timestamp=datetime.fromtimestamp(1_700_000_000 + created, UTC),
            deletion_timestamp=datetime.fromtimestamp(1_700_000_100, UTC) if terminating else None,
        ),
        spec=k8s.V1PodSpec(
            containers=[
                k8s.V1Container(name="exporter"),
                k8s.V1Container(name="vllm", args=args),
            ]
        ),
        status=k8s.V1PodStatus(
            phase="Running",
            conditions=[k8s.V1PodCondition(type="Ready", status="True" if ready else "False")],
            container_statuses=[vllm] if vllm else None,
        ),
    )


def _crash_looping(restart_count: int) -> k8s.V1ContainerStatus:
    return k8s.V1ContainerStatus(
        name="vllm", image="vllm", image_id="", ready=False, restart_count=restart_count,
        state=k8s.V1ContainerState(
            waiting=k8s.V1ContainerStateWaiting(reason="CrashLoopBackOff")
        ),
    )  # fmt: skip


def test_the_new_pod_is_the_newest_ready_one_running_exactly_the_args() -> None:
    patched = [*ORIGINAL, "--max-num-seqs", "4"]
    pods = [
        _pod("old", ORIGINAL, created=0),
        _pod("new", patched, created=10),
        _pod("newer-not-ready", patched, created=20, ready=False),
        _pod("newest-terminating", patched, created=30, terminating=True),
        _pod("earlier", patched, created=5),
    ]
    assert newest_pod_running(pods, "vllm", patched).metadata.name == "new"
    assert newest_pod_running(pods, "vllm", ORIGINAL).metadata.name == "old"
    assert newest_pod_running(pods, "exporter", patched) is None
    assert [pod_ready(p) for p in pods] == [True, True, False, False, True]


def test_a_pod_that_is_not_ready_is_summed_up_in_its_containers_words() -> None:
    crashing = _pod("vllm-1", ORIGINAL, ready=False, vllm=_crash_looping(3))
    assert pod_summary(crashing) == "vllm-1 (Running, vllm waiting: CrashLoopBackOff, 3 restarts)"
    assert restarts(crashing, "vllm") == 3 and restarts(crashing, "exporter") == 0
    leaving = _pod("vllm-0", ORIGINAL, terminating=True)
    assert pod_summary(leaving) == "vllm-0 (Running, terminating)"
    assert pod_summary(k8s.V1Pod(metadata=k8s.V1ObjectMeta(name="p"))) == "p (Unknown)"
