#!/usr/bin/env bash
# train_gpt --stop-after K --save DIR, then --resume DIR, against one uninterrupted run of the same
# --steps, in float64:
#   same      DDP on 2 ranks saves at step 4 of 8, DDP on 2 ranks resumes; again with a text so
#             short that the save falls in the data's second epoch (step 8 of 12)
#   layouts   DDP on 2 ranks saves; ZeRO-3 (--mode fsdp --stage 3) on 2 ranks resumes, and ZeRO-1
#             on 4 ranks (--batch 2: the same 8 windows a step)
#   fewer     ZeRO-2 on 2 ranks saves (--batch 4 each); DDP on 1 rank and --mode none resume
#             (--batch 8: the same 8 windows a step, which 1 rank now takes alone); across an
#             epoch's end, DDP's save resumed on 4 ranks and, where an epoch is a step shorter, on 1
#   tp        ZeRO-3 x --tp 2 on 4 ranks saves; DDP on 2 ranks (whole blocks) and ZeRO-1 x --tp 2 on
#             4 resume; and DDP's save of 2 ranks resumes under --tp 2 on 2 (one replica, --batch 8)
#   pp        --pp 2 on 2 ranks (one pipeline, --batch 8) saves; DDP on 2 ranks and --pp 2 in two
#             ZeRO-3 pipelines on 4 (--batch 4 each) resume; and DDP's save resumes in interleaved
#             stages (--pp 2 --pp-schedule interleaved-1f1b: 4 stages, cut unlike the saver's 2)
#   faults    what cannot resume is refused by name before any step (exit 1)
#   init      a run started from a GPT-2 (--init-from: a --dtype float64 run's export, whose
#             vocabulary and positions are not the text's characters and --block) saves and resumes;
#             --export into a sharded save's directory leaves one model there
# Each resumed run must print the uninterrupted run's held-out loss and train its steps 5-8 with
# its losses (--losses-out, %.17g).
# Usage: train_gpt_resume.sh CASE CPPRUN TRAIN_GPT
#
# The held-out loss is printed to 12 decimals in float64, each step's loss to 17 digits. Under the
# save's own layout the resumed run computes what the uninterrupted one does, so it must print the
# same digits (tolerance 0). Under another layout or rank count only the summation order may
# differ: tolerance 1e-10 (measured: DDP's save under ZeRO-3 on 2 ranks, equal in every digit; on
# 1 rank or 4 instead of 2, step losses 4.4e-16 apart, one mean of 8 windows or four of 2 against
# two of 4, and the held-out loss equal in its 12 decimals). Resumed without the data position
# (the sampler back at its start) the held-out loss moves by 8.3e-3, without the epoch (the save's
# position in epoch 0's order) by 8.2e-3, without the optimizer state by 2.2e-2, without the model
# by 0.14.
set -u
case_name=$1 cpprun=$2 gpt=$3
small=(--dtype float64 --layers 2 --embed 32 --heads 4 --block 16 --steps 8 --log-every 1 --sample 0
       --straggler-every 0)
# shellcheck source=train_gpt_runs.sh
. "$(dirname "$0")/train_gpt_runs.sh"  # $tmp, fail, run, same (within $tolerance, 1e-10), refused

# resumed REFERENCE NAME [K N]: NAME (resumed at step K, default 4, of N, default 8) ends as
# REFERENCE (uninterrupted) did.
resumed() {
  local k=${3:-4} n=${4:-8}
  grep -q "resumed from $tmp/ck at step $k " "$tmp/$2.out" || fail "$2 did not say it resumed at step $k"
  tail -n $((n - k)) "$tmp/$1.loss" >"$tmp/$1.tail"
  echo -n "$2 vs $1, held-out loss: " && same "$tmp/$1.val" "$tmp/$2.val" "held-out loss of $2"
  echo -n "$2 vs $1, losses of steps $((k + 1))-$n: " && same "$tmp/$1.tail" "$tmp/$2.loss" "step losses of $2"
}
# saved NAME [K N]: NAME stopped after step K (default 4) of N (default 8) and left a whole
# checkpoint in $tmp/ck.
saved() {
  local k=${2:-4} n=${3:-8}
  grep -qF "saved step $k of $n to $tmp/ck" "$tmp/$1.out" || fail "$1 did not say it saved step $k"
  ! grep -q "^step +$((k + 1))/" "$tmp/$1.out" || fail "$1 went on after --stop-after $k"
  for f in trainer.json model.safetensors.index.json optimizer.safetensors.index.json; do
    [ -f "$tmp/ck/$f" ] || fail "$1 left no $f in its checkpoint"
  done
  grep -q "\"step\": $k, \"steps\": $n" "$tmp/ck/trainer.json" || fail "trainer.json: $(cat "$tmp/ck/trainer.json")"
}

