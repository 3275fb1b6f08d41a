#!/usr/bin/env bash
# Frozen parameters under ZeRO-3, cpprun against PyTorch's FSDP2, side by side: a LoRA-style
# fine-tune's steady-state bytes per rank (parameters' local shards + gradients + AdamW state, after
# three steps) for bench/fsdp_memory's MLP 1024-[1024 x 4]-10 with every weight but the last frozen
# (4.19M of 4.21M parameters), at 2 and 4 ranks, and cpprun's over FSDP2's. Both shard the frozen
# weights and keep no gradient for them; before 2026-12-07 cpprun kept them whole on every rank.
# 2 cores: the 4-rank runs share them, which changes no byte here.
#   usage: scripts/bench_frozen_memory.sh
set -euo pipefail
source "$(dirname "$0")/bench_common.sh"
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
echo "(bytes on rank 0 after the third step: parameters' local shards (FSDP2: DTensor.to_local();"
echo " cpprun: FsdpCore::memory()), gradients, AdamW's exp_avg and exp_avg_sq)"
