#!/bin/sh
# A sharded FSDP checkpoint saved on 3 ranks loads on 2 and on 4 (and 1), with optimizer state:
# each loaded run continues training and must match one process trained throughout (the test
# case "[.ckpt]" in test_fsdp.cpp). usage: reshard_checkpoint.sh CPPRUN TEST_BINARY
set -eu
cpprun=$1 binary=$2
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
export CPPRUN_CKPT_DIR="$dir/checkpoint"
CPPRUN_CKPT_PHASE=save "$cpprun" --standalone --nproc_per_node=3 "$binary" "[.ckpt]"
test -f "$CPPRUN_CKPT_DIR/meta.pt"
for n in 2 4 1; do
  echo "--- loading on $n ranks"
  CPPRUN_CKPT_PHASE=load "$cpprun" --standalone --nproc_per_node=$n "$binary" "[.ckpt]"
done
echo PASS
