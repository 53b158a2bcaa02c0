"""The Kubernetes backend through the real `kubernetes` client, against the loopback
API double and fake vLLM of tests/k8s_double.py (no API server can run here)."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml
from vllm_glassbox.core.startup_log import read_facts
from vllm_glassbox.lab.backends.args import REMOVE
from vllm_glassbox.lab.backends.backend import Backend, exit_code, restoring
from vllm_glassbox.lab.backends.kubernetes import KubernetesBackend, KubernetesError, Timeouts
from vllm_glassbox.lab.backends.restore_protocol import ANNOTATION

from tests.jobs import with_sigint_ignored
from tests.k8s_double import BYTES_PER_TOKEN, FakeCluster, Fault, Recorded, wait_until
from tests.k8s_lab import (
    FAST,
    ORIGINAL,
    SMALL_POOL,
    as_rbac,
    backend_for,
    not_allowed,
    write_kubeconfig,
)

pytestmark = pytest.mark.slow  # starts servers or processes and waits for them

REPO = Path(__file__).resolve().parents[2]


def _log_reads(cluster: FakeCluster) -> list[str]:
    """Names of the pods whose log was read."""
    return [r.path.split("/")[-2] for r in cluster.requests if r.path.endswith("/log")]


def _pod_args(pod: dict[str, Any]) -> list[str]:
    return next(c["args"] for c in pod["spec"]["containers"] if c["name"] == "vllm")


# -- deploy ------------------------------------------------------------------------------


def test_the_backend_fulfils_the_lab_contract(cluster: FakeCluster) -> None:
    backend: Backend = backend_for(cluster)
    assert backend.name == "kubernetes"


def test_deploy_json_patches_only_the_vllm_containers_args(cluster: FakeCluster) -> None:
    backend_for(cluster).deploy(
        {**SMALL_POOL, "--enforce-eager": REMOVE, "--gpu-memory-utilization": "0.5"}
    )

    expected = [
        "/models/tiny", "--served-model-name", "tiny", "--max-model-len", "2048",
        "--kv-cache-memory-bytes", "8388608", "--gpu-memory-utilization=0.5",
    ]  # fmt: skip
    container = "/spec/template/spec/containers/1"  # after the exporter sidecar
    record = {"container": "vllm", "args": ORIGINAL, "patched": expected}
    assert cluster.patches == [[
        {"op": "test", "path": f"{container}/name", "value": "vllm"},
        {"op": "test", "path": f"{container}/args", "value": ORIGINAL},
        # The original args, recorded in the same atomic patch (the Deployment had no
        # annotations: the whole map is added).
        {"op": "add", "path": "/metadata/annotations",
         "value": {ANNOTATION: json.dumps(record)}},
        {"op": "replace", "path": f"{container}/args", "value": expected},
    ]]  # fmt: skip
    patch = next(r for r in cluster.requests if r.method == "PATCH")
    assert patch.content_type == "application/json-patch+json"
    assert cluster.current_args == expected
    sidecar = cluster.deployment["spec"]["template"]["spec"]["containers"][0]
    assert sidecar == {"name": "exporter", "image": "example/exporter:1"}


def test_deploy_returns_the_service_url_the_served_name_and_the_new_pods_log(
    cluster: FakeCluster,
) -> None:
    old_pods = {p["metadata"]["name"] for p in cluster.pods()}

    deployed = backend_for(cluster).deploy(SMALL_POOL)

    assert deployed.url == cluster.service_url
    assert deployed.served_model_name == "tiny"
    [read] = _log_reads(cluster)
    assert read not in old_pods
    [pod] = [p for p in cluster.pods() if p["metadata"]["name"] == read]
    assert _pod_args(pod) == cluster.current_args
    assert deployed.startup_log == cluster.log_of(read)
    assert read_facts(deployed.startup_log).kv_cache_tokens == 8388608 // BYTES_PER_TOKEN
    log_query = next(r.query for r in cluster.requests if r.path.endswith("/log"))
    assert log_query["container"] == ["vllm"]


def test_each_phase_starts_from_the_original_args(cluster: FakeCluster) -> None:
    backend = backend_for(cluster)
    first = backend.deploy({"--enforce-eager": REMOVE, "--max-model-len": "1024"})
    second = backend.deploy({"--kv-cache-memory-bytes": "16777216"})

    assert cluster.current_args == [
        "/models/tiny", "--served-model-name", "tiny", "--max-model-len", "2048",
        "--kv-cache-memory-bytes", "16777216", "--enforce-eager",
    ]  # fmt: skip
    assert read_facts(first.startup_log).kv_cache_tokens == 33554432 // BYTES_PER_TOKEN
    assert read_facts(first.startup_log).max_model_len == 1024
    assert read_facts(second.startup_log).kv_cache_tokens == 16777216 // BYTES_PER_TOKEN
    assert read_facts(second.startup_log).max_model_len == 2048
    reads = _log_reads(cluster)
    assert len(reads) == 2 and reads[0] != reads[1]


def test_deploy_waits_until_the_new_pod_is_ready(cluster: FakeCluster) -> None:
    cluster.ready_after = 0.6
    started = time.monotonic()
    backend_for(cluster).deploy(SMALL_POOL)

    assert time.monotonic() - started >= 0.6
    assert cluster.rolled_out()
    assert all(_pod_args(p) == cluster.current_args for p in cluster.pods()
               if "deletionTimestamp" not in p["metadata"])  # fmt: skip


def test_deploy_waits_until_the_controller_has_observed_the_patch(cluster: FakeCluster) -> None:
    # Until then the status still describes the old, complete rollout.
    cluster.ready_after, cluster.observe_after = 0.0, 0.5
    started = time.monotonic()
    backend_for(cluster).deploy(SMALL_POOL)

    assert time.monotonic() - started >= 0.5
    status = cluster.deployment["status"]
    assert status["observedGeneration"] == cluster.deployment["metadata"]["generation"] == 2


def test_deploy_waits_for_cache_config_info_on_the_service(cluster: FakeCluster) -> None:
    cluster.cache_config_shown = False

    def show_once_looked_at() -> None:
        # The backend asks /health then /metrics; a /health after a /metrics means that
        # /metrics (without cache_config_info) was answered.
        def answered_once() -> bool:
            seen = list(cluster.service_requests)
            return "/metrics" in seen and "/health" in seen[seen.index("/metrics") :]

        wait_until(answered_once)
        cluster.cache_config_shown = True

    threading.Thread(target=show_once_looked_at, daemon=True).start()
    backend_for(cluster).deploy(SMALL_POOL)

    assert cluster.service_requests.count("/metrics") >= 2
    assert cluster.service_requests[-1] == "/metrics"


def test_deploy_without_changes_does_not_patch(cluster: FakeCluster) -> None:
    backend = backend_for(cluster)
    deployed = backend.deploy({"--max-model-len": "2048"})
    backend.restore()

    assert cluster.patches == []
    assert read_facts(deployed.startup_log).kv_cache_tokens == 33554432 // BYTES_PER_TOKEN


def test_transient_api_errors_are_retried(cluster: FakeCluster) -> None:
    cluster.faults += [
        Fault("GET", "/deployments/vllm", 500, times=2),
        Fault("PATCH", "/deployments/vllm", 503),
        Fault("GET", "/pods", 429),
        Fault("GET", "/log", 500),
    ]
    backend_for(cluster).deploy(SMALL_POOL)
    assert all(f.times == 0 for f in cluster.faults)
    assert cluster.current_args[-2] == "8388608"


# -- restore -----------------------------------------------------------------------------


def test_restore_patches_the_original_args_back_and_waits_for_the_rollout(
    cluster: FakeCluster,
) -> None:
    backend = backend_for(cluster)
    phase = backend.deploy(SMALL_POOL)
    cluster.ready_after = 0.3
    backend.restore()

    assert cluster.current_args == ORIGINAL
    assert cluster.patches[-1][-1]["value"] == ORIGINAL
    assert cluster.rolled_out()
    [pod] = [p for p in cluster.pods() if "deletionTimestamp" not in p["metadata"]]
    assert _pod_args(pod) == ORIGINAL
    assert phase.startup_log != cluster.log_of(pod["metadata"]["name"])


def test_restore_twice_does_nothing_the_second_time(cluster: FakeCluster) -> None:
    backend = backend_for(cluster)
    backend.deploy(SMALL_POOL)
    backend.restore()
    seen = len(cluster.requests)
    backend.restore()
    assert len(cluster.requests) == seen


def test_restore_before_any_deploy_makes_no_request(cluster: FakeCluster) -> None:
    backend_for(cluster).restore()
    assert cluster.requests == []


def test_restoring_restores_after_success(cluster: FakeCluster) -> None:
    with restoring(backend_for(cluster)) as backend:
        backend.deploy(SMALL_POOL)
        assert cluster.current_args != ORIGINAL
    assert cluster.current_args == ORIGINAL and cluster.rolled_out()


FAILURES: list[tuple[str, dict[str, Any], str]] = [
    # (step, how the double fails it, what the error says)
    ("reading the deployment",
     {"faults": [Fault("GET", "/deployments/vllm", 403)]},
     r"deployment lab/vllm: reading the Deployment failed: HTTP 403 .*see the Role"),
    ("patching",
     {"faults": [Fault("PATCH", "/deployments/vllm", 403)]},
     r"deployment lab/vllm: patching the args failed: HTTP 403"),
    ("the rollout",
     {"ready_after": None},
     r"deployment lab/vllm: rollout of the patched args not complete after 1s: "
     r"1 old replicas pending termination; not ready: vllm-\w+-\d+ "
     r"\(Running, vllm waiting: CrashLoopBackOff, 3 restarts\)"),
    ("a stalled rollout",
     {"ready_after": None, "progress_deadline": 0.2},
     r"deployment lab/vllm: rollout of the patched args failed: ReplicaSet \"vllm-\w+\" has "
     r"timed out progressing\.; 1 old replicas pending termination; not ready: vllm-"),
    ("listing pods",
     {"faults": [Fault("GET", "/pods", 403)]},
     r"deployment lab/vllm: listing its pods failed: HTTP 403"),
    ("the service",
     {"serving": False},
     r"deployment lab/vllm: rolled out, but not serving after 1s: http://127\.0\.0\.1:\d+: "
     r"/health: HTTP 503"),
    ("reading the log",
     {"faults": [Fault("GET", "/log", 404)]},
     r"deployment lab/vllm: reading the log of pod vllm-\w+-\d+ failed: HTTP 404"),
]  # fmt: skip


@pytest.mark.parametrize(("failing", "message"), [f[1:] for f in FAILURES],
                         ids=[f[0] for f in FAILURES])  # fmt: skip
def test_a_failure_in_any_step_is_reported_and_the_original_args_are_restored(
    cluster: FakeCluster, failing: dict[str, Any], message: str
) -> None:
    for name, value in failing.items():
        setattr(cluster, name, value)
    timeouts = Timeouts(rollout_seconds=1, serving_seconds=1, request_seconds=1,
                        poll_seconds=0.02)  # fmt: skip
    backend = backend_for(cluster, timeouts=timeouts)
    with pytest.raises(KubernetesError, match=message), restoring(backend):
        backend.deploy(SMALL_POOL)

    assert cluster.current_args == ORIGINAL
    assert cluster.rolled_out()
    assert [_pod_args(p) for p in cluster.pods() if "deletionTimestamp" not in p["metadata"]] == [
        ORIGINAL
    ]


def test_someone_elses_edit_during_the_patch_is_not_overwritten(cluster: FakeCluster) -> None:
    theirs = [*ORIGINAL, "--max-num-seqs", "4"]

    def edit_first(c: FakeCluster, request: Recorded) -> None:
        if request.method == "PATCH" and len(c.patches) == 1:
            c.deployment["spec"]["template"]["spec"]["containers"][1]["args"] = list(theirs)

    cluster.before_request = edit_first
    with pytest.raises(KubernetesError, match="changed while the lab patched it"):
        backend_for(cluster).deploy(SMALL_POOL)
    assert cluster.current_args == theirs


# -- what the backend refuses ------------------------------------------------------------


def test_several_containers_need_the_vllm_container_named(cluster: FakeCluster) -> None:
    with pytest.raises(KubernetesError, match=r"has 2 containers \(exporter, vllm\): say which"):
        backend_for(cluster, container=None).deploy(SMALL_POOL)
    with pytest.raises(KubernetesError, match=r"has no container 'engine' \(has: exporter, vllm"):
        backend_for(cluster, container="engine").deploy(SMALL_POOL)
    assert cluster.patches == []


def test_the_only_container_needs_no_name() -> None:
    with FakeCluster(list(ORIGINAL)) as cluster:
        backend_for(cluster, container=None).deploy(SMALL_POOL)
        assert cluster.current_args[-2] == "8388608"


def test_a_container_without_args_is_refused() -> None:
    with FakeCluster([], command=["vllm", "serve", "/models/tiny"]) as cluster:
        with pytest.raises(KubernetesError, match="container 'vllm' has no args"):
            backend_for(cluster).deploy(SMALL_POOL)
        assert cluster.patches == []


def test_a_flag_in_the_command_is_refused() -> None:
    with FakeCluster(["--port", "8000"], command=["vllm", "serve", "/models/tiny"]) as cluster:
        with pytest.raises(KubernetesError, match="--model is set in container 'vllm''s command"):
            backend_for(cluster).deploy({"--model": "/models/other"})
        assert cluster.patches == []


@pytest.mark.parametrize(
    ("command", "args"),
    [
        (["/entrypoint.sh"], ["/models/tiny", "--port", "8000"]),
        (["python3", "-m", "vllm.entrypoints.openai.api_server"], ["--model", "/models/tiny"]),
        (["vllm", "serve"], ["/models/tiny", "--port", "8000"]),
    ],
)
def test_a_program_in_the_command_is_not_mistaken_for_the_model(
    command: list[str], args: list[str]
) -> None:
    with FakeCluster(args, command=command) as cluster:
        deployed = backend_for(cluster).deploy({"--model": "/models/other"})
        assert "/models/other" in cluster.current_args
        assert deployed.served_model_name == "/models/other"


def test_a_deployment_scaled_to_zero_is_refused() -> None:
    with (
        FakeCluster(list(ORIGINAL), replicas=0) as cluster,
        pytest.raises(KubernetesError, match="is scaled to 0 replicas"),
    ):
        backend_for(cluster).deploy(SMALL_POOL)


def test_a_bad_override_is_refused_before_any_patch(cluster: FakeCluster) -> None:
    with pytest.raises(ValueError, match="'max-model-len' is not a long flag name"):
        backend_for(cluster).deploy({"max-model-len": "1"})
    assert cluster.patches == []


# -- from a laptop: kube-config --------------------------------------------------------


def test_from_environment_falls_back_to_kube_config(
    cluster: FakeCluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    kubeconfig = write_kubeconfig(tmp_path / "config", cluster, namespace="lab")
    monkeypatch.setenv("KUBECONFIG", str(kubeconfig))
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)

    backend = KubernetesBackend.from_environment("vllm", cluster.service_url, container="vllm",
                                                 timeouts=FAST)  # fmt: skip
    assert backend.namespace == "lab"
    with restoring(backend):
        backend.deploy(SMALL_POOL)
    assert cluster.current_args == ORIGINAL
    assert len(cluster.patches) == 2


# -- signals: a real process, a real signal ----------------------------------------------

SCENARIO = textwrap.dedent("""
    import sys, time
    from kubernetes import client as k8s
    from vllm_glassbox.lab.backends.backend import exit_code, restoring
    from vllm_glassbox.lab.backends.kubernetes import KubernetesBackend, Timeouts

    api_url, service_url = sys.argv[1:3]
    backend = KubernetesBackend(
        k8s.ApiClient(k8s.Configuration(host=api_url)), "lab", "vllm", service_url,
        container="vllm", timeouts=Timeouts(60, 60, 5, 0.02),
    )
    try:
        with restoring(backend):
            print("deploying", flush=True)
            backend.deploy({"--kv-cache-memory-bytes": "8388608"})
            print("workload", flush=True)
            time.sleep(60)
    except BaseException as e:
        print(f"ended by {e!r}", file=sys.stderr)
        sys.exit(exit_code(e))
