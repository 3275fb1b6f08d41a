#!/usr/bin/env bash
# GPU tests: training steps of DDP and ZeRO-1/2/3 (bench/dp_bench, MLP) on CUDA under cpprun, with
# NPROC ranks on NPROC GPUs over NCCL (NCCL refuses two ranks on one GPU), or with SHARED, NPROC
# ranks sharing GPU 0 over Gloo (dp_bench --device cuda:0; docs/gpu.md). dp_bench --check: each
# rank's trained parameters (float64) must equal those of one process trained on the whole global
# batch to 1e-10, or it exits 1 naming the worst parameter. Skipped (77), with the reason, on a
# build without CUDA or a machine with fewer GPUs: never reported as passed.
#   usage: cuda_steps.sh CPPRUN DP_BENCH WITH_NCCL(ON|OFF) NPROC [shared]
set -u
cpprun=$1 dp_bench=$2 with_nccl=$3 nproc=$4 shared=${5:-}
if [ "$with_nccl" != ON ]; then
  echo "SKIP: cpprun was built against a LibTorch without CUDA/NCCL"
  exit 77
fi
gpus=$( (nvidia-smi -L 2>/dev/null || true) | grep -c '^GPU')
need=$nproc device=cuda
if [ "$shared" = shared ]; then need=1 device=cuda:0; fi
if [ "$gpus" -lt "$need" ]; then
  echo "SKIP: needs $need CUDA GPU(s); this machine has $gpus"
  exit 77
fi
status=0
for mode in ddp zero1 zero2 zero3; do
  out=$(timeout 120 "$cpprun" --standalone --nproc_per_node="$nproc" "$dp_bench" --mode "$mode" --device "$device" \
          --hidden 512 --steps 5 --warmup 2 --check 2>&1)
  rc=$?
  checked=$(grep -c "check rank [0-9]*: ok:" <<<"$out")
  if [ $rc -eq 0 ] && [ "$checked" -eq "$nproc" ] && line=$(grep -m1 "RESULT .*device=$device .*world=$nproc " <<<"$out"); then
    echo "ok   $mode: $line"; grep "check rank" <<<"$out"
  else
    echo "FAIL $mode on $nproc rank(s) (exit $rc, $checked of $nproc ranks checked ok):"; tail -20 <<<"$out"; status=1
  fi
done
exit $status
