#!/bin/sh
# A model and its AdamW state saved in Hugging Face's sharded layout by DDP and by FSDP stage 3
# on 2 ranks resume on 1 and 3 ranks: a few more steps there end where the 2-rank run's own
# next steps ended (1e-6; the test case "[.opt_resume]" in test_optimizer_state_dict.cpp).
# usage: optimizer_resume.sh CPPRUN TEST_BINARY
set -eu
cpprun=$1 binary=$2
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
export CPPRUN_OPT_DIR="$dir"
echo "--- saving on 2 ranks"
CPPRUN_OPT_PHASE=save "$cpprun" --standalone --nproc_per_node=2 "$binary" "[.opt_resume]"
ls "$dir/ddp" "$dir/zero3"
for n in 1 3; do
  echo "--- resuming on $n ranks"
  CPPRUN_OPT_PHASE=load "$cpprun" --standalone --nproc_per_node=$n "$binary" "[.opt_resume]"
done
echo PASS
