#!/usr/bin/env bash
# mypy on the package as it installs. The package is assembled from several top-level
# folders (package-dir), which mypy cannot follow through an editable install, so we
# type-check a throwaway non-editable copy.
set -euo pipefail
cd "$(dirname "$0")/.."
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
rm -rf build  # setuptools' staging folder: a module renamed since the last build would stay in it
.venv/bin/python -m pip -q --disable-pip-version-check install --no-deps --no-build-isolation \
  --target "$tmp" . 2> >(grep -v "is ignored" >&2)
cp pyproject.toml "$tmp/"
(cd "$tmp" && "$OLDPWD/.venv/bin/python" -m mypy --config-file pyproject.toml --cache-dir "$OLDPWD/.mypy_cache" -p vllm_glassbox) |
  sed "s#^vllm_glassbox/core/#core/#; s#^vllm_glassbox/exporter/#exporter/#; s#^vllm_glassbox/lab/#lab/#; s#^vllm_glassbox/dashboards/#dashboards/#; s#^vllm_glassbox/explain/#explain/#; s#^vllm_glassbox/#glassbox/#"
