#!/usr/bin/env bash
# gpu_check.sh: everything loom checks on a GPU, as one time-boxed script for the lent
# GPU machine (one H100/H200, 16 cores, python3 with torch + CUDA, no internet). Target:
# under 8 minutes in all. How to run it: docs/gpu.md.
#
#   1. machine   nvidia-smi, nvcc, torch: what we are running on
#   2. deps      loom's CPU libraries (OpenBLAS, oneDNN, doctest, Gloo) from the system, or
#                from .gpu_debs/ (scripts/gpu_deps.sh, carried) unpacked into .gpu_prefix/;
#                cuDNN / NCCL from the CUDA toolkit, or from PyTorch's nvidia-* wheels
#   3. build     meson with -Dcuda=enabled for sm_90 only, ninja -j16, only the targets below
#   4. tests     meson test: test_cuda, test_cuda_kernels, test_cuda_nn, test_cuda_transformer, test_train_device,
#                test_comm_nccl, test_autocast, test_grad_scaler, test_data_parallel, test_pipeline;
#                pass/fail/skip counts, and a loud FAIL if GPU cases skipped on this GPU
#   5. bench     ResNet18-CIFAR training, batch 128 and 512, fp32 / tf32 / bf16 autocast:
#                loom vs PyTorch, CUDA-event timed, a table with ratios (bench/bench_train_gpu.py)
#   6. train     train_cifar10 --device cuda for a few steps: --amp bf16 and fp16;
#                --mode ddp and --mode fsdp with --backend nccl at world size 1 via loomrun;
#                ddp, fsdp, a --pp 2 pipeline and --tp 2 as 2 processes sharing the GPU over --backend gloo;
#                --tp 1 over nccl
#   7. summary   one line per phase; exit 1 if any failed
# Each phase has its own `timeout`, and a phase that would start with too little of the
# budget left is skipped (and says so). All output goes to the terminal and to
# $OUT/gpu_check.log ($OUT: the folder the device tool brings back; else ./gpu_check_out).
#
# Flags: --deps-only stops after phase 2 (to debug the environment); --force-debs uses
# .gpu_debs even where the system has the libraries (to test that path anywhere).
# Environment: GPU_CHECK_BUDGET (seconds, default 470), BUILD (default build-gpu),
# GPU_GENCODE (default sm_90), BENCH_BATCHES (128,512), BENCH_PRECISIONS (fp32,tf32,bf16),
# PYTHON (default python3).
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
ROOT=$PWD
OUTDIR=${OUT:-$ROOT/gpu_check_out}
mkdir -p "$OUTDIR"
LOG=$OUTDIR/gpu_check.log
exec > >(tee "$LOG") 2>&1

DEPS_ONLY=0
FORCE_DEBS=0
for arg in "$@"; do
  case $arg in
    --deps-only) DEPS_ONLY=1 ;;
    --force-debs) FORCE_DEBS=1 ;;
    *) echo "gpu_check.sh: unknown argument '$arg' (expected --deps-only, --force-debs)"; exit 2 ;;
  esac
done
BUDGET=${GPU_CHECK_BUDGET:-470}
BUILD=${BUILD:-build-gpu}
GENCODE=${GPU_GENCODE:--gencode=arch=compute_90,code=sm_90}
PYTHON=${PYTHON:-python3}
JOBS=$(nproc)
START=$(date +%s)
SUMMARY=()
FAILED=0

elapsed() { echo $(( $(date +%s) - START )); }
left() { echo $(( BUDGET - $(elapsed) )); }
phase() { echo; echo "=== [$(elapsed)s] $* ==="; }
# result PHASE STATUS [DETAIL]: STATUS is PASS, FAIL or SKIP; FAIL makes the exit code 1.
result() {
  SUMMARY+=("$(printf '%-34s %-5s %s' "$1" "$2" "${3:-}")")
  [ "$2" = FAIL ] && FAILED=1
  echo ">>> $1: $2 ${3:-}"
}
# enough SECONDS: true if the budget still has SECONDS left, else records a SKIP for $2.
enough() {
  if [ "$(left)" -lt "$1" ]; then
    result "$2" SKIP "only $(left)s of the ${BUDGET}s budget left, needs ~$1s"
    return 1
  fi
}
# run_timed NAME SECONDS CMD...: runs CMD under timeout, records PASS/FAIL with its time.
run_timed() {
  local name=$1 limit=$2 t0 rc
  shift 2
  t0=$(date +%s)
  timeout --kill-after=10 "$limit" "$@"
  rc=$?
  if [ $rc -eq 0 ]; then result "$name" PASS "$(( $(date +%s) - t0 ))s"
  elif [ $rc -eq 124 ] || [ $rc -eq 137 ]; then result "$name" FAIL "timed out after ${limit}s"
  else result "$name" FAIL "exit code $rc after $(( $(date +%s) - t0 ))s"
  fi
  return $rc
}

