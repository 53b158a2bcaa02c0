"""What the Kubernetes backend's tests share: the vLLM args the API double's Deployment
starts with, a backend pointed at the double, a kube-config naming it, and the RBAC view
of the requests the backend made (the `cluster` fixture is in tests/conftest.py)."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client as k8s
from vllm_glassbox.lab.backends.kubernetes import KubernetesBackend, Timeouts

from tests.k8s_double import FakeCluster, Recorded

ORIGINAL = [
    "/models/tiny", "--served-model-name", "tiny", "--max-model-len", "2048",
    "--kv-cache-memory-bytes", "33554432", "--enforce-eager",
]  # fmt: skip
"""The vLLM container's args before the lab patches them (the double's captured server)."""
SMALL_POOL = {"--kv-cache-memory-bytes": "8388608"}
FAST = Timeouts(rollout_seconds=5, serving_seconds=2, request_seconds=2, poll_seconds=0.02)


def backend_for(cluster: FakeCluster, **options: Any) -> KubernetesBackend:
    """The backend against the double's API and Service, naming its vLLM container."""
    api = k8s.ApiClient(k8s.Configuration(host=cluster.api_url))
    options.setdefault("container", cluster.container)
    options.setdefault("timeouts", FAST)
    return KubernetesBackend(api, cluster.namespace, cluster.name, cluster.service_url, **options)


def write_kubeconfig(path: Path, cluster: FakeCluster, namespace: str | None = None) -> Path:
    """A kube-config whose current context is the double (in `namespace`, if given)."""
    context = {"cluster": "double", "user": "me"}
    if namespace is not None:
        context["namespace"] = namespace
    path.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "lab",
        "clusters": [{"name": "double", "cluster": {"server": cluster.api_url}}],
        "users": [{"name": "me", "user": {"token": "not-a-secret"}}],
        "contexts": [{"name": "lab", "context": context}],
    }))  # fmt: skip
    return path


def as_rbac(request: Recorded) -> tuple[str, str, str, str | None]:
    """(API group, resource, verb, name) of a request, as RBAC sees it."""
    parts = request.path.strip("/").split("/")
    group, rest = (parts[1], parts[3:]) if parts[0] == "apis" else ("", parts[2:])
    resource, name = rest[2], (rest[3] if len(rest) > 3 else None)
    if len(rest) > 4:
        resource += "/" + rest[4]
    verb = "patch" if request.method == "PATCH" else ("get" if name else "list")
    return group, resource, verb, name


def not_allowed(
    rules: list[dict[str, Any]], requests: Iterable[Recorded]
) -> list[tuple[str, str, str, str | None]]:
    """The requests, as RBAC sees them, that no rule of a Role allows."""
    return [
        (group, resource, verb, name)
        for group, resource, verb, name in sorted({as_rbac(r) for r in requests}, key=str)
        if not any(
            group in rule["apiGroups"] and resource in rule["resources"]
            and verb in rule["verbs"] and name in rule.get("resourceNames", [name])
            for rule in rules
        )
    ]  # fmt: skip
