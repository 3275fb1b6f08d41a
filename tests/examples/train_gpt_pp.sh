#!/usr/bin/env bash
# train_gpt --pp N against one rank training the whole model on the same windows, in float64: each
# schedule (1F1B, GPipe, Interleaved 1F1B and LoopedBFS with 2 stages a rank, zero bubble), 2 and 3 stages, activation
# checkpointing inside the stages, must train to the same 6 step losses and held-out loss within
# 1e-10 (only the summation order differs: the micro-batches' means averaged against one mean; the
# head tied to the embedding lives on the first and last stages, its gradients summed between them);
# two pipelines data-parallel (4 ranks, {dp 2, pp 2}: DDP, FSDP ZeRO-3 and ZeRO-2) against one rank
# on both pipelines' windows; one pipeline whose stages are tensor-parallel ({pp 2, tp 2}); and all
# three at 8 ranks ({dp 2, pp 2, tp 2}, ZeRO-3).
# --amp fp16 (float32) against one rank with --amp fp16 within 1e-3.
# And what --pp does not do yet, or cannot, is refused by name.
# Usage: train_gpt_pp.sh CPPRUN TRAIN_GPT
set -u
cpprun=$1 gpt=$2
small=(--dtype float64 --layers 2 --embed 32 --heads 4 --block 16 --steps 6 --log-every 1 --sample 0
       --straggler-every 0 --batch 8)
# shellcheck source=train_gpt_runs.sh
. "$(dirname "$0")/train_gpt_runs.sh"  # $tmp, fail, run, same (within $tolerance, 1e-10), refused
agree() {
  [ "$(wc -l <"$tmp/$1.loss")" = 6 ] && [ "$(wc -l <"$tmp/$2.loss")" = 6 ] || fail "$1 or $2 did not log 6 step losses"
  echo -n "$2 vs $1, step losses: " && same "$tmp/$1.loss" "$tmp/$2.loss" "step losses of $2"
  echo -n "$2 vs $1, held-out loss: " && same "$tmp/$1.val" "$tmp/$2.val" "held-out loss of $2"
}

run whole 1 --mode none
run pp2.1f1b 2 --pp 2 --microbatches 4
grep -q "pipeline parallel: 2 stages over 2 ranks (1 a rank), 1f1b, 4 micro-batches of 2 windows" "$tmp/out" ||
  fail "the --pp run did not say how it is split"
agree whole pp2.1f1b
run pp2.gpipe 2 --pp 2 --pp-schedule gpipe --microbatches 2
agree whole pp2.gpipe
run pp2.interleaved 2 --pp 2 --pp-schedule interleaved-1f1b --microbatches 2
agree whole pp2.interleaved
run pp2.looped 2 --pp 2 --pp-schedule looped-bfs --microbatches 1  # fewer micro-batches than ranks
agree whole pp2.looped
run pp3.1f1b 3 --pp 3 --microbatches 8
agree whole pp3.1f1b
run pp3.zb 3 --pp 3 --pp-schedule zero-bubble --microbatches 4
agree whole pp3.zb
run whole.ckpt 1 --mode none --checkpoint-activations
run pp2.ckpt 2 --pp 2 --checkpoint-activations
agree whole.ckpt pp2.ckpt
run pp2.zb.ckpt 2 --pp 2 --pp-schedule zero-bubble --checkpoint-activations
agree whole.ckpt pp2.zb.ckpt
agree whole whole.ckpt
# --amp fp16 (float32 parameters: fp16 autocast casts float32 only): each micro-batch's loss scaled
# by the GradScaler, its overflow check agreed over every rank; as one rank with --amp fp16 within
# float32's rounding of the two summation orders (1e-3: measured 1.5e-5; with the loss left
# unscaled on purpose they differed by 3e-3 to 1e-2). The scaling itself is checked exactly, in
# float64, by dist.pipeline's GradScaler case.
run whole.fp16 1 --mode none --amp fp16 --dtype float32
run pp2.fp16 2 --pp 2 --amp fp16 --pp-schedule zero-bubble --dtype float32
tolerance=1e-3 agree whole.fp16 pp2.fp16
grep -q "fp16: 0 of 6 steps skipped for overflow, loss scale now 65536" "$tmp/out" ||
  fail "the --pp --amp fp16 run did not report its loss scale"
