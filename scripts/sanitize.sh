#!/usr/bin/env bash
# The test suite under sanitizers, each in a build directory of its own (Meson's
# b_sanitize), compiled with clang. ./test.sh --sanitize KIND [meson test args] runs this.
#
#   scripts/sanitize.sh address,undefined   the whole suite under ASan + UBSan
#                                            (build-sanitize-address-undefined/; it also
#                                            holds the fuzz harnesses, tests/fuzz/run.sh)
#   scripts/sanitize.sh thread              the threaded suites under TSan
#                                            (build-sanitize-thread/)
#
# clang 16 or later is installed where missing (scripts/setup_sanitize.sh, which also
# configures the build directory). Why clang: the fuzz harnesses need libFuzzer, and
# clang's OpenMP runtime (libomp) tells TSan about its own synchronisation, where GCC's
# libgomp is uninstrumented and makes every parallel region a false race. Suppressions,
# each with its reason, are in tests/sanitizers/. Run times and results: docs/testing.md.
set -euo pipefail
cd "$(dirname "$0")/.."
kind=${1:-}
shift || true
case "$kind" in
  address,undefined | undefined,address) kind=address,undefined ;;
  thread) ;;
  *)
    echo "usage: ./test.sh --sanitize address,undefined|thread [meson test arguments]" >&2
    exit 2
    ;;
esac
# As root, installs what is missing (clang included) with apt-get; otherwise prints the
# apt-get line and stops here, before any build step.
scripts/setup_sanitize.sh "$kind"
dir=build-sanitize-${kind//,/-}

supp=$PWD/tests/sanitizers
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:detect_odr_violation=0:abort_on_error=0}
export LSAN_OPTIONS=${LSAN_OPTIONS:-suppressions=$supp/lsan.supp:print_suppressions=0}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-halt_on_error=1:print_stacktrace=1:suppressions=$supp/ubsan.supp}
# ignore_noninstrumented_modules: libomp's own advice ("to avoid false positive reports
# from the OpenMP runtime"): its thread pool's locks live in the uninstrumented runtime.
export TSAN_OPTIONS=${TSAN_OPTIONS:-halt_on_error=0:second_deadlock_stack=1:ignore_noninstrumented_modules=1:suppressions=$supp/tsan.supp}

if [ "$kind" = thread ]; then
  # The suites whose code runs threads (docs/testing.md): ranks as threads in one process
  # (tests/rank_threads.h), data-parallel replicas, loader workers, the store's server.
  wanted=(test_threading test_dataloader test_data_parallel test_pipeline test_pipeline_schedule test_ddp
          test_ddp_buckets test_comm_gloo test_comm_gloo_errors test_comm_shm test_comm_symmetric test_store
          test_store_robustness test_rendezvous test_launch_env test_loomrun test_sync_batch_norm test_trace
          test_pipeline_stage test_pipeline_ddp test_zero_redundancy_optimizer test_fsdp
          test_distributed_checkpoint test_balance test_parallel_dims test_pipeline_sharding test_comm_traffic
          test_traffic_modes test_dtensor test_tensor_parallel test_activation_checkpoint test_kernel_benchmark
          test_fully_shard test_sharded_grad_scaler test_conv2d test_resharding_checkpoint test_memory_estimate)
  # test_memory_estimate: the memory advice runs its alternatives' ranks as threads in-process.
  targets=$(printf 'tests/%s ' "${wanted[@]}")" parallel/loomrun tests/loomrun_worker examples/train_cifar10"
else
  wanted=($(meson introspect "$dir" --tests | python3 -c 'import json,sys; print(" ".join(t["name"] for t in json.load(sys.stdin)))'))
  targets=""
fi
# Suite names among the arguments choose those suites (meson test would run them on top of
# every suite passed here); the other arguments go to meson test.
names=" ${wanted[*]} "
chosen=()
rest=()
for a in "$@"; do
  if [[ "$names" == *" $a "* ]]; then chosen+=("$a"); else rest+=("$a"); fi
done
[ ${#chosen[@]} -gt 0 ] && wanted=("${chosen[@]}")
set -- "${rest[@]}"
# -k 0: a suite this clang cannot compile is reported by name and skipped; the others still
# run (with clang 16 every suite compiles: see Note [doctest messages name no structured
# binding] in tests/test_main.cpp).
ninja -C "$dir" -k 0 $targets || true
# A suite runs where its program was built: its doctest executable (which two suites may
# share, e.g. test_cpu_bf16 and test_cpu_bf16_staging), or bash for a script's test.
built=$(meson introspect "$dir" --tests | python3 -c '
import json, os, sys
for t in json.load(sys.stdin):
    if os.access(t["cmd"][0], os.X_OK): print(t["name"])')
suites=()
skipped=()
for t in "${wanted[@]}"; do
  if grep -qxF "$t" <<<"$built"; then suites+=("$t"); else skipped+=("$t"); fi
done
[ ${#skipped[@]} -gt 0 ] && echo "loom: not built with this compiler, skipped: ${skipped[*]}" >&2
set +e
meson test -C "$dir" --no-rebuild --print-errorlogs --num-processes 1 --timeout-multiplier 10 "${suites[@]}" "$@"
status=$?
set -e
[ ${#skipped[@]} -gt 0 ] && echo "loom: not built with this compiler, skipped: ${skipped[*]}" >&2
exit $status
