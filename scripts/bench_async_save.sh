#!/usr/bin/env bash
# What a checkpoint costs training, synchronous (save_state_dict) against asynchronous
# (save_async), for the 25M-parameter MLP 1024-[2720 x 4]-10 (100 MB of fp32) under DDP on 2 ranks,
# one thread each (bench/async_save_bench.cpp): a single .safetensors file that rank 0 writes, and a
# Hugging Face sharded directory that each rank writes half of. Prints each save's blocking time
# (how long the training thread waits in the call), the step time with no save in flight and
# while an asynchronous save is written, and the ratios. Medians of SAVES saves each. Then the same
# with the optimizer's state (SGD momentum, another 100 MB) in each save: save_state_dict +
# save_optimizer_state_dict against one save_async(model, optimizer, ...) ("+ optimizer" rows).
#   usage: scripts/bench_async_save.sh [SAVES] [DIR]    (DIR: where the files go; default /tmp;
#          CPPRUN_LAUNCHER: another built cpprun than build/launcher/cpprun)
set -euo pipefail
cd "$(dirname "$0")/.."
build=${CPPRUN_BUILD_DIR:-build}
saves=${1:-3} dir=${2:-/tmp} n=2
prog=$build/bench/async_save_bench launcher=${CPPRUN_LAUNCHER:-$build/launcher/cpprun}
[ -x "$prog" ] || { echo "bench: build $prog first (cmake --build $build --target async_save_bench cpprun)" >&2; exit 1; }
echo "cores: $(nproc); $n ranks, 1 thread each; DDP, MLP 1024-[2720 x 4]-10 (25M parameters); files in $dir ($(df -T "$dir" | awk 'NR == 2 { print $2 }'))"
printf '%-10s %8s %9s %10s %8s %10s %11s %6s %10s %11s %10s\n' target "sync ms" "async ms" "async/sync" "step ms" \
  "during ms" "during/step" steps "lost sync" "lost async" "async/sync"
file="$dir/cpprun_async_bench_$$.safetensors" hf="$dir/cpprun_async_bench_$$_hf/"
for run in "file|$file|" "directory|$hf|" "file+opt|$file|$dir/cpprun_async_bench_$$_opt.safetensors" "dir+opt|$hf|$hf"; do
  IFS='|' read -r kind target optimizer <<<"$run"
  line=$(tests/run_isolated.sh "$launcher" --standalone --nproc_per_node=$n \
           "$prog" --hidden 2720 --saves "$saves" --path "$target" ${optimizer:+--optimizer "$optimizer"} 2>/dev/null |
         grep RESULT) || { echo "bench: $prog --path $target ${optimizer:+--optimizer $optimizer} printed no RESULT line" >&2; exit 1; }
  field() { sed -n "s/.* $1=\([0-9.]*\).*/\1/p" <<<"$line"; }
  awk -v kind="$kind" -v s="$(field sync_block_ms)" -v a="$(field async_block_ms)" -v p="$(field step_ms)" \
      -v d="$(field during_step_ms)" -v k="$(field steps_during_save)" -v c="$(field sync_cpu_ms)" 'BEGIN {
    lost = a + k * (d - p)
    printf "%-10s %8.1f %9.1f %10.3f %8.1f %10.1f %11.2f %6d %10.1f %11.1f %10.2f\n", kind, s, a, a / s, p, d, d / p, k, s, lost, lost / s
    printf "           (the synchronous save took %.0f ms of the calling thread'"'"'s CPU)\n", c }'
done
echo "(file / directory: the model's state alone; +opt: with the optimizer's (its momentum, as many bytes again) in the"
echo " same save, beside the model's file or in its directory;"
echo " sync/async ms: how long the call blocks training; step ms: a step with no save in flight; during ms:"
echo " a step while the asynchronous save is written, over 'steps' steps; lost: the training time a save costs,"
echo " sync: its blocking time, async: its blocking time + steps x (during - step). On $(nproc) cores the $n ranks' training already"
echo " keeps every core busy, so the background write (serialising, the CRC, the kernel's copy into the page"
echo " cache) takes its CPU time from training: steps during the save are slower, and the save cannot be free."
echo " The floor is a step plus the write's CPU time spread over the steps it spans; on a machine with spare"
echo " cores the write would run beside training and the steps would keep their time.)"
