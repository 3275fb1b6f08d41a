#!/usr/bin/env bash
# GPT-2 moves both ways between train_gpt and Hugging Face's transformers, each side checked by
# the other's own code (tests/examples/gpt2_interop.py builds a small random GPT2LMHeadModel from
# a config: nothing is downloaded):
#   init    train_gpt --init-from a save_pretrained directory (one file, sharded, and a GPT2Model's
#           whose names lack "transformer.", as the Hub's gpt2; and the file into --pp 2 stages) gives
#           transformers' logits within 1e-5
#   export  trained a few steps on 2 ranks (FSDP from that GPT-2; --tp 2 and --pp 2 from it too; DDP
#           from scratch with the exact GELU), --export's directory loads with
#           GPT2LMHeadModel.from_pretrained, which gives train_gpt's logits within 1e-5
#   faults  a config option train_gpt lacks, another model type, a missing tensor, a conflicting
#           flag: exit code 1 and a message naming it, nothing trained
# Usage: gpt2_interop.sh CASE CPPRUN TRAIN_GPT PYTHON. Skips (77) without a python with transformers.
set -u
case_name=$1 cpprun=$2 gpt=$3 python=${4:-}
here=$(dirname "$0")
# shellcheck source=../interop_setup.sh
. "$here/../interop_setup.sh"
interop_setup "$python" torch safetensors transformers
tmp=$dir
fail() { echo "FAIL: $*"; echo "--- output:"; cat "$tmp/out" 2>/dev/null; exit 1; }
# py ARGS...: gpt2_interop.py ARGS (240 s at most), its output shown; fails unless it exits 0.
py() {
  local rc=0
  timeout 240 "$python" "$here/gpt2_interop.py" "$@" >"$tmp/py_out" 2>&1 || rc=$?
  [ $rc -eq 0 ] || { cat "$tmp/py_out"; fail "exit code $rc from: gpt2_interop.py $*"; }
  grep -v "Writing model shards" "$tmp/py_out"
}
ids=5,17,3,99,42,0,127,64,8,33,12,70  # token ids (vocab 128)

# run PROGRAM ARGS...: runs it (output in $tmp/out, 240 s at most), fails unless it exits 0.
run() {
  timeout 240 "$@" >"$tmp/out" 2>&1 || fail "exit code $? from: $*"
  cat "$tmp/out"
}
# compare CHECK...: each CHECK four words, same|differs DIR IDS LOGITS: transformers'
# from_pretrained(DIR) gives LOGITS' values for IDS within 1e-5 (same), or does not (differs). One
# Python process for all of them (importing transformers costs seconds); each failure is named.
compare() {
  out=$(timeout 240 "$python" "$here/gpt2_interop.py" compare "$@" 2>&1)
  rc=$?
  echo "$out"
  [ $rc -eq 0 ] || fail "transformers' logits and train_gpt's disagree (the FAIL lines above)"
}

case $case_name in
init)
  py make single="$tmp/single" sharded="$tmp/sharded" base="$tmp/base"
  checks=()
  for layout in single sharded base; do
    run "$gpt" --init-from "$tmp/$layout" --steps 0 --sample 0 --logits-for "$ids" --logits-out "$tmp/$layout.txt"
    grep -qF "GPT-2 from $tmp/$layout" "$tmp/out" || fail "train_gpt does not say it started from $tmp/$layout"
    checks+=(same "$tmp/$layout" "$ids" "$tmp/$layout.txt")
  done
  # Cut into two pipeline stages, each rank loading its part into its stage (and the last the head's
  # copy of the token embedding, which the file holds once, from the first stage), gathered back for
  # the logits: from one file; from the sharded directory into a deferred model (each rank
  # materialises only its stage); from a GPT2Model's file (no "transformer." in its names).
  for run_args in "single" "sharded --deferred-init on" "base"; do
    read -r layout more <<<"$run_args"
    # shellcheck disable=SC2086  # $more: the flags, split
    run "$cpprun" --standalone --nproc_per_node=2 "$gpt" --pp 2 --init-from "$tmp/$layout" $more --steps 0 --sample 0 \
        --logits-for "$ids" --logits-out "$tmp/pp_$layout.txt"
    checks+=(same "$tmp/$layout" "$ids" "$tmp/pp_$layout.txt")
  done
  compare "${checks[@]}"
  echo "PASS: transformers' GPT-2 in train_gpt, one file, sharded, a GPT2Model's, and in --pp 2 stages (each)"
  ;;
