#!/bin/sh
# A state dict saved in Hugging Face's sharded layout by FSDP stage 3 on 4 ranks (one file per
# rank), and one saved by the same under bf16 mixed precision (its fp32 masters), load bit-exactly
# on 3, 2 and 1 ranks, into a plain module, DDP, FSDP and bf16 FSDP (the test case "[.hf_reshard]"
# in test_state_dict.cpp). usage: hf_sharded_reshard.sh CPPRUN TEST_BINARY
set -eu
cpprun=$1 binary=$2
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
export CPPRUN_HF_DIR="$dir/hf"
echo "--- saving on 4 ranks"
CPPRUN_HF_PHASE=save "$cpprun" --standalone --nproc_per_node=4 "$binary" "[.hf_reshard]"
ls "$CPPRUN_HF_DIR" "${CPPRUN_HF_DIR}_bf16"
for n in 3 2 1; do
  echo "--- loading on $n ranks"
  CPPRUN_HF_PHASE=load "$cpprun" --standalone --nproc_per_node=$n "$binary" "[.hf_reshard]"
done
echo PASS
