"""What the API's objects say about a rollout, as pure functions: whether a Deployment is
rolled out (and if not, why), whether it stalled, which pod is the new one, and why a pod
is not ready, in words for an error message.

They read the `kubernetes` client's objects (V1Deployment, V1Pod, V1LabelSelector) by
attribute and never call the API; lab/backends/kubernetes.py reads the objects and waits.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from vllm_glassbox.lab.backends.restore_protocol import KubernetesError


def rollout_problem(deployment: Any, generation: int) -> str | None:
    """What keeps `deployment` from being rolled out at `generation`; None when it is.

    The checks of `kubectl rollout status`: the controller has seen the change, every
    replica runs the new template, no old replica is left, every new one is available.
    """
    want = deployment.spec.replicas if deployment.spec.replicas is not None else 1
    status = deployment.status
    observed = (status.observed_generation if status else None) or 0
    updated = (status.updated_replicas if status else None) or 0
    total = (status.replicas if status else None) or 0
    available = (status.available_replicas if status else None) or 0
    if observed < generation:
        return f"the controller has not seen generation {generation} yet (observed {observed})"
    if updated < want:
        return f"{updated} of {want} replicas run the new template"
    if total > updated:
        return f"{total - updated} old replicas pending termination"
    if available < updated:
        return f"{available} of {updated} updated replicas are available"
    return None


def stalled(deployment: Any, generation: int) -> str | None:
    """Why the rollout of `generation` will not complete (the controller's progress
    deadline passed), or None."""
    status = deployment.status
    # A stale status may still carry the verdict on the previous rollout.
    if status is None or (status.observed_generation or 0) < generation:
        return None
    for condition in status.conditions or []:
        if condition.type == "Progressing" and condition.reason == "ProgressDeadlineExceeded":
            return str(condition.message or "progress deadline exceeded")
    return None


def label_selector(selector: Any) -> str:
    """A V1LabelSelector as the `labelSelector` query string."""
    parts = [f"{k}={v}" for k, v in sorted((selector.match_labels or {}).items())]
    for expression in selector.match_expressions or []:
        key, op, values = expression.key, expression.operator, expression.values or []
        if op == "In":
            parts.append(f"{key} in ({','.join(values)})")
        elif op == "NotIn":
            parts.append(f"{key} notin ({','.join(values)})")
        elif op == "Exists":
            parts.append(key)
        elif op == "DoesNotExist":
            parts.append(f"!{key}")
        else:
            raise KubernetesError(f"unknown label selector operator {op!r} for key {key!r}")
    return ",".join(parts)


def pod_ready(pod: Any) -> bool:
    """Running, Ready and not terminating."""
    if pod.metadata.deletion_timestamp is not None or pod.status is None:
        return False
    conditions = pod.status.conditions or []
    return pod.status.phase == "Running" and any(
        c.type == "Ready" and c.status == "True" for c in conditions
    )


def newest_pod_running(pods: Sequence[Any], container: str, args: list[str]) -> Any | None:
    """The newest Running and Ready pod whose `container` runs exactly `args`."""

    def runs_args(pod: Any) -> bool:
        return any(c.name == container and list(c.args or []) == args for c in pod.spec.containers)

    candidates = [p for p in pods if pod_ready(p) and runs_args(p)]
    return max(candidates, key=lambda p: p.metadata.creation_timestamp) if candidates else None


def pod_summary(pod: Any) -> str:
    """`name (phase, container: state reason)` for an error message."""
    status = pod.status
    states = []
    for cs in (status.container_statuses if status else None) or []:
        state = cs.state
        if state and state.waiting:
            states.append(f"{cs.name} waiting: {state.waiting.reason or '?'}")
        elif state and state.terminated:
            states.append(f"{cs.name} terminated: {state.terminated.reason or '?'}")
        elif not cs.ready:
            states.append(f"{cs.name} not ready")
        if cs.restart_count:
            states.append(f"{cs.restart_count} restarts")
    if pod.metadata.deletion_timestamp:
        states.insert(0, "terminating")
    phase = (status.phase if status else None) or "Unknown"
    return f"{pod.metadata.name} ({', '.join([phase, *states])})"


def restarts(pod: Any, container: str | None) -> int:
    """How often `container` restarted in `pod`."""
    statuses = (pod.status.container_statuses or []) if pod.status else []
    return sum(cs.restart_count or 0 for cs in statuses if cs.name == container)
