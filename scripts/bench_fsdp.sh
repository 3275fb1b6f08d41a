#!/usr/bin/env bash
# FSDP benchmark: cpprun's DDP, ZeRO-1, ZeRO-2 and ZeRO-3 against PyTorch 2.15's (the project's
# .venv; the same LibTorch the C++ side links) DDP, DDP + ZeroRedundancyOptimizer (its ZeRO-1),
# FSDP2 fully_shard with reshard_after_forward=True (ZeRO-3) and =False (ZeRO-2-like), on a CPU
# device mesh over Gloo. 2 and 4 ranks, 1 thread each, 64 samples per rank, MLP 1024-[H x 4]-10
# at H=1024 (4.2M parameters) and H=2720 (25M), SGD with momentum, one unit per Linear on both
# sides. Prints two tables: samples/s over all the ranks, and rank 0's peak resident memory
# (how far it rose above its size just before the model was built), each with the ratios of the
# matching C++ and PyTorch stages. Each figure is the median of REPEATS runs (default 3), the C++
# and Python runs alternating, so that a slow minute on a shared machine does not land on one
# side only.
#   usage: scripts/bench_fsdp.sh [steps_scale] [repeats]   (defaults 1 and 3: 20 and 10 timed steps)
set -euo pipefail
source "$(dirname "$0")/bench_common.sh"
scale=${1:-1}
repeats=${2:-3}
[ "$repeats" -ge 1 ] 2>/dev/null || { echo "bench_fsdp: repeats must be a number, 1 or more (got '$repeats')" >&2; exit 1; }
configs=("1024 4.2M $((20 * scale))" "2720 25M $((10 * scale))")
# C++ and PyTorch modes side by side, stage by stage: the runs alternate in this order.
modes=("cpp ddp" "py ddp" "cpp zero1" "py zero1" "cpp zero2" "py fsdp2_noreshard" "cpp zero3" "py fsdp2")
declare -A ms mem  # [ranks hidden impl mode]: median ms/step, median peak_rss_mb

for nproc in 2 4; do
  BENCH_NPROC=$nproc
  for config in "${configs[@]}"; do
    read -r hidden params steps <<<"$config"
    declare -A ms_runs=() mem_runs=()
    for ((r = 1; r <= repeats; ++r)); do
      echo "bench_fsdp: $nproc ranks, H=$hidden, run $r of $repeats" >&2
      for m in "${modes[@]}"; do
        read -r impl mode <<<"$m"
        out=$(run_dp_ms_mem "$impl" "$mode" "$hidden" "$steps")  # an assignment: a failed run stops the script
        read -r w k <<<"$out"
        ms_runs[$m]+=" $w"
        mem_runs[$m]+=" $k"
      done
    done
    for m in "${modes[@]}"; do
      ms["$nproc $hidden $m"]=$(median <<<"${ms_runs[$m]}")
      mem["$nproc $hidden $m"]=$(median <<<"${mem_runs[$m]}")
    done
    unset ms_runs mem_runs
  done
done

# table TITLE LEGEND KIND: one row per ranks x model, C++ | PyTorch | ratios C++/PyTorch; KIND
# samples: samples/s over all the ranks (from the median ms/step); mem: the median peak_rss_mb.
table() {
  local title=$1 legend=$2 kind=$3 nproc config hidden params steps m values
  printf '\n%s\n%-5s %-7s %-5s %7s %7s %7s %7s | %7s %7s %7s %7s | %7s %7s' "$title" ranks model params \
    DDP ZeRO-1 ZeRO-2 ZeRO-3 DDP ZeRO-1 FSDP2nr FSDP2 Z3/F2 Z2/F2nr
  if [ "$kind" = samples ]; then printf ' %7s\n' Z1/Z1; else printf '\n'; fi
  for nproc in 2 4; do
    for config in "${configs[@]}"; do
      read -r hidden params steps <<<"$config"
      values=()
      for m in "cpp ddp" "cpp zero1" "cpp zero2" "cpp zero3" "py ddp" "py zero1" "py fsdp2_noreshard" "py fsdp2"; do
        if [ "$kind" = samples ]; then values+=("${ms["$nproc $hidden $m"]}"); else values+=("${mem["$nproc $hidden $m"]}"); fi
      done
      awk -v kind="$kind" -v n="$nproc" -v h="$hidden" -v p="$params" -v v="${values[*]}" '
        function ratio(a, b) { return b > 0 ? sprintf("%.2fx", a / b) : "n/a" }
        BEGIN {
          split(v, x, " ")  # C++ DDP, ZeRO-1, ZeRO-2, ZeRO-3, then PyTorch DDP, ZeRO-1, FSDP2 no reshard, FSDP2
          for (i = 1; i <= 8; ++i) y[i] = kind == "samples" ? 64000 * n / x[i] : x[i]
          printf "%-5s %-7s %-5s %7.0f %7.0f %7.0f %7.0f | %7.0f %7.0f %7.0f %7.0f | %7s %7s", n, "H=" h, p,
            y[1], y[2], y[3], y[4], y[5], y[6], y[7], y[8], ratio(y[4], y[8]), ratio(y[3], y[7])
          if (kind == "samples") printf " %7s", ratio(y[2], y[6])
          printf "\n" }'
    done
  done
  echo "$legend"
}

table "Throughput: samples/s over all the ranks (cpprun | PyTorch | cpprun/PyTorch)" \
  "(ZeRO-k: cpprun FSDP stage k; FSDP2nr: reshard_after_forward=False; Z3/F2 = ZeRO-3/FSDP2, Z2/F2nr = ZeRO-2/FSDP2nr, Z1/Z1 = ZeRO-1/ZeroRedundancyOptimizer; above 1: cpprun faster)" samples
table "Peak memory: MiB, rank 0's peak RSS above its size before the model was built (cpprun | PyTorch | cpprun/PyTorch)" \
  "(same columns; below 1: cpprun smaller; both sides also count the first use of the same LibTorch: kernels paged in, allocator caches)" mem
