#!/usr/bin/env bash
# Set up (scripts/setup.sh), then run the whole story on this machine: a real vLLM CPU
# server with tiny generated models, the exporter beside it, the lab's three experiments
# and the report (written to ./demo-out). 10 to 13 minutes on two cores, most of it
# starting vLLM; README.md says what takes the time.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh --demo  # the demo's part of the set-up only (no test tools, no checkov)
exec .venv/bin/glassbox demo --out demo-out "$@"
