#!/usr/bin/env bash
# Installs what is missing, builds, and runs loom's main job.
set -euo pipefail
cd "$(dirname "$0")"
scripts/setup_deps.sh
scripts/build.sh
# The main job: ResNet18 on CIFAR-10 for 3 epochs, with the settings of
# examples/reference/train_ddp.py (recipes/resnet18_run_sh.toml). Flags pass through and
# override the recipe's keys, e.g. ./run.sh --epochs 1, or ./run.sh --help.
exec build/examples/train_cifar10 --recipe resnet18_run_sh "$@"
