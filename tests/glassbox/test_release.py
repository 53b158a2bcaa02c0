"""What a release publishes, as far as it runs here.

One version in one place (glassbox/__init__.py): the package's metadata, `glassbox
--version`, the chart's version, appVersion and ArtifactHub annotations, the image's label,
CHANGELOG.md, the release workflow and docs/install.md all follow it, and these tests fail
when one drifts. Then scripts/release.py builds the artifacts (marked slow): the wheel is
installed into a clean virtualenv and its exporter reads a real captured page over
loopback; the sdist holds the package and builds; the packaged chart is rendered and
installed (client-side) from its `.tgz` by Helm's own engine; the mixin's archive is
vendored as jsonnet-bundler vendors it and rendered by jsonnet. The image, loaded from its
tarball: tests/e2e/test_image_release.py.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tomllib
import venv
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import helm_python as helm
import httpx
import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families
from vllm_glassbox import __version__
from vllm_glassbox.lab.backends.server_process import free_port

from tests.chart_render import CHART, REPO, container_named, pod_specs, render
from tests.fixtures import page
from tests.k8s_double import wait_until
from tests.misbehaving import Misbehaving, body
from tests.mixin.test_mixin import groups_of
from tests.oci_registry import oci_registry

CHART_YAML = yaml.safe_load((CHART / "Chart.yaml").read_text())
WORKFLOW = yaml.safe_load((REPO / ".github" / "workflows" / "release.yml").read_text())
INSTALL = (REPO / "docs" / "install.md").read_text()
H200_PAGE = "cuda-0.24.0-h200x2/dp2-flood-008.txt"  # two engines, a flood in progress


def _annotation(name: str) -> list[dict[str, str]]:
    text = CHART_YAML["annotations"][f"artifacthub.io/{name}"]
    found: list[dict[str, str]] = yaml.safe_load(text)
    return found


def changelog_entries(version: str) -> list[dict[str, str]]:
    """CHANGELOG.md's section of `version` as ArtifactHub's changes: each `### Kind`
    heading's `- entry` lines."""
    text = (REPO / "CHANGELOG.md").read_text()
    section = re.search(rf"^## {re.escape(version)}\n(.*?)(?=^## |\Z)", text, re.M | re.S)
    assert section, f"CHANGELOG.md has no section ## {version}"
    entries, kind = [], None
    for line in section.group(1).splitlines():
        if line.startswith("### "):
            kind = line.removeprefix("### ").strip().lower()
        elif line.startswith("- "):
            assert kind, line
            entries.append({"kind": kind, "description": line.removeprefix("- ").strip()})
    return entries


# -- one version ----------------------------------------------------------------------


def test_the_package_takes_its_version_from_glassbox_init() -> None:
    project = tomllib.loads((REPO / "pyproject.toml").read_text())
    assert "version" not in project["project"] and project["project"]["dynamic"] == ["version"]
    assert project["tool"]["setuptools"]["dynamic"]["version"] == {
        "attr": "vllm_glassbox.__version__"
    }
    printed = subprocess.run(
        [sys.executable, str(REPO / "scripts" / "version.py")], capture_output=True, text=True
    )
    assert printed.stdout == f"{__version__}\n"


def test_the_chart_is_versioned_as_glassbox_and_names_its_images_at_that_version() -> None:
    assert CHART_YAML["version"] == CHART_YAML["appVersion"] == __version__
    images = {i["name"]: i["image"] for i in _annotation("images")}
    assert images["vllm-glassbox"] == f"{WORKFLOW['env']['IMAGE']}:{__version__}"
    assert images["vllm-glassbox-lab"] == f"{WORKFLOW['env']['IMAGE']}:{__version__}-lab"
    values = yaml.safe_load((CHART / "values.yaml").read_text())["vllm"]["image"]
    assert images["vllm"] == f"{values['repository']}:{values['tag']}"


def test_the_charts_changes_are_the_changelogs_section_of_this_version() -> None:
    assert (REPO / "CHANGELOG.md").read_text().split("\n## ")[1].startswith(f"{__version__}\n")
    assert _annotation("changes") == changelog_entries(__version__)
    kinds = {"added", "changed", "deprecated", "removed", "fixed", "security"}
    assert {c["kind"] for c in _annotation("changes")} <= kinds


