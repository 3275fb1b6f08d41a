#!/bin/sh
# A sharded FSDP checkpoint saved on 4 ranks loads on 3, 2 and 1, with optimizer state:
# each loaded run continues training and must match one process trained throughout (the test
# case "[.ckpt]" in test_fsdp.cpp). Saved at ZeRO-2 and at ZeRO-3, and loaded at the other stage
# too (the shards are the same). usage: reshard_checkpoint.sh CPPRUN TEST_BINARY
set -eu
cpprun=$1 binary=$2
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
export CPPRUN_CKPT_DIR="$dir/checkpoint"
for saved in 2 3; do
  rm -rf "$CPPRUN_CKPT_DIR"
  echo "--- saving at stage $saved on 4 ranks"
  CPPRUN_CKPT_STAGE=$saved CPPRUN_CKPT_PHASE=save "$cpprun" --standalone --nproc_per_node=4 "$binary" "[.ckpt]"
  test -f "$CPPRUN_CKPT_DIR/meta.pt"
  for loaded in 2 3; do
    for n in 3 2 1; do
      echo "--- loading at stage $loaded on $n ranks"
      CPPRUN_CKPT_STAGE=$loaded CPPRUN_CKPT_PHASE=load "$cpprun" --standalone --nproc_per_node=$n "$binary" "[.ckpt]"
    done
  done
done
echo PASS
