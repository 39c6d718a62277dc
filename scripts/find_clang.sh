#!/usr/bin/env bash
# Prints the newest clang (or clang++, by $1), version 16 or later, whose OpenMP runtime is
# installed (/usr/lib/llvm-N/lib/libomp.so): loom captures structured bindings in lambdas
# (C++20), which clang accepts only from 16 on. Debian 12:
#   apt-get install clang-16 libclang-rt-16-dev libomp-16-dev
# (Debian's libomp-N-dev packages replace each other: only one version's is installed.)
# clang 16 refuses structured bindings captured into lambdas when -fopenmp is on, so loom's
# code does not do that (see Note [doctest messages name no structured binding] in
# tests/test_main.cpp); clang 19 accepts it, given libclang-rt-19-dev libomp-19-dev.
set -euo pipefail
name=${1:-clang++}
for v in 19 18 17 16; do
  if command -v "$name-$v" >/dev/null && [ -e "/usr/lib/llvm-$v/lib/libomp.so" ]; then
    echo "$name-$v"
    exit 0
  fi
done
echo "loom: the sanitizer and fuzz builds need clang 16 or later with its OpenMP runtime" \
     "(apt-get install clang-16 libclang-rt-16-dev libomp-16-dev)" >&2
exit 1