# ---- 1. machine ---------------------------------------------------------------------------
phase "1. machine"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || echo "nvidia-smi failed"
NGPU=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU' || true)
command -v nvcc >/dev/null || export PATH=/usr/local/cuda/bin:$PATH
nvcc --version | tail -2
# The driver must support the toolkit's CUDA version, or every GPU test skips after a
# full build: say so now.
driver_cuda=$(nvidia-smi 2>/dev/null | sed -n 's/.*CUDA Version: *\([0-9]*\)\.\([0-9]*\).*/\1\2/p' | head -1)
nvcc_cuda=$(nvcc --version | sed -n 's/.*release \([0-9]*\)\.\([0-9]*\).*/\1\2/p' | head -1)
if [ -n "$driver_cuda" ] && [ -n "$nvcc_cuda" ] && [ "$driver_cuda" -lt "$nvcc_cuda" ]; then
  result "driver vs toolkit" FAIL "the driver supports CUDA up to ${driver_cuda:0:-1}.${driver_cuda: -1}, nvcc is ${nvcc_cuda:0:-1}.${nvcc_cuda: -1}: binaries will not run; use an older toolkit"
fi
g++ --version | head -1
echo "meson $(meson --version 2>/dev/null || echo MISSING), ninja $(ninja --version 2>/dev/null || echo MISSING), $JOBS cores"
timeout 60 "$PYTHON" -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'cudnn', \
torch.backends.cudnn.version(), 'gpu', torch.cuda.is_available() and torch.cuda.get_device_name())" \
  || echo "torch: not importable by $PYTHON"
if [ "$NGPU" -lt 1 ]; then
  result "machine" FAIL "nvidia-smi lists no GPU: this script is for the GPU machine"
else
  result "machine" PASS "$NGPU GPU(s)"
fi

# ---- 2. dependencies ----------------------------------------------------------------------
phase "2. dependencies"
# Note [Private prefix for carried packages]
# The GPU image has CUDA, g++, meson and ninja but not loom's CPU libraries, and it cannot
# fetch them. Debian 12 packages (built for an older glibc than the image's, so they run
# there) are unpacked with dpkg -x into .gpu_prefix/, never into /, and found through
# CPATH / LIBRARY_PATH (g++ and meson's find_library), PKG_CONFIG_PATH (rewritten .pc
# files: Debian's say prefix=/usr) and LD_LIBRARY_PATH (run time).
system_has_deps() {
  echo '#include <dnnl.hpp>
#include <doctest/doctest.h>
int main() {}' | g++ -std=c++20 -x c++ -fsyntax-only - 2>/dev/null && "${PKG_CONFIG:-pkg-config}" --exists openblas 2>/dev/null
}
PREFIX=$ROOT/.gpu_prefix
if [ $FORCE_DEBS = 0 ] && system_has_deps; then
  result "deps (CPU libraries)" PASS "from the system"
