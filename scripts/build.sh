#!/usr/bin/env bash
# Configures (once) and compiles loom into ./build. Extra arguments go to meson setup,
# e.g. scripts/build.sh -Dcuda=disabled.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ ! -f build/build.ninja ]; then
  meson setup build "$@"
elif [ $# -gt 0 ]; then
  meson configure build "$@"
fi
meson compile -C build