export)
  py make single="$tmp/hf"
  run "$cpprun" --standalone --nproc_per_node=2 "$gpt" --mode fsdp --stage 2 --init-from "$tmp/hf" --steps 5 \
      --batch 4 --block 32 --sample 0 --export "$tmp/fsdp" --logits-for "$ids" --logits-out "$tmp/fsdp.txt"
  grep -qE "exported to $tmp/fsdp" "$tmp/out" || fail "train_gpt did not say it exported"
  # Trained it has changed: the export is not the start again (differs).
  checks=(same "$tmp/fsdp" "$ids" "$tmp/fsdp.txt" differs "$tmp/hf" "$ids" "$tmp/fsdp.txt")
  # Tensor parallel (--tp 2): the GPT-2 is cut into each rank's heads and MLP units, and gathered
  # back whole for the export.
  run "$cpprun" --standalone --nproc_per_node=2 "$gpt" --tp 2 --init-from "$tmp/hf" --steps 5 \
      --batch 4 --block 32 --sample 0 --export "$tmp/tp" --logits-for "$ids" --logits-out "$tmp/tp.txt"
  checks+=(same "$tmp/tp" "$ids" "$tmp/tp.txt")
  # Pipeline parallel (--pp 2): each rank's stage starts from its part of the GPT-2 and the stages
  # export it under GPT-2's names.
  run "$cpprun" --standalone --nproc_per_node=2 "$gpt" --pp 2 --init-from "$tmp/hf" --steps 5 \
      --batch 4 --block 32 --sample 0 --export "$tmp/pp" --logits-for "$ids" --logits-out "$tmp/pp.txt"
  checks+=(same "$tmp/pp" "$ids" "$tmp/pp.txt")
  # From scratch under DDP, with PyTorch's exact GELU (config.json says "gelu").
  run "$cpprun" --standalone --nproc_per_node=2 "$gpt" --mode ddp --layers 2 --embed 32 --heads 2 --block 16 \
      --steps 5 --batch 4 --sample 0 --export "$tmp/ddp" --logits-for 1,2,3,4,5,6 --logits-out "$tmp/ddp.txt"
  grep -qF '"activation_function": "gelu"' "$tmp/ddp/config.json" || fail "the DDP export's config.json does not say gelu"
  checks+=(same "$tmp/ddp" "1,2,3,4,5,6" "$tmp/ddp.txt")
  compare "${checks[@]}"
  echo "PASS: train_gpt's exports load in transformers, FSDP, --tp 2, --pp 2 and DDP"
  ;;