""")


SCENARIO_EXIT_SECONDS = 120


def _start_scenario(cluster: FakeCluster) -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.Popen(
        with_sigint_ignored([sys.executable, "-c", SCENARIO, cluster.api_url,
                             cluster.service_url]),
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
    )  # fmt: skip


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
@pytest.mark.parametrize("during", ["rollout", "workload"])
def test_a_signal_during_a_phase_restores_the_original_args_and_exits_non_zero(
    cluster: FakeCluster, sig: signal.Signals, during: str
) -> None:
    if during == "rollout":
        cluster.ready_after = None  # the phase's pod never becomes ready
    process = _start_scenario(cluster)
    try:
        assert process.stdout is not None
        assert process.stdout.readline() == "deploying\n"
        if during == "rollout":
            wait_until(lambda: len(cluster.patches) == 1)
        else:
            assert process.stdout.readline() == "workload\n"
        process.send_signal(sig)
        # Longer than the scenario's own 60 s rollout limit: a signal that went unheard
        # ends as a failure that shows what the process said, not as a hung test.
        _, stderr = process.communicate(timeout=SCENARIO_EXIT_SECONDS)
    finally:
        process.kill()

    assert process.returncode == 128 + sig
    assert ("KeyboardInterrupt" if sig == signal.SIGINT else "Terminated") in stderr
    assert cluster.current_args == ORIGINAL
    assert len(cluster.patches) == 2
    wait_until(cluster.rolled_out)


def test_a_second_signal_does_not_interrupt_the_restore(cluster: FakeCluster) -> None:
    process = _start_scenario(cluster)
    try:
        assert process.stdout is not None
        assert process.stdout.readline() == "deploying\n"
        assert process.stdout.readline() == "workload\n"
        wait_until(lambda: len(cluster.patches) == 1 and cluster.rolled_out())
        cluster.ready_after = 1.0  # the restored pod takes a while
        process.send_signal(signal.SIGTERM)
        wait_until(lambda: len(cluster.patches) == 2)
        process.send_signal(signal.SIGINT)
        _, stderr = process.communicate(timeout=SCENARIO_EXIT_SECONDS)
    finally:
        process.kill()

    assert "SIGINT received while restoring the original state" in stderr
    assert process.returncode == 128 + signal.SIGTERM
    assert cluster.current_args == ORIGINAL and cluster.rolled_out()


# -- the documented RBAC and manifests ---------------------------------------------------

DOC = REPO / "docs" / "lab-kubernetes.md"


def _doc_manifests() -> list[dict[str, Any]]:
    blocks = re.findall(r"```yaml\n(.*?)```", DOC.read_text(), flags=re.S)
    docs = [d for block in blocks for d in yaml.safe_load_all(block)]
    return [d for d in docs if isinstance(d, dict) and "kind" in d]


def test_the_documented_manifests_are_valid_kubernetes_objects() -> None:
    manifests = _doc_manifests()
    assert sorted(m["kind"] for m in manifests) == ["Job", "Role", "RoleBinding", "ServiceAccount"]
    for manifest in manifests:
        kubernetes_validate.validate(manifest, "1.30.0", strict=True)


def test_the_documented_role_allows_what_the_backend_does_and_no_more(
    cluster: FakeCluster,
) -> None:
    [role] = [m for m in _doc_manifests() if m["kind"] == "Role"]
    rules = role["rules"]
    assert "*" not in json.dumps(rules) and "secrets" not in json.dumps(rules)
    with restoring(backend_for(cluster)) as backend:
        backend.deploy(SMALL_POOL)

    used = {as_rbac(r) for r in cluster.requests}
    assert {u[:3] for u in used} == {
        ("apps", "deployments", "get"), ("apps", "deployments", "patch"),
        ("", "pods", "list"), ("", "pods/log", "get"),
    }  # fmt: skip
    assert not_allowed(rules, cluster.requests) == []


# -- pure parts --------------------------------------------------------------------------


def test_exit_codes_follow_the_shell_convention() -> None:
    assert exit_code(KeyboardInterrupt()) == 130
    assert exit_code(RuntimeError("x")) == 1