case $case_name in
same)
  tolerance=0
  run whole 2 --batch 4
  run first 2 --batch 4 --stop-after 4 --save "$tmp/ck"
  saved first
  run second 2 --batch 4 --resume "$tmp/ck"
  resumed whole second
  # Across an epoch: 240 characters give 199 windows, 100 a rank (one repeated), 6 steps of 16 an
  # epoch; saved at step 8, in epoch 1 with 2 x 2 x 16 of its windows taken.
  head -c 240 /usr/share/common-licenses/GPL-3 >"$tmp/short.txt"
  short=(--text "$tmp/short.txt" --batch 16 --steps 12)
  rm -rf "$tmp/ck"
  run short_whole 2 "${short[@]}"
  run short_first 2 "${short[@]}" --stop-after 8 --save "$tmp/ck"
  saved short_first 8 12
  grep -q '"epoch": 1, "epoch_windows": 64' "$tmp/ck/trainer.json" || fail "not in epoch 1: $(cat "$tmp/ck/trainer.json")"
  run short_second 2 "${short[@]}" --resume "$tmp/ck"
  resumed short_whole short_second 8 12
  echo "PASS: DDP resumed on 2 ranks ends as the uninterrupted run, within an epoch and in the next"
  ;;
layouts)
  run whole 2 --batch 4
  run first 2 --batch 4 --stop-after 4 --save "$tmp/ck"
  saved first
  run zero3 2 --batch 4 --mode fsdp --stage 3 --resume "$tmp/ck"
  grep -q "(saved by --mode ddp, 2 ranks)" "$tmp/zero3.out" || fail "the resumed run did not say what saved it"
  resumed whole zero3
  run zero1_4 4 --batch 2 --mode fsdp --stage 1 --resume "$tmp/ck"
  resumed whole zero1_4
  echo "PASS: DDP's checkpoint of 2 ranks resumed under ZeRO-3 on 2 and ZeRO-1 on 4 ends as the uninterrupted DDP run"
  ;;
fewer)
  run whole 2 --batch 4 --mode fsdp --stage 2
  run first 2 --batch 4 --mode fsdp --stage 2 --stop-after 4 --save "$tmp/ck"
  saved first
  run ddp1 1 --batch 8 --mode ddp --resume "$tmp/ck"
  resumed whole ddp1
  run none1 1 --batch 8 --mode none --resume "$tmp/ck"
  resumed whole none1
  # Across an epoch's end: 240 characters give 199 windows; on 2 ranks of 4 (and on 4 of 2) an
  # epoch is 25 steps, on 1 rank of 8 it is 24 (DistributedSampler pads to a multiple of the ranks):
  # saved at step 20 of 30, resumed on 4 the run is the uninterrupted one; on 1 it is to step 24,
  # then the order differs, and the run says so.
  head -c 240 /usr/share/common-licenses/GPL-3 >"$tmp/short.txt"
  short=(--text "$tmp/short.txt" --steps 30)
  rm -rf "$tmp/ck"
  run short_whole 2 "${short[@]}" --batch 4
  run short_first 2 "${short[@]}" --batch 4 --stop-after 20 --save "$tmp/ck"
  saved short_first 20 30
  grep -q '"epoch_steps": 25,' "$tmp/ck/trainer.json" || fail "trainer.json: $(cat "$tmp/ck/trainer.json")"
  run short_four 4 "${short[@]}" --batch 2 --resume "$tmp/ck"
  ! grep -q "note: an epoch is" "$tmp/short_four.out" || fail "a note on 4 ranks, whose epochs are the saved run's"
  resumed short_whole short_four 20 30
  run short_one 1 "${short[@]}" --batch 8 --resume "$tmp/ck"
  grep -q "note: an epoch is 24 steps here (199 windows over 1 data-parallel ranks, padded to a multiple of them as" \
    "$tmp/short_one.out" || fail "no note on 1 rank, whose epochs are 24 steps: $(grep note "$tmp/short_one.out")"
  grep -q "25 in the saved run: the data goes on as the saved run's to the end of epoch 0, in another order after it" \
    "$tmp/short_one.out" || fail "the note does not say where the order parts: $(grep note "$tmp/short_one.out")"
  sed -n 21,24p "$tmp/short_whole.loss" >"$tmp/short_whole.21_24"
  head -n 4 "$tmp/short_one.loss" >"$tmp/short_one.21_24"
  echo -n "short_one vs short_whole, losses of steps 21-24: " &&
    same "$tmp/short_whole.21_24" "$tmp/short_one.21_24" "steps 21-24 on 1 rank"
  echo "PASS: ZeRO-2's checkpoint of 2 ranks resumed on 1 (DDP, and no wrapper) ends as the uninterrupted run;" \
    "across an epoch's end on 4 ranks too, and on 1 to the epoch's end, with a note"
  ;;
