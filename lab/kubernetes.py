"""The lab's Kubernetes backend: vLLM is a Deployment whose container args are patched.

Per phase: read the Deployment, patch its vLLM container's `args` by flag name (a JSON
patch of that one list, guarded by `test` operations so a concurrent edit is refused,
not overwritten), wait for the rollout, find the new pod (Running, Ready, with exactly
the patched args), wait until the Service answers `/health` and shows
`vllm:cache_config_info`, and read that pod's log for the startup facts. `restore()`
patches the original args back and waits for that rollout too.

The lab may be killed (SIGKILL, OOM, node loss) with its args in place, so every patch
also writes the original args onto the Deployment, in the annotation `ANNOTATION`, in
the same atomic JSON patch: the Deployment is never patched without a record of how it
was. `restore()` removes the record with the same patch that puts the args back.
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

import json
import os
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import urllib3
from kubernetes import client as k8s
from kubernetes import config as k8s_config
from kubernetes.client.exceptions import ApiException
from kubernetes.config.config_exception import ConfigException
from vllm_glassbox.exporter.errors import ScrapeError
from vllm_glassbox.exporter.fetch import Fetcher
from vllm_glassbox.exporter.snapshot import read_snapshot
from vllm_glassbox.lab.args import apply_overrides, flag_value
from vllm_glassbox.lab.backend import Deployed, FlagOverrides

_NAMESPACE_FILE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")
_T = TypeVar("_T")


ANNOTATION = "lab.vllm-glassbox/original-args"
"""On the Deployment while the lab's args may be in place: JSON `{"container", "args"
(the original), "patched" (what the lab set)}`."""
_ANNOTATION_PATH = "/metadata/annotations/" + ANNOTATION.replace("~", "~0").replace("/", "~1")


class KubernetesError(RuntimeError):
    """The Deployment could not be changed, rolled out or reached; the message says why."""


@dataclass(frozen=True)
class Record:
    """What the annotation says: the container, its original args, the lab's args."""

    container: str
    original: list[str]
    patched: list[str]
    raw: str  # the annotation's text, to guard a patch with a `test`


def record_of(deployment: Any) -> Record | None:
    """The lab's record on `deployment`, or None; KubernetesError if it is unreadable."""
    raw = (deployment.metadata.annotations or {}).get(ANNOTATION)
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


def record_ops(deployment: Any, record: tuple[str, list[str], list[str]] | None) -> list[Any]:
    """JSON patch operations that write `record` (container, original, patched) as the
    annotation, or remove it (None)."""
    annotations = deployment.metadata.annotations
    if record is None:
        return (
            [{"op": "remove", "path": _ANNOTATION_PATH}]
            if ANNOTATION in (annotations or {})
            else []
        )
    container, original, patched = record
    value = json.dumps({"container": container, "args": original, "patched": patched})
    if annotations is None:  # a JSON patch cannot add a member to a missing object
        return [{"op": "add", "path": "/metadata/annotations", "value": {ANNOTATION: value}}]
    return [{"op": "add", "path": _ANNOTATION_PATH, "value": value}]


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


def rollout_problem(deployment: Any, generation: int) -> str | None:
    """What keeps `deployment` from being rolled out at `generation`; None when it is.

    The checks of `kubectl rollout status`: the controller has seen the change, every
    replica runs the new template, no old replica is left, every new one is available.
    """
    want = deployment.spec.replicas if deployment.spec.replicas is not None else 1
    status = deployment.status or k8s.V1DeploymentStatus()
    observed = status.observed_generation or 0
    updated = status.updated_replicas or 0
    total = status.replicas or 0
    available = status.available_replicas or 0
    if observed < generation:
        return f"the controller has not seen generation {generation} yet (observed {observed})"
    if updated < want:
        return f"{updated} of {want} replicas run the new template"
    if total > updated:
        return f"{total - updated} old replicas pending termination"
    if available < updated:
        return f"{available} of {updated} updated replicas are available"
    return None


def _deadline_exceeded(deployment: Any) -> str | None:
    for condition in (deployment.status.conditions or []) if deployment.status else []:
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


def _ready(pod: Any) -> bool:
    if pod.metadata.deletion_timestamp is not None or pod.status is None:
        return False
    conditions = pod.status.conditions or []
    return pod.status.phase == "Running" and any(
        c.type == "Ready" and c.status == "True" for c in conditions
    )


def _pod_summary(pod: Any) -> str:
    """`name (phase, container: state reason)` for an error message."""
    status = pod.status or k8s.V1PodStatus()
    states = []
    for cs in status.container_statuses or []:
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
    return f"{pod.metadata.name} ({', '.join([status.phase or 'Unknown', *states])})"


def _restarts(pod: Any, container: str | None) -> int:
    statuses = (pod.status.container_statuses or []) if pod.status else []
    return sum(cs.restart_count or 0 for cs in statuses if cs.name == container)


def _set_in_command(command: list[str], name: str) -> bool:
    """Whether vLLM's flag `name` is given in a container's `command`."""
    if not command:
        return False
    # A command starts with a program, never with a model: read what follows it (or
    # follows `serve`) the way `vllm serve` reads its arguments.
    program = command.index("serve") + 1 if "serve" in command else 1
    return flag_value(["serve", *command[program:]], name) is not None


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
        current = self._args_of(container)
        if self._original is None:
            self._original = current
        for name in overrides:
            if _set_in_command(list(container.command or []), name):
                raise KubernetesError(
                    f"{self._where}: {name} is set in container {container.name!r}'s command, "
                    "which the lab does not change; move vLLM's flags to its args"
                )
        args = apply_overrides(self._original, overrides)
        generation = deployment.metadata.generation or 0
        if args != current:
            self.log(f"{self._where}: patching args of {container.name!r}")
            self._patched = True
            record = (container.name, self._original, args)
            ops = record_ops(deployment, record)
            generation = self._patch_args(index, container.name, current, args, ops)
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
        current = self._args_of(container)
        generation = deployment.metadata.generation or 0
        unrecord = record_ops(deployment, None)
        if current != self._original or unrecord:
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
        record = record_of(deployment)
        if record is None:
            return None
        if self.container is not None and self.container != record.container:
            raise KubernetesError(
                f"{self._where}: the lab's record is for container {record.container!r}, "
                f"not {self.container!r}; restore it with a plan naming that container"
            )
        self.container = record.container
        index, container = self._container_of(deployment)
        current = self._args_of(container)
        if current not in (record.original, record.patched):
            raise KubernetesError(
                f"{self._where}: container {record.container!r}'s args changed since an "
                f"interrupted run of the lab patched them; not overwriting them. The "
                f"original args were: {json.dumps(record.original)}. Remove the annotation "
                f"{ANNOTATION} once the args are as they should be"
            )
        guard = [{"op": "test", "path": _ANNOTATION_PATH, "value": record.raw}]
        ops = guard + record_ops(deployment, None)
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
        containers = deployment.spec.template.spec.containers
        if self.container is None:
            if len(containers) != 1:
                names = ", ".join(c.name for c in containers)
                raise KubernetesError(
                    f"{self._where} has {len(containers)} containers ({names}): "
                    "say which one runs vLLM"
                )
            self.container = containers[0].name
        for index, container in enumerate(containers):
            if container.name == self.container:
                return index, container
        names = ", ".join(c.name for c in containers)
        raise KubernetesError(f"{self._where} has no container {self.container!r} (has: {names})")

    def _args_of(self, container: Any) -> list[str]:
        args = list(container.args or [])
        if not args:
            raise KubernetesError(
                f"{self._where}: container {container.name!r} has no args; the lab changes "
                "vLLM's flags in args (e.g. command: [vllm, serve], args: [MODEL, --flag, ...])"
            )
        if len(args) <= 3 and any(" --" in a for a in args):
            raise KubernetesError(
                f"{self._where}: container {container.name!r} runs vLLM from one shell "
                "string; give vLLM's flags as separate args so they can be changed by name"
            )
        return args

    def _patch_args(
        self, index: int, name: str, current: list[str], args: list[str], record: list[Any]
    ) -> int:
        """JSON-patch the container's args from `current` to `args`, with the `record`
        operations (the annotation) in the same atomic patch; the new generation."""
        path = f"/spec/template/spec/containers/{index}"
        body = [
            {"op": "test", "path": f"{path}/name", "value": name},
            {"op": "test", "path": f"{path}/args", "value": current},
            *record,
        ]
        if args != current:
            body.append({"op": "replace", "path": f"{path}/args", "value": args})
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
            if self._args_of(self._container_of(after)[1]) == args and _recorded_as(after, record):
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
            observed = deployment.status.observed_generation if deployment.status else None
            # A stale status may still carry the verdict on the previous rollout.
            stalled = _deadline_exceeded(deployment) if (observed or 0) >= generation else None
            if stalled:
                raise KubernetesError(
                    f"{self._where}: rollout of {what} failed: {stalled}; {problem}"
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
        not_ready = [p for p in pods if not _ready(p)]
        if not not_ready:
            return ""
        note = f"; not ready: {', '.join(_pod_summary(p) for p in not_ready)}"
        crashed = [p for p in not_ready if _restarts(p, self.container) > 0]
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

    def _new_pod(self, deployment: Any, container: str, args: list[str]) -> Any | None:
        """The newest Running and Ready pod whose container runs exactly `args`."""

        def runs_args(pod: Any) -> bool:
            return any(
                c.name == container and list(c.args or []) == args for c in pod.spec.containers
            )

        candidates = [p for p in self._pods(deployment) if _ready(p) and runs_args(p)]
        return max(candidates, key=lambda p: p.metadata.creation_timestamp) if candidates else None

    def _wait_serving(self, deployment: Any, container: str, args: list[str]) -> Any:
        """The new pod, once the Service answers /health and shows cache_config_info."""
        deadline = time.monotonic() + self.timeouts.serving_seconds
        pauses = self._pauses()
        fetcher = Fetcher(self.service_url, self.timeouts.request_seconds, 64 * 1024 * 1024)
        try:
            while True:
                pod = self._new_pod(deployment, container, args)
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


def _recorded_as(deployment: Any, ops: list[Any]) -> bool:
    """Whether the annotation on `deployment` is what the `ops` of a patch left."""
    value = (deployment.metadata.annotations or {}).get(ANNOTATION)
    for op in ops:
        if op["op"] == "remove":
            return value is None
        if op["op"] == "add":
            added = op["value"] if op["path"] == _ANNOTATION_PATH else op["value"][ANNOTATION]
            return bool(value == added)
    return True


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


__all__ = [
    "KubernetesBackend",
    "KubernetesError",
    "Timeouts",
    "label_selector",
    "rollout_problem",
    "served_model_name",
]
