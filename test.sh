#!/usr/bin/env bash
# Installs what is missing, builds, and runs the whole test suite (meson test).
#   ./test.sh                                 the suite, in build/ (what CI runs)
#   ./test.sh --sanitize address,undefined    the suite under ASan + UBSan (scripts/sanitize.sh)
#   ./test.sh --sanitize thread               the threaded suites under TSan
#   ./test.sh --stress N                      the suites that start processes, N times each,
#                                             beside a busy loop on every core (scripts/stress.sh)
# Further arguments go to meson test (e.g. a suite's name).
set -euo pipefail
cd "$(dirname "$0")"
if [ "${1:-}" = "--sanitize" ]; then
  shift
  exec scripts/sanitize.sh "$@"
fi
if [ "${1:-}" = "--stress" ]; then
  shift
  exec scripts/stress.sh "$@"
fi
scripts/setup_deps.sh
scripts/build.sh
meson test -C build --print-errorlogs --num-processes 1 "$@"
