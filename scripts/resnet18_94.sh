#!/usr/bin/env bash
# ResNet18 on CIFAR-10 to >= 94% test accuracy (six-view test-time augmentation) in 15 epochs:
# the recipe's run under DDP on 2 processes, started -- or resumed, when its folder already
# holds a checkpoint -- in the background, with its command, log and checkpoints in RUN_DIR
# (keep it outside the repository). docs/resnet18.md describes the recipe and its results.
#
#   scripts/resnet18_94.sh RUN_DIR [train_cifar10 flags...]   e.g. --data /path/to/cifar-10-batches-bin
#
# RUN_DIR gets COMMAND (the exact command, resumable by adding --resume), log.txt, ckpt/
# (a checkpoint every epoch and every 100 steps), COMMIT (the source of each start and resume),
# load.txt (the machine's load average each minute while it runs), final.safetensors (the
# weights) and, after the last epoch, tta.txt (the six-view evaluation of those weights).
# bench/resnet18_curve.py turns the folder into bench/results/resnet18_curve.json and its picture.
set -euo pipefail
cd "$(dirname "$0")/.."

# The recipe is recipes/resnet18_94.toml (docs/resnet18.md): its keys are train_cifar10's flags.
[ $# -ge 1 ] || { sed -n '2,13p' "$0"; exit 2; }
run_dir=$(realpath -m "$1"); shift
mkdir -p "$run_dir/ckpt"

command="build/parallel/loomrun --standalone --nproc_per_node 2 build/examples/train_cifar10 --mode ddp --threads 1
  --recipe resnet18_94 --checkpoint-dir $run_dir/ckpt --checkpoint-every 100 --checkpoint-format full --quiet
  --save $run_dir/final.safetensors $*"
command=$(echo $command)
resume=""
if [ -f "$run_dir/ckpt/checkpoint.safetensors" ]; then
  resume=" --resume"
  echo "$(date -u +%FT%TZ) resuming: $command$resume" >> "$run_dir/log.txt"
else
  echo "$command" > "$run_dir/COMMAND"
  echo "$(date -u +%FT%TZ) starting: $command" >> "$run_dir/log.txt"
fi
{
  rc=0
  $command$resume || rc=$?
  echo "$(date -u +%FT%TZ) exit $rc"
  if [ $rc = 0 ] && [ -f "$run_dir/final.safetensors" ]; then
    data_flags=$(echo "$*" | grep -o -- '--data [^ ]*' || true)
    build/examples/train_cifar10 --eval-only --init "$run_dir/final.safetensors" --tta mirror_translate \
      --threads 2 $data_flags > "$run_dir/tta.txt" 2>&1
    sha256sum "$run_dir/final.safetensors" >> "$run_dir/tta.txt"
  fi
} >> "$run_dir/log.txt" 2>&1 < /dev/null &
run_pid=$!
disown
echo "$(date -u +%FT%TZ) $(git rev-parse --short HEAD)$(git diff --quiet HEAD || echo ' with uncommitted changes')" \
  >> "$run_dir/COMMIT"
# The load the run shares the machine with, sampled while it lives.
(while kill -0 $run_pid 2>/dev/null; do
   echo "$(date -u +%FT%TZ) $(cut -d' ' -f1-3 /proc/loadavg)" >> "$run_dir/load.txt"; sleep 60
 done) > /dev/null 2>&1 < /dev/null &
disown
echo "ResNet18 run in $run_dir (log: $run_dir/log.txt)"
