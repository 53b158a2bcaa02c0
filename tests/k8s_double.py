"""A loopback double of the Kubernetes API subset the lab's backend uses, and a fake vLLM.

No Kubernetes API server can run on this machine: there is no cluster, and no package
on the registries reachable here ships kube-apiserver (Debian has kubectl and etcd, not
the API server; kind and k3s fetch their binaries at run time). So the
backend's tests drive the real `kubernetes` client (`Configuration(host=...)`) against
this real HTTP server on 127.0.0.1, which implements exactly what lab/backends/kubernetes.py
calls and nothing else (anything else is a 404, another patch type a 415):

    GET   /apis/apps/v1/namespaces/{ns}/deployments/{name}
    PATCH /apis/apps/v1/namespaces/{ns}/deployments/{name}    JSON patch (RFC 6902)
    GET   /api/v1/namespaces/{ns}/pods?labelSelector=k=v,...
    GET   /api/v1/namespaces/{ns}/pods/{pod}/log?container=...&limitBytes=...
                                                   &previous=true&tailLines=N

A changed pod template starts a simulated rolling update (maxSurge 1, maxUnavailable 0,
as a 1-replica Deployment gets by default): the generation bumps, the controller
"observes" it after `observe_after` seconds, a pod with the new template hash appears
and becomes Ready after `ready_after` seconds (None: never, it crash-loops), then the
old pods terminate. Returning to an older template whose pods still run needs no new pod,
as with a ReplicaSet scaled back up. A pod whose vLLM args hold a flag of `unknown_flags`
crash-loops, as vLLM does when its argument parser refuses a flag: its previous
container's log is the parser's error, and it never becomes Ready.

The fake vLLM behind the "Service URL" answers `/health` and `/metrics` for the newest
Ready pod, and takes `POST /v1/completions` without ever answering (a long generation,
for tests that kill the lab in the middle of a workload). The page is a real capture of
vLLM 0.32 (tests/fixtures/metrics) whose `vllm:cache_config_info` is rewritten to that
pod's `--kv-cache-memory-bytes`, and the pod's log is the real captured startup log with
its `non-default args` and KV cache size lines rewritten to the pod's args, so each
pod's log tells which args it ran.

Every request is recorded (`requests`, `patches`); `faults` makes a matching request
fail with a given HTTP status, to test each step's failure.
"""

from __future__ import annotations

import copy
import hashlib
import json
import re
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

FIXTURES = Path(__file__).parent / "fixtures"
CAPTURED_PAGE = FIXTURES / "metrics" / "cpu-0.32" / "plain-idle.txt"
CAPTURED_LOG = FIXTURES / "logs" / "cpu-0.32-plain-startup.log"
# The captured server: --kv-cache-memory-bytes 33554432 held 16,384 tokens in blocks of 128.
BYTES_PER_TOKEN = 2048
BLOCK_SIZE = 128
DEFAULT_KV_BYTES = 33554432
DEFAULT_MAX_MODEL_LEN = 2048
UNKNOWN_FLAGS = frozenset({"--max-model-length"})


def _captured(path: Path) -> str:
    if not path.exists():
        raise FileNotFoundError(f"{path}: the real vLLM capture is missing; see tests/fixtures")
    return path.read_text()


def simple_flags(args: Sequence[str]) -> dict[str, str]:
    """`--name value` / `--name=value` pairs, read plainly (independently of lab.args)."""
    flags: dict[str, str] = {}
    for i, arg in enumerate(args):
        if arg.startswith("--"):
            name, eq, value = arg.partition("=")
            if not eq and i + 1 < len(args) and not args[i + 1].startswith("--"):
                value = args[i + 1]
            flags[name.replace("_", "-")] = value
    return flags


def kv_tokens(args: Sequence[str]) -> int:
    """The KV pool this fake vLLM reports for `args` (the captured model's ratio)."""
    flags = simple_flags(args)
    return int(flags.get("--kv-cache-memory-bytes", DEFAULT_KV_BYTES)) // BYTES_PER_TOKEN


