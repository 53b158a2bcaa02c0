"""The chart's locked-down sidecar (ci/secure-values.yaml), run for real: the vLLM CPU
build asking for the API key the chart gives it, the exporter serving TLS with basic auth
from the web-config the chart writes, the helm test's probe and a real Prometheus
scraping as the rendered ServiceMonitor says, and the lab's client with the key.

No kubelet and no Prometheus Operator here. `Mounted` plays the kubelet's part for
Secrets only: each Secret volume's items written as files under a temporary root, each
secretKeyRef resolved into the environment; the rendered paths under /etc/glassbox/ are
read under that root. `_operator_job` writes the scrape job the operator makes of a
ServiceMonitor endpoint (scheme, tls_config from tlsConfig, basic_auth from basicAuth,
the referenced Secret keys as files). Everything else is as rendered.
"""

from __future__ import annotations

import ssl
import subprocess
from collections.abc import Iterator
from contextlib import closing
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from vllm_glassbox.lab.backends.prometheus_process import PrometheusProcess
from vllm_glassbox.lab.backends.server_process import ChildProcess, ServerProcess, free_port
from vllm_glassbox.lab.backends.tinymodel import TinyModelSpec, generate
from vllm_glassbox.lab.vllm.client import LabError, VllmClient
from vllm_glassbox.lab.vllm.credentials import ApiKeySource, open_api_key

from tests.chart_render import CI_DIR, Rendered, container_named, render
from tests.exporter.test_security import _scraped_targets
from tests.realstack import GLASSBOX, wait_until
from tests.tlsfiles import Pki, make_pki

pytestmark = [pytest.mark.vllm, pytest.mark.prometheus, pytest.mark.slow]

API_KEY = "sk-glassbox-chart-test"
USER, PASSWORD = "prometheus", "scrape-password"  # the hash in ci/secure-values.yaml
SERVICE = "demo-vllm-glassbox-glassbox.llm.svc"  # the exporter's Service, as rendered
WEB_SECRET = "demo-vllm-glassbox-glassbox-web"


def _secrets(rendered: Rendered, pki: Pki, password: str, api_key: str) -> dict[str, Any]:
    """The Secrets secure-values.yaml names, as an operator would create them, and the
    one the chart renders."""
    return {
        "vllm-api-key": {"api-key": api_key},
        "hf-token": {"token": "hf_unused_offline"},
        "glassbox-exporter-tls": {
            "tls.crt": pki.server.cert.read_text(),
            "tls.key": pki.server.key.read_text(),
            "ca.crt": pki.ca.read_text(),
        },
        "glassbox-scrape": {"username": USER, "password": password},
        WEB_SECRET: rendered.one("Secret", WEB_SECRET)["stringData"],
    }


class Mounted:
    """One container's Secret volumes and secretKeyRefs, as the kubelet provides them."""

    def __init__(
        self, spec: dict[str, Any], container: dict[str, Any], secrets: dict[str, Any], root: Path
    ) -> None:
        self.root = root
        volumes = {v["name"]: v for v in spec.get("volumes", [])}
        for mount in container.get("volumeMounts", []):
            secret = volumes[mount["name"]].get("secret")
            if secret is None:
                continue
            data = secrets[secret["secretName"]]
            for item in secret.get("items") or [{"key": k, "path": k} for k in data]:
                path = Path(self.local(f"{mount['mountPath']}/{item['path']}"))
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_text(self.local(data[item["key"]]))
        self.env = {
            e["name"]: secrets[ref["name"]][ref["key"]]
            for e in container.get("env", [])
            if (ref := e.get("valueFrom", {}).get("secretKeyRef"))
        }

    def local(self, text: str) -> str:
        """`text` with the pod's /etc/glassbox/ read under the root."""
        return text.replace("/etc/glassbox/", f"{self.root}/etc/glassbox/")


