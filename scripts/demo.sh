#!/usr/bin/env bash
# Set up (scripts/setup.sh), then run the whole story on this machine: a real vLLM CPU
# server with tiny generated models, the exporter beside it, the lab's three experiments
# and the report (written to ./demo-out). 8 to 13 minutes on two cores, most of it
# starting vLLM; README.md says what takes the time. How long the set-up and the demo
# took goes to demo-out/timing.txt (scripts/showcase.py puts it in the README).
set -euo pipefail
cd "$(dirname "$0")/.."
started=$SECONDS
scripts/setup.sh --demo  # the demo's part of the set-up only (no test tools, no checkov)
setup_seconds=$((SECONDS - started))
status=0
.venv/bin/glassbox demo --out demo-out "$@" || status=$?
if [ -d demo-out ]; then
  printf 'setup_seconds %d\ndemo_seconds %d\nstatus %d\n' \
    "$setup_seconds" $((SECONDS - started - setup_seconds)) "$status" >demo-out/timing.txt
fi
exit "$status"
