#!/usr/bin/env bash
# Installs what is missing, builds, and runs loom's main job.
set -euo pipefail
cd "$(dirname "$0")"
scripts/setup_deps.sh
scripts/build.sh
exec build/examples/demo_mlp "$@"