@dataclass
class Secured:
    rendered: Rendered
    pki: Pki
    workdir: Path
    vllm: ServerProcess
    exporter_port: int

    def probe(self, password: str = PASSWORD, api_key: str = API_KEY) -> tuple[int, str]:
        """`helm test`: the rendered probe pod's command, its Secrets mounted."""
        [pod] = self.rendered.of_kind("Pod")
        container = pod["spec"]["containers"][0]
        secrets = _secrets(self.rendered, self.pki, password, api_key)
        mounted = Mounted(pod["spec"], container, secrets, self.workdir / f"probe-{password}")
        args = [
            mounted.local(a)
            .replace(f"{SERVICE}:9400", f"localhost:{self.exporter_port}")
            .replace("http://demo-vllm-glassbox.llm.svc:8000", self.vllm.url)
            for a in container["args"]
        ]
        run = subprocess.run([GLASSBOX, *container["command"][1:], *args],
                             capture_output=True, text=True, timeout=60)  # fmt: skip
        return run.returncode, run.stdout + run.stderr


@pytest.fixture(scope="module")
def secured(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Secured]:
    workdir = tmp_path_factory.mktemp("secured")
    values = yaml.safe_load((CI_DIR / "secure-values.yaml").read_text())
    rendered = render(values)
    pki = make_pki(workdir / "pki", server_names=[SERVICE])
    secrets = _secrets(rendered, pki, PASSWORD, API_KEY)
    [deployment] = rendered.of_kind("Deployment")
    spec = deployment["spec"]["template"]["spec"]
    vllm_env = Mounted(spec, container_named(spec, "vllm"), secrets, workdir / "vllm").env
    assert set(vllm_env) == {"VLLM_API_KEY", "HF_TOKEN"}
    model_dir = generate(TinyModelSpec("tiny-secured"), workdir / "models")
    # The tiny model's flags instead of the rendered 8B's; the environment as rendered.
    args = ["--model", str(model_dir), "--served-model-name", "tiny", "--max-model-len",
            "2048", "--kv-cache-memory-bytes", "8388608", "--enforce-eager"]  # fmt: skip
    with ServerProcess(args, workdir / "vllm.log", env=vllm_env) as vllm:
        vllm.wait_ready()
        exporter = container_named(spec, "glassbox")
        mounted = Mounted(spec, exporter, secrets, workdir / "exporter")
        port = free_port()
        where = {"--target": vllm.url, "--listen": f"127.0.0.1:{port}",
                 "--vllm-log": str(vllm.log_path)}  # fmt: skip
        exporter_args = [
            f"{a.split('=')[0]}={where[a.split('=')[0]]}" if a.split("=")[0] in where
            else mounted.local(a)
            for a in exporter["args"]
        ]  # fmt: skip
        process = ChildProcess([GLASSBOX, *exporter["command"][1:], *exporter_args],
                               workdir / "exporter.log", name="the exporter").start()  # fmt: skip
        try:
            # The kubelet's probe: https, no credentials.
            healthz = f"https://localhost:{port}/healthz"
            wait_until(lambda: _answers(healthz, pki), "the exporter serving TLS")
            yield Secured(rendered, pki, workdir, vllm, port)
        finally:
            process.stop()


def _answers(url: str, pki: Pki) -> bool:
    try:
        context = ssl.create_default_context(cafile=str(pki.ca))
        return httpx.get(url, verify=context, timeout=5).status_code == 200
    except httpx.HTTPError:
        return False


