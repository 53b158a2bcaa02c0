#!/usr/bin/env bash
# Fuzz the page parser and the log parser (atheris, coverage-guided), SECONDS each
# (default 600), at low priority. Not part of CI: it is CPU-heavy and runs for minutes.
# The oracle is tests/parser_contract.py; the corpus and any crash land in .fuzz/<target>/.
#
#   scripts/fuzz.sh          # 10 minutes per target
#   scripts/fuzz.sh 60       # a quick look
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=${1:-600}
.venv/bin/python -c "import atheris" 2>/dev/null || .venv/bin/python -m pip install -q -e '.[fuzz]'
for target in page log; do
  dir=.fuzz/$target
  mkdir -p "$dir"
  echo "== fuzz $target for ${seconds}s (log: $dir/fuzz.log)"
  status=0
  nice -n 19 .venv/bin/python scripts/fuzz_parsers.py "$target" "$dir/corpus" \
    -max_total_time="$seconds" > "$dir/fuzz.log" 2>&1 || status=$?
  runs=$(grep -o 'stat::number_of_executed_units: [0-9]*' "$dir/fuzz.log" | grep -o '[0-9]*$' || echo '?')
  took=$(grep -o 'Done [0-9]* runs in [0-9]* second' "$dir/fuzz.log" | grep -o 'in [0-9]*' | grep -o '[0-9]*' || echo '?')
  corpus=$(find "$dir/corpus" -type f | wc -l)
  crashes=$(find "$dir/crashes" -type f 2>/dev/null | wc -l)
  echo "$target: $runs executions in ${took}s, corpus $corpus inputs, $crashes crash(es), exit $status"
  if [ "$status" -ne 0 ]; then tail -40 "$dir/fuzz.log"; fi
done
