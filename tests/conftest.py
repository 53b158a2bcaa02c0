"""Shared fixtures. End-to-end tests use the real vLLM CPU build and Debian's Prometheus;
scripts/setup.sh installs both, so a missing one is a failure, not a skip."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.k8s_double import FakeCluster
from tests.realstack import RealStack, real_stack

FIXTURES = Path(__file__).parent / "fixtures"


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--update-golden",
        action="store_true",
        help="rewrite golden files from the current output instead of comparing",
    )


@pytest.fixture(scope="session")
def update_golden(request: pytest.FixtureRequest) -> bool:
    return bool(request.config.getoption("--update-golden"))


@pytest.fixture(scope="session")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RealStack]:
    """vLLM + exporter + Prometheus after the fixed workload (see tests/realstack.py)."""
    with real_stack(tmp_path_factory.mktemp("stack")) as s:
        yield s


@pytest.fixture
def cluster() -> Iterator[FakeCluster]:
    """The Kubernetes API double: a vLLM Deployment running tests/k8s_lab.py's ORIGINAL
    args, behind an exporter sidecar (so vLLM's container is not the first)."""
    # Imported here: the Kubernetes client loads only for the tests that use it.
    from tests.k8s_lab import ORIGINAL

    with FakeCluster(list(ORIGINAL), sidecars=["exporter"]) as c:
        yield c