def test_vllm_asks_for_the_key_the_chart_gives_it_and_the_lab_sends_it(
    secured: Secured, tmp_path: Path
) -> None:
    body = {"model": "tiny", "prompt": "Kubernetes is", "max_tokens": 8, "temperature": 0}
    refused = httpx.post(f"{secured.vllm.url}/v1/completions", json=body, timeout=120)
    assert refused.status_code == 401
    # As the chart's lab Job has it: the key in a mounted file that VLLM_API_KEY_FILE names.
    (tmp_path / "api-key").write_text(API_KEY + "\n")
    key = open_api_key(ApiKeySource(file=str(tmp_path / "api-key")))
    with closing(VllmClient(secured.vllm.url, "tiny", api_key=key)) as client:
        assert client.complete(body).completion_tokens == 8
    with closing(VllmClient(secured.vllm.url, "tiny")) as client, pytest.raises(LabError) as error:
        client.complete(body)
    assert "HTTP 401" in str(error.value) and "VLLM_API_KEY" in str(error.value)


def test_the_helm_test_passes_over_tls_with_basic_auth_and_the_api_key(secured: Secured) -> None:
    def passed() -> bool:  # the exporter's first poll of vLLM may still be under way
        return secured.probe()[0] == 0

    wait_until(passed, "the probe passing", timeout_seconds=60)
    code, out = secured.probe()
    assert code == 0, out
    assert out.splitlines() == [
        f"exporter https://localhost:{secured.exporter_port}: ok",
        f"vllm {secured.vllm.url}: ok",
    ]
    assert API_KEY not in out and PASSWORD not in out


def test_the_helm_test_fails_with_a_wrong_password_or_key_and_quotes_neither(
    secured: Secured,
) -> None:
    code, out = secured.probe(password="guess")
    assert code == 1
    assert f"exporter https://localhost:{secured.exporter_port}: FAILED: /metrics: HTTP 401" in out
    code, out = secured.probe(api_key="sk-wrong")
    assert code == 1
    assert "FAILED: with the API key of " in out and "/v1/models: HTTP 401" in out
    assert "guess" not in out and "sk-wrong" not in out


def _operator_job(
    name: str, endpoint: dict[str, Any], secrets: dict[str, Any], files: Path, target: str
) -> dict[str, Any]:
    """The scrape job the Prometheus Operator makes of a ServiceMonitor endpoint."""
    files.mkdir(parents=True, exist_ok=True)

    def secret_file(ref: dict[str, str]) -> str:
        path = files / f"{ref['name']}-{ref['key']}"
        path.write_text(secrets[ref["name"]][ref["key"]])
        return str(path)

    tls, auth = endpoint["tlsConfig"], endpoint["basicAuth"]
    return {
        "job_name": name,
        "scheme": endpoint["scheme"],
        "metrics_path": endpoint["path"],
        "tls_config": {
            "ca_file": secret_file(tls["ca"]["secret"]),
            "server_name": tls["serverName"],
        },
        "basic_auth": {
            "username": secrets[auth["username"]["name"]][auth["username"]["key"]],
            "password_file": secret_file(auth["password"]),
        },
        "static_configs": [{"targets": [target]}],
    }


def test_prometheus_scrapes_the_exporter_as_the_rendered_service_monitor_says(
    secured: Secured,
) -> None:
    [endpoint] = secured.rendered.one("ServiceMonitor", "demo-vllm-glassbox-glassbox")["spec"][
        "endpoints"
    ]
    target = f"127.0.0.1:{secured.exporter_port}"  # a pod IP: serverName checks the name
    jobs = [
        _operator_job(name, endpoint, _secrets(secured.rendered, secured.pki, password, API_KEY),
                      secured.workdir / f"operator-{name}", target)
        for name, password in (("glassbox", PASSWORD), ("wrong", "guess"))
    ]  # fmt: skip
    config = {"global": {"scrape_interval": "1s"}, "scrape_configs": jobs}
    with PrometheusProcess(secured.workdir / "prometheus", config) as prometheus:
        targets = _scraped_targets(prometheus.url, {"glassbox", "wrong"})
    assert targets["glassbox"]["health"] == "up", targets["glassbox"]
    assert targets["wrong"]["health"] == "down"
    assert "401 Unauthorized" in targets["wrong"]["lastError"]
