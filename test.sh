#!/usr/bin/env bash
# Installs what is missing, builds, and runs the whole test suite (meson test).
set -euo pipefail
cd "$(dirname "$0")"
scripts/setup_deps.sh
scripts/build.sh
meson test -C build --print-errorlogs --num-processes 1 "$@"
