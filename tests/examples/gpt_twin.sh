#!/usr/bin/env bash
# cpprun's train_gpt against its PyTorch twin (bench/gpt_twin.py: the same model op for op, the
# same initial checkpoint, batches and AdamW) through scripts/bench_gpt.sh on the CPU at its tiny
# shape: one rank, cpprun without a wrapper / DDP / ZeRO-3 and PyTorch without a wrapper / DDP /
# FSDP2, 4 steps, both in float64 with their defaults (scaled_dot_product_attention; AdamW fused:
# cpprun::FusedAdamW against torch.optim.AdamW(fused=True)); then --grad-accum 2 (--batch 4) on
# both sides, and --attention math --optimizer libtorch (--dtype float64), so that the verdict does not depend on how
# this CPU rounds float32: every step's loss must agree with PyTorch DDP's within bench_gpt.sh's
# float64 tolerance (1e-8 relative; rounding alone was measured to reach 1.1e-12 in 30 steps and
# 8.3e-12 in 200; a learning rate 1% off differs by 2.5e-4 at step 2).
# Then the check itself: the twin at a learning rate 1% higher must be caught (exit 1, FAIL lines).
# Usage: gpt_twin.sh BUILD_DIR PYTHON. Skips (77) without a python with torch.
set -u
build=$1 python=${2:-}
here=$(dirname "$0")
# shellcheck source=../interop_setup.sh
. "$here/../interop_setup.sh"
interop_setup "$python" torch
bench() {
  BENCH_NO_SETUP=1 BENCH_PYTHON="$python" BENCH_DEVICE=cpu CPPRUN_BUILD_DIR="$build" timeout 300 \
    bash "$here/../../scripts/bench_gpt.sh" --dtype float64 --steps 4 --warmup 1 --log-every 1 "$@" >"$dir/out" 2>&1
}

bench
rc=$?
cat "$dir/out"
[ $rc -eq 0 ] || fail "scripts/bench_gpt.sh exited $rc (above)"
[ "$(grep -c '^losses against PyTorch DDP: ok' "$dir/out")" = 5 ] || fail "expected 5 rows' losses checked and ok"

# Gradient accumulation on both sides (DDP's and FSDP2's own no-sync against cpprun's), and the
# written-out attention with LibTorch's AdamW, which the twin steps operation for operation.
bench --batch 4 --grad-accum 2 --rows cpprun-none,cpprun-ddp,cpprun-zero3,pytorch-fsdp2
rc=$?
cat "$dir/out"
[ $rc -eq 0 ] || fail "scripts/bench_gpt.sh --grad-accum 2 exited $rc (above)"
[ "$(grep -c '^losses against PyTorch DDP: ok' "$dir/out")" = 4 ] || fail "--grad-accum 2: expected 4 rows' losses checked and ok"
bench --optimizer libtorch --attention math --rows cpprun-none
rc=$?
cat "$dir/out"
[ $rc -eq 0 ] || fail "scripts/bench_gpt.sh --optimizer libtorch --attention math exited $rc (above)"
[ "$(grep -c '^losses against PyTorch DDP: ok' "$dir/out")" = 1 ] || fail "--optimizer libtorch --attention math: expected 1 row checked and ok"

BENCH_GPT_TWIN_ARGS="--lr 3.03e-3" bench --steps 2 --rows cpprun-ddp
rc=$?
[ $rc -eq 1 ] || { cat "$dir/out"; fail "a twin trained at another learning rate gave exit $rc, not 1"; }
grep -q '^losses against PyTorch DDP: FAIL cpprun ddp: step 2' "$dir/out" ||
  { cat "$dir/out"; fail "the learning-rate change was not named at step 2"; }
echo "PASS: train_gpt and its PyTorch twin agree; a 1% learning-rate change is caught"
