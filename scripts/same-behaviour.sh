#!/usr/bin/env bash
# Behaviour unchanged? Everything glassbox writes from its inputs (scripts/behaviour_snapshot.py:
# the exporter's pages over every captured fixture, the rules, the dashboards' JSON, explain's
# answers, the lab's report) written by BASE (a commit, default main) and by this tree, then
# compared byte for byte. Exit 0 when they are the same.
#
#   scripts/same-behaviour.sh [BASE]
set -euo pipefail
cd "$(dirname "$0")/.."
base=${1:-main}
work=$(mktemp -d)
trap 'git worktree remove --force "$work/tree" >/dev/null 2>&1 || true; rm -rf "$work"' EXIT
git worktree add -q --detach "$work/tree" "$base"
# BASE installed apart (not editable), so that its modules, not this tree's, are imported.
.venv/bin/python -m pip -q --disable-pip-version-check install --no-deps --no-build-isolation \
  --target "$work/site" "$work/tree" >/dev/null
cp scripts/behaviour_snapshot.py "$work/tree/scripts/"
(cd "$work/tree" && PYTHONPATH="$work/site:$work/tree" \
  "$OLDPWD/.venv/bin/python" scripts/behaviour_snapshot.py "$work/before")
.venv/bin/python scripts/behaviour_snapshot.py "$work/after"
if diff -r "$work/before" "$work/after"; then
  echo "same behaviour as $base: $(find "$work/after" -type f | wc -l) files compared"
else
  echo "behaviour differs from $base (above)" >&2
  exit 1
fi
