#!/usr/bin/env bash
# scripts/bench_checkpoint.sh at a tiny size (Linear(64, 64) x 3, one repeat, 2 ranks, DDP and
# FSDP stage 3, cpprun and its PyTorch twin, an 8 MiB dd): it exits 0 and prints what it promises —
# dd's two rates, one row per run of 19 fields with numbers where numbers belong (the cpprun rows
# only after their load gave back every saved tensor bit for bit: bench/checkpoint_bench's
# roundtrip check), and the ratio table. No timing is asserted. The page cache is left alone
# (BENCH_DROP_CACHES=0): a test must not flush the machine's cache under the tests beside it.
# Usage: checkpoint_bench_smoke.sh BUILD_DIR PYTHON. Skips (77) without a python with torch.
set -u
build=$1 python=${2:-}
here=$(dirname "$0")
# shellcheck source=../interop_setup.sh
. "$here/../interop_setup.sh"
interop_setup "$python" torch

BENCH_CHECKPOINT_RANKS=2 BENCH_CHECKPOINT_MODES="ddp zero3" BENCH_CHECKPOINT_MODEL="64 3" BENCH_DD_MB=8 \
  BENCH_DROP_CACHES=0 BENCH_PYTHON="$python" CPPRUN_BUILD_DIR="$build" timeout 240 \
  bash "$here/../../scripts/bench_checkpoint.sh" 1 "$dir" >"$dir/out" 2>&1
rc=$?
cat "$dir/out"
[ $rc -eq 0 ] || fail "scripts/bench_checkpoint.sh exited $rc (above)"

number='^[0-9]+(\.[0-9]+)?$'
grep -Eq '^disk \(dd, 8 MiB, median of 3\): write [0-9.]+ GB/s .*, read [0-9.]+ GB/s' "$dir/out" || fail "no dd line with both rates"
rows=$(grep -E '^2 +(ddp|zero3) +(cpprun|PyTorch) ' "$dir/out")
[ "$(wc -l <<<"$rows")" = 4 ] || fail "expected 4 rows (ddp, zero3 x cpprun, PyTorch), got: $rows"
while read -r -a f; do
  [ ${#f[@]} = 19 ] || fail "a row of ${#f[@]} fields, not 19: ${f[*]}"
  [ "${f[4]}" = warm ] || fail "cache '${f[4]}', not warm (the script was told not to drop it): ${f[*]}"
  for i in 3 5 6 7 8 9 10 11 12 13 14 15 16 17; do
    [[ ${f[$i]} =~ $number ]] || fail "field $((i + 1)) '${f[$i]}' is not a number: ${f[*]}"
  done
  awk -v s="${f[5]}" -v l="${f[8]}" 'BEGIN { exit !(s > 0 && l > 0) }' || fail "a save or load of 0 s: ${f[*]}"
done <<<"$rows"
ratios=$(grep -cE '^2 +(ddp|zero3) +[0-9.]+ +[0-9.]+ +[0-9.]+ +[0-9.]+$' "$dir/out")
[ "$ratios" = 2 ] || fail "expected 2 rows of cpprun-against-PyTorch ratios, got $ratios"
echo "PASS: scripts/bench_checkpoint.sh ran both wrappers on both sides and printed every figure"
