#!/usr/bin/env bash
# Builds and checks cpprun on a lent GPU machine (the `device` tool: one H100 or H200, 16 cores,
# PyTorch 2.x in python3, CMake and ninja, no apt and no network). Two steps:
#
#   here, before the call:  bash scripts/gpu_check.sh --pack
#       copies the header-only dependencies that machine lacks (CLI11, Catch2 v2, and Gloo's
#       headers in case its LibTorch ships none) into .gpu_deps/ (ignored by git);
#   there:                  bash scripts/gpu_check.sh [stage...]      (run with carry: [".gpu_deps"])
#       stages, in order, default all: build test bench smoke. Logs go to $OUT (or /tmp/gpu_check).
#
# What each stage shows:
#   build  cpprun compiles against that machine's LibTorch, with scripts/build.sh as everywhere;
#   test   the whole ctest suite on that LibTorch, CPU and Gloo;
#   bench  scripts/bench_ddp.sh and bench_fsdp.sh on the CPU with 16 cores, so the ranks' Gloo
#          threads have cores to spare, against that machine's PyTorch;
#   smoke  DDP and FSDP training steps on the GPU with one rank. One GPU cannot hold two NCCL
#          ranks (NCCL refuses two ranks on one device), so NCCL itself is not exercised here.
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
[ ${#stages[@]} -gt 0 ] || stages=(build test bench smoke)
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
  if CPPRUN_LIBTORCH="$torch_prefix" CPPRUN_BUILD_DIR="$build" \
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
  if ctest --test-dir "$build" --parallel "$jobs" --output-on-failure >"$out/ctest.log" 2>&1; then result=ok; else result=FAILED; fi
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
fi
log "logs in $out"
