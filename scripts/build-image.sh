#!/usr/bin/env bash
# Build the glassbox image from the Dockerfile, hermetically: the wheels are built and
# downloaded here, for the base image's Python, and the build installs them offline.
#
#   scripts/build-image.sh [--base IMAGE] [--tag TAG] [--extras lab]
#
# Defaults: --base python:3.12-slim-bookworm, --tag vllm-glassbox:<version>[-lab].
# Needs docker, and a Python with pip: the virtualenv of scripts/setup.sh when there is
# one, else python3. The image's revision label and glassbox_build_info{revision} are
# this checkout's HEAD; its version label is glassbox's (scripts/version.py).
set -euo pipefail
cd "$(dirname "$0")/.."

base=python:3.12-slim-bookworm
tag=""
extras=""
while [ $# -gt 0 ]; do
  case "$1" in
    --base) base=$2; shift 2 ;;
    --tag) tag=$2; shift 2 ;;
    --extras) extras=$2; shift 2 ;;
    *) echo "build-image: unknown argument $1" >&2; exit 2 ;;
  esac
done
python=.venv/bin/python
isolation=(--no-build-isolation)  # the virtualenv has setuptools; a bare python3 may not
if [ ! -x "$python" ]; then python=python3; isolation=(); fi
version=$(python3 scripts/version.py)
tag=${tag:-vllm-glassbox:${version}${extras:+-$extras}}

# The base image's Python and machine decide which binary wheels fit it.
read -r py machine < <(docker run --rm --network host --entrypoint python3 "$base" \
  -c 'import platform, sys; print(f"{sys.version_info[0]}.{sys.version_info[1]}", platform.machine())')
echo "build-image: $base has Python $py on $machine"

pip=("$python" -m pip -q --disable-pip-version-check)
rm -rf build/wheels
"${pip[@]}" wheel --no-deps "${isolation[@]}" -w build/wheels . \
  2> >(grep -v "is ignored: it is neither a file nor a directory" >&2)
wheel=$(ls build/wheels/vllm_glassbox-*.whl)
"${pip[@]}" download --only-binary=:all: --python-version "$py" \
  --platform "manylinux2014_$machine" --platform "manylinux_2_28_$machine" \
  --platform "manylinux_2_17_$machine" --platform any \
  -d build/wheels "${wheel}${extras:+[$extras]}" \
  2> >(grep -v "is ignored: it is neither a file nor a directory" >&2)

revision=$(git rev-parse HEAD 2>/dev/null || echo unknown)
docker build --network host --build-arg "BASE=$base" --build-arg "EXTRAS=$extras" \
  --build-arg "REVISION=$revision" --build-arg "VERSION=$version" -t "$tag" .
echo "build-image: built $tag"