elif ls .gpu_debs/*.deb >/dev/null 2>&1; then
  rm -rf "$PREFIX" && mkdir -p "$PREFIX/pkgconfig"
  for deb in .gpu_debs/*.deb; do
    if command -v dpkg >/dev/null; then dpkg -x "$deb" "$PREFIX"
    else (d=$(mktemp -d) && cd "$d" && ar x "$ROOT/$deb" && tar -xf data.tar.* -C "$PREFIX" && rm -rf "$d"); fi
  done
  LIB=$PREFIX/usr/lib/x86_64-linux-gnu
  export CPATH=$PREFIX/usr/include:$PREFIX/usr/include/x86_64-linux-gnu/openblas-openmp${CPATH:+:$CPATH}
  # (libgloo sits in usr/lib, libnl in lib/x86_64-linux-gnu: Debian's own choices.)
  libdirs=$LIB:$LIB/openblas-openmp:$PREFIX/usr/lib:$PREFIX/lib/x86_64-linux-gnu
  export LIBRARY_PATH=$libdirs${LIBRARY_PATH:+:$LIBRARY_PATH}
  export LD_LIBRARY_PATH=$libdirs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
  # The .so links dpkg -x cannot make (Debian makes them with update-alternatives).
  [ -e "$LIB/libopenblas.so.0" ] || ln -s openblas-openmp/libopenblas.so.0 "$LIB/libopenblas.so.0"
  for pc in "$LIB/openblas-openmp/pkgconfig/openblas.pc" "$PREFIX/usr/share/pkgconfig/doctest.pc" \
            "$LIB/pkgconfig/doctest.pc"; do
    [ -f "$pc" ] && sed "s|^prefix=/usr|prefix=$PREFIX/usr|; s|=/usr/|=$PREFIX/usr/|g" "$pc" > "$PREFIX/pkgconfig/$(basename "$pc")"
  done
  if [ ! -f "$PREFIX/pkgconfig/doctest.pc" ]; then  # doctest-dev ships only CMake files
    printf 'Name: doctest\nDescription: doctest (from .gpu_debs)\nVersion: 2.4.9\nCflags: -I%s/usr/include\n' \
      "$PREFIX" > "$PREFIX/pkgconfig/doctest.pc"
  fi
  export PKG_CONFIG_PATH=$PREFIX/pkgconfig${PKG_CONFIG_PATH:+:$PKG_CONFIG_PATH}
  command -v pkg-config >/dev/null || export PKG_CONFIG=$PREFIX/usr/bin/pkgconf
  if system_has_deps; then result "deps (CPU libraries)" PASS "from .gpu_debs (see Note [Private prefix ...])"
  else result "deps (CPU libraries)" FAIL "unpacked .gpu_debs but dnnl.hpp / doctest / openblas.pc still not found"; fi
else
  result "deps (CPU libraries)" FAIL "OpenBLAS/oneDNN/doctest missing and no .gpu_debs: run scripts/gpu_deps.sh here, carry .gpu_debs"
fi

# cuDNN and NCCL: in the toolkit, or in PyTorch's nvidia-* wheels (headers + versioned .so
# only; a shim folder adds the unversioned names the linker looks for).
CUDA_ROOT=$(dirname "$(dirname "$(command -v nvcc)")")
SHIM=$PREFIX/cuda_shim
find_in_wheels() {  # find_in_wheels NAME: the first file called NAME under site-packages/nvidia
  "$PYTHON" -c "import site; print('\n'.join(site.getsitepackages() + [site.getusersitepackages()]))" 2>/dev/null |
    while read -r sp; do [ -d "$sp/nvidia" ] && find -L "$sp/nvidia" -name "$1" 2>/dev/null; done | head -1
}
for lib in cudnn nccl cublas; do
  header=$lib.h; [ $lib = cublas ] && header=cublas_v2.h
  if [ -f "$CUDA_ROOT/include/$header" ] || [ -f "/usr/include/$header" ]; then
    echo "$lib: $header in the system"; continue
  fi
  h=$(find_in_wheels "$header")
  so=$(find_in_wheels "lib$lib.so.*")
  if [ -z "$h" ] || [ -z "$so" ]; then echo "$lib: not found (system or wheels)"; continue; fi
  mkdir -p "$SHIM/include" "$SHIM/lib"
  ln -sf "$(dirname "$h")"/*.h "$SHIM/include/"
  ln -sf "$so" "$SHIM/lib/lib$lib.so"
  [ $lib = cublas ] && [ -n "$(find_in_wheels 'libcublasLt.so.*')" ] && ln -sf "$(find_in_wheels 'libcublasLt.so.*')" "$SHIM/lib/libcublasLt.so"
  export CPATH=$SHIM/include${CPATH:+:$CPATH}
  export LIBRARY_PATH=$SHIM/lib${LIBRARY_PATH:+:$LIBRARY_PATH}
  LD_LIBRARY_PATH=$(dirname "$so")${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
  export LD_LIBRARY_PATH
  echo "$lib: from the wheel at $(dirname "$(dirname "$so")")"
done
echo "CPATH=${CPATH:-}"; echo "LIBRARY_PATH=${LIBRARY_PATH:-}"; echo "LD_LIBRARY_PATH=${LD_LIBRARY_PATH:-}"
echo "PKG_CONFIG_PATH=${PKG_CONFIG_PATH:-}; openblas: $("${PKG_CONFIG:-pkg-config}" --cflags --libs openblas 2>&1)"
if [ $DEPS_ONLY = 1 ]; then
  printf '%s\n' "${SUMMARY[@]}"
  exit $FAILED
fi

# ---- 3. build -------------------------------------------------------------------------------
phase "3. build ($BUILD, $GENCODE, -j$JOBS)"
TARGETS=(libloom.so tests/test_cuda tests/test_cuda_kernels tests/test_cuda_nn tests/test_cuda_transformer
         tests/test_train_device tests/test_comm_nccl tests/test_autocast tests/test_grad_scaler tests/test_data_parallel
         tests/test_pipeline bench/bench_train_gpu
         examples/train_cifar10 parallel/loomrun)
BUILT=0
if [ -f "$BUILD/build.ninja" ]; then
  configure=(meson configure "$BUILD" -Dcuda=enabled "-Dgpu_gencode=$GENCODE")
else
  configure=(meson setup "$BUILD" -Dbuildtype=release -Dcuda=enabled "-Dgpu_gencode=$GENCODE")
fi
if run_timed "configure (meson, CUDA on)" 120 "${configure[@]}"; then
  grep -E "CUDA backend|NCCL|Gloo|Message" "$BUILD/meson-logs/meson-log.txt" | grep -iv "^Program\|^Running" | tail -6
  run_timed "build (ninja -j$JOBS)" $(( $(left) > 330 ? 300 : $(left) - 30 )) ninja -C "$BUILD" -j"$JOBS" "${TARGETS[@]}" && BUILT=1
fi

# ---- 4. tests ---------------------------------------------------------------------------------
phase "4. GPU tests"
# Expected skips on this machine: the cases for machines without a GPU (skip(kGpu),
# skip(kGpus > 0)) and, on one GPU, the 2-rank NCCL cases (skip(kGpus < 2)). Anything
# more means GPU cases skipped on a GPU: a FAIL, however green the rest.
expected_skips() {
  local pattern='doctest::skip\((kGpu|kGpus > 0)\)'
  [ "$NGPU" -lt 2 ] && pattern='doctest::skip\((kGpu|kGpus > 0|kGpus < 2)\)'
  grep -cE "$pattern" "tests/$1.cpp" || true
}
if [ $BUILT = 1 ]; then
  for t in test_cuda test_cuda_kernels test_cuda_nn test_cuda_transformer test_train_device test_comm_nccl test_autocast \
           test_grad_scaler test_data_parallel test_pipeline; do
    enough 20 "test $t" || continue
    out=$(timeout --kill-after=10 150 meson test -C "$BUILD" --no-rebuild --print-errorlogs --verbose "$t" 2>&1)
    rc=$?
    echo "$out" | grep -vE '^\s*$' | tail -40
    counts=$(echo "$out" | grep -E '\[doctest\] test cases:' | tail -1 | sed 's/.*test cases: *//')
    skipped=$(echo "$counts" | sed -n 's/.*| *\([0-9]*\) skipped.*/\1/p')
    expect=$(expected_skips "$t")
    if [ $rc -ne 0 ]; then
      result "test $t" FAIL "meson test exit $rc; ${counts:-no doctest summary}"
    elif echo "$out" | grep -qE 'GPU test cases are skipped|NCCL cases are skipped|CUDA cases are skipped'; then
      result "test $t" FAIL "GPU CASES SKIPPED ON A GPU MACHINE: $counts"
    elif [ -n "$skipped" ] && [ "$skipped" -gt "$expect" ]; then
      result "test $t" FAIL "$skipped skipped, expected at most $expect on this machine: GPU cases skipped? ($counts)"
    else
      result "test $t" PASS "$counts (expected skips: $expect)"
    fi
  done
