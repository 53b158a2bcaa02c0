"""A real OCI registry on loopback: Debian's docker-registry (the CNCF distribution
registry, `registry serve`), storing in a folder, plain HTTP, no auth. What a release
pushes to GHCR is pushed here the same way (`helm push`, `docker push`) and read back as a
user would (`helm install oci://…`, `docker pull`).
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest
import yaml
from vllm_glassbox.lab.backends.server_process import ChildProcess, free_port

from tests.k8s_double import wait_until


@contextmanager
def oci_registry(workdir: Path) -> Iterator[str]:
    """A registry serving until the block ends; yields its host:port."""
    exe = shutil.which("docker-registry")
    if exe is None:
        pytest.fail("docker-registry is missing: scripts/setup.sh installs Debian's package")
    port = free_port()
    config = workdir / "registry.yml"
    config.write_text(
        yaml.safe_dump(
            {
                "version": 0.1,
                "storage": {"filesystem": {"rootdirectory": str(workdir / "blobs")}},
                "http": {"addr": f"127.0.0.1:{port}"},
            }
        )
    )
    registry = ChildProcess([exe, "serve", str(config)], workdir / "registry.log",
                            name="the OCI registry").start()  # fmt: skip
    try:

        def answering() -> bool:
            try:
                return httpx.get(f"http://127.0.0.1:{port}/v2/", timeout=5).status_code == 200
            except httpx.HTTPError:
                return False

        wait_until(answering, timeout=60)
        yield f"127.0.0.1:{port}"
    finally:
        registry.stop()
