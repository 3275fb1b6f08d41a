#!/usr/bin/env bash
# Builds and checks cpprun on a lent GPU machine (the `device` tool: one H100 or H200, 16 cores,
# PyTorch 2.x in python3, CMake and ninja, no apt and no network). Three uses:
#
#   here, before the call:  bash scripts/gpu_check.sh --pack
#       copies the header-only dependencies that machine lacks (CLI11, Catch2 v2, and Gloo's
#       headers in case its LibTorch ships none) into .gpu_deps/ (ignored by git);
#   there:                  bash scripts/gpu_check.sh [stage...]      (run with carry: [".gpu_deps"])
#       stages, in this order, default all: build test bench smoke gpt shared ncclfr gpt2 compare goals
#       asan.
#       Logs go to $OUT (or /tmp/gpu_check); $OUT/gpu_run.md is the run written up in Markdown
#       (device, driver, PyTorch, each stage's figures under the command that produced them),
#       ready to commit as docs/gpu_run.md, which docs/gpu.md links as the latest run;
#   anywhere (CI):          bash scripts/gpu_check.sh --dry-run [stage...]
#       walks the same stages and prints every command they would run, running none: no GPU,
#       build or PyTorch needed. Every command of a stage goes through `run`, so the dry run walks
#       the real run's command list, not a copy of it.
#
# What each stage shows:
#   build  cpprun compiles against that machine's LibTorch, with scripts/build.sh as everywhere;
#   test   the whole ctest suite on that LibTorch, CPU and Gloo (the GPU hidden from it);
#   bench  scripts/bench_ddp.sh and bench_fsdp.sh on the CPU with 16 cores, so the ranks' Gloo
#          threads have cores to spare, against that machine's PyTorch;
#   smoke  DDP and FSDP training steps on the GPU with one rank, fused_cross_entropy's CUDA
#          kernels against F::cross_entropy (and timed at GPT-2's loss), then ctest's gpu label
#          (which holds the multi-rank parity tests on the shared GPU, gpu.shared_parity.*);
#   gpt    examples/train_gpt on the GPU: DDP and ZeRO-1/2/3, bf16 and fp16 (GradScaler),
#          activation checkpointing. One GPU holds one NCCL rank (NCCL refuses two ranks on one
#          device), so these run NCCL's code paths with a world of 1; no bytes cross a link.
#   shared 2 and 4 ranks sharing the one GPU over Gloo (dp_bench --device cuda:0): DDP and
#          ZeRO-1/2/3 with CUDA tensors and more than one rank, which NCCL cannot give one GPU.
#   ncclfr PyTorch's own NCCL flight recorder under cpprun: a one-rank job whose all-reduce times
#          out; its dump must land in the attempt's nccl_flight_recorder/ and the diagnosis name it.
#   gpt2   train_gpt at GPT-2 124M's shape (12 layers, 768 wide, 12 heads, block 1024; the
#          vocabulary is the text's characters), bf16, one rank: DDP against ZeRO-3.
#   compare scripts/bench_gpt.sh --gpt2: train_gpt (no wrapper, DDP, ZeRO-3) against its PyTorch
#          twin bench/gpt_twin.py (no wrapper, DDP, FSDP2) at GPT-2 124M's shape (vocab 50304),
#          bf16, one rank, SDPA and fused AdamW on both sides: tokens/s, MFU, peak GPU memory, the
#          losses (which must agree); then train_gpt without SDPA and/or the fused AdamW, and
#          scripts/bench_adamw.sh (the optimizers' step times alone).
#   goals  issue 40's goals: bench_gpt.sh --gpt2 at batch 16 and 32, cpprun eager and in a CUDA
#          graph against PyTorch eager, DDP and ZeRO-3 against no wrapper, the fused loss against
#          ATen's (batch 16); then the no-wrapper rows and ZeRO-3 traced (idle time; the kernels
#          ZeRO-3 adds at one rank).
#   asan   the three test cases that ended in SIGSEGV on LibTorch 2.11 (docs/gpu.md), built with
#          AddressSanitizer in build-asan/ and run alone, the GPU hidden as in `test`; the first
#          ASan report, if any, goes to the summary and gpu_run.md.
# GPU_CHECK_TARGETS="cpprun dp_bench train_gpt" builds only those (CPPRUN_BUILD_TARGETS).
set -euo pipefail
cd "$(dirname "$0")/.."
deps=.gpu_deps
source scripts/gpt2_shape.sh  # gpt2_layers, gpt2_block: GPT-2 124M's shape, as bench_gpt.sh --gpt2's

