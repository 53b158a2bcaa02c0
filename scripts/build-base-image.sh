#!/usr/bin/env bash
# A Debian base image with Python, made without a container registry (none is reachable
# on the machines glassbox is tested on): debootstrap from the Debian mirror apt already
# uses, then `docker import`. About 2 minutes; the tests build it once and reuse it.
#
#   scripts/build-base-image.sh [TAG]     (default local/debian-python:bookworm)
#
# Needs root, debootstrap and a running docker daemon.
set -euo pipefail
tag=${1:-local/debian-python:bookworm}
suite=bookworm

# The mirror of apt's configuration: deb822 .sources files, else one-line .list files.
mirror=$(awk '/^URIs:/ {print $2; exit}' /etc/apt/sources.list.d/*.sources 2>/dev/null || true)
if [ -z "$mirror" ]; then
  mirror=$(grep -hE '^deb ' /etc/apt/sources.list /etc/apt/sources.list.d/*.list 2>/dev/null \
    | grep -v security | awk '{print $2; exit}')
fi
[ -n "$mirror" ] || { echo "build-base-image: no Debian mirror in apt's sources" >&2; exit 1; }

rootfs=$(mktemp -d /tmp/glassbox-rootfs.XXXXXX)
trap 'rm -rf "$rootfs"' EXIT
echo "build-base-image: debootstrap $suite from $mirror"
debootstrap --variant=minbase --include=python3,python3-venv,ca-certificates \
  "$suite" "$rootfs" "$mirror" >"$rootfs.log" 2>&1 \
  || { tail -20 "$rootfs.log" >&2; rm -f "$rootfs.log"; exit 1; }
rm -f "$rootfs.log"
rm -rf "$rootfs"/var/cache/apt/archives/*.deb "$rootfs"/var/lib/apt/lists/*
tar -C "$rootfs" -c . | docker import - "$tag" >/dev/null
echo "build-base-image: imported $tag"
