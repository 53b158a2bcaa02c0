#!/usr/bin/env bash
# One step of the H200 runs, on the GPU machine, from a copy of the repository: vLLM 0.24.0
# from its site folder carried in parts (../shared/gpu/README.md's way), glassbox from its
# wheel, a Qwen2.5-7B-shaped model for vLLM's dummy loader (random weights of the real
# shapes), a 96,016-token pool (--gpu-memory-utilization 0.16) so a burst fills it; then
# STEP, its files tarred into OUT.
#   storm:     scripts/gpu/storm_timeline.py --profile gpu (two exporters: 5 s and 1 s polls)
#   telemetry: scripts/gpu/telemetry_sweep.py (nvidia-smi beside vLLM's page at each load)
# usage: scripts/gpu/run_on_h200.sh PARTS_DIR WHEEL OUT STEP
set -euo pipefail
parts=$1 wheel=$2 out=$3 step=$4
site=/tmp/site site2=${GLASSBOX_SITE:-/tmp/site2} models=/tmp/models  # GLASSBOX_SITE: another build
if [ ! -d "$site/vllm" ]; then
  mkdir -p "$site"; cat "$parts"/site.tar.xz.part* | xz -dc | tar -C "$site" -xf -
fi
[ -d "$site2/vllm_glassbox" ] || python3 -m pip -q install --no-deps --target "$site2" "$wheel"
export PYTHONPATH=$site2:$site HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 VLLM_NO_USAGE_STATS=1 \
  VLLM_USE_FLASHINFER_SAMPLER=0
model=$(python3 -c "
from pathlib import Path
from vllm_glassbox.lab.backends.tinymodel import TinyModelSpec, generate
spec = TinyModelSpec('qwen7b', hidden_size=3584, intermediate_size=18944, num_layers=28,
    num_heads=28, num_kv_heads=4, vocab_size=152064, max_position_embeddings=32768,
    checkpoint=False)
print(generate(spec, Path('$models')))")
mkdir -p "$out/$step"
setsid python3 -m vllm.entrypoints.openai.api_server --model "$model" --served-model-name qwen7b \
  --load-format dummy --max-model-len 8192 --gpu-memory-utilization 0.16 --port 8000 \
  >"$out/$step/vllm.log" 2>&1 &
vllm=$!
trap 'kill -- -$vllm 2>/dev/null || true; sleep 5; kill -9 -- -$vllm 2>/dev/null || true' EXIT
started=$(date +%s)
until curl -sf http://127.0.0.1:8000/health >/dev/null; do
  kill -0 $vllm 2>/dev/null || { tail -30 "$out/$step/vllm.log"; exit 1; }
  [ $(( $(date +%s) - started )) -lt 300 ] || { echo "vLLM not ready in 300 s"; exit 1; }
  sleep 2
done
echo "vLLM ready after $(( $(date +%s) - started )) s"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv > "$out/$step/gpu.csv"
case $step in
  storm) python3 scripts/gpu/storm_timeline.py --url http://127.0.0.1:8000 --model qwen7b \
           --profile gpu --out "$out/$step/run" ;;
  telemetry) python3 scripts/gpu/telemetry_sweep.py http://127.0.0.1:8000 --model qwen7b \
           --out "$out/$step/run" ;;
  *) echo "unknown step $step"; exit 2 ;;
esac
kill -- -$vllm 2>/dev/null || true; wait $vllm 2>/dev/null || true
tar -C "$out" -czf "$out/$step.tar.gz" "$step" && rm -rf "${out:?}/$step"
ls -la "$out"
