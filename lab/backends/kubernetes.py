"""The lab's Kubernetes backend: vLLM is a Deployment whose container args are patched.

This module is the I/O edge: the API calls, their retries and the waits. What a patch
holds, the record of the original args and what a restore puts back are the pure
functions of lab/backends/restore_protocol.py; what a Deployment's and its pods' status say, those
of lab/backends/rollout_status.py.

Per phase: read the Deployment, patch its vLLM container's `args` by flag name (with the
record of the original args in the same atomic patch), wait for the rollout, find the new
pod (Running, Ready, with exactly the patched args), wait until the Service answers
`/health` and shows `vllm:cache_config_info`, and read that pod's log for the startup
facts. `restore()` patches the original args back and waits for that rollout too.
`restore_leftover()` (`glassbox lab restore`, and the start of every run) finds a record
a killed run left and puts those args back.

Every API call has a request timeout and every wait a deadline; transient API errors
(5xx, 429, a dropped connection) are retried until the deadline. The backend polls with
GET/LIST instead of watching, so there is no resourceVersion to expire (no 410 Gone).

It needs only: get/patch on the one Deployment, get/list on pods, get on pods/log (see
docs/lab-kubernetes.md). It never reads ReplicaSets: the new pod is the one whose
container runs the patched args.

No Kubernetes API server can run where this is developed: the tests drive this code
through the real `kubernetes` client against a loopback double of the few API paths it
uses (tests/k8s_double.py).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import urllib3
from kubernetes import client as k8s
from kubernetes import config as k8s_config
from kubernetes.client.exceptions import ApiException
from kubernetes.config.config_exception import ConfigException
from vllm_glassbox.core.errors import ScrapeError
from vllm_glassbox.core.fetch import Fetcher
from vllm_glassbox.core.snapshot import read_snapshot
from vllm_glassbox.lab.backends.args import apply_overrides
from vllm_glassbox.lab.backends.backend import Deployed, FlagOverrides
from vllm_glassbox.lab.backends.restore_protocol import (
    KubernetesError,
    Operation,
    args_patch,
    container_index,
    leftover_container,
    leftover_record_ops,
    patch_went_through,
    patchable_args,
    record_of,
    refuse_flags_in_command,
    restore_record_ops,
    served_model_name,
    write_record,
)
from vllm_glassbox.lab.backends.rollout_status import (
    label_selector,
    newest_pod_running,
    pod_ready,
    pod_summary,
    restarts,
    rollout_problem,
    stalled,
)

_NAMESPACE_FILE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")
_T = TypeVar("_T")


@dataclass(frozen=True)
class Timeouts:
    rollout_seconds: float = 1800.0  # a rollout: image pull, weights load, compile, warmup
    serving_seconds: float = 300.0  # after the rollout: /health and cache_config_info
    request_seconds: float = 30.0  # one API or HTTP request
    poll_seconds: float = 2.0
    max_log_bytes: int = 16 * 1024 * 1024  # the startup facts are at the start of the log


def _transient(error: Exception) -> bool:
    if isinstance(error, ApiException):
        return error.status in (429, 500, 502, 503, 504)
    return isinstance(error, urllib3.exceptions.HTTPError | ConnectionError | TimeoutError)


def _describe(error: Exception) -> str:
    if isinstance(error, ApiException):
        return f"HTTP {error.status} {error.reason}"
    return f"{type(error).__name__}: {error}"


class KubernetesBackend:
    """A vLLM Deployment, patched per phase and restored at the end."""

    name = "kubernetes"

    def __init__(
        self,
        api_client: k8s.ApiClient,
        namespace: str,
        deployment: str,
        service_url: str,
        container: str | None = None,
        timeouts: Timeouts = Timeouts(),
        log: Callable[[str], None] = lambda message: None,
    ) -> None:
        self.namespace = namespace
        self.deployment = deployment
        self.service_url = service_url.rstrip("/")
        self.container = container  # resolved to the only container on first read
        self.timeouts = timeouts
        self.log = log
        self._apps = k8s.AppsV1Api(api_client)
        self._core = k8s.CoreV1Api(api_client)
        self._original: list[str] | None = None
        self._patched = False  # our args may be in place: restore() has work to do
        self._leftover_checked = False

    @classmethod
    def from_environment(
        cls,
        deployment: str,
        service_url: str,
        namespace: str | None = None,
        container: str | None = None,
        timeouts: Timeouts = Timeouts(),
        log: Callable[[str], None] = lambda message: None,
    ) -> KubernetesBackend:
        """In a pod: its ServiceAccount and namespace; else kube-config's current context
        ($KUBECONFIG, else ~/.kube/config)."""
        configuration = k8s.Configuration()
        try:
            k8s_config.load_incluster_config(client_configuration=configuration)
            default_namespace = _NAMESPACE_FILE.read_text().strip()
        except ConfigException:
            # The client reads $KUBECONFIG once, at import; read it now.
            path = os.environ.get("KUBECONFIG") or "~/.kube/config"
            try:
                k8s_config.load_kube_config(path, client_configuration=configuration)
                _, active = k8s_config.list_kube_config_contexts(path)
            except (ConfigException, OSError) as e:
                raise KubernetesError(
                    f"no Kubernetes configuration: not in a pod, and no usable kube-config ({e})"
                ) from e
            default_namespace = active.get("context", {}).get("namespace") or "default"
        return cls(
            k8s.ApiClient(configuration),
            namespace or default_namespace,
            deployment,
            service_url,
            container,
            timeouts,
            log,
        )

    @property
    def _where(self) -> str:
        return f"deployment {self.namespace}/{self.deployment}"

    # -- the Backend contract ------------------------------------------------------------

    def deploy(self, overrides: FlagOverrides) -> Deployed:
        if not self._leftover_checked:  # a run killed before it could restore comes first
            restored = self.restore_leftover()
            if restored:
                self.log(restored)
        deployment = self._read()
        if deployment.spec.replicas == 0:
            raise KubernetesError(f"{self._where} is scaled to 0 replicas: nothing would serve")
        index, container = self._container_of(deployment)
        current = patchable_args(self._where, container.name, container.args or [])
        if self._original is None:
            self._original = current
        refuse_flags_in_command(self._where, container.name, container.command or [], overrides)
        args = apply_overrides(self._original, overrides)
        generation = deployment.metadata.generation or 0
        if args != current:
            self.log(f"{self._where}: patching args of {container.name!r}")
            self._patched = True
            annotations = deployment.metadata.annotations
            record = write_record(annotations, container.name, self._original, args)
            generation = self._patch_args(index, container.name, current, args, record)
        self._wait_rollout(generation, "the patched args")
        pod = self._wait_serving(deployment, container.name, args)
        return Deployed(
            self.service_url, self._read_log(pod, container.name), served_model_name(args)
        )

    def restore(self) -> None:
        if self._original is None or not self._patched:
            return
        deployment = self._read()
        index, container = self._container_of(deployment)
        current = patchable_args(self._where, container.name, container.args or [])
        generation = deployment.metadata.generation or 0
        unrecord = restore_record_ops(deployment.metadata.annotations, current, self._original)
        if unrecord is not None:
            self.log(f"{self._where}: restoring the original args of {container.name!r}")
            generation = self._patch_args(index, container.name, current, self._original, unrecord)
        self._wait_rollout(generation, "the original args (restored)")
        self._patched = False

    def restore_leftover(self) -> str | None:
        """Put back the original args a killed run recorded on the Deployment, and wait
        for that rollout. Returns what was done, or None when there was no record.

        Args that are neither the recorded original nor what the lab set were changed by
        someone since: they are not overwritten (KubernetesError says so).
        """
        self._leftover_checked = True
        deployment = self._read()
        record = record_of(deployment.metadata.annotations)
        if record is None:
            return None
        self.container = leftover_container(self._where, record, self.container)
        index, container = self._container_of(deployment)
        current = patchable_args(self._where, container.name, container.args or [])
        ops = leftover_record_ops(self._where, record, current)
        generation = self._patch_args(index, container.name, current, record.original, ops)
        self._wait_rollout(generation, "the original args (left by an interrupted run)")
        what = "put back" if current != record.original else "already in place"
        return (
            f"{self._where}: an interrupted run had left its args on container "
            f"{record.container!r}; the original args are {what} and rolled out"
        )

    # -- steps ---------------------------------------------------------------------------

    def _call(self, what: str, call: Callable[[], _T], deadline: float | None = None) -> _T:
        """One API call; transient errors are retried until `deadline` (default: one try
        plus the request timeout's worth of retries). Others raise KubernetesError."""
        deadline = deadline or time.monotonic() + self.timeouts.request_seconds
        while True:
            try:
                return call()
            except (ApiException, urllib3.exceptions.HTTPError, OSError) as e:
                if _transient(e) and time.monotonic() + self.timeouts.poll_seconds < deadline:
                    time.sleep(self.timeouts.poll_seconds)
                    continue
                hint = ""
                if isinstance(e, ApiException) and e.status == 403:
                    hint = " (forbidden: see the Role in docs/lab-kubernetes.md)"
                if isinstance(e, ApiException) and e.status == 404:
                    hint = " (not found)"
                raise KubernetesError(f"{self._where}: {what} failed: {_describe(e)}{hint}") from e

    def _read(self, deadline: float | None = None) -> Any:
        return self._call(
            "reading the Deployment",
            lambda: self._apps.read_namespaced_deployment(
                self.deployment, self.namespace, _request_timeout=self.timeouts.request_seconds
            ),
            deadline,
        )

    def _container_of(self, deployment: Any) -> tuple[int, Any]:
        """The vLLM container and its index; the only one when none was named."""
        containers = deployment.spec.template.spec.containers
        index = container_index(self._where, [c.name for c in containers], self.container)
        self.container = containers[index].name
        return index, containers[index]

    def _patch_args(
        self,
        index: int,
        name: str,
        current: list[str],
        args: list[str],
        record: list[Operation],
    ) -> int:
        """JSON-patch the container's args from `current` to `args`, with the `record`
        operations (the annotation) in the same atomic patch; the new generation."""
        body = args_patch(index, name, current, args, record)
        try:
            patched = self._call(
                "patching the args",
                lambda: self._apps.patch_namespaced_deployment(
                    self.deployment,
                    self.namespace,
                    body,
                    _content_type="application/json-patch+json",
                    _request_timeout=self.timeouts.request_seconds,
                ),
            )
        except KubernetesError as e:
            # A retried patch whose first try went through fails its `test`: check.
            after = self._read()
            container = self._container_of(after)[1]
            now = patchable_args(self._where, container.name, container.args or [])
            if patch_went_through(after.metadata.annotations, now, args, record):
                return int(after.metadata.generation or 0)
            if isinstance(e.__cause__, ApiException) and e.__cause__.status == 422:
                raise KubernetesError(
                    f"{self._where}: container {name!r} changed while the lab patched it "
                    "(someone else edited the Deployment); not overwriting it"
                ) from e
            raise
        return int(patched.metadata.generation or 0)

    def _pauses(self) -> Iterator[float]:
        """Polling pauses: short at first (a quick rollout is seen at once), then the
        configured period."""
        pause = 0.1
        while True:
            yield min(pause, self.timeouts.poll_seconds)
            pause *= 2

    def _wait_rollout(self, generation: int, what: str) -> None:
        deadline = time.monotonic() + self.timeouts.rollout_seconds
        pauses = self._pauses()
        while True:
            deployment = self._read(deadline)
            problem = rollout_problem(deployment, generation)
            if problem is None:
                return
            why_stalled = stalled(deployment, generation)
            if why_stalled:
                raise KubernetesError(
                    f"{self._where}: rollout of {what} failed: {why_stalled}; {problem}"
                    f"{self._pods_note(deployment)}"
                )
            if time.monotonic() > deadline:
                raise KubernetesError(
                    f"{self._where}: rollout of {what} not complete after "
                    f"{self.timeouts.rollout_seconds:g}s: {problem}{self._pods_note(deployment)}"
                )
            time.sleep(next(pauses))

    def _pods(self, deployment: Any, deadline: float | None = None) -> list[Any]:
        selector = label_selector(deployment.spec.selector)
        pods = self._call(
            "listing its pods",
            lambda: self._core.list_namespaced_pod(
                self.namespace,
                label_selector=selector,
                _request_timeout=self.timeouts.request_seconds,
            ),
            deadline,
        )
        return list(pods.items or [])

    def _pods_note(self, deployment: Any) -> str:
        """`; not ready: a (Running, vllm waiting: CrashLoopBackOff, 3 restarts); a's last
        log lines: …` or "": why a rollout does not complete, in the pods' words."""
        try:
            pods = self._pods(deployment)
        except KubernetesError:
            return ""
        not_ready = [p for p in pods if not pod_ready(p)]
        if not not_ready:
            return ""
        note = f"; not ready: {', '.join(pod_summary(p) for p in not_ready)}"
        crashed = [p for p in not_ready if restarts(p, self.container) > 0]
        if crashed:  # vLLM says why it exits: a bad flag, out of memory, …
            note += self._crash_lines(crashed[0])
        return note

    def _crash_lines(self, pod: Any) -> str:
        """`; POD's last log lines: a | b` from its crashed vLLM container, or ""."""
        try:
            response = self._core.read_namespaced_pod_log(
                pod.metadata.name,
                self.namespace,
                container=self.container,
                previous=True,
                tail_lines=5,
                limit_bytes=4096,
                _preload_content=False,
                _request_timeout=self.timeouts.request_seconds,
            )
            try:
                text = response.read(4096).decode("utf-8", "replace")
            finally:
                response.release_conn()
        except (ApiException, urllib3.exceptions.HTTPError, OSError):
            return ""
        lines = [line.strip() for line in text.splitlines() if line.strip()]
        return f"; {pod.metadata.name}'s last log lines: {' | '.join(lines)}" if lines else ""

    def _wait_serving(self, deployment: Any, container: str, args: list[str]) -> Any:
        """The new pod, once the Service answers /health and shows cache_config_info."""
        deadline = time.monotonic() + self.timeouts.serving_seconds
        pauses = self._pauses()
        fetcher = Fetcher(self.service_url, self.timeouts.request_seconds, 64 * 1024 * 1024)
        try:
            while True:
                pod = newest_pod_running(self._pods(deployment), container, args)
                problem = "no Running and Ready pod runs the patched args"
                if pod is not None:
                    problem = _serving_problem(fetcher) or ""
                    if not problem:
                        return pod
                if time.monotonic() > deadline:
                    raise KubernetesError(
                        f"{self._where}: rolled out, but not serving after "
                        f"{self.timeouts.serving_seconds:g}s: {problem}"
                        f"{self._pods_note(deployment)}"
                    )
                time.sleep(next(pauses))
        finally:
            fetcher.close()

    def _read_log(self, pod: Any, container: str) -> str:
        def read() -> str:
            response = self._core.read_namespaced_pod_log(
                pod.metadata.name,
                self.namespace,
                container=container,
                limit_bytes=self.timeouts.max_log_bytes,
                _preload_content=False,
                _request_timeout=self.timeouts.request_seconds,
            )
            try:
                data: bytes = response.read(self.timeouts.max_log_bytes)
            finally:
                response.release_conn()
            return data.decode("utf-8", "replace")

        return self._call(f"reading the log of pod {pod.metadata.name}", read)


def _serving_problem(fetcher: Fetcher) -> str | None:
    """Why the Service does not serve vLLM yet, or None."""
    try:
        fetcher.get_text("/health")
        snapshot = read_snapshot(fetcher.get_text("/metrics"))
    except ScrapeError as e:
        return f"{fetcher.base_url}: {e}"
    if not snapshot.cache:
        return f"{fetcher.base_url}/metrics has no vllm:cache_config_info yet"
    return None


__all__ = ["KubernetesBackend", "KubernetesError", "Timeouts"]
