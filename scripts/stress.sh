#!/usr/bin/env bash
# The suites that start processes (meson suite 'launch'), each run N times with a busy loop
# on every core beside them, so that results which depend on timing show up where they are
# made instead of once in a while in CI. ./test.sh --stress N runs this.
#
#   scripts/stress.sh 5                       every launch suite 5 times, under load
#   scripts/stress.sh 3 test_pipeline_launch  one suite (further arguments go to meson test)
#
# The load: one `while :; do :; done` per core (nproc), started here, each bounded by
# `timeout` (LOOM_STRESS_MAX_SECONDS, default 3600) and stopped when this script exits,
# however it exits. Which tests depend on timing, and why they may: docs/testing.md.
set -euo pipefail
cd "$(dirname "$0")/.."
repeats=${1:-}
if ! [[ "$repeats" =~ ^[1-9][0-9]*$ ]]; then
  echo "usage: ./test.sh --stress N [meson test arguments]   (N: how many times each launch suite runs, >= 1; got '${repeats}')" >&2
  exit 2
fi
shift
scripts/setup_deps.sh
scripts/build.sh

max_seconds=${LOOM_STRESS_MAX_SECONDS:-3600}
busy=()
stop_load() {
  [ ${#busy[@]} -gt 0 ] && kill "${busy[@]}" 2>/dev/null || true
  wait 2>/dev/null || true
}
trap stop_load EXIT
cores=$(nproc)
for _ in $(seq "$cores"); do
  timeout "$max_seconds" bash -c 'while :; do :; done' &
  busy+=($!)
done
echo "loom: stress: the 'launch' suites $repeats times each, beside $cores busy loops (one per core)"

log=build/meson-logs/stress.txt
set +e
if [ $# -gt 0 ]; then
  meson test -C build --print-errorlogs --num-processes 1 --repeat "$repeats" "$@" | tee "$log"
else
  meson test -C build --print-errorlogs --num-processes 1 --repeat "$repeats" --suite launch | tee "$log"
fi
status=${PIPESTATUS[0]}
set -e
# Per suite: runs and passes, from meson's one line per run ("  3/10 loom:launch /
# test_ddp_launch   OK   1.89s": the name and status follow the "/").
echo "loom: stress results (runs passed / runs) per suite:"
awk '/^ *[0-9]+\/[0-9]+ / {
       name = $2; status = $3
       for (i = 3; i < NF; i++) if ($i == "/") { name = $(i + 1); status = $(i + 2) }
       runs[name]++; if (status == "OK") ok[name]++
     }
     END { for (n in runs) printf "  %-28s %d / %d\n", n, ok[n] + 0, runs[n] }' "$log" | sort
exit "$status"