# Two pipelines of 2 stages, each on its 8 of the 16 windows a step, gradients averaged between
# them: as one rank on all 16.
run whole16 1 --mode none --batch 16
run dp2.pp2 4 --pp 2 --mode ddp --microbatches 4
grep -q "1f1b, 4 micro-batches of 2 windows, 2 pipelines (data parallel)" "$tmp/out" ||
  fail "the {dp 2, pp 2} run did not say it has 2 pipelines"
agree whole16 dp2.pp2
# The same two pipelines with each stage in FSDP over its copy in the other pipeline: ZeRO-3 under
# 1F1B, ZeRO-2 under zero bubble (the shards reduced once a step, the tied head's summed between the
# first and last stages), as one rank on all 16 windows.
run dp2.pp2.zero3 4 --pp 2 --mode fsdp --stage 3 --microbatches 4
grep -q "1f1b, 4 micro-batches of 2 windows, 2 pipelines (FSDP ZeRO-3 over them, units gathered once a step)" "$tmp/out" ||
  fail "the {dp 2, pp 2} FSDP run did not say its stages are sharded"
agree whole16 dp2.pp2.zero3
run dp2.pp2.zero2.zb 4 --pp 2 --mode fsdp --stage 2 --pp-schedule zero-bubble --microbatches 4
agree whole16 dp2.pp2.zero2.zb
run dp2.pp2.zero3.zb 4 --pp 2 --mode fsdp --stage 3 --pp-schedule zero-bubble --microbatches 4
agree whole16 dp2.pp2.zero3.zb
# Each stage's blocks split over 2 tensor-parallel ranks ({pp 2, tp 2}, one pipeline): 1F1B and
# zero bubble, as one rank on the same 8 windows.
run pp2.tp2 4 --pp 2 --tp 2 --microbatches 4
grep -q "tensor parallel: 1 x 2 ranks" "$tmp/out" || fail "the --pp 2 --tp 2 run did not say its blocks are split"
agree whole pp2.tp2
run pp2.tp2.zb 4 --pp 2 --tp 2 --pp-schedule zero-bubble --microbatches 4
agree whole pp2.tp2.zb
# All three: 8 ranks, {dp 2, pp 2, tp 2}, each stage's tensor-parallel shards in ZeRO-3 over the
# two pipelines, as one rank on all 16 windows.
run dp2.pp2.tp2.zero3 8 --pp 2 --tp 2 --mode fsdp --stage 3 --microbatches 4
grep -q "2 pipelines (FSDP ZeRO-3 over them, units gathered once a step)" "$tmp/out" || fail "the 3-d run did not say its stages are sharded"
agree whole16 dp2.pp2.tp2.zero3

refused 2 "--pp 2 x --tp 2 runs pipelines of 4 ranks (one stage a rank and tensor-parallel rank)" --pp 2 --tp 2
refused 1 "--pp does not go with --grad-accum" --pp 2 --grad-accum 2
refused 1 "--microbatches goes with --pp N" --microbatches 4
refused 1 "--batch 8 does not split into --microbatches 3" --pp 2 --microbatches 3
refused 1 "--pp-schedule must be gpipe, 1f1b, interleaved-1f1b, looped-bfs or zero-bubble" --pp 2 --pp-schedule zb
refused 1 "--pp 2 runs pipelines of 2 ranks (one stage a rank), data-parallel across them with --mode ddp or fsdp; this job has 1 ranks" --pp 2
refused 4 "this job has 4 ranks and --mode none (one pipeline)" --pp 2 --mode none
refused 2 "5 micro-batches is not a multiple of 2" --pp 2 --pp-schedule interleaved-1f1b --microbatches 5 --batch 10
echo "PASS: --pp trains as one rank under every schedule; what it cannot do is refused"