tp)
  run whole 4 --batch 4 --tp 2 --mode fsdp --stage 3
  run first 4 --batch 4 --tp 2 --mode fsdp --stage 3 --stop-after 4 --save "$tmp/ck"
  saved first
  run ddp2 2 --batch 4 --mode ddp --resume "$tmp/ck"
  resumed whole ddp2
  run tp_zero1 4 --batch 4 --tp 2 --mode fsdp --stage 1 --resume "$tmp/ck"
  resumed whole tp_zero1
  rm -rf "$tmp/ck"
  run ddp_whole 2 --batch 4
  run ddp_first 2 --batch 4 --stop-after 4 --save "$tmp/ck"
  saved ddp_first
  run tp_one 2 --batch 8 --tp 2 --mode ddp --resume "$tmp/ck"
  resumed ddp_whole tp_one
  echo "PASS: ZeRO-3 x --tp 2's checkpoint resumes under DDP and ZeRO-1 x --tp 2, DDP's under --tp 2"
  ;;
pp)
  run whole 2 --batch 4
  run first 2 --batch 8 --pp 2 --stop-after 4 --save "$tmp/ck"
  saved first
  grep -q '"transformer.h.1.attn.c_attn.weight"' "$tmp/ck/model.safetensors.index.json" ||
    fail "the stages' checkpoint is not under GPT-2's names: $(head -c 600 "$tmp/ck/model.safetensors.index.json")"
  run ddp2 2 --batch 4 --resume "$tmp/ck"
  grep -q "(saved by --mode ddp --pp 2 (1f1b), 2 ranks)" "$tmp/ddp2.out" ||
    fail "the resumed run did not say what saved it"
  resumed whole ddp2
  run pp_zero3 4 --batch 4 --pp 2 --mode fsdp --stage 3 --resume "$tmp/ck"
  resumed whole pp_zero3
  rm -rf "$tmp/ck"
  run ddp_first 2 --batch 4 --stop-after 4 --save "$tmp/ck"
  saved ddp_first
  run interleaved 2 --batch 8 --pp 2 --pp-schedule interleaved-1f1b --resume "$tmp/ck"
  resumed whole interleaved
  # {pp 2, tp 2}: the second stage ([ln_f..head]) holds no tensor-parallel module, whole on each
  # rank of its tensor-parallel group (PipelineStage::set_tensor_parallel_group); it once refused.
  rm -rf "$tmp/ck"
  run pptp_first 4 --batch 8 --pp 2 --tp 2 --stop-after 4 --save "$tmp/ck"
  saved pptp_first
  run pptp_ddp2 2 --batch 4 --resume "$tmp/ck"
  resumed whole pptp_ddp2
  run pptp_again 4 --batch 8 --pp 2 --tp 2 --resume "$tmp/ck"
  resumed whole pptp_again
  echo "PASS: --pp's checkpoint resumes under DDP and in ZeRO-3 pipelines, DDP's in interleaved stages," \
    "{pp 2, tp 2}'s under DDP and in {pp 2, tp 2}"
  ;;
init)
  # The GPT-2: 32 positions and the default text's characters; its config.json says float64.
  run donor 1 --batch 4 --steps 2 --block 32 --export "$tmp/gpt2"
  grep -q '"dtype": "float64"' "$tmp/gpt2/config.json" ||
    fail "a float64 export's config.json: $(cat "$tmp/gpt2/config.json")"
  # A text of fewer characters than the GPT-2's vocabulary, windows of 16 of its 32 positions. The
  # resumed run built the text's model (its characters, --block's positions), which the checkpoint
  # refused; trainer.json records the model's now.
  head -c 6000 /usr/share/common-licenses/GPL-3 | tr -cd 'a-z \n' >"$tmp/lower.txt"
  lower=(--text "$tmp/lower.txt" --batch 4)
  run whole 2 "${lower[@]}" --init-from "$tmp/gpt2"
  run first 2 "${lower[@]}" --init-from "$tmp/gpt2" --stop-after 4 --save "$tmp/ck"
  saved first
  grep -q '"positions": 32' "$tmp/ck/trainer.json" ||
    fail "trainer.json has not the model's positions: $(cat "$tmp/ck/trainer.json")"
  run second 2 "${lower[@]}" --resume "$tmp/ck"
  resumed whole second
  refused 1 "--init-from $tmp/gpt2: config.json says the weights are float64" --init-from "$tmp/gpt2" --dtype float32
  # --export into the save's directory: the save's index and shards go (as save_pretrained cleans a
  # folder), where the index beside the new model.safetensors made a directory --init-from refused.
  cp -r "$tmp/ck" "$tmp/both"
  run over 1 --batch 4 --steps 2 --block 32 --export "$tmp/both"
  [ ! -e "$tmp/both/model.safetensors.index.json" ] || fail "--export left the earlier index: $(ls "$tmp/both")"
  ! ls "$tmp/both" | grep -q '^model-.*-of-.*\.safetensors$' ||
    fail "--export left the earlier shards: $(ls "$tmp/both")"
  run reloaded 1 --batch 4 --steps 2 --block 32 --init-from "$tmp/both"
  echo "PASS: an --init-from run resumes as the uninterrupted run; a float64 export loads back; --export" \
    "cleans a sharded folder"
  ;;
