#!/usr/bin/env bash
# Set up (scripts/setup.sh), then lint, type-check and run every test, end-to-end ones
# included (they start a real vLLM CPU server and a real Prometheus on loopback).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
echo "== ruff"; .venv/bin/ruff check . && .venv/bin/ruff format --check .
echo "== mypy"; scripts/check-types.sh
echo "== pytest"; .venv/bin/python -m pytest "$@"
