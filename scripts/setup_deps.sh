#!/usr/bin/env bash
# Installs the Debian packages loom needs to build and test, if any are missing.
# Used by ./run.sh and ./test.sh. As root it runs apt-get; otherwise it prints the exact
# command to run and stops, rather than guessing at sudo.
set -euo pipefail

packages=(meson ninja-build pkg-config g++ libopenblas-openmp-dev libdnnl-dev doctest-dev libgloo-dev)
if [ "${LOOM_WITH_TORCH:-0}" = 1 ]; then packages+=(python3-torch); fi

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && exit 0

if [ "$(id -u)" = 0 ]; then
  echo "loom: installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq "${missing[@]}" >/dev/null
else
  echo "loom: missing Debian packages: ${missing[*]}" >&2
  echo "run:  sudo apt-get update && sudo apt-get install -y ${missing[*]}" >&2
  exit 1
fi
