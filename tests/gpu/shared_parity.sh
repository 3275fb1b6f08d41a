#!/usr/bin/env bash
# NPROC ranks sharing GPU 0 over Gloo run test_shared_gpu_parity (DDP, ZeRO-1/2/3, HSDP,
# checkpointing, fp16 + GradScaler, CPU offload, state dicts; each against one process). Skipped
# (77), with the reason, on a build without CUDA or a machine without a GPU: never reported as passed.
#   usage: shared_parity.sh CPPRUN TEST_BINARY WITH_NCCL(ON|OFF) NPROC
set -u
cpprun=$1 binary=$2 with_nccl=$3 nproc=$4
if [ "$with_nccl" != ON ]; then
  echo "SKIP: cpprun was built against a LibTorch without CUDA"
  exit 77
fi
gpus=$( (nvidia-smi -L 2>/dev/null || true) | grep -c '^GPU')
if [ "$gpus" -lt 1 ]; then
  echo "SKIP: needs a CUDA GPU; this machine has none (nvidia-smi -L)"
  exit 77
fi
CPPRUN_TEST_DEVICE=cuda:0 exec timeout 500 "$cpprun" --standalone --nproc_per_node="$nproc" "$binary"
