#!/usr/bin/env bash
# DDP benchmark: cpprun's C++ DistributedDataParallel against PyTorch's Python DDP (Debian's
# python3-torch, same LibTorch 1.13, Gloo), side by side on this machine. 2 ranks, 1 thread per
# rank, 64 samples per rank, MLP 1024-[H x 4]-10 at H=1024 (4.2M parameters) and H=2720 (25M).
# Both sides are started by cpprun (Debian's torchrun crashes at its defaults on Python 3.11).
# Prints samples/s, C++/Python ratios, and communication overhead = DDP step time / step time
# of the same per-rank work without communication.
#   usage: scripts/bench_ddp.sh [steps_scale]   (default 1: 20 and 10 timed steps)
set -euo pipefail
source "$(dirname "$0")/bench_common.sh"
scale=${1:-1}

printf '\n%-7s %-8s %12s %12s %12s %12s %9s %14s %14s\n' model params "C++ ms/step" "Py ms/step" \
  "C++ samp/s" "Py samp/s" "C++/Py" "C++ overhead" "Py overhead"
for config in "1024 4.2M $((20 * scale))" "2720 25M $((10 * scale))"; do
  read -r hidden params steps <<<"$config"
  cpp_ddp=$(run_dp cpp ddp "$hidden" "$steps"); py_ddp=$(run_dp py ddp "$hidden" "$steps")
  cpp_local=$(run_dp cpp local "$hidden" "$steps"); py_local=$(run_dp py local "$hidden" "$steps")
  awk -v h="$hidden" -v p="$params" -v cd="$cpp_ddp" -v pd="$py_ddp" -v cl="$cpp_local" -v pl="$py_local" 'BEGIN {
    printf "%-7s %-8s %12.1f %12.1f %12.0f %12.0f %8.2fx %13.0f%% %13.0f%%\n", "H=" h, p, cd, pd,
      128000 / cd, 128000 / pd, pd / cd, 100 * (cd / cl - 1), 100 * (pd / pl - 1) }'
done
