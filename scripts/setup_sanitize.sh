#!/usr/bin/env bash
# Configures (once) the build directory of a sanitizer run, build-sanitize-<kind>/ (Meson's
# b_sanitize), with clang: installed with the other packages where missing
# (scripts/setup_deps.sh --clang). Used by scripts/sanitize.sh and tests/fuzz/run.sh.
#
#   scripts/setup_sanitize.sh address,undefined   also -Dfuzz=true: the fuzz harnesses live there
#   scripts/setup_sanitize.sh thread
#
# SANITIZE_CC and SANITIZE_CXX, both set, choose the compilers instead (nothing is installed
# for them).
set -euo pipefail
cd "$(dirname "$0")/.."
kind=$1
case "$kind" in
  address,undefined) fuzz=true ;;
  thread) fuzz=false ;;
  *) echo "loom: setup_sanitize.sh: expected address,undefined or thread, got '$kind'" >&2; exit 2 ;;
esac
dir=build-sanitize-${kind//,/-}
if [ -n "${SANITIZE_CC:-}" ] && [ -n "${SANITIZE_CXX:-}" ]; then
  scripts/setup_deps.sh
  cc=$SANITIZE_CC
  cxx=$SANITIZE_CXX
else
  scripts/setup_deps.sh --clang
  cxx=$(scripts/find_clang.sh clang++)
  cc=${cxx/clang++/clang}
fi
[ -f "$dir/build.ninja" ] && exit 0
cache=$(command -v ccache >/dev/null && echo "ccache " || true)
echo "loom: configuring $dir with $cxx"
CC="$cache$cc" CXX="$cache$cxx" meson setup "$dir" -Dcuda=disabled -Dfuzz=$fuzz \
  -Db_sanitize="$kind" -Db_lundef=false -Dbuildtype=debugoptimized
