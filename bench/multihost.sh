#!/usr/bin/env bash
# DDP on one host and across two, on one machine: what crosses the "network" and what it
# costs per step. Three runs of the same job (2 ranks, ResNet18 by default), each in
# network namespaces made by scripts/two_hosts.sh, so that every byte counted below is
# the job's own:
#   shm   1 host, 2 processes, collectives through shared memory (loom's default there)
#   lo    1 host, 2 processes, collectives over loopback TCP (LOOM_GLOO_SHM=0)
#   veth  2 hosts, 1 process each, over TCP through a veth pair and a bridge
# For each: the median step time and rank 0's collective bytes per step (--metrics-json),
# and the bytes each rank sent through its host's interface per step (`ip -s link`: the
# payload plus TCP/IP headers, the fingerprints and the store's traffic; lo carries both
# ranks' sends, so its count is halved; shared memory sends nothing).
#
#   bench/multihost.sh                          # resnet18, batch 32 per rank, 20 steps, 3 rounds
#   MODEL=resnet_tiny STEPS=40 ROUNDS=5 bench/multihost.sh
#
# The runs take turns, ROUNDS times (shm, lo, veth, shm, ...), so that a machine whose load
# drifts slows them alike; the table gives the median of the rounds' median step times,
# and their lowest and highest.
#
# Needs root (network namespaces) and a build (build/). Prints a markdown table.
set -euo pipefail
cd "$(dirname "$0")/.."
model=${MODEL:-resnet18}
steps=${STEPS:-20}
batch=${BATCH:-32}
rounds=${ROUNDS:-3}
out=$(mktemp -d /tmp/loom_multihost.XXXXXX)
trap 'rm -rf "$out"' EXIT
train="$PWD/build/examples/train_cifar10 --mode ddp --model $model --synthetic --batch-size $batch \
--max-steps $steps --eval-limit 16 --threads 1 --workers 0 --quiet --conv-benchmark off"
loomrun="$PWD/build/parallel/loomrun"

# Bytes sent through interface $1 of the current namespace.
iface_bytes='ip -s -j link show dev "$1" | python3 -c "import json,sys; print(json.load(sys.stdin)[0][\"stats64\"][\"tx\"][\"bytes\"])"'

# run NAME HOSTS IFACE COMMAND: runs COMMAND on every host, recording the interface's bytes.
run() {
  local name=$1 hosts=$2 iface=$3 command=$4
  scripts/two_hosts.sh --hosts "$hosts" "
    bytes() { $iface_bytes; }
    before=\$(bytes $iface)
    $command --metrics-json $out/$name.\$HOST_RANK.json
    echo \$((\$(bytes $iface) - before)) > $out/$name.\$HOST_RANK.bytes" >/dev/null
}

for round in $(seq "$rounds"); do
  run shm.$round 1 lo "OMP_NUM_THREADS=1 $loomrun --standalone --nproc_per_node 2 $train"
  run lo.$round 1 lo "LOOM_GLOO_SHM=0 OMP_NUM_THREADS=1 $loomrun --standalone --nproc_per_node 2 $train"
  run veth.$round 2 eth0 "OMP_NUM_THREADS=1 $loomrun --nnodes 2 --node_rank \$HOST_RANK --nproc_per_node 1 \
--master_addr host0 --master_port 29500 $train"
done

echo "| run | median step (s), median of $rounds rounds [lowest, highest] | collective bytes / step (rank 0) | sent through the interface / step (per rank) |"
echo "|---|---:|---:|---:|"
for name in shm lo veth; do
  python3 - "$out" "$name" "$steps" "$rounds" <<'EOF'
import json, statistics, sys
out, name, steps, rounds = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
runs = [json.load(open(f"{out}/{name}.{r}.0.json")) for r in range(1, rounds + 1)]
times = sorted(m["median_step_s"] for m in runs)
counted = sum(runs[0]["comm_bytes_per_step"].values())
ranks_sending = 2 if name == "lo" else 1  # lo carries both ranks' sends
wire = statistics.median(int(open(f"{out}/{name}.{r}.0.bytes").read()) for r in range(1, rounds + 1))
wire /= steps * ranks_sending
print(f"| {name} | {statistics.median(times):.3f} [{times[0]:.3f}, {times[-1]:.3f}] | {counted / 1e6:.1f} MB "
      f"| {wire / 1e6:.1f} MB |")
EOF
done
