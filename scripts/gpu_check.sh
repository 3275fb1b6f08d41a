#!/usr/bin/env bash
# Builds and checks cpprun on a lent GPU machine (the `device` tool: one H100 or H200, 16 cores,
# PyTorch 2.x in python3, CMake and ninja, no apt and no network). Two steps:
#
#   here, before the call:  bash scripts/gpu_check.sh --pack
#       copies the header-only dependencies that machine lacks (CLI11, Catch2 v2, and Gloo's
#       headers in case its LibTorch ships none) into .gpu_deps/ (ignored by git);
#   there:                  bash scripts/gpu_check.sh [stage...]      (run with carry: [".gpu_deps"])
#       stages, in order, default all: build test bench smoke gpt. Logs go to $OUT (or /tmp/gpu_check).
#
# What each stage shows:
#   build  cpprun compiles against that machine's LibTorch, with scripts/build.sh as everywhere;
#   test   the whole ctest suite on that LibTorch, CPU and Gloo (the GPU hidden from it);
#   bench  scripts/bench_ddp.sh and bench_fsdp.sh on the CPU with 16 cores, so the ranks' Gloo
#          threads have cores to spare, against that machine's PyTorch;
#   smoke  DDP and FSDP training steps on the GPU with one rank, then ctest's gpu label;
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
#          twin bench/gpt_twin.py (no wrapper, DDP, FSDP2) at GPT-2 124M's shape (vocab 50257),
#          bf16, one rank: tokens/s, MFU, peak GPU memory, the losses (which must agree).
# GPU_CHECK_TARGETS="cpprun dp_bench train_gpt" builds only those (CPPRUN_BUILD_TARGETS).
set -euo pipefail
cd "$(dirname "$0")/.."
deps=.gpu_deps

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

