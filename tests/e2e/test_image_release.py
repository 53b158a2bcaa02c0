"""The image a release publishes: scripts/release.py --image builds it (scripts/build-image.sh
on the local Debian base), saves it with `docker save` and writes its SBOM with syft; here
it is loaded back from that tarball into a daemon that no longer has it, and run as the
chart runs it (read-only, non-root, no capabilities) against a real captured two-engine
H200 page served on loopback. Its OCI labels and `glassbox --version` are glassbox's
version; its SBOM lists glassbox at that version beside what it runs on.

Needs root, docker.io and debootstrap, like tests/e2e/test_image.py, whose daemon fixture
it shares (one daemon per module, stopped by pid).
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families
from vllm_glassbox import __version__
from vllm_glassbox.core.build import git_revision
from vllm_glassbox.lab.backends.server_process import free_port

from tests.chart_render import REPO
from tests.e2e.test_image import BASE_IMAGE, Docker, docker  # noqa: F401 (the fixture)
from tests.fixtures import page
from tests.misbehaving import Misbehaving, body
from tests.oci_registry import oci_registry

pytestmark = [pytest.mark.docker, pytest.mark.slow]

TAG = f"vllm-glassbox:{__version__}"
H200_PAGE = "cuda-0.24.0-h200x2/dp2-flood-008.txt"


@pytest.fixture(scope="module")
def released(docker: Docker, tmp_path_factory: pytest.TempPathFactory) -> Path:  # noqa: F811
    """What scripts/release.py --image left, the image then removed from the daemon."""
    if docker.run("image", "inspect", BASE_IMAGE, check=False).returncode != 0:
        base = subprocess.run(
            [str(REPO / "scripts/build-base-image.sh"), BASE_IMAGE],
            env=docker.env, capture_output=True, text=True,
        )  # fmt: skip
        assert base.returncode == 0, base.stdout + base.stderr
    out = tmp_path_factory.mktemp("release")
    done = subprocess.run(
        [sys.executable, str(REPO / "scripts" / "release.py"), "--out", str(out), "--image",
         "--base", BASE_IMAGE],
        env=docker.env, capture_output=True, text=True, cwd=REPO,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    print("\n".join(line for line in done.stdout.splitlines() if "bytes" in line))
    docker.run("image", "rm", TAG)
    assert docker.run("image", "inspect", TAG, check=False).returncode != 0
    return out


@pytest.fixture(scope="module")
def loaded(docker: Docker, released: Path) -> dict[str, Any]:  # noqa: F811
    """The image loaded from its tarball: its configuration, as docker inspects it."""
    shown = docker.run("load", "-i", str(released / f"vllm-glassbox-{__version__}.image.tar"))
    assert TAG in shown.stdout
    [inspected] = json.loads(docker.run("image", "inspect", TAG).stdout)
    found: dict[str, Any] = inspected
    return found


def test_the_loaded_image_is_labelled_with_glassboxs_version_and_commit(
    loaded: dict[str, Any],
) -> None:
    labels = loaded["Config"]["Labels"]
    assert labels["org.opencontainers.image.version"] == __version__
    assert labels["org.opencontainers.image.revision"] == git_revision(REPO)
    assert labels["org.opencontainers.image.licenses"] == "Apache-2.0"
    assert labels["org.opencontainers.image.source"].startswith("https://github.com/")
    assert loaded["Config"]["User"] == "65532:65532"


def _run_as_the_chart(client: Docker, *args: str, **kw: Any) -> subprocess.CompletedProcess[str]:
    return client.run(
        "run", "--rm", "--network", "host", "--read-only", "--user", "65532:65532",
        "--cap-drop", "ALL", "--security-opt", "no-new-privileges", *args, **kw,
    )  # fmt: skip


def test_the_loaded_image_says_its_version(docker: Docker, loaded: dict[str, Any]) -> None:  # noqa: F811
    assert _run_as_the_chart(docker, TAG, "--version").stdout.strip() == f"glassbox {__version__}"


def test_the_loaded_image_exports_a_captured_h200_page(
    docker: Docker,  # noqa: F811
    loaded: dict[str, Any],
) -> None:
    port = free_port()
    name = f"glassbox-release-{port}"
    with Misbehaving() as vllm:
        vllm.behave(body(page(H200_PAGE)))
        _run_as_the_chart(
            docker, "-d", "--name", name, TAG, "exporter", "--target", vllm.url,
            "--listen", f"127.0.0.1:{port}", "--interval", "1s",
        )  # fmt: skip
        try:
            samples = _wait_for_samples(f"http://127.0.0.1:{port}/metrics", docker, name)
        finally:
            docker.run("rm", "-f", name, check=False)
    assert samples["glassbox_target_up"] == [({}, 1.0)]
    [(build, _)] = samples["glassbox_build_info"]
    assert build["version"] == __version__ and build["revision"] == git_revision(REPO)
    engines = {labels["engine"] for labels, _ in samples["glassbox_kv_cache_capacity_tokens"]}
    assert engines == {"0", "1"}


def _wait_for_samples(
    url: str,
    client: Docker,
    name: str,
    timeout: float = 60,
) -> dict[str, list[tuple[dict[str, str], float]]]:
    """The exporter's samples by name, once its first poll is published."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            text = httpx.get(url, timeout=5).text
        except httpx.HTTPError:
            time.sleep(0.3)  # not listening yet
            continue
        samples: dict[str, list[tuple[dict[str, str], float]]] = {}
        for family in text_string_to_metric_families(text):
            for s in family.samples:
                samples.setdefault(s.name, []).append((s.labels, s.value))
        if "glassbox_target_up" in samples:
            return samples
        time.sleep(0.3)
    logs = client.run("logs", name, check=False)
    pytest.fail(f"no poll published in {timeout:g}s: {logs.stdout[-2000:]}{logs.stderr[-2000:]}")


def test_the_loaded_image_pushed_to_an_oci_registry_pulls_and_runs(
    docker: Docker,  # noqa: F811
    loaded: dict[str, Any],
    tmp_path: Path,
) -> None:
    """What the workflow pushes to GHCR, pushed to a registry here and pulled back."""
    with oci_registry(tmp_path) as host:
        remote = f"{host}/vllm-glassbox/vllm-glassbox:{__version__}"
        docker.run("tag", TAG, remote)
        docker.run("push", remote)
        docker.run("image", "rm", remote)
        docker.run("pull", remote)
        [pulled] = json.loads(docker.run("image", "inspect", remote).stdout)
        shown = _run_as_the_chart(docker, remote, "--version").stdout.strip()
        docker.run("image", "rm", remote)
    assert pulled["Id"] == loaded["Id"]
    assert shown == f"glassbox {__version__}"


def test_the_sbom_lists_glassbox_and_what_it_runs_on(released: Path) -> None:
    sbom = json.loads((released / f"vllm-glassbox-{__version__}.spdx.json").read_text())
    assert sbom["spdxVersion"].startswith("SPDX-")
    versions = {
        (p["name"].lower().replace("_", "-"), p.get("versionInfo")) for p in sbom["packages"]
    }
    assert ("vllm-glassbox", __version__) in versions
    names = {name for name, _ in versions}
    assert {"prometheus-client", "httpx", "pyyaml", "bcrypt"} <= names
    assert "python3" in names or any(n.startswith("python3.") for n in names)  # the base's