def startup_log(args: Sequence[str]) -> str:
    """The captured vLLM 0.32 startup log, as a server started with `args` writes it."""
    flags = simple_flags(args)
    tokens = kv_tokens(args)
    max_len = int(flags.get("--max-model-len", DEFAULT_MAX_MODEL_LEN))
    non_default = {name[2:].replace("-", "_"): value for name, value in flags.items()}
    log = _captured(CAPTURED_LOG)
    log = re.sub(r"non-default args: .*", f"non-default args: {non_default!r}", log)
    return re.sub(
        r"KV cache size: [\d,]+ tokens, Maximum concurrency for [\d,]+ tokens per request: "
        r"[\d.]+x",
        f"KV cache size: {tokens:,} tokens, Maximum concurrency for {max_len:,} tokens "
        f"per request: {tokens / max_len:.2f}x",
        log,
    )


def parser_error(args: Sequence[str], unknown: frozenset[str]) -> str | None:
    """vLLM's argument parser's complaint about `args`, as it logs it, or None."""
    bad = [a for a in args if a.split("=", 1)[0] in unknown]
    if not bad:
        return None
    return (
        "usage: vllm serve [model_tag] [options]\n"
        f"vllm serve: error: unrecognized arguments: {' '.join(bad)}\n"
    )


def metrics_page(args: Sequence[str]) -> str:
    """The captured /metrics page with cache_config_info as `args` would make it."""
    flags = simple_flags(args)
    tokens = kv_tokens(args)
    max_len = int(flags.get("--max-model-len", DEFAULT_MAX_MODEL_LEN))
    labels = {
        "kv_cache_memory_bytes": str(tokens * BYTES_PER_TOKEN),
        "kv_cache_size_tokens": str(tokens),
        "num_gpu_blocks": str(tokens // BLOCK_SIZE),
        "kv_cache_max_concurrency": str(tokens / max_len),
    }

    def rewrite(line: re.Match[str]) -> str:
        text = line.group(0)
        for name, value in labels.items():
            text = re.sub(rf'(?<=[{{,]){name}="[^"]*"', f'{name}="{value}"', text)
        return text

    return re.sub(r"^vllm:cache_config_info\{.*$", rewrite, _captured(CAPTURED_PAGE), flags=re.M)


# -- JSON patch (RFC 6902), the subset a patch of a list inside objects needs -----------


class PatchError(Exception):
    pass


def _pointer(path: str) -> list[str]:
    if not path.startswith("/"):
        raise PatchError(f"bad JSON pointer {path!r}")
    return [p.replace("~1", "/").replace("~0", "~") for p in path[1:].split("/")]


def _parent(document: Any, path: str) -> tuple[Any, str]:
    *parents, last = _pointer(path)
    node = document
    for part in parents:
        try:
            node = node[int(part)] if isinstance(node, list) else node[part]
        except (KeyError, IndexError, ValueError) as e:
            raise PatchError(f"path {path!r} does not exist") from e
    return node, last


def json_patch(document: Any, operations: list[dict[str, Any]]) -> Any:
    """`document` after `operations` (test, add, replace, remove); raises PatchError."""
    document = copy.deepcopy(document)
    for op in operations:
        parent, key = _parent(document, op["path"])
        kind = op["op"]
        if isinstance(parent, list):
            index = len(parent) if key == "-" else int(key)
            if kind != "add" and not 0 <= index < len(parent):
                raise PatchError(f"index {key} out of range at {op['path']!r}")
            if kind == "test" and parent[index] != op["value"]:
                raise PatchError(f"test failed at {op['path']!r}")
            if kind == "add":
                parent.insert(index, op["value"])
            elif kind == "replace":
                parent[index] = op["value"]
            elif kind == "remove":
                del parent[index]
        else:
            if kind in ("test", "replace", "remove") and key not in parent:
                raise PatchError(f"path {op['path']!r} does not exist")
            if kind == "test" and parent[key] != op["value"]:
                raise PatchError(f"test failed at {op['path']!r}")
            if kind in ("add", "replace"):
                parent[key] = op["value"]
            elif kind == "remove":
                del parent[key]
        if kind not in ("test", "add", "replace", "remove"):
            raise PatchError(f"unsupported op {kind!r}")
    return document


# -- the simulated cluster ---------------------------------------------------------------


def deployment_manifest(
    name: str = "vllm",
    namespace: str = "lab",
    container: str = "vllm",
    args: Sequence[str] = (),
    command: Sequence[str] = ("vllm", "serve"),
    sidecars: Sequence[str] = (),
    replicas: int = 1,
) -> dict[str, Any]:
    """A vLLM Deployment as the API server returns it, before any rollout."""
    labels = {"app.kubernetes.io/name": "vllm", "app.kubernetes.io/instance": name}
    # Sidecars first, so the vLLM container's index in the patch is not always 0.
    containers: list[dict[str, Any]] = [{"name": s, "image": f"example/{s}:1"} for s in sidecars]
    vllm: dict[str, Any] = {"name": container, "image": "vllm/vllm-openai:v0.11.0"}
    if command:
        vllm["command"] = list(command)
    if args:
        vllm["args"] = list(args)
    containers.append(vllm)
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "uid": "uid-deploy",
            "generation": 1,
            "resourceVersion": "1",
            "labels": labels,
        },
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": dict(labels)},
            "template": {
                "metadata": {"labels": dict(labels)},
                "spec": {"containers": containers},
            },
            "strategy": {
                "type": "RollingUpdate",
                "rollingUpdate": {"maxSurge": "25%", "maxUnavailable": "25%"},
            },
        },
        "status": {},
    }