def test_the_image_is_labelled_with_the_version_its_build_is_given() -> None:
    dockerfile = (REPO / "Dockerfile").read_text()
    assert 'org.opencontainers.image.version="${VERSION}"' in dockerfile
    build = (REPO / "scripts" / "build-image.sh").read_text()
    assert "version=$(python3 scripts/version.py)" in build
    assert '--build-arg "VERSION=$version"' in build
    [image_job] = [
        step["with"]
        for step in WORKFLOW["jobs"]["image"]["steps"]
        if step.get("uses", "").startswith("docker/build-push-action@")
    ]
    assert "VERSION=${{ needs.build.outputs.version }}" in image_job["build-args"]
    assert image_job["sbom"] is True


def test_the_release_workflow_publishes_from_a_tag_of_this_version() -> None:
    jobs = WORKFLOW["jobs"]
    assert WORKFLOW[True]["push"]["tags"] == ["v*"]  # YAML 1.1 reads `on` as True
    check = next(s for s in jobs["build"]["steps"] if s.get("id") == "version")["run"]
    assert 'test "v$version" = "$GITHUB_REF_NAME"' in check
    assert any("scripts/release.py" in s.get("run", "") for s in jobs["build"]["steps"])
    assert jobs["pypi"]["permissions"] == {"id-token": "write"}  # trusted publishing
    assert jobs["pypi"]["steps"][-1]["uses"].startswith("pypa/gh-action-pypi-publish@")
    assert 'helm push "dist/vllm-glassbox-' in jobs["chart"]["steps"][-1]["run"]
    assert set(jobs["github-release"]["needs"]) == {"build", "pypi", "image", "chart"}


def test_docs_install_gives_this_versions_commands() -> None:
    versions = set(re.findall(r"(?<![\w.])v?(\d+\.\d+\.\d+)(?![\w.])", INSTALL))
    # vLLM's own versions are not glassbox's; every other one is this release's.
    assert versions == {__version__}, versions
    chart = WORKFLOW["env"]["CHARTS"] + "/vllm-glassbox"
    assert f"helm install llm {chart} --version {__version__}" in INSTALL
    assert f"docker pull {WORKFLOW['env']['IMAGE']}:{__version__}" in INSTALL
    assert f"pip install vllm-glassbox=={__version__}" in INSTALL
    assert f"jb install github.com/vllm-glassbox/vllm-glassbox/mixin@v{__version__}" in INSTALL
    [jsonnetfile] = re.findall(r"```json\n(.*?)```", INSTALL, re.S)
    [dependency] = json.loads(jsonnetfile)["dependencies"]
    assert dependency["source"]["git"]["subdir"] == "mixin"
    assert dependency["version"] == f"v{__version__}"
    assert "docs/install.md" in (REPO / "README.md").read_text()


def test_the_mixin_is_a_jsonnet_bundler_package() -> None:
    jsonnetfile = json.loads((REPO / "mixin" / "jsonnetfile.json").read_text())
    assert jsonnetfile["version"] == 1 and jsonnetfile["dependencies"] == []


# -- the artifacts, built ---------------------------------------------------------------


