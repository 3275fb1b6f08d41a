#!/usr/bin/env bash
# Frozen parameters, cpprun against PyTorch side by side, for a LoRA-style fine-tune: the MLP
# 1024-[1024 x 4]-10 with every weight but the head's frozen (4.19M of its 4.21M parameters;
# bench/bench_mlp.h's freeze_all_weights_but_the_head, the same tensors frozen on PyTorch's side).
#  1. memory: the steady-state bytes per rank under ZeRO-3 against FSDP2 (parameters' local shards +
#     gradients + AdamW state, after three steps; bench/fsdp_memory --frozen 1 and fsdp_memory.py),
#     at 2 and 4 ranks. Both shard the frozen weights and keep no gradient for them; before
#     2026-12-07 cpprun kept them whole on every rank.
#  2. step time: bench/dp_bench --frozen 1 (SGD with momentum, 64 samples per rank, one unit per
#     Linear) under cpprun's DDP, ZeRO-2 and ZeRO-3 against PyTorch's DDP, FSDP2 without and with
#     reshard_after_forward, at 2 ranks, the runs alternating, each figure the median of REPEATS.
# 2 cores: the 4-rank memory runs share them, which changes no byte; the 2-rank step times fill
# both cores with compute, so communication's CPU time cannot hide behind it (with spare cores
# Gloo's threads would run beside the compute, on both sides alike).
#   usage: scripts/bench_frozen.sh [repeats]   (default 3)
set -euo pipefail
source "$(dirname "$0")/bench_common.sh"
repeats=${1:-3}
[ "$repeats" -ge 1 ] 2>/dev/null || { echo "bench_frozen: repeats must be a number, 1 or more (got '$repeats')" >&2; exit 1; }

echo "Memory: bytes on rank 0 after the third step, ZeRO-3 against FSDP2"
printf '%-7s %2s %12s %12s %12s %12s\n' impl N "params B" "grads B" "optim B" "total/FSDP2"
for n in 2 4; do
  run=(tests/run_isolated.sh "$build/launcher/cpprun" --standalone --nproc_per_node="$n")
  cpp=$("${run[@]}" "$build/bench/fsdp_memory" --mode zero3 --frozen 1 2>/dev/null | grep RESULT) ||
    { echo "bench: cpprun's side failed at $n ranks" >&2; exit 1; }
  py=$("${run[@]}" "$python" bench/fsdp_memory.py --frozen 1 2>/dev/null | grep RESULT) ||
    { echo "bench: FSDP2's side failed at $n ranks" >&2; exit 1; }
  field() { sed -n "s/.* $2=\([0-9]*\).*/\1/p" <<<"$1"; }
  awk -v n="$n" -v cp="$(field "$cpp" params)" -v cg="$(field "$cpp" grads)" -v co="$(field "$cpp" optim)" \
      -v pp="$(field "$py" params)" -v pg="$(field "$py" grads)" -v po="$(field "$py" optim)" 'BEGIN {
    printf "%-7s %2d %12d %12d %12d %12.3f\n", "cpprun", n, cp, cg, co, (cp + cg + co) / (pp + pg + po)
    printf "%-7s %2d %12d %12d %12d %12.3f\n", "FSDP2", n, pp, pg, po, 1 }'
done
echo "(parameters' local shards (FSDP2: DTensor.to_local(); cpprun: FsdpCore::memory()), gradients,"
echo " AdamW's exp_avg and exp_avg_sq)"

# C++ and PyTorch modes side by side: the runs alternate in this order.
modes=("cpp ddp" "py ddp" "cpp zero2" "py fsdp2_noreshard" "cpp zero3" "py fsdp2")
declare -A ms_runs=()
BENCH_NPROC=2
for ((r = 1; r <= repeats; ++r)); do
  echo "bench_frozen: step times, run $r of $repeats" >&2
  for m in "${modes[@]}"; do
    read -r impl mode <<<"$m"
    out=$(run_dp "$impl" "$mode" 1024 20 --frozen 1)  # an assignment: a failed run stops the script
    ms_runs[$m]+=" $out"
  done
done
echo
echo "Step time: 2 ranks, 64 samples per rank, 20 timed steps, ms/step (the median of $repeats runs)"
printf '%-22s %10s   %-22s %10s %14s\n' cpprun ms PyTorch ms "cpprun/PyTorch"
for pair in "ddp ddp" "zero2 fsdp2_noreshard" "zero3 fsdp2"; do
  read -r cpp_mode py_mode <<<"$pair"
  cpp_ms=$(median <<<"${ms_runs["cpp $cpp_mode"]}")
  py_ms=$(median <<<"${ms_runs["py $py_mode"]}")
  awk -v a="$cpp_mode" -v b="$py_mode" -v x="$cpp_ms" -v y="$py_ms" \
    'BEGIN { printf "%-22s %10.2f   %-22s %10.2f %13.2fx\n", a, x, b, y, y / x }'
done
echo "(cpprun/PyTorch: PyTorch's ms over cpprun's, the speed ratio; above 1: cpprun faster."
echo " ZeRO-2 against FSDP2 with reshard_after_forward=False, ZeRO-3 against FSDP2)"
