#!/usr/bin/env bash
# Installs the Debian packages loom needs to build and test, if any are missing.
# Used by ./run.sh and ./test.sh. As root it runs apt-get; otherwise it prints the exact
# command to run and stops, rather than guessing at sudo.
#   scripts/setup_deps.sh           the packages of the main build (gcc)
#   scripts/setup_deps.sh --clang   and clang 16 with its sanitizer runtimes and OpenMP
#                                   runtime, unless scripts/find_clang.sh finds a clang >= 16
#                                   with both (the sanitizer and fuzz builds, scripts/sanitize.sh)
set -euo pipefail
cd "$(dirname "$0")"

packages=(meson ninja-build pkg-config g++ libopenblas-openmp-dev libdnnl-dev doctest-dev libgloo-dev libtomlplusplus-dev)
if [ "${LOOM_WITH_TORCH:-0}" = 1 ]; then packages+=(python3-torch); fi
clang=false
if [ "${1:-}" = --clang ] && ! ./find_clang.sh >/dev/null; then
  clang=true
  # Debian 12's clang is 14; 16 is the oldest that compiles loom (scripts/find_clang.sh says why).
  # libomp-16-dev replaces any other libomp-N-dev.
  packages+=(clang-16 libclang-rt-16-dev libomp-16-dev)
fi

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
  $clang || exit 0
  echo "loom: clang-16 libclang-rt-16-dev libomp-16-dev are installed, yet scripts/find_clang.sh finds no clang" \
       ">= 16 with /usr/lib/llvm-N/lib/libomp.so and libclang_rt.asan; set SANITIZE_CC and SANITIZE_CXX to one" >&2
  exit 1
fi

if [ "$(id -u)" = 0 ]; then
  echo "loom: installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq "${missing[@]}" >/dev/null
  if $clang && ! ./find_clang.sh >/dev/null; then
    echo "loom: installed clang-16 libclang-rt-16-dev libomp-16-dev, but scripts/find_clang.sh still finds no" \
         "clang >= 16 with /usr/lib/llvm-N/lib/libomp.so and libclang_rt.asan" >&2
    exit 1
  fi
else
  echo "loom: missing Debian packages: ${missing[*]}" >&2
  echo "run:  sudo apt-get update && sudo apt-get install -y ${missing[*]}" >&2
  exit 1
fi