@pytest.fixture(scope="module")
def dist(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("dist")
    done = subprocess.run(
        [sys.executable, str(REPO / "scripts" / "release.py"), "--out", str(out)],
        capture_output=True, text=True, cwd=REPO,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    print("\n".join(line for line in done.stdout.splitlines() if "bytes" in line))
    return out


@pytest.fixture(scope="module")
def installed(dist: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A clean virtualenv with the wheel, and what pip brings with it, only."""
    env = tmp_path_factory.mktemp("venv") / "venv"
    venv.create(env, with_pip=False)
    uv = Path(sys.executable).parent / "uv"
    [wheel] = dist.glob("vllm_glassbox-*.whl")
    done = subprocess.run(
        [str(uv), "pip", "install", "-q", "--python", str(env / "bin" / "python"), str(wheel)],
        capture_output=True, text=True,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return env


def _clean_env() -> dict[str, str]:
    """The environment less anything that would find the checkout's package."""
    return {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}


@pytest.mark.slow
def test_the_installed_wheel_is_this_version_and_not_the_checkout(
    installed: Path, tmp_path: Path
) -> None:
    python, glassbox = installed / "bin" / "python", installed / "bin" / "glassbox"
    shown = subprocess.run([str(glassbox), "--version"], capture_output=True, text=True,
                           cwd=tmp_path, env=_clean_env())  # fmt: skip
    assert shown.stdout.strip() == f"glassbox {__version__}"
    where = subprocess.run(
        [str(python), "-c", "import vllm_glassbox, importlib.metadata as m;"
         "print(vllm_glassbox.__file__); print(m.version('vllm-glassbox'))"],
        capture_output=True, text=True, cwd=tmp_path, env=_clean_env(),
    )  # fmt: skip
    path, version = where.stdout.split()
    assert Path(path).is_relative_to(installed) and version == __version__
    # The exporter's install only: the lab's libraries are the extra's.
    lab = subprocess.run([str(python), "-c", "import matplotlib"], capture_output=True)
    assert lab.returncode != 0


@pytest.mark.slow
def test_the_installed_exporter_reads_a_captured_two_engine_h200_page(
    installed: Path, tmp_path: Path
) -> None:
    port = free_port()
    with Misbehaving() as vllm:
        vllm.behave(body(page(H200_PAGE)))
        exporter = subprocess.Popen(
            [str(installed / "bin" / "glassbox"), "exporter", "--target", vllm.url,
             "--listen", f"127.0.0.1:{port}", "--interval", "1s"],
            cwd=tmp_path, env=_clean_env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
        )  # fmt: skip
        try:
            samples: dict[str, list[Any]] = {}

            def polled() -> bool:
                try:
                    text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text
                except httpx.HTTPError:
                    return False  # not listening yet
                samples.clear()
                for family in text_string_to_metric_families(text):
                    for s in family.samples:
                        samples.setdefault(s.name, []).append(s)
                return "glassbox_target_up" in samples

            wait_until(polled, timeout=60)
        finally:
            exporter.terminate()
            _, err = exporter.communicate(timeout=30)
    [up] = samples["glassbox_target_up"]
    assert up.value == 1.0, err
    [build] = samples["glassbox_build_info"]
    assert build.labels["version"] == __version__
    # Both engines' pools, as the page gives them (vllm:cache_config_info, per engine).
    capacity = {s.labels["engine"]: s.value for s in samples["glassbox_kv_cache_capacity_tokens"]}
    assert set(capacity) == {"0", "1"} and min(capacity.values()) > 0


@pytest.mark.slow
def test_the_sdist_holds_the_package_and_no_tests(dist: Path) -> None:
    [sdist] = dist.glob("vllm_glassbox-*.tar.gz")
    with tarfile.open(sdist) as tar:
        names = {n.split("/", 1)[1] for n in tar.getnames() if "/" in n}
    top = f"vllm_glassbox-{__version__}"
    assert sdist.name == f"{top}.tar.gz"
    needed = {
        "pyproject.toml", "README.md", "CHANGELOG.md", "glassbox/__init__.py",
        "glassbox/slo_rules.yaml", "core/snapshot.py", "exporter/service.py",
        "dashboards/generated/glassbox-overview.json", "lab/plans/cpu-demo.yaml",
    }  # fmt: skip
    assert needed <= names, needed - names
    assert not any(n.startswith("tests/") for n in names)


@pytest.mark.slow
def test_the_packaged_chart_renders_and_installs_from_its_tgz(dist: Path) -> None:
    archive = dist / f"vllm-glassbox-{__version__}.tgz"
    with tarfile.open(archive) as tar:
        names = tar.getnames()
        meta = yaml.safe_load(tar.extractfile("vllm-glassbox/Chart.yaml").read())  # type: ignore[union-attr]
    assert meta["version"] == meta["appVersion"] == __version__
    assert meta["annotations"] == CHART_YAML["annotations"]
    assert "vllm-glassbox/files/rules/glassbox-alerts.yaml" in names
    assert not any(n.startswith("vllm-glassbox/ci/") for n in names)  # .helmignore
    values = {"image": {"registry": "ghcr.io/vllm-glassbox"}, "vllm": {"model": "/models/m"},
              "weights": {"existingClaim": "models"}}  # fmt: skip
    rendered = render(values, chart_dir=archive)
    [deployment] = rendered.of_kind("Deployment")
    [spec] = pod_specs(deployment)
    published = {i["name"]: i["image"] for i in _annotation("images")}
    assert container_named(spec, "glassbox")["image"] == published["vllm-glassbox"]
    assert container_named(spec, "vllm")["image"] == published["vllm"]
    # Helm's install action on the archive itself, as `helm install llm ./….tgz
    # --dry-run=client` runs it (no cluster here: a memory store of releases).
    config = helm.Config(storage_driver="memory", namespace="llm")
    try:
        release = config.install(archive, "llm", values, namespace="llm", dry_run="client")
    finally:
        config.close()
    assert (release["chart_version"], release["app_version"]) == (__version__, __version__)
    installed = sorted(d["kind"] for d in yaml.safe_load_all(release["manifest"]) if d)
    # The same objects as `helm template` of the archive for a cluster without the
    # operator's kinds, less the hook (`helm test`'s Pod, kept apart from the manifest).
    bare = render(values, chart_dir=archive, api_versions=()).kinds()
    bare.remove("Pod")
    assert installed == bare


def _docs_helm_install() -> tuple[str, dict[str, Any]]:
    """docs/install.md's `helm install`: its chart reference and its --set values."""
    [command] = re.findall(r"^helm install .*?(?<!\\)$", INSTALL.replace("\\\n", " "), re.M)
    words = command.split()
    sets = [words[i + 1] for i, w in enumerate(words) if w == "--set"]
    values: dict[str, Any] = helm.parse_set_string(",".join(sets))
    return words[3], values


@pytest.mark.slow
def test_the_chart_pushed_to_an_oci_registry_installs_as_docs_install_says(
    dist: Path, tmp_path: Path
) -> None:
    chart, values = _docs_helm_install()
    assert chart == f"{WORKFLOW['env']['CHARTS']}/vllm-glassbox"
    with oci_registry(tmp_path) as host:
        # What the workflow's `helm push` does, to a registry here instead of GHCR.
        helm.push(
            dist / f"vllm-glassbox-{__version__}.tgz", f"oci://{host}/charts", plain_http=True
        )
        here = chart.replace("oci://ghcr.io/vllm-glassbox", f"oci://{host}")
        shown = yaml.safe_load(
            helm.show(f"{here}:{__version__}", plain_http=True, output_format="chart")
        )
        assert shown["annotations"] == CHART_YAML["annotations"]
        config = helm.Config(storage_driver="memory", namespace="llm")
        try:
            release = config.install(here, "llm", values, namespace="llm", dry_run="client",
                                     chart_version=__version__, plain_http=True)  # fmt: skip
        finally:
            config.close()
    assert (release["chart_version"], release["app_version"]) == (__version__, __version__)
    [deployment] = [
        d for d in yaml.safe_load_all(release["manifest"]) if d and d["kind"] == "Deployment"
    ]
    [spec] = pod_specs(deployment)
    published = {i["name"]: i["image"] for i in _annotation("images")}
    assert container_named(spec, "glassbox")["image"] == published["vllm-glassbox"]


@pytest.fixture
def vendored(dist: Path, tmp_path: Path) -> Iterator[Path]:
    """A consumer's vendor/ as `jb install` leaves it for docs/install.md's jsonnetfile:
    the repository's mixin/ at its path, and the legacy name linked to it."""
    vendor = tmp_path / "vendor"
    package = vendor / "github.com" / "vllm-glassbox" / "vllm-glassbox" / "mixin"
    with tarfile.open(dist / f"vllm-glassbox-mixin-{__version__}.tar.gz") as tar:
        tar.extractall(tmp_path / "unpacked", filter="data")
    shutil.copytree(tmp_path / "unpacked" / "vllm-glassbox-mixin", package)
    (vendor / "vllm-glassbox-mixin").symlink_to(package.relative_to(vendor))
    yield vendor


@pytest.mark.slow
def test_the_mixin_archive_renders_as_docs_install_imports_it(vendored: Path) -> None:
    [example] = re.findall(r"```jsonnet\n(.*?)```", INSTALL, re.S)
    done = subprocess.run(
        ["jsonnet", "-J", str(vendored), "-e", example], capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    rendered = {g["name"]: g for g in json.loads(done.stdout)["groups"]}
    assert rendered == groups_of(sorted((REPO / "alerts").glob("*.yaml")))