stages=("$@")
[ ${#stages[@]} -gt 0 ] || stages=(build test bench smoke gpt shared ncclfr gpt2 compare)
out=${OUT:-/tmp/gpu_check}
mkdir -p "$out"
build=build-gpu
python=${BENCH_PYTHON:-python3}
wants() { local s; for s in "${stages[@]}"; do [ "$s" = "$1" ] && return 0; done; return 1; }
log() { echo "gpu_check: $*" | tee -a "$out/summary.txt"; }

log "$(nvidia-smi --query-gpu=name,memory.total --format=csv,noheader 2>/dev/null || echo 'no nvidia-smi')"
log "torch $("$python" -c 'import torch; print(torch.__version__, "cuda", torch.version.cuda, "gpus", torch.cuda.device_count())')"

torch_prefix=$("$python" -c 'import torch; print(torch.utils.cmake_prefix_path)')
if wants build; then
  [ -d "$deps/include" ] || { log "build: $deps missing: run 'bash scripts/gpu_check.sh --pack' here and carry $deps"; exit 1; }
  torch_include=$("$python" -c 'import torch, os; print(os.path.join(os.path.dirname(torch.__file__), "include"))')
  header_args=()
  [ -f /usr/include/CLI/CLI.hpp ] || header_args+=("-DCPPRUN_CLI11_INCLUDE_DIR=$PWD/$deps/include")
  [ -f /usr/include/catch2/catch.hpp ] || header_args+=("-DCPPRUN_CATCH2_INCLUDE=$PWD/$deps/include")
  if [ -f "$torch_include/gloo/config.h" ]; then
    log "Gloo headers: LibTorch's own"
  else
    # Debian's Gloo headers, older than the Gloo inside this LibTorch: fine for the parts c10d's
    # headers use, but say so.
    header_args+=("-DCPPRUN_GLOO_INCLUDE=$PWD/$deps/gloo/include")
    log "Gloo headers: none in LibTorch, using Debian's from $deps"
  fi
  start=$SECONDS
  if CPPRUN_LIBTORCH="$torch_prefix" CPPRUN_BUILD_DIR="$build" CPPRUN_BUILD_TARGETS="${GPU_CHECK_TARGETS:-}" \
       bash scripts/build.sh -DCMAKE_BUILD_TYPE=Release "${header_args[@]}" >"$out/build.log" 2>&1; then
    log "build: ok in $((SECONDS - start)) s ($(grep -o 'backends built: .*' "$out/build.log"))"
  else
    log "build: FAILED after $((SECONDS - start)) s; first errors:"
    grep -m 20 -E 'error|Error' "$out/build.log" | tee -a "$out/summary.txt"
    exit 1
  fi
fi

if wants test; then
  start=$SECONDS
  jobs=$(nproc); [ "$jobs" -le 8 ] || jobs=8
  export CMAKE_PREFIX_PATH="$torch_prefix"  # the find_package test's own project must find this LibTorch too
  # The suite is the CPU and Gloo one CI runs, so the GPU is hidden from it (a test of one rank
  # would otherwise get cuda:0 and NCCL); the gpu label runs with the GPU, in the smoke stage.
  if CUDA_VISIBLE_DEVICES= ctest --test-dir "$build" --parallel "$jobs" --label-exclude gpu --output-on-failure \
       >"$out/ctest.log" 2>&1; then result=ok; else result=FAILED; fi
  log "test: $result in $((SECONDS - start)) s: $(grep -E 'tests passed' "$out/ctest.log" || true)"
  grep -E '\(Failed\)|\(Timeout\)|\*\*\*' "$out/ctest.log" | tee -a "$out/summary.txt" || true
fi

if wants bench; then
  export BENCH_NO_SETUP=1 BENCH_PYTHON="$python" CPPRUN_BUILD_DIR="$build"
  for bench in bench_ddp bench_fsdp; do  # a failure is logged and the stages after it still run
    if bash "scripts/$bench.sh" >"$out/$bench.txt" 2>&1; then result=ok; else result=FAILED; fi
    cat "$out/$bench.txt" >>"$out/summary.txt"
    log "bench: $bench $result"
  done
fi

if wants smoke; then
  for mode in ddp zero1 zero2 zero3; do
    if line=$("$build/launcher/cpprun" --standalone --nproc_per_node=1 "$build/bench/dp_bench" --mode "$mode" \
                --device cuda --hidden 1024 --steps 20 --warmup 3 2>"$out/smoke_$mode.err" | grep RESULT); then
      log "smoke: $line"
    else
      log "smoke: $mode on cuda FAILED: $(tail -3 "$out/smoke_$mode.err" | tr '\n' ' ')"
    fi
  done
  if ctest --test-dir "$build" -L gpu --output-on-failure >"$out/ctest_gpu.log" 2>&1; then result=ok; else result=FAILED; fi
  log "smoke: ctest -L gpu $result: $(grep -E 'tests passed' "$out/ctest_gpu.log" || true)"
fi

if wants gpt; then
  # The README and docs/ as the text: every checkout has them, whatever the machine's distribution
  # (about 150 kB together; the README alone became a short front page).
  cat README.md docs/*.md >"$out/gpt_text.md"
  gpt=("$build/launcher/cpprun" --standalone --nproc_per_node=1 "$build/examples/train_gpt" --text "$out/gpt_text.md"
       --steps 60 --layers 4 --embed 128 --block 128 --batch 32 --sample 0)
  for run in "--mode ddp" "--mode ddp --amp bf16" "--mode fsdp --stage 1 --amp fp16" "--mode fsdp --stage 2 --amp bf16" \
             "--mode fsdp --stage 3" "--mode fsdp --stage 3 --amp fp16 --checkpoint-activations"; do
    # shellcheck disable=SC2086  # $run is a list of flags
    if "${gpt[@]}" $run >"$out/gpt.log" 2>&1; then
      log "gpt: $run: $(grep -E 'tokens/s|held-out|skipped' "$out/gpt.log" | tr '\n' ' ')"
    else
      log "gpt: $run FAILED: $(tail -4 "$out/gpt.log" | tr '\n' ' ')"
    fi
  done
fi
if wants shared; then
  for nproc in 2 4; do
    for mode in ddp zero1 zero2 zero3; do
      if line=$(timeout 120 "$build/launcher/cpprun" --standalone --nproc_per_node=$nproc "$build/bench/dp_bench" \
                  --mode "$mode" --device cuda:0 --hidden 1024 --steps 10 --warmup 2 \
                  2>"$out/shared_${nproc}_$mode.err" | grep RESULT); then
        log "shared: $line"
      else
        log "shared: $nproc ranks $mode on cuda:0 over Gloo FAILED: $(grep -v -E 'W[0-9]{4}|^\s*$' \
              "$out/shared_${nproc}_$mode.err" | tail -4 | tr '\n' ' ')"
      fi
    done
  done
fi

if wants ncclfr; then
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
  start=$SECONDS
  code=0
  timeout 150 "$build/launcher/cpprun" --standalone --nproc_per_node=1 --log_dir "$out/ncclfr_logs" \
    "$python" "$out/nccl_timeout.py" >"$out/ncclfr.out" 2>"$out/ncclfr.err" || code=$?
  dumps=$(find "$out/ncclfr_logs" -path '*nccl_flight_recorder/rank_*' 2>/dev/null | tr '\n' ' ')
  log "ncclfr: exit $code after $((SECONDS - start)) s; dumps: ${dumps:-none}"
  grep -E 'NCCL|torchfrtrace' "$out/ncclfr.err" | grep -v -E '^\[rank' | head -6 | tee -a "$out/summary.txt" || true
  if [ -n "$dumps" ] && command -v torchfrtrace >/dev/null; then
    dir=$(dirname "$(echo "$dumps" | cut -d' ' -f1)")
    if timeout 60 torchfrtrace "$dir" -p rank_ >"$out/ncclfr_torchfrtrace.txt" 2>&1; then result=ok; else result=FAILED; fi
    log "ncclfr: torchfrtrace $dir -p rank_: $result ($(wc -l <"$out/ncclfr_torchfrtrace.txt") lines)"
  fi
fi

if wants gpt2; then
  cat README.md docs/*.md >"$out/gpt_text.md"
  for run in "--mode ddp" "--mode fsdp --stage 3"; do
    # shellcheck disable=SC2086  # $run is a list of flags
    if timeout 300 "$build/launcher/cpprun" --standalone --nproc_per_node=1 "$build/examples/train_gpt" \
         --text "$out/gpt_text.md" --layers 12 --embed 768 --heads 12 --block 1024 --batch 8 --steps 12 \
         --sample 0 --straggler-every 0 --amp bf16 $run >"$out/gpt2.log" 2>&1; then
      log "gpt2: $run: $(grep -E 'parameters|tokens/s|held-out|peak' "$out/gpt2.log" | tr '\n' ' ')"
    else
      log "gpt2: $run FAILED: $(tail -4 "$out/gpt2.log" | tr '\n' ' ')"
    fi
  done
fi
if wants compare; then
  if BENCH_NO_SETUP=1 BENCH_PYTHON="$python" CPPRUN_BUILD_DIR="$build" BENCH_DEVICE=cuda timeout 480 \
       bash scripts/bench_gpt.sh --gpt2 >"$out/compare.txt" 2>&1; then result=ok; else result=FAILED; fi
  cat "$out/compare.txt" >>"$out/summary.txt"
  log "compare: scripts/bench_gpt.sh --gpt2 (cuda, bf16, one rank): $result"
fi
log "logs in $out"
