"""Build what a release publishes, into one folder, and check each artifact as it is made.

    .venv/bin/python scripts/release.py --out dist            # wheel, sdist, chart, mixin
    .venv/bin/python scripts/release.py --out dist --image    # and the image, its SBOM

  vllm_glassbox-V-py3-none-any.whl, vllm_glassbox-V.tar.gz
        `python -m build`: the sdist, then the wheel built from the sdist (so the sdist
        is known to build); `twine check` on both (the metadata PyPI will show).
  vllm-glassbox-V.tgz
        the chart packaged by Helm's own package action (helm-python-sdk: `helm package`),
        linted strictly; it is what `helm push` sends to an OCI registry.
  vllm-glassbox-mixin-V.tar.gz
        mixin/ as jsonnet-bundler vendors it (its jsonnetfile.json at the top, under
        `vllm-glassbox-mixin/`), for the GitHub release.
  vllm-glassbox-V.image.tar, vllm-glassbox-V.spdx.json   (--image: needs docker)
        scripts/build-image.sh's image saved by `docker save`, and its SBOM by syft.

V is glassbox's version (glassbox/__init__.py), which every artifact carries. The release
workflow (.github/workflows/release.yml) runs the same builds before publishing them;
tests/glassbox/test_release.py runs this script and installs what it made.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "scripts"))

from version import version  # noqa: E402

CHART = REPO / "helm" / "vllm-glassbox"
MIXIN = REPO / "mixin"
MIXIN_NAME = "vllm-glassbox-mixin"  # the name jsonnet-bundler vendors it under


def run(*command: str | Path) -> None:
    print("release:", " ".join(str(c) for c in command), flush=True)
    subprocess.run([str(c) for c in command], check=True, cwd=REPO)


def python_package(out: Path) -> list[Path]:
    # No isolation: the virtualenv has setuptools; the workflow builds isolated.
    run(sys.executable, "-m", "build", "--no-isolation", "--outdir", out, REPO)
    v = version()
    built = [out / f"vllm_glassbox-{v}-py3-none-any.whl", out / f"vllm_glassbox-{v}.tar.gz"]
    run(sys.executable, "-m", "twine", "check", "--strict", *built)
    return built


def chart(out: Path) -> Path:
    import helm_python as helm

    report = helm.lint(CHART, strict=True)
    if report["errors"] or report["messages"]:
        raise SystemExit(f"release: helm lint --strict: {report}")
    packaged = Path(helm.package(CHART, destination=out))
    expected = out / f"vllm-glassbox-{version()}.tgz"
    if packaged != expected:
        raise SystemExit(f"release: the chart packaged as {packaged.name}, not {expected.name}")
    print(f"release: {packaged.name} {helm.digest(packaged)}")
    return packaged


def tracked(folder: Path) -> list[Path]:
    """The files git tracks under `folder` (what a clone, and so jsonnet-bundler, gets)."""
    listed = subprocess.run(
        ["git", "ls-files", "-z", str(folder.relative_to(REPO))],
        cwd=REPO, capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    return [REPO / name for name in listed.split("\0") if name]


def mixin(out: Path) -> Path:
    archive = out / f"{MIXIN_NAME}-{version()}.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        for path in tracked(MIXIN):
            tar.add(path, arcname=f"{MIXIN_NAME}/{path.relative_to(MIXIN)}", recursive=False)
    print(f"release: {archive.name}")
    return archive


def image(out: Path, base: str | None) -> list[Path]:
    v = version()
    tag = f"vllm-glassbox:{v}"
    run(REPO / "scripts" / "build-image.sh", "--tag", tag, *(["--base", base] if base else []))
    saved, sbom = out / f"vllm-glassbox-{v}.image.tar", out / f"vllm-glassbox-{v}.spdx.json"
    run("docker", "save", "-o", saved, tag)
    syft = shutil.which("syft") or str(Path(sys.executable).parent / "syft")
    run(syft, "scan", f"docker-archive:{saved}", "-q", "-o", f"spdx-json={sbom}")
    return [saved, sbom]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, default=REPO / "dist", help="folder (default dist/)")
    p.add_argument("--image", action="store_true", help="also the image and its SBOM (docker)")
    p.add_argument("--base", help="the image's base (scripts/build-image.sh's default)")
    args = p.parse_args(argv)
    out = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    made = [*python_package(out), chart(out), mixin(out)]
    if args.image:
        made += image(out, args.base)
    for path in made:
        print(f"release: {path.name:<44} {path.stat().st_size:>12,} bytes")
    return 0


if __name__ == "__main__":
    sys.exit(main())
