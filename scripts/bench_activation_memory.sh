#!/usr/bin/env bash
# Activation checkpointing's memory: peak resident memory growth of one forward + backward through
# N residual MLP blocks (width 256, hidden 1024, batch 4096, GELU + dropout), N = 2, 4, 8, 16, with
# and without checkpointing each block; cpprun::checkpoint (bench/activation_memory.cpp) beside
# torch.utils.checkpoint (bench/activation_memory.py, the same blocks) in one run. Without
# checkpointing the growth is about N blocks' activations; with it, N block inputs plus one
# block's activations (recomputed in backward). One process, one thread: nothing distributed.
#   usage: scripts/bench_activation_memory.sh
set -euo pipefail
BENCH_NPROC=1
source "$(dirname "$0")/bench_common.sh"
# Large blocks straight from and back to the kernel (glibc otherwise raises its mmap threshold
# after the first frees and keeps freed memory), so that resident memory follows live tensors.
export MALLOC_MMAP_THRESHOLD_=65536

field() { sed -n "s/.* $1=\([0-9.]*\).*/\1/p"; }
printf '\n%6s %12s | %10s %10s %8s | %10s %10s %8s\n' blocks "1 block MB" "cpp MB" "cpp ckpt" "ckpt/1b" \
  "torch MB" "torch ckpt" "c/torch"
for n in 2 4 8 16; do
  plain=$("$build/bench/activation_memory" --blocks "$n" --checkpoint 0 | grep RESULT)
  ckpt=$("$build/bench/activation_memory" --blocks "$n" --checkpoint 1 | grep RESULT)
  py_plain=$("$python" bench/activation_memory.py --blocks "$n" --checkpoint 0 | grep RESULT)
  py_ckpt=$("$python" bench/activation_memory.py --blocks "$n" --checkpoint 1 | grep RESULT)
  awk -v n="$n" -v one="$(field one_block_mb <<<"$plain")" -v p="$(field peak_growth_mb <<<"$plain")" \
      -v c="$(field peak_growth_mb <<<"$ckpt")" -v pp="$(field peak_growth_mb <<<"$py_plain")" \
      -v pc="$(field peak_growth_mb <<<"$py_ckpt")" 'BEGIN {
    printf "%6d %12.1f | %10.1f %10.1f %8.2f | %10.1f %10.1f %8.2f\n", n, one, p, c, c / one, pp, pc, (pc > 0 ? c / pc : 0) }'
done
echo "(MB: peak resident memory growth during one forward + backward; 1 block MB: one block's saved"
echo " activations by formula; ckpt/1b: the checkpointed growth in those units. Without checkpointing"
echo " the growth adds about one block's activations per block; with it, one block input (batch x"
echo " width x 4 B = 4.2 MB) per block over a constant of about one block's activations and gradients."
echo " c/torch: cpprun::checkpoint's growth over torch.utils.checkpoint's)"
