#!/usr/bin/env bash
# The README's main job: set-up, build, then a real two-rank training run under cpprun:
# examples/train_mnist (real MNIST with --data DIR, else a generated stand-in of the same shape).
set -euo pipefail
cd "$(dirname "$0")/.."
echo "demo: [1/3] set-up (Debian packages, PyTorch's LibTorch)"
bash scripts/setup.sh
echo "demo: [2/3] build"
bash scripts/build.sh
build=${CPPRUN_BUILD_DIR:-build}
echo "demo: [3/3] $build/launcher/cpprun --standalone --nproc_per_node=2 $build/examples/train_mnist --out mnist_run $*"
exec "$build/launcher/cpprun" --standalone --nproc_per_node=2 "$build/examples/train_mnist" --out mnist_run "$@"
