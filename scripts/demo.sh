#!/usr/bin/env bash
# The README's main job: set-up, build, then a real two-rank training run under cpprun:
# examples/train_mnist (real MNIST with --data DIR, else a generated stand-in of the same shape).
# Builds only what it runs (the cpprun launcher and train_mnist, with the library they link);
# scripts/test.sh builds everything else. Says how long each stage took.
set -euo pipefail
cd "$(dirname "$0")/.."
build=${CPPRUN_BUILD_DIR:-build}
start=$(date +%s)
stage_start=$start
stage_done() {  # "demo: set-up took 81 s (81 s so far)"
  local now; now=$(date +%s)
  echo "demo: $1 took $(( now - stage_start )) s ($(( now - start )) s so far)"
  stage_start=$now
}
echo "demo: [1/3] set-up (Debian packages, PyTorch's LibTorch)"
bash scripts/setup.sh
stage_done "set-up"
echo "demo: [2/3] build (the launcher, its store keeper and train_mnist only: about 5 minutes from scratch on 2 idle cores)"
CPPRUN_BUILD_TARGETS="cpprun cpprun-store-keeper train_mnist" bash scripts/build.sh
stage_done "build"
echo "demo: [3/3] $build/launcher/cpprun --standalone --nproc_per_node=2 $build/examples/train_mnist --out mnist_run $*"
status=0
"$build/launcher/cpprun" --standalone --nproc_per_node=2 "$build/examples/train_mnist" --out mnist_run "$@" || status=$?
stage_done "training"
exit "$status"
