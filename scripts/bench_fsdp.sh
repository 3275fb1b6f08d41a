#!/usr/bin/env bash
# FSDP benchmark: cpprun's ZeRO-1, ZeRO-2 and ZeRO-3 against cpprun's DDP on the same model and ranks,
# and PyTorch's DDP + ZeroRedundancyOptimizer (its ZeRO-1; Python FSDP in Debian's torch 1.13
# cannot be imported under Python 3.11). 2 ranks, 1 thread each, 64 samples per rank, MLP 1024-[H x 4]-10 at H=1024 (4.2M
# parameters) and H=2720 (25M), SGD with momentum, one unit per Linear. Prints samples/s and ratios.
#   usage: scripts/bench_fsdp.sh [steps_scale]
set -euo pipefail
source "$(dirname "$0")/bench_common.sh"
scale=${1:-1}

printf '\n%-7s %-6s %10s %8s %8s %8s %10s %10s %10s %9s %9s\n' model params "DDP samp/s" "ZeRO-1" "ZeRO-2" \
  "ZeRO-3" "ZeRO-1/DDP" "ZeRO-2/DDP" "ZeRO-3/DDP" "Py DDP" "Py ZeRO-1"
for config in "1024 4.2M $((20 * scale))" "2720 25M $((10 * scale))"; do
  read -r hidden params steps <<<"$config"
  ddp=$(run_dp cpp ddp "$hidden" "$steps"); z1=$(run_dp cpp zero1 "$hidden" "$steps"); z2=$(run_dp cpp zero2 "$hidden" "$steps")
  z3=$(run_dp cpp zero3 "$hidden" "$steps")
  pddp=$(run_dp py ddp "$hidden" "$steps"); pz1=$(run_dp py zero1 "$hidden" "$steps")
  awk -v h="$hidden" -v p="$params" -v d="$ddp" -v a="$z1" -v b="$z2" -v c="$z3" -v pd="$pddp" -v pz="$pz1" 'BEGIN {
    printf "%-7s %-6s %10.0f %8.0f %8.0f %8.0f %9.2fx %9.2fx %9.2fx %9.0f %9.0f\n", "H=" h, p, 128000 / d, 128000 / a,
      128000 / b, 128000 / c, d / a, d / b, d / c, 128000 / pd, 128000 / pz }'
done
echo "(samples/s over both ranks; ZeRO-k/DDP = ratio of samples/s)"
