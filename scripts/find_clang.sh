#!/usr/bin/env bash
# Prints the newest clang (or clang++, by $1), version 16 or later, whose OpenMP runtime
# (/usr/lib/llvm-N/lib/libomp.so) and sanitizer runtimes (libclang_rt.asan, ...) are
# installed: loom captures structured bindings in lambdas (C++20), which clang accepts only
# from 16 on. Exits 1, silently, where there is none: scripts/setup_deps.sh --clang then
# installs Debian 12's
#   clang-16 libclang-rt-16-dev libomp-16-dev
# (Debian's libomp-N-dev packages replace each other: only one version's is installed.)
# clang 16 refuses structured bindings captured into lambdas when -fopenmp is on, so loom's
# code does not do that (see Note [doctest messages name no structured binding] in
# tests/test_main.cpp); clang 19 accepts it, given libclang-rt-19-dev libomp-19-dev.
set -euo pipefail
name=${1:-clang++}
for v in 19 18 17 16; do
  if command -v "$name-$v" >/dev/null && [ -e "/usr/lib/llvm-$v/lib/libomp.so" ] &&
     compgen -G "/usr/lib/llvm-$v/lib/clang/*/lib/linux/libclang_rt.asan*" >/dev/null; then
    echo "$name-$v"
    exit 0
  fi
done
exit 1
