#!/usr/bin/env bash
# Gathers the Debian 12 packages loom builds against into .gpu_debs/, for a machine that
# has CUDA, a compiler, meson and ninja but no internet and none of loom's CPU libraries
# -- the lent GPU machine (docs/gpu.md). Run it here, once, from
# the repository root; then name .gpu_debs in the device tool's `carry`, and
# scripts/gpu_check.sh unpacks them into a private prefix (never into /) where the
# machine lacks a library. .gpu_debs/ is git-ignored; about 25 MiB.
set -euo pipefail
cd "$(dirname "$0")/.."

packages=(
  libopenblas0-openmp libopenblas-openmp-dev libgfortran5     # BLAS (OpenMP build)
  libdnnl2 libdnnl-dev ocl-icd-libopencl1                     # oneDNN 2.6 (links libOpenCL)
  doctest-dev                                                 # tests
  libgloo0 libgloo-dev libhiredis0.14 libibverbs1 libnl-3-200 libnl-route-3-200  # Gloo communicator
  pkgconf pkgconf-bin libpkgconf3                             # in case pkg-config is missing there
)
mkdir -p .gpu_debs
cd .gpu_debs
apt-get download "${packages[@]}"
du -sh .
ls
