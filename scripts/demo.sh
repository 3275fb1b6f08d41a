#!/usr/bin/env bash
# The README's main job: set-up, build, then a real two-rank training run under cpprun:
# examples/train_mnist (real MNIST with --data DIR, else a generated stand-in of the same shape).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
bash scripts/build.sh >/dev/null
build=${CPPRUN_BUILD_DIR:-build}
echo "demo: $build/launcher/cpprun --standalone --nproc_per_node=2 $build/examples/train_mnist --out mnist_run $*"
exec "$build/launcher/cpprun" --standalone --nproc_per_node=2 "$build/examples/train_mnist" --out mnist_run "$@"