else
  result "tests" SKIP "nothing built"
fi

# ---- 5. benchmark ---------------------------------------------------------------------------
phase "5. benchmark: ResNet18-CIFAR training, loom vs PyTorch"
if [ $BUILT = 1 ] && enough 100 "benchmark"; then
  # Up to 180s, leaving ~45s for the short training runs after it.
  run_timed "benchmark (table: bench_table.md)" $(( $(left) - 45 < 180 ? $(left) - 45 : 180 )) \
    "$PYTHON" bench/bench_train_gpu.py --loom="$BUILD/bench/bench_train_gpu" --python="$PYTHON" \
      --batches="${BENCH_BATCHES:-128,512}" --precisions="${BENCH_PRECISIONS:-fp32,tf32,bf16}" \
      --warmup=5 --steps=20 --timeout=45 --out="$OUTDIR/bench_table.md"
fi

# ---- 6. training runs ---------------------------------------------------------------------------
phase "6. train_cifar10 on the GPU"
TRAIN=(--synthetic --max-steps 5 --epochs 1 --batch-size 128 --eval-limit 256 --workers 2 --quiet)
if [ $BUILT = 1 ]; then
  for amp in bf16 fp16; do
    enough 40 "train --amp $amp" &&
      run_timed "train --amp $amp" 60 "$BUILD/examples/train_cifar10" --device cuda --amp "$amp" "${TRAIN[@]}"
  done
  enough 60 "ddp nccl, world size 1" &&
    run_timed "ddp nccl, world size 1" 90 "$BUILD/parallel/loomrun" --standalone --nproc_per_node 1 \
      "$BUILD/examples/train_cifar10" --mode ddp --backend nccl --device cuda "${TRAIN[@]}"
  # cuda:0, not cuda: a bare "cuda" means cuda:LOCAL_RANK (one GPU per process, as
  # torchrun), and this machine has one GPU for both ranks.
  enough 60 "ddp gloo, 2 procs on 1 GPU" &&
    OMP_NUM_THREADS=4 run_timed "ddp gloo, 2 procs on 1 GPU" 120 "$BUILD/parallel/loomrun" --standalone \
      --nproc_per_node 2 --prefix-output "$BUILD/examples/train_cifar10" --mode ddp --backend gloo --device cuda:0 \
      "${TRAIN[@]}"
  # The sharded family and the pipeline of processes: FSDP over NCCL at world size 1; FSDP
  # and a 2-stage pipeline as 2 processes sharing the GPU over gloo.
  enough 60 "fsdp nccl, world size 1" &&
    run_timed "fsdp nccl, world size 1" 90 "$BUILD/parallel/loomrun" --standalone --nproc_per_node 1 \
      "$BUILD/examples/train_cifar10" --mode fsdp --sharding-strategy full_shard --backend nccl --device cuda \
      "${TRAIN[@]}"
  enough 60 "fsdp gloo, 2 procs on 1 GPU" &&
    OMP_NUM_THREADS=4 run_timed "fsdp gloo, 2 procs on 1 GPU" 120 "$BUILD/parallel/loomrun" --standalone \
      --nproc_per_node 2 --prefix-output "$BUILD/examples/train_cifar10" --mode fsdp --backend gloo --device cuda:0 \
      "${TRAIN[@]}"
  enough 60 "pipeline --pp 2 gloo, 2 procs on 1 GPU" &&
    OMP_NUM_THREADS=4 run_timed "pipeline --pp 2 gloo, 2 procs on 1 GPU" 120 "$BUILD/parallel/loomrun" --standalone \
      --nproc_per_node 2 --prefix-output "$BUILD/examples/train_cifar10" --mode pipeline --pp 2 --chunks 4 \
      --backend gloo --device cuda:0 "${TRAIN[@]}"
  # Tensor parallelism: the mesh's tp dimension over NCCL at world size 1, and the ResNet
  # plan's hooks and DTensor moves on CUDA tensors with 2 processes sharing the GPU over gloo.
  enough 60 "tp 1 nccl, world size 1" &&
    run_timed "tp 1 nccl, world size 1" 90 "$BUILD/parallel/loomrun" --standalone --nproc_per_node 1 \
      "$BUILD/examples/train_cifar10" --mode ddp --tp 1 --backend nccl --device cuda "${TRAIN[@]}"
  enough 60 "tp 2 gloo, 2 procs on 1 GPU" &&
    OMP_NUM_THREADS=4 run_timed "tp 2 gloo, 2 procs on 1 GPU" 120 "$BUILD/parallel/loomrun" --standalone \
      --nproc_per_node 2 --prefix-output "$BUILD/examples/train_cifar10" --tp 2 --backend gloo --device cuda:0 \
      "${TRAIN[@]}"
fi

# ---- 7. summary -----------------------------------------------------------------------------
phase "7. summary ($(elapsed)s of ${BUDGET}s)"
printf '%s\n' "${SUMMARY[@]}"
[ -f "$OUTDIR/bench_table.md" ] && { echo; cat "$OUTDIR/bench_table.md"; }
echo
if [ $FAILED = 0 ]; then echo "gpu_check: ALL PASSED"; else echo "gpu_check: FAILURES above"; fi
exit $FAILED