faults)
  py faults "$tmp"
  # expect PATTERN ARGS...: train_gpt ARGS exits 1 (not an abort) naming PATTERN, before any step.
  expect() {
    pattern=$1
    shift
    timeout 240 "$gpt" --steps 2 --sample 0 "$@" >"$tmp/out" 2>&1
    rc=$?
    [ $rc -eq 1 ] || fail "exit code $rc (expected 1) from: train_gpt $*"
    grep -qF -- "$pattern" "$tmp/out" || fail "no '$pattern' in the output of: train_gpt $*"
    ! grep -q "^step\|first loss" "$tmp/out" || fail "train_gpt $* trained"
    echo "ok: train_gpt $* -> 1, '$pattern'"
  }
  expect '"scale_attn_by_inverse_layer_idx": true, which train_gpt does not implement' --init-from "$tmp/inverse_layer_idx"
  expect '"activation_function" to "relu", which train_gpt does not implement' --init-from "$tmp/relu"
  expect '"model_type": "llama"; train_gpt loads GPT-2' --init-from "$tmp/not_gpt2"
  expect 'missing: transformer.h.1.mlp.c_fc.weight' --init-from "$tmp/missing_tensor"
  expect "cannot read $tmp/none/config.json" --init-from "$tmp/none"
  expect "--layers 3 conflicts with --init-from $tmp/good/config.json's \"n_layer\": 2" --init-from "$tmp/good" --layers 3
  expect "--layer-norm-eps conflicts with --init-from $tmp/good/config.json's \"layer_norm_epsilon\"" \
    --init-from "$tmp/good" --layer-norm-eps 1e-3
  expect "--block 64 exceeds --init-from $tmp/good/config.json's \"n_positions\": 32" --init-from "$tmp/good" --block 64
  expect "--logits-for: token id 128 is outside the vocabulary" --init-from "$tmp/good" --logits-for 1,128 --logits-out "$tmp/x"
  # A config.json that is not the weights' cannot size the model without bound (1e6 layers made
  # train_gpt allocate 5.7 GB before std::bad_alloc), nor hide a bare std::stoll/std::stod.
  edited_config() {  # edited_config NAME SED: $tmp/good with config.json edited
    rm -rf "${tmp:?}/$1"
    cp -r "$tmp/good" "$tmp/$1"
    sed -i "$2" "$tmp/$1/config.json"
    ! cmp -s "$tmp/good/config.json" "$tmp/$1/config.json" || fail "$1: the edit '$2' changed nothing"
  }
  edited_config layers_1e6 's/"n_layer": 2/"n_layer": 1000000/'
  expect "config.json and the weights beside it are not one model's" --init-from "$tmp/layers_1e6"
  edited_config layers_20_digits 's/"n_layer": 2/"n_layer": 99999999999999999999/'
  expect 'sets "n_layer" to 99999999999999999999, far beyond any GPT-2' --init-from "$tmp/layers_20_digits"
  edited_config eps_1e999 's/"layer_norm_epsilon": [0-9.e-]*/"layer_norm_epsilon": 1e999/'
  expect 'sets "layer_norm_epsilon" to 1e999, not a finite number from 0 up' --init-from "$tmp/eps_1e999"
  # Not a regular file: a FIFO blocked the read forever.
  rm -rf "$tmp/fifo_config" && cp -r "$tmp/good" "$tmp/fifo_config" && rm "$tmp/fifo_config/config.json"
  mkfifo "$tmp/fifo_config/config.json"
  expect "config.json: it is a FIFO (named pipe), not a regular file" --init-from "$tmp/fifo_config"
  # A float16 model: one line saying what to do (was: a line a tensor, "file float16, module float32").
  expect 'config.json says the weights are float16; train_gpt loads float32 weights' --init-from "$tmp/fp16"
  # transformers' older pytorch_model.bin is read as from_pretrained reads it: the same logits as
  # the same weights in model.safetensors.
  for layout in good bin; do
    timeout 240 "$gpt" --init-from "$tmp/$layout" --steps 0 --sample 0 --logits-for 1,2,3 \
      --logits-out "$tmp/$layout.logits" >"$tmp/out" 2>&1 || fail "train_gpt --init-from $tmp/$layout: $(cat "$tmp/out")"
  done
  cmp -s "$tmp/good.logits" "$tmp/bin.logits" || fail "pytorch_model.bin gave other logits than model.safetensors"
  echo "ok: train_gpt --init-from a directory of pytorch_model.bin -> the model.safetensors copy's logits"
  echo "PASS: train_gpt refuses what it cannot load, naming it"
  ;;
*) echo "FAIL: unknown case $case_name"; exit 1 ;;
esac