@dataclass(frozen=True)
class Recorded:
    method: str
    path: str
    query: dict[str, list[str]]
    content_type: str | None
    body: Any


@dataclass
class Fault:
    """Answer requests with `method` whose path contains `path_part` with `status`."""

    method: str
    path_part: str
    status: int
    times: int = 1


def _rfc3339(t: float) -> str:
    return datetime.fromtimestamp(int(t), UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _template_hash(template: Any) -> str:
    return hashlib.sha256(json.dumps(template, sort_keys=True).encode()).hexdigest()[:10]


@dataclass
class _Pod:
    body: dict[str, Any]
    log: str
    ready_at: float | None
    remove_at: float | None = None

    @property
    def name(self) -> str:
        return str(self.body["metadata"]["name"])

    @property
    def hash(self) -> str:
        return str(self.body["metadata"]["labels"]["pod-template-hash"])

    @property
    def ready(self) -> bool:
        return bool(self.body["status"]["conditions"][0]["status"] == "True")


@dataclass
class FakeCluster:
    """One namespace with one vLLM Deployment, its pods and the Service in front of them."""

    args: list[str]
    namespace: str = "lab"
    name: str = "vllm"
    container: str = "vllm"
    sidecars: list[str] = field(default_factory=list)  # other containers in the pod
    command: list[str] = field(default_factory=lambda: ["vllm", "serve"])
    replicas: int = 1
    ready_after: float | None = 0.3  # seconds from a pod's creation to Ready; None: never
    observe_after: float = 0.1  # seconds before the controller observes a new generation
    terminate_after: float = 0.1  # seconds an old pod spends terminating
    progress_deadline: float | None = None  # then Progressing=False ProgressDeadlineExceeded
    unknown_flags: frozenset[str] = UNKNOWN_FLAGS  # a pod with one of these crash-loops
    serving: bool = True  # the fake vLLM answers /health (after its pod is Ready)
    cache_config_shown: bool = True  # its /metrics page has vllm:cache_config_info
    faults: list[Fault] = field(default_factory=list)
    # Called with each API request before it is handled (e.g. someone else's edit).
    before_request: Callable[[FakeCluster, Recorded], None] | None = None
    requests: list[Recorded] = field(default_factory=list)
    service_requests: list[str] = field(default_factory=list)  # paths asked of the fake vLLM
    # Completions wait for this (set when the double stops): generation that never ends.
    finish_completions: threading.Event = field(default_factory=threading.Event)

    def __post_init__(self) -> None:
        self._lock = threading.RLock()
        self._pods: list[_Pod] = []
        self._serial = 0
        self.deployment: dict[str, Any] = deployment_manifest(
            self.name, self.namespace, self.container, self.args, self.command,
            self.sidecars, self.replicas,
        )  # fmt: skip
        self._observe_at: float | None = 0.0
        self._rollout_started = 0.0
        for _ in range(self.replicas):
            self._new_pod(ready_at=0.0)
        self._advance(time.monotonic())

    # -- what the tests look at ----------------------------------------------------------

    @property
    def current_args(self) -> list[str]:
        with self._lock:
            return list(self._template_container().get("args", []))

    @property
    def patches(self) -> list[Any]:
        return [r.body for r in self.requests if r.method == "PATCH"]

    def pods(self) -> list[dict[str, Any]]:
        with self._lock:
            self._advance(time.monotonic())
            return [copy.deepcopy(p.body) for p in self._pods]

    def log_of(self, pod_name: str) -> str:
        with self._lock:
            return next(p.log for p in self._pods if p.name == pod_name)

    def rolled_out(self) -> bool:
        with self._lock:
            self._advance(time.monotonic())
            status = self.deployment["status"]
            return bool(
                status.get("observedGeneration") == self.deployment["metadata"]["generation"]
                and status.get("updatedReplicas") == self.replicas
                and status.get("availableReplicas") == self.replicas
                and status.get("replicas") == self.replicas
            )

    # -- simulation ----------------------------------------------------------------------

    def _template_container(self) -> dict[str, Any]:
        containers = self.deployment["spec"]["template"]["spec"]["containers"]
        return next(c for c in containers if c["name"] == self.container)  # type: ignore[no-any-return]

    def _new_pod(self, ready_at: float | None) -> None:
        template = self.deployment["spec"]["template"]
        pod_hash = _template_hash(template)
        self._serial += 1
        name = f"{self.name}-{pod_hash}-{self._serial:05d}"
        containers = copy.deepcopy(template["spec"]["containers"])
        vllm_args = next(c.get("args", []) for c in containers if c["name"] == self.container)
        refused = parser_error(vllm_args, self.unknown_flags)
        if refused is not None:
            ready_at = None
        statuses = [
            {
                "name": c["name"],
                "image": c["image"],
                "imageID": "",
                "ready": False,
                "restartCount": 0,
                "state": {"running": {"startedAt": _rfc3339(time.time())}},
            }
            for c in containers
        ]
        for s in statuses:
            if s["name"] != self.container:
                s["ready"] = True  # sidecars are ready at once; vLLM takes its time
            elif ready_at is None:
                s["restartCount"] = 3
                s["state"] = {"waiting": {"reason": "CrashLoopBackOff"}}
                s["lastState"] = {"terminated": {"exitCode": 1 if refused is None else 2}}
        body = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": name,
                "namespace": self.namespace,
                "uid": f"uid-{name}",
                "creationTimestamp": _rfc3339(time.time()),
                "labels": {**template["metadata"]["labels"], "pod-template-hash": pod_hash},
                "ownerReferences": [
                    {
                        "apiVersion": "apps/v1",
                        "kind": "ReplicaSet",
                        "name": f"{self.name}-{pod_hash}",
                        "uid": f"uid-rs-{pod_hash}",
                        "controller": True,
                    }
                ],
            },
            "spec": {"containers": containers},
            "status": {
                "phase": "Running",
                "conditions": [{"type": "Ready", "status": "False"}],
                "containerStatuses": statuses,
            },
        }
        log = startup_log(vllm_args) if refused is None else refused
        self._pods.append(_Pod(body, log, ready_at))

    def _terminate(self, pod: _Pod, now: float) -> None:
        if pod.remove_at is None:
            pod.remove_at = now + self.terminate_after
            pod.body["metadata"]["deletionTimestamp"] = _rfc3339(time.time())
            pod.body["status"]["conditions"][0]["status"] = "False"

    def _on_template_change(self, now: float) -> None:
        self.deployment["metadata"]["generation"] += 1
        self._observe_at = now + self.observe_after
        self._rollout_started = now
        current = _template_hash(self.deployment["spec"]["template"])
        live = [p for p in self._pods if p.remove_at is None]
        for pod in live:
            if pod.hash != current and not pod.ready:  # a superseded rollout's pods
                self._terminate(pod, now)
        have = sum(1 for p in live if p.hash == current)
        for _ in range(self.replicas - have):
            self._new_pod(None if self.ready_after is None else now + self.ready_after)

    def _advance(self, now: float) -> None:
        for pod in self._pods:
            if pod.remove_at is None and pod.ready_at is not None and now >= pod.ready_at:
                pod.body["status"]["conditions"][0]["status"] = "True"
                for s in pod.body["status"]["containerStatuses"]:
                    s["ready"] = True
        current = _template_hash(self.deployment["spec"]["template"])
        live = [p for p in self._pods if p.remove_at is None]
        if sum(1 for p in live if p.hash == current and p.ready) >= self.replicas:
            for pod in live:
                if pod.hash != current:
                    self._terminate(pod, now)
        self._pods = [p for p in self._pods if p.remove_at is None or now < p.remove_at]
        if self._observe_at is None or now < self._observe_at:
            return  # the controller has not caught up: the status is stale
        live = [p for p in self._pods if p.remove_at is None]
        updated = [p for p in live if p.hash == current]
        ready = sum(1 for p in live if p.ready)
        complete = len(updated) == self.replicas == len(live) and all(p.ready for p in updated)
        progressing = {
            "type": "Progressing",
            "status": "True",
            "reason": "NewReplicaSetAvailable" if complete else "ReplicaSetUpdated",
        }
        if (
            not complete
            and self.progress_deadline is not None
            and now - self._rollout_started > self.progress_deadline
        ):
            progressing = {
                "type": "Progressing",
                "status": "False",
                "reason": "ProgressDeadlineExceeded",
                "message": f'ReplicaSet "{self.name}-{current}" has timed out progressing.',
            }
        self.deployment["status"] = {
            "observedGeneration": self.deployment["metadata"]["generation"],
            "replicas": len(live),
            "updatedReplicas": len(updated),
            "readyReplicas": ready,
            "availableReplicas": ready,
            "conditions": [
                {"type": "Available", "status": "True" if ready >= self.replicas else "False"},
                progressing,
            ],
        }

    # -- HTTP ----------------------------------------------------------------------------

    def _fault(self, method: str, path: str) -> int | None:
        for fault in self.faults:
            if fault.times > 0 and fault.method == method and fault.path_part in path:
                fault.times -= 1
                return fault.status
        return None

    def handle_api(
        self, method: str, url: str, content_type: str | None, raw: bytes
    ) -> tuple[int, str, bytes]:
        parts = urlsplit(url)
        query = parse_qs(parts.query)
        body = json.loads(raw) if raw else None
        with self._lock:
            recorded = Recorded(method, parts.path, query, content_type, body)
            self.requests.append(recorded)
            if self.before_request is not None:
                self.before_request(self, recorded)
            now = time.monotonic()
            self._advance(now)
            if (status := self._fault(method, parts.path)) is not None:
                return _status(status, f"injected fault on {method} {parts.path}")
            ns = f"/namespaces/{self.namespace}/"
            if parts.path == f"/apis/apps/v1{ns}deployments/{self.name}":
                if method == "GET":
                    return _json(200, self.deployment)
                if method == "PATCH":
                    return self._patch(content_type, body, now)
            if parts.path == f"/api/v1{ns}pods" and method == "GET":
                return self._list_pods(query.get("labelSelector", [""])[0])
            log = re.fullmatch(rf"/api/v1{ns}pods/([^/]+)/log", parts.path)
            if log and method == "GET":
                return self._log(log.group(1), query)
        return _status(404, f"the double does not serve {method} {parts.path}")

    def _patch(self, content_type: str | None, body: Any, now: float) -> tuple[int, str, bytes]:
        if content_type != "application/json-patch+json" or not isinstance(body, list):
            return _status(415, f"the double implements JSON patch only, not {content_type}")
        try:
            patched = json_patch(self.deployment, body)
        except (PatchError, KeyError, ValueError, TypeError) as e:
            return _status(422, f"JSON patch rejected: {e}")
        if patched != self.deployment:  # metadata (annotations) or spec
            template_changed = patched["spec"]["template"] != self.deployment["spec"]["template"]
            self.deployment = patched
            self.deployment["metadata"]["resourceVersion"] = str(
                int(self.deployment["metadata"]["resourceVersion"]) + 1
            )
            if template_changed:
                self._on_template_change(now)
        return _json(200, self.deployment)

    def _list_pods(self, selector: str) -> tuple[int, str, bytes]:
        wanted: dict[str, str] = {}
        for term in filter(None, selector.split(",")):
            key, eq, value = term.partition("=")
            if not eq or not re.fullmatch(r"[\w./-]+", key):
                return _status(400, f"the double supports equality selectors only: {term!r}")
            wanted[key] = value
        items = [
            copy.deepcopy(p.body)
            for p in self._pods
            if all(p.body["metadata"]["labels"].get(k) == v for k, v in wanted.items())
        ]
        return _json(
            200,
            {
                "apiVersion": "v1",
                "kind": "PodList",
                "metadata": {"resourceVersion": "1"},
                "items": items,
            },
        )

    def _log(self, pod_name: str, query: dict[str, list[str]]) -> tuple[int, str, bytes]:
        pod = next((p for p in self._pods if p.name == pod_name), None)
        if pod is None:
            return _status(404, f'pods "{pod_name}" not found')
        names = [c["name"] for c in pod.body["spec"]["containers"]]
        container = query.get("container", [None])[0]
        if container is None and len(names) > 1:
            return _status(
                400,
                f"a container name must be specified for pod {pod_name}, choose one of: {names}",
            )
        if container is not None and container not in names:
            return _status(400, f"container {container} is not valid for pod {pod_name}")
        if (container or names[0]) != self.container:
            return 200, "text/plain", b"sidecar log\n"
        statuses = pod.body["status"]["containerStatuses"]
        restarted = any(s["restartCount"] for s in statuses if s["name"] == self.container)
        if query.get("previous") == ["true"] and not restarted:
            return _status(400, f'previous terminated container "{self.container}" not found')
        text = pod.log
        if tail := query.get("tailLines"):
            text = "".join(text.splitlines(keepends=True)[-int(tail[0]) :])
        data = text.encode()
        if limit := query.get("limitBytes"):
            data = data[: int(limit[0])]
        return 200, "text/plain", data

    def handle_vllm(self, path: str) -> tuple[int, str, bytes]:
        if path == "/v1/completions":
            with self._lock:
                self.service_requests.append(path)
            self.finish_completions.wait()
            return 503, "application/json", b'{"error": "the server is shutting down"}'
        with self._lock:
            self.service_requests.append(path)
            self._advance(time.monotonic())
            ready = [p for p in self._pods if p.ready and p.remove_at is None]
            if not ready or not self.serving:
                return 503, "text/plain", b"no ready endpoint\n"
            newest = max(ready, key=lambda p: p.name)
            containers = newest.body["spec"]["containers"]
            args = next(c.get("args", []) for c in containers if c["name"] == self.container)
            shown = self.cache_config_shown
        if path == "/health":
            return 200, "text/plain", b""
        if path == "/metrics":
            page = metrics_page(args)
            if not shown:
                page = re.sub(r"^.*vllm:cache_config_info.*\n", "", page, flags=re.M)
            return 200, "text/plain; version=0.0.4", page.encode()
        return 404, "text/plain", b"not found\n"

    # -- servers -------------------------------------------------------------------------

    def __enter__(self) -> FakeCluster:
        self._servers = [_serve(self._api_handler), _serve(self._vllm_handler)]
        self.api_url = f"http://127.0.0.1:{self._servers[0].server_address[1]}"
        self.service_url = f"http://127.0.0.1:{self._servers[1].server_address[1]}"
        return self

    def __exit__(self, *exc: object) -> None:
        self.finish_completions.set()
        for server in self._servers:
            server.shutdown()
            server.server_close()

    def _api_handler(self, handler: BaseHTTPRequestHandler, method: str) -> tuple[int, str, bytes]:
        length = int(handler.headers.get("Content-Length") or 0)
        raw = handler.rfile.read(length) if length else b""
        content_type = (handler.headers.get("Content-Type") or "").split(";")[0] or None
        return self.handle_api(method, handler.path, content_type, raw)

    def _vllm_handler(self, handler: BaseHTTPRequestHandler, method: str) -> tuple[int, str, bytes]:
        length = int(handler.headers.get("Content-Length") or 0)
        if length:
            handler.rfile.read(length)
        return self.handle_vllm(urlsplit(handler.path).path)


def _json(code: int, body: Any) -> tuple[int, str, bytes]:
    return code, "application/json", json.dumps(body).encode()


_REASONS = {
    400: "BadRequest",
    403: "Forbidden",
    404: "NotFound",
    409: "Conflict",
    415: "UnsupportedMediaType",
    422: "Invalid",
    500: "InternalError",
    503: "ServiceUnavailable",
}


def _status(code: int, message: str) -> tuple[int, str, bytes]:
    """An error as the API server sends it: a v1 Status object."""
    return _json(
        code,
        {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": message,
            "reason": _REASONS.get(code, "Unknown"),
            "code": code,
        },
    )


def _serve(
    route: Callable[[BaseHTTPRequestHandler, str], tuple[int, str, bytes]],
) -> ThreadingHTTPServer:
    class Handler(BaseHTTPRequestHandler):
        def _answer(self, method: str) -> None:
            code, content_type, data = route(self, method)
            self.send_response(code)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self) -> None:
            self._answer("GET")

        def do_PATCH(self) -> None:
            self._answer("PATCH")

        def do_POST(self) -> None:
            self._answer("POST")

        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True).start()
    return server


def wait_until(condition: Callable[[], bool], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError(f"condition not met within {timeout}s")
        time.sleep(0.02)
