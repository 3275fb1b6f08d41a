#!/usr/bin/env bash
# DDP benchmark: cpprun's C++ DistributedDataParallel against PyTorch's Python DDP (Debian's
# python3-torch, same LibTorch 1.13, Gloo), side by side on this machine. 2 ranks, 1 thread per
# rank, 64 samples per rank, MLP 1024-[H x 4]-10 at H=1024 (4.2M parameters) and H=2720 (25M).
# Both sides are started by cpprun (Debian's torchrun crashes at its defaults on Python 3.11).
# Prints samples/s, C++/Python ratios, and communication overhead = DDP step time / step time
# of the same per-rank work without communication.
#   usage: scripts/bench_ddp.sh [steps_scale]   (default 1: 20 and 10 timed steps)
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh --bench >/dev/null
bash scripts/build.sh >/dev/null
build=${CPPRUN_BUILD_DIR:-build}
scale=${1:-1}
blas=$(update-alternatives --query libblas.so.3-x86_64-linux-gnu 2>/dev/null | sed -n 's/^Value: //p')
echo "BLAS: ${blas:-unknown}; cores: $(nproc); LibTorch (C++) and torch (Python): 1.13"

# Runs one configuration; prints its ms/step.
run() {  # impl mode hidden steps
  local impl=$1 mode=$2 hidden=$3 steps=$4 prog
  if [ "$impl" = cpp ]; then prog=("$build/bench/dp_bench"); else prog=(/usr/bin/python3 bench/dp_bench.py); fi
  tests/run_isolated.sh "$build/launcher/cpprun" --standalone --nproc_per_node=2 "${prog[@]}" \
      --mode "$mode" --hidden "$hidden" --steps "$steps" --warmup 3 2>/dev/null |
    sed -n 's/.*ms_per_step=\([0-9.]*\).*/\1/p'
}

printf '\n%-7s %-8s %12s %12s %12s %12s %9s %14s %14s\n' model params "C++ ms/step" "Py ms/step" \
  "C++ samp/s" "Py samp/s" "C++/Py" "C++ overhead" "Py overhead"
for config in "1024 4.2M $((20 * scale))" "2720 25M $((10 * scale))"; do
  read -r hidden params steps <<<"$config"
  cpp_ddp=$(run cpp ddp "$hidden" "$steps"); py_ddp=$(run py ddp "$hidden" "$steps")
  cpp_local=$(run cpp local "$hidden" "$steps"); py_local=$(run py local "$hidden" "$steps")
  awk -v h="$hidden" -v p="$params" -v cd="$cpp_ddp" -v pd="$py_ddp" -v cl="$cpp_local" -v pl="$py_local" 'BEGIN {
    printf "%-7s %-8s %12.1f %12.1f %12.0f %12.0f %8.2fx %13.0f%% %13.0f%%\n", "H=" h, p, cd, pd,
      128000 / cd, 128000 / pd, pd / cd, 100 * (cd / cl - 1), 100 * (pd / pl - 1) }'
done