if [ "${1:-}" = "--pack" ]; then
  # Gloo apart: on the include path only when that LibTorch has no Gloo headers of its own.
  rm -rf "$deps" && mkdir -p "$deps/include" "$deps/gloo/include"
  for header_dir in CLI catch2 gloo; do
    [ -d "/usr/include/$header_dir" ] || { echo "gpu_check: /usr/include/$header_dir missing: run scripts/setup.sh" >&2; exit 1; }
  done
  cp -r /usr/include/CLI /usr/include/catch2 "$deps/include/"
  cp -r /usr/include/gloo "$deps/gloo/include/"
  echo "gpu_check: packed $(du -sh "$deps" | cut -f1) into $deps; pass carry [\"$deps\"] to the device run"
  exit 0
fi

dry_run=0
if [ "${1:-}" = "--dry-run" ]; then dry_run=1; shift; fi
all_stages=(build test bench smoke gpt shared ncclfr gpt2 compare goals asan)
stages=("$@")
[ ${#stages[@]} -gt 0 ] || stages=("${all_stages[@]}")
for s in "${stages[@]}"; do
  [[ " ${all_stages[*]} " == *" $s "* ]] || { echo "gpu_check: no stage '$s'; the stages are: ${all_stages[*]}" >&2; exit 2; }
done
out=${OUT:-/tmp/gpu_check}
mkdir -p "$out"
: >"$out/summary.txt"
report=$out/gpu_run.md
build="build-gpu"
python=${BENCH_PYTHON:-python3}
stage=setup       # the stage running, for the logs
last_cmd=""       # the last command `run` ran (or showed), which a figure names

log() { echo "gpu_check: $*" | tee -a "$out/summary.txt"; }
md() { printf '%s\n' "$@" >>"$report"; }

# run LOG CMD ARG...: the one way a stage runs a command. The dry run prints it, as a shell would
# read it, and succeeds; the real run runs it with stdout and stderr in LOG and returns its status.
run() {
  local run_log=$1
  shift
  last_cmd=$(printf '%q ' "$@")
  last_cmd=${last_cmd% }
  if [ "$dry_run" = 1 ]; then
    echo "gpu_check: [$stage] would run: $last_cmd >$run_log 2>&1"
    return 0
  fi
  "$@" >"$run_log" 2>&1
}

# figure TEXT: one of a stage's results, in the summary and in gpu_run.md under its command.
figure() {
  [ "$dry_run" = 0 ] || set -- "(dry run) $*"
  log "$stage: $*"
  if [ -n "$last_cmd" ]; then md "- \`$last_cmd\`" "  $*"; else md "- $*"; fi
}

# from LOG [GREP ARGS...]: what a stage reads from a log; nothing (not an error) in the dry run.
from() {
  local file=$1
  shift
  [ -f "$file" ] || return 0
  if [ $# -gt 0 ]; then grep "$@" "$file" || true; else cat "$file"; fi
}

# fenced: its standard input into the summary, and into gpu_run.md as a code block.
fenced() { tee -a "$out/summary.txt" | { md '' '```'; cat >>"$report"; md '```'; }; }

# bench_gpt_on_gpu LOG SECONDS WHAT ARG...: scripts/bench_gpt.sh --gpt2 ARG... on the GPU within
# SECONDS, its output in LOG, its verdict a figure named WHAT.
bench_gpt_on_gpu() {
  local log=$1 limit=$2 what=$3 result
  shift 3
  if run "$log" env BENCH_NO_SETUP=1 BENCH_PYTHON="$python" CPPRUN_BUILD_DIR="$build" BENCH_DEVICE=cuda \
       timeout "$limit" bash scripts/bench_gpt.sh --gpt2 "$@"; then
    result=ok
  else
    result=FAILED
  fi
  figure "$what: $result"
}

# torch_query EXPR [WHAT]: what PyTorch says of itself; without PyTorch (a dry run), <WHAT> instead.
torch_query() {
  "$python" -c "import torch, os; print($1)" 2>/dev/null || echo "<${2:-$1}: no torch in $python>"
}
torch_prefix=$(torch_query torch.utils.cmake_prefix_path)

# The header-only dependencies that machine lacks, from .gpu_deps (--pack).
header_args=()
set_header_args() {
  local torch_include
  torch_include=$(torch_query 'os.path.join(os.path.dirname(torch.__file__), "include")')
  header_args=()
  [ -f /usr/include/CLI/CLI.hpp ] || header_args+=("-DCPPRUN_CLI11_INCLUDE_DIR=$PWD/$deps/include")
  [ -f /usr/include/catch2/catch.hpp ] || header_args+=("-DCPPRUN_CATCH2_INCLUDE=$PWD/$deps/include")
  if [ -f "$torch_include/gloo/config.h" ]; then
    log "Gloo headers: LibTorch's own"
  elif [ -f /usr/include/gloo/config.h ]; then
    log "Gloo headers: this machine's, in /usr/include"  # what CMake finds by itself, as here
  else
    # Debian's Gloo headers, older than the Gloo inside this LibTorch: fine for the parts c10d's
    # headers use, but say so.
    header_args+=("-DCPPRUN_GLOO_INCLUDE=$PWD/$deps/gloo/include")
    log "Gloo headers: none in LibTorch, using Debian's from $deps"
  fi
}

# The README and docs/ as train_gpt's text: every checkout has them, whatever the machine's
# distribution (about 150 kB together; the README alone became a short front page).
gpt_text() { cat README.md docs/*.md >"$out/gpt_text.md"; }

stage_build() {
  if [ ! -d "$deps/include" ]; then
    [ "$dry_run" = 1 ] || { log "build: $deps missing: run 'bash scripts/gpu_check.sh --pack' here and carry $deps"; exit 1; }
    log "build: $deps missing (the real run stops here: --pack it and carry it)"
  fi
  set_header_args
  if run "$out/build.log" env CPPRUN_LIBTORCH="$torch_prefix" CPPRUN_BUILD_DIR="$build" \
       CPPRUN_BUILD_TARGETS="${GPU_CHECK_TARGETS:-}" bash scripts/build.sh -DCMAKE_BUILD_TYPE=Release "${header_args[@]}"; then
    figure "ok in $((SECONDS - stage_start)) s ($(from "$out/build.log" -o 'backends built: .*'))"
  else
    figure "FAILED after $((SECONDS - stage_start)) s; first errors:"
    from "$out/build.log" -m 20 -E 'error|Error' | tee -a "$out/summary.txt"
    exit 1
  fi
}

stage_test() {
  local jobs result
  jobs=$(nproc); [ "$jobs" -le 8 ] || jobs=8
  # The suite is the CPU and Gloo one CI runs, so the GPU is hidden from it (a test of one rank
  # would otherwise get cuda:0 and NCCL); the gpu label runs with the GPU, in the smoke stage.
  # CMAKE_PREFIX_PATH: the find_package test's own project must find this LibTorch too.
  if run "$out/ctest.log" env CUDA_VISIBLE_DEVICES= CMAKE_PREFIX_PATH="$torch_prefix" \
       ctest --test-dir "$build" --parallel "$jobs" --label-exclude gpu --output-on-failure; then
    result=ok
  else
    result=FAILED
  fi
  figure "$result in $((SECONDS - stage_start)) s: $(from "$out/ctest.log" -E 'tests passed')"
  from "$out/ctest.log" -E '\(Failed\)|\(Timeout\)|\*\*\*' | tee -a "$out/summary.txt"
}

stage_bench() {
  local bench result
  for bench in bench_ddp bench_fsdp; do  # a failure is logged and the stages after it still run
    if run "$out/$bench.txt" env BENCH_NO_SETUP=1 BENCH_PYTHON="$python" CPPRUN_BUILD_DIR="$build" \
         bash "scripts/$bench.sh"; then result=ok; else result=FAILED; fi
    from "$out/$bench.txt" >>"$out/summary.txt"
    figure "$bench $result"
    [ "$dry_run" = 1 ] || md '' '```' "$(from "$out/$bench.txt")" '```'
  done
}

stage_smoke() {
  local mode result
  for mode in ddp zero1 zero2 zero3; do
    if run "$out/smoke_$mode.log" "$build/launcher/cpprun" --standalone --nproc_per_node=1 "$build/bench/dp_bench" \
         --mode "$mode" --device cuda --hidden 1024 --steps 20 --warmup 3; then
      figure "$(from "$out/smoke_$mode.log" -m1 RESULT)"
    else
      figure "$mode on cuda FAILED: $(from "$out/smoke_$mode.log" | tail -3 | tr '\n' ' ')"
    fi
  done
  # cpprun::fused_cross_entropy's CUDA kernels against F::cross_entropy, then timed at GPT-2's loss
  # (also in ctest's gpu label below; run here too for its timing line).
  if run "$out/fused_ce.log" timeout 120 "$build/tests/fused_cross_entropy_check" --device cuda; then
    figure "$(from "$out/fused_ce.log" -E '^timing|^measured|: ok' | tr '\n' ' ')"
  else
    figure "fused_cross_entropy_check on cuda FAILED: $(from "$out/fused_ce.log" -E 'FAIL|error|what' | head -6 | tr '\n' ' ')"
  fi
  if run "$out/ctest_gpu.log" ctest --test-dir "$build" -L gpu --output-on-failure; then result=ok; else result=FAILED; fi
  figure "ctest -L gpu $result: $(from "$out/ctest_gpu.log" -E 'tests passed|Skipped|Failed' | tr '\n' ' ')"
}

stage_gpt() {
  local run_flags
  gpt_text
  for run_flags in "--mode ddp" "--mode ddp --amp bf16" "--mode fsdp --stage 1 --amp fp16" \
                   "--mode fsdp --stage 2 --amp bf16" "--mode fsdp --stage 3" \
                   "--mode fsdp --stage 3 --amp fp16 --checkpoint-activations"; do
    # shellcheck disable=SC2086  # $run_flags is a list of flags
    if run "$out/gpt.log" "$build/launcher/cpprun" --standalone --nproc_per_node=1 "$build/examples/train_gpt" \
         --text "$out/gpt_text.md" --steps 60 --layers 4 --embed 128 --block 128 --batch 32 --sample 0 $run_flags; then
      figure "$(from "$out/gpt.log" -E 'tokens/s|held-out|skipped' | tr '\n' ' ')"
    else
      figure "$run_flags FAILED: $(from "$out/gpt.log" | tail -4 | tr '\n' ' ')"
    fi
  done
}

stage_shared() {
  local nproc mode err
  for nproc in 2 4; do
    for mode in ddp zero1 zero2 zero3; do
      err=$out/shared_${nproc}_$mode.log
      if run "$err" timeout 120 "$build/launcher/cpprun" --standalone --nproc_per_node=$nproc "$build/bench/dp_bench" \
           --mode "$mode" --device cuda:0 --hidden 1024 --steps 10 --warmup 2; then
        figure "$(from "$err" -m1 RESULT)"
      else
        figure "$nproc ranks $mode on cuda:0 over Gloo FAILED: $(from "$err" -v -E 'W[0-9]{4}|^\s*$' | tail -4 | tr '\n' ' ')"
      fi
    done
  done
}

stage_ncclfr() {
  local code dumps dir result
  cat >"$out/nccl_timeout.py" <<'PY'
import datetime, os, torch, torch.distributed as dist
dist.init_process_group("nccl", timeout=datetime.timedelta(seconds=5))
torch.cuda.set_device(0)
x = torch.ones(1 << 20, device="cuda")
dist.all_reduce(x)  # the communicator is made at the first collective (and waits for the device): before the sleep
torch.cuda.synchronize()
torch.cuda._sleep(int(6e10))  # about 30 s on an H100: the all-reduce behind it times out at 5 s
dist.all_reduce(x)
torch.cuda.synchronize()
PY
  rm -rf "$out/ncclfr_logs"
  code=0
  run "$out/ncclfr.log" timeout 150 "$build/launcher/cpprun" --standalone --nproc_per_node=1 \
    --log_dir "$out/ncclfr_logs" "$python" "$out/nccl_timeout.py" || code=$?
  dumps=$(find "$out/ncclfr_logs" -path '*nccl_flight_recorder/rank_*' 2>/dev/null | tr '\n' ' ' || true)
  [ "$dry_run" = 0 ] || dumps="$out/ncclfr_logs/attempt_0/nccl_flight_recorder/rank_0"  # to walk the reader too
  figure "exit $code after $((SECONDS - stage_start)) s; dumps: ${dumps:-none}"
  from "$out/ncclfr.log" -E 'NCCL|torchfrtrace' | grep -v -E '^\[rank' | head -6 | tee -a "$out/summary.txt" || true
  if [ -n "$dumps" ] && { [ "$dry_run" = 1 ] || command -v torchfrtrace >/dev/null; }; then
    dir=$(dirname "$(echo "$dumps" | cut -d' ' -f1)")
    if run "$out/ncclfr_torchfrtrace.txt" timeout 60 torchfrtrace "$dir" -p rank_; then result=ok; else result=FAILED; fi
    figure "torchfrtrace: $result ($(from "$out/ncclfr_torchfrtrace.txt" | wc -l) lines)"
  fi
}

stage_gpt2() {
  local run_flags
  gpt_text
  for run_flags in "--mode ddp" "--mode fsdp --stage 3"; do
    # shellcheck disable=SC2086  # $run_flags is a list of flags
    if run "$out/gpt2.log" timeout 300 "$build/launcher/cpprun" --standalone --nproc_per_node=1 \
         "$build/examples/train_gpt" --text "$out/gpt_text.md" "${gpt2_layers[@]}" --block "$gpt2_block" \
         --batch 8 --steps 12 --sample 0 --straggler-every 0 --amp bf16 $run_flags; then
      figure "$(from "$out/gpt2.log" -E 'parameters|tokens/s|held-out|peak' | tr '\n' ' ')"
    else
      figure "$run_flags FAILED: $(from "$out/gpt2.log" | tail -4 | tr '\n' ' ')"
    fi
  done
}

# train_gpt against its PyTorch twin at GPT-2 124M's shape (scripts/bench_gpt.sh): both sides with
# their defaults, SDPA attention and the fused AdamW (PyTorch's AdamW(fused=True): what a PyTorch
# user who wants speed runs). Then what each of the two brings, cpprun alone with no wrapper
# (train_gpt --attention math / --optimizer libtorch: the written-out attention and LibTorch's
# AdamW), and the optimizers' step times alone (scripts/bench_adamw.sh: LibTorch's, FusedAdamW,
# PyTorch's fused, foreach and for-loop, GPT-2 124M's tensors). COMPARE_BATCH: bench_gpt's --batch.
stage_compare() {
  local run_flags
  bench_gpt_on_gpu "$out/compare.txt" 300 "bench_gpt.sh --gpt2 (cuda, bf16, one rank)" \
    ${COMPARE_BATCH:+--batch "$COMPARE_BATCH"}
  [ ! -f "$out/compare.txt" ] || fenced <"$out/compare.txt"
  gpt_text
  for run_flags in "--attention sdpa --optimizer fused" "--attention math --optimizer fused" \
                   "--attention sdpa --optimizer libtorch" "--attention math --optimizer libtorch"; do
    # shellcheck disable=SC2086  # $run_flags is a list of flags
    if run "$out/ablate.log" timeout 120 "$build/launcher/cpprun" --standalone --nproc_per_node=1 \
         "$build/examples/train_gpt" --text "$out/gpt_text.md" "${gpt2_layers[@]}" --block "$gpt2_block" \
         --batch 16 --steps 25 --warmup 5 --log-every 5 --sample 0 --straggler-every 0 --amp bf16 --mode none $run_flags; then
      figure "$run_flags: $(from "$out/ablate.log" -E 'step +25/|tokens/s over' | tr '\n' ' ')"
    else
      figure "$run_flags FAILED: $(from "$out/ablate.log" | tail -4 | tr '\n' ' ')"
    fi
  done
  if run "$out/adamw.txt" env BENCH_NO_SETUP=1 BENCH_PYTHON="$python" CPPRUN_BUILD_DIR="$build" \
       timeout 120 bash scripts/bench_adamw.sh --device cuda --steps 20; then
    figure "bench_adamw.sh --device cuda (GPT-2 124M's tensors): $(from "$out/adamw.txt" -E 'ms/step' | tr '\n' ';')"
  else
    figure "bench_adamw.sh FAILED: $(from "$out/adamw.txt" | tail -4 | tr '\n' ' ')"
  fi
}

# Issue 40's goals at GPT-2 124M's shape, bf16, one rank (scripts/bench_gpt.sh --gpt2): tokens/s
# and MFU of cpprun without a wrapper, eager and in a CUDA graph, against PyTorch eager, and DDP
# and ZeRO-3 against no wrapper, at batch 16 (medians of GOALS_REPEATS runs, default 2; with the
# fused loss's row against ATen's, cpprun-atenloss) and at batch 32 (the no-wrapper rows);
# then the no-wrapper rows and ZeRO-3 traced (8 steps, 3 of them under the profiler): cpprun's
# idle time against PyTorch's, and the kernels ZeRO-3 adds at one rank.
stage_goals() {
  local batch rows
  for batch in 16 32; do
    rows=cpprun-none,cpprun-graph,pytorch-none
    [ "$batch" != 16 ] || rows+=,cpprun-atenloss,cpprun-ddp,cpprun-zero3,pytorch-fsdp2
    bench_gpt_on_gpu "$out/goals_b$batch.txt" 270 "bench_gpt.sh --gpt2 --batch $batch (cuda, bf16, one rank)" \
      --batch "$batch" --rows "$rows" --repeats "$([ "$batch" = 16 ] && echo "${GOALS_REPEATS:-2}" || echo 1)"
    [ ! -f "$out/goals_b$batch.txt" ] || fenced <"$out/goals_b$batch.txt"
  done
  bench_gpt_on_gpu "$out/goals_trace.txt" 150 "the no-wrapper rows and ZeRO-3 traced" \
    --rows cpprun-none,pytorch-none,cpprun-zero3 --steps 8 --warmup 3 --trace "$out/traces"
  from "$out/goals_trace.txt" -A 12 '^trace_kernels' | fenced
  if run "$out/goals_trace_zero3.txt" "$python" bench/trace_kernels.py "$out/traces/cpprun.none.json" \
       "$out/traces/cpprun.zero3.json"; then
    figure "cpprun's no wrapper (left) against its ZeRO-3 (right), one rank:"
    from "$out/goals_trace_zero3.txt" | head -n 20 | fenced
  else
    figure "trace_kernels FAILED: $(from "$out/goals_trace_zero3.txt" | tail -3 | tr '\n' ' ')"
  fi
}

# The 2.11 SIGSEGVs under AddressSanitizer. Only cpprun's code is instrumented (LibTorch is not);
# the test binaries link libasan first, so no LD_PRELOAD is needed (it would be for a host that is
# not instrumented, such as python). ASAN_OPTIONS: detect_leaks=0 (LibTorch's and CUDA's
# process-lifetime allocations would bury a report), protect_shadow_gap=0 (the CUDA driver maps
# memory where ASan's shadow gap lies, if libtorch_cuda initialises), alloc_dealloc_mismatch=0
# (memory allocated inside LibTorch and freed in inlined header code, or the reverse, crosses the
# instrumented line), log_path (a report a process, not 4 ranks interleaved on stderr).
stage_asan() {
  local asan_build=build-asan targets launcher case_log code reports first
  local -a cases
  targets="cpprun_unit_tests cpprun_dist_fsdp cpprun_dist_hsdp"
  launcher=$build/launcher/cpprun  # the launcher needs no instrumenting; built here when `build` did not
  if [ ! -x "$launcher" ]; then targets="$targets cpprun" launcher=$asan_build/launcher/cpprun; fi
  set_header_args
  if run "$out/asan_build.log" env CPPRUN_LIBTORCH="$torch_prefix" CPPRUN_BUILD_DIR="$asan_build" \
       CPPRUN_BUILD_TARGETS="$targets" bash scripts/build.sh -DCMAKE_BUILD_TYPE=RelWithDebInfo \
       "-DCMAKE_CXX_FLAGS=-fsanitize=address -fno-omit-frame-pointer" -DCMAKE_EXE_LINKER_FLAGS=-fsanitize=address \
       -DCMAKE_SHARED_LINKER_FLAGS=-fsanitize=address "${header_args[@]}"; then
    figure "ASan build ok in $((SECONDS - stage_start)) s"
  else
    figure "ASan build FAILED: $(from "$out/asan_build.log" -m 5 -E 'error|Error' | tr '\n' ' ')"
    return 0
  fi
  rm -rf "$out/asan" && mkdir -p "$out/asan"
  local -a asan_env=(env CUDA_VISIBLE_DEVICES=
    "ASAN_OPTIONS=detect_leaks=0:protect_shadow_gap=0:alloc_dealloc_mismatch=0:log_path=$out/asan/report")
  # Catch2 reads a comma as "or": the names end in * before their first comma.
  cases=("unit|$asan_build/tests/cpprun_unit_tests|checkpoint_file: a torch archive round-trips*")
  for nproc in ${ASAN_NPROCS:-2 4}; do
    cases+=("fsdp.np$nproc|tests/run_isolated.sh $launcher --standalone --nproc_per_node=$nproc $asan_build/tests/cpprun_dist_fsdp|fsdp: a damaged checkpoint is refused on every rank*")
    cases+=("hsdp.np$nproc|tests/run_isolated.sh $launcher --standalone --nproc_per_node=$nproc $asan_build/tests/cpprun_dist_hsdp|hsdp: a sharded checkpoint is written by the first replica*")
  done
  local entry name cmd spec
  for entry in "${cases[@]}"; do
    IFS='|' read -r name cmd spec <<<"$entry"
    case_log=$out/asan_$name.log
    code=0
    # shellcheck disable=SC2086  # $cmd is the command's words (no spaces inside one)
    run "$case_log" "${asan_env[@]}" timeout 300 $cmd "$spec" || code=$?
    figure "$name: exit $code; $(from "$case_log" -E 'test cases|All tests passed' | tail -1)"
  done
  last_cmd=""  # what follows is of all the cases
  reports=$(ls -tr "$out"/asan/report.* 2>/dev/null || true)
  if [ -n "$reports" ]; then
    first=$(echo "$reports" | head -1)
    figure "ASan reported in $(echo "$reports" | wc -l) process(es); the first ($first):"
    head -60 "$first" | fenced
  else
    figure "no ASan report"
  fi
}

# The report's head: the machine and software the figures below come from.
gpu=$(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null | head -1 || true)
torch_version=$(torch_query '" ".join(map(str, [torch.__version__, "CUDA", torch.version.cuda, "GPUs", torch.cuda.device_count()]))' version)
commit=$(git rev-parse --short HEAD 2>/dev/null || echo "not a git checkout")
{
  echo "# The latest gpu_check run"  # committed as docs/gpu_run.md, as it stands
  echo
  echo "[Back to docs/gpu.md](gpu.md)."
  echo
  echo "## $(date -u '+%Y-%m-%d %H:%M UTC')$([ "$dry_run" = 0 ] || echo ' (dry run: nothing ran)')"
  echo
  echo "- Device: ${gpu:-no nvidia-smi} (nvidia-smi: name, driver, memory)"
  echo "- PyTorch $torch_version; LibTorch from \`$torch_prefix\`"
  echo "- Host: $(nproc) cores, $(uname -sr); cpprun at $commit"
  echo "- Command (repository root): \`$(printf '%q ' bash scripts/gpu_check.sh "$@" | sed 's/ $//')\`, logs in \`$out\`"
} >"$report"
log "${gpu:-no nvidia-smi}"
log "torch $torch_version"

for stage in "${all_stages[@]}"; do
  [[ " ${stages[*]} " == *" $stage "* ]] || continue
  stage_start=$SECONDS
  md '' "### $stage" ''
  "stage_$stage"
  md "" "($stage: $((SECONDS - stage_start)) s)"
done
stage="done"
log "logs in $out; the run in Markdown: $report"
