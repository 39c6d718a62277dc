#!/usr/bin/env bash
# Prints the newest clang (or clang++, by $1) installed, version 16 or later: loom captures
# structured bindings in lambdas (C++20), which clang accepts only from 16 on. Debian 12:
# apt-get install clang-16 libclang-rt-16-dev libomp-16-dev.
set -euo pipefail
name=${1:-clang++}
for v in 19 18 17 16; do
  if command -v "$name-$v" >/dev/null; then echo "$name-$v"; exit 0; fi
done
if command -v "$name" >/dev/null && [ "$("$name" -dumpversion | cut -d. -f1)" -ge 16 ]; then echo "$name"; exit 0; fi
echo "loom: the sanitizer and fuzz builds need clang 16 or later (apt-get install clang-16 libclang-rt-16-dev" \
     "libomp-16-dev)" >&2
exit 1
