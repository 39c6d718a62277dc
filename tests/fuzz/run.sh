#!/usr/bin/env bash
# Builds the libFuzzer harnesses under ASan + UBSan (clang; the build directory of
# ./test.sh --sanitize address,undefined) and runs each for SECONDS (default 60).
#
#   tests/fuzz/run.sh [SECONDS] [HARNESS...]     e.g. tests/fuzz/run.sh 30 fuzz_json
#
# Each harness starts from its seed corpus (tests/fuzz/corpus/<harness>/), grows a working
# corpus in build-sanitize-address-undefined/fuzz/<harness>/corpus, and writes any crash,
# hang (-timeout) or oversized allocation (-rss_limit_mb, -malloc_limit_mb) there as an
# artifact to reproduce with `<harness> <artifact>`. A finding becomes a fix plus a
# regression test in the suite (see docs/testing.md for the ones found so far).
set -euo pipefail
cd "$(dirname "$0")/../.."
seconds=${1:-60}
shift || true
all=(fuzz_json fuzz_safetensors fuzz_cifar10 fuzz_store_protocol fuzz_loomrun_options)
harnesses=("$@")
[ ${#harnesses[@]} -eq 0 ] && harnesses=("${all[@]}")

dir=build-sanitize-address-undefined
scripts/setup_sanitize.sh address,undefined  # clang, installed where missing; -Dfuzz=true
meson compile -C "$dir" $(printf 'tests/fuzz/%s ' "${harnesses[@]}")

supp=$PWD/tests/sanitizers
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:detect_odr_violation=0}
export LSAN_OPTIONS=${LSAN_OPTIONS:-suppressions=$supp/lsan.supp:print_suppressions=0}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-halt_on_error=1:print_stacktrace=1:suppressions=$supp/ubsan.supp}
export OMP_NUM_THREADS=1
status=0
printf '%-22s %10s %8s %10s  %s\n' harness executions seconds corpus result
for h in "${harnesses[@]}"; do
  work=$dir/fuzz/$h
  mkdir -p "$work/corpus" "$work/artifacts"
  log=$work/log.txt
  set +e
  "$dir/tests/fuzz/$h" "$work/corpus" "tests/fuzz/corpus/$h" -max_total_time="$seconds" -timeout=10 \
    -rss_limit_mb=4096 -malloc_limit_mb=2048 -max_len=65536 -print_final_stats=1 \
    -artifact_prefix="$work/artifacts/" >"$log" 2>&1
  rc=$?
  set -e
  execs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$log" | grep -o '[0-9]*$' || echo "?")
  corpus=$(find "$work/corpus" -type f | wc -l)
  result=ok
  if [ $rc -ne 0 ]; then
    result="FINDING (exit $rc): $(ls -t "$work/artifacts" | head -n 1); see $log"
    status=1
  fi
  printf '%-22s %10s %8s %10s  %s\n' "$h" "$execs" "$seconds" "$corpus" "$result"
done
exit $status