faults)
  # expect PATTERN NPROC ARGS...: exit code 1 naming PATTERN, before any step (train_gpt_runs.sh's
  # refused, with the runs' 240 s).
  expect() {
    local pattern=$1 nproc=$2
    shift 2
    refused_within=240 refused "$nproc" "$pattern" "$@"
  }
  expect "--stop-after 9 is beyond --steps 8" 1 --stop-after 9 --save "$tmp/x"
  expect "--stop-after 4 without --save would stop and keep nothing" 1 --stop-after 4
  expect "--stop-after must be at least 1, got 0" 1 --stop-after 0 --save "$tmp/x"
  expect "--resume $tmp/none: no such directory" 2 --resume "$tmp/none"
  expect "--export $tmp/x is --save's directory" 1 --save "$tmp/x/" --export "$tmp/x"
  run first 2 --batch 4 --stop-after 4 --save "$tmp/ck"
  saved first
  # Another --heads or --gelu: the same tensors' shapes, another model (trainer.json's "model").
  expect "the checkpoint's model is --layers 2 --embed 32 --heads 4 --gelu exact --layer-norm-eps 1e-05 (saved by" 2 \
    --resume "$tmp/ck" --heads 8
  expect "this run's --layers 2 --embed 32 --heads 4 --gelu tanh" 2 --resume "$tmp/ck" --gelu tanh
  expect "this run's --layers 2 --embed 32 --heads 4 --gelu exact --layer-norm-eps 1e-06" 2 --resume "$tmp/ck" \
    --layer-norm-eps 1e-6
  expect "--export $tmp/ck is --resume's directory" 1 --resume "$tmp/ck" --export "$tmp/ck"
  # A save that fails part-way (a 64 KiB file-size limit ends a rank as it writes the model) keeps
  # the earlier save: its trainer.json stays until a new one replaces it, and --resume continues it.
  cp -r "$tmp/ck" "$tmp/ck_before"
  (ulimit -f 64; timeout 240 "$cpprun" --standalone --nproc_per_node=2 "$gpt" "${small[@]}" --batch 4 \
    --resume "$tmp/ck" --stop-after 6 --save "$tmp/ck" >"$tmp/out" 2>&1) && fail "a save under ulimit -f 64 succeeded"
  grep -q "^\[rank0\]: step *6/" "$tmp/out" || fail "the run under ulimit -f 64 did not reach its save: $(tail -5 "$tmp/out")"
  cmp "$tmp/ck/trainer.json" "$tmp/ck_before/trainer.json" || fail "the failed save changed or removed trainer.json"
  # trainer.json is part of the save (Note [A trainer's files in the save]): when it cannot be
  # written (a directory where its temporary file goes), the save fails and the model's and the
  # optimizer's earlier files come back with it, where they used to stay new beside the old one.
  mkdir -p "$tmp/ck/trainer.json.tmp/in_the_way"
  timeout 240 "$cpprun" --standalone --nproc_per_node=2 "$gpt" "${small[@]}" --batch 4 \
    --resume "$tmp/ck" --stop-after 6 --save "$tmp/ck" >"$tmp/out" 2>&1 &&
    fail "a save with trainer.json blocked succeeded"
  grep -q "^\[rank0\]: step *6/" "$tmp/out" ||
    fail "the run with trainer.json blocked did not reach its save: $(tail -5 "$tmp/out")"
  grep -q "trainer.json.tmp" "$tmp/out" || fail "the failed save did not name trainer.json: $(tail -5 "$tmp/out")"
  rm -r "$tmp/ck/trainer.json.tmp"
  for f in "$tmp/ck_before"/*; do
    cmp -s "$f" "$tmp/ck/${f##*/}" || fail "the save that failed on trainer.json changed ${f##*/}"
  done
  run after_failed_save 2 --batch 4 --resume "$tmp/ck"
  grep -q "resumed from $tmp/ck at step 4 " "$tmp/after_failed_save.out" || fail "the earlier save did not resume"
  expect "the checkpoint is at step 4, so --steps 4 leaves nothing to train" 2 --resume "$tmp/ck" --steps 4
  expect "--stop-after 3 is not after the checkpoint's step 4" 2 --resume "$tmp/ck" --stop-after 3 --save "$tmp/x"
  expect "the checkpoint is in --dtype float64 (saved by --mode ddp, 2 ranks), this run in float32" 2 \
    --resume "$tmp/ck" --dtype float32
  expect "the checkpoint was trained on" 2 --resume "$tmp/ck" --block 8
  expect "--resume $tmp/ck and --init-from" 1 --resume "$tmp/ck" --init-from "$tmp/ck"
  # 2 ranks took 4 x 4 windows a step for 4 steps: 32, which 3 ranks cannot share out.
  expect "the checkpoint stopped 32 windows into its epoch, which 3 data-parallel ranks cannot share out evenly" 3 \
    --resume "$tmp/ck"
  # Another model: trainer.json's "model" says so; without it (a trainer.json written before it was
  # recorded, which still resumes), the strict load names what differs.
  expect "this run's --layers 2 --embed 64 --heads 4" 2 --resume "$tmp/ck" --embed 64
  cp -r "$tmp/ck" "$tmp/older" && sed -i 's/, "model": .*}/}/' "$tmp/older/trainer.json"
  ! grep -q '"model"\|"epoch_steps"' "$tmp/older/trainer.json" || fail "not an older trainer.json: $(cat "$tmp/older/trainer.json")"
  expect "transformer.h.0.attn.c_attn.weight" 2 --resume "$tmp/older" --embed 64
  run older 2 --batch 4 --resume "$tmp/older"
  # The model's files without trainer.json (a save cut short), and trainer.json without the model's files.
  cp -r "$tmp/ck" "$tmp/cut" && rm "$tmp/cut/trainer.json"
  expect "--resume $tmp/cut: no trainer.json there" 2 --resume "$tmp/cut"
  cp -r "$tmp/ck" "$tmp/lost" && rm "$tmp/lost"/model*
  expect "$tmp/lost/ holds neither model.safetensors.index.json nor model.safetensors" 2 --resume "$tmp/lost"
  cp -r "$tmp/ck" "$tmp/no_optimizer" && rm "$tmp/no_optimizer"/optimizer*
  expect "$tmp/no_optimizer/ holds no optimizer.safetensors.index.json" 2 --resume "$tmp/no_optimizer"
  # Not regular files, on every rank at once (a FIFO blocked rank 0's read forever while the other
  # waited for its bytes; a link to /dev/zero grew without bound).
  cp -r "$tmp/ck" "$tmp/fifo_trainer" && rm "$tmp/fifo_trainer/trainer.json" && mkfifo "$tmp/fifo_trainer/trainer.json"
  expect "trainer.json: it is a FIFO (named pipe), not a regular file" 2 --resume "$tmp/fifo_trainer"
  cp -r "$tmp/ck" "$tmp/zero_shard"
  shard=$(ls "$tmp/zero_shard"/model-*.safetensors | head -1)
  rm "$shard" && ln -s /dev/zero "$shard"
  expect "$(basename "$shard"): it is a character device, not a regular file" 2 --resume "$tmp/zero_shard"
  # trainer.json from another save beside this save's model: the weights would resume at its step.
  run other_first 2 --batch 4 --stop-after 2 --save "$tmp/ck_other"
  cp -r "$tmp/ck" "$tmp/other_trainer" && cp "$tmp/ck_other/trainer.json" "$tmp/other_trainer/trainer.json"
  expect "trainer.json is from another save" 2 --resume "$tmp/other_trainer"
  # Its step edited (trainer.json has no checksum): the optimizer's state and the data would
  # resume at different steps.
  cp -r "$tmp/ck" "$tmp/edited_step" && sed -i -E 's/"step": [0-9]+,/"step": 1,/' "$tmp/edited_step/trainer.json"
  expect "trainer.json says step 1 but the model beside it was saved at step" 2 --resume "$tmp/edited_step"
  echo "PASS: train_gpt refuses what cannot resume, naming it"
  ;;
*) echo "FAIL: unknown case $case_name"; exit 1 ;;
esac
