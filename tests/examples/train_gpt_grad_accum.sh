#!/usr/bin/env bash
# train_gpt --grad-accum K against one pass of the same windows, in float64: --batch 4 --grad-accum 2
# takes the 8 windows --batch 8 takes, in the same order, and must train to the same per-step
# losses and held-out loss within 1e-10 (only the summation order differs: two means of 4 windows
# halved and added, against one mean of 8; measured 1.8e-15). Under DDP and ZeRO-2/3 on 2 ranks
# the first pass runs under no_sync: the wrapper's deferred reduction must still sum both passes'
# gradients. --loss fused (cpprun::fused_cross_entropy) trains as --loss aten (F::cross_entropy),
# alone and under ZeRO-3 with 2 passes a step. And the options --cuda-graph cannot go with are
# refused by name (it needs a GPU to run; gpu_check's compare stage runs it).
# Usage: train_gpt_grad_accum.sh CPPRUN TRAIN_GPT
set -u
cpprun=$1 gpt=$2
small=(--dtype float64 --layers 2 --embed 32 --heads 4 --block 16 --steps 6 --log-every 1 --sample 0
       --straggler-every 0)
# shellcheck source=train_gpt_runs.sh
. "$(dirname "$0")/train_gpt_runs.sh"  # $tmp, fail, run, same (within $tolerance, 1e-10), refused
# agree A B: runs A and B trained alike: all 6 step losses and the held-out loss within 1e-10.
agree() {
  [ "$(wc -l <"$tmp/$1.loss")" = 6 ] && [ "$(wc -l <"$tmp/$2.loss")" = 6 ] || fail "$1 or $2 did not log 6 step losses"
  echo -n "$2 vs $1, step losses: " && same "$tmp/$1.loss" "$tmp/$2.loss" "step losses of $2"
  echo -n "$2 vs $1, held-out loss: " && same "$tmp/$1.val" "$tmp/$2.val" "held-out loss of $2"
}

run none.whole 1 --mode none --batch 8
run none.accum 1 --mode none --batch 4 --grad-accum 2
agree none.whole none.accum
grep -q "1 ranks x 4 windows of 16, 2 passes a step" "$tmp/out" || fail "the run did not say it takes 2 passes a step"
run none.accum4 1 --mode none --batch 2 --grad-accum 4
agree none.whole none.accum4
for mode in "ddp" "fsdp --stage 2" "fsdp --stage 3"; do
  name=${mode// /}; name=${name//--stage/}
  # shellcheck disable=SC2086  # $mode is a list of flags
  run "$name.whole" 2 --mode $mode --batch 4
  # shellcheck disable=SC2086
  run "$name.accum" 2 --mode $mode --batch 2 --grad-accum 2
  agree "$name.whole" "$name.accum"
done
agree none.whole ddp.whole  # and 2 ranks of 4 windows train as 1 of 8
# The fused loss's scaling of the gradient (1 / rows, the passes' 1/2) as ATen's.
run none.fused 1 --mode none --batch 8 --loss fused
agree none.whole none.fused
run fsdp3.accum.fused 2 --mode fsdp --stage 3 --batch 2 --grad-accum 2 --loss fused
agree fsdp3.whole fsdp3.accum.fused

refused 1 "--cuda-graph does not go with --mode ddp" --cuda-graph --mode ddp
refused 1 "--cuda-graph does not go with --optimizer libtorch" --cuda-graph --mode none --optimizer libtorch
refused 1 "--cuda-graph does not go with --amp fp16" --cuda-graph --mode none --amp fp16
refused 1 "--cuda-graph needs a GPU" --cuda-graph --mode none
refused 1 "--grad-accum must be at least 1" --grad-accum 0
refused 1 "--optimizer must be fused or libtorch" --optimizer sgd
refused 1 "--attention must be sdpa or math" --attention flash
refused 1 "--loss must be auto, fused or aten" --loss softmax
echo "PASS: --grad-accum trains as one pass of the same windows; --cuda-graph's conflicts refused"
