#!/bin/sh
# Bad input and damaged files make the examples stop with a message naming the problem and exit
# code 1 (cpprun::record), never an abort (134) or a silent success; a damaged checkpoint is
# refused and the one before it used.
# usage: example_faults.sh CASE CPPRUN TRAIN_MNIST TRAIN_MLP TRAIN_GPT
#   CASE: options | mnist_files | checkpoints | full_disk | gpt_full_disk | under_cpprun
set -u
case_name=$1 cpprun=$2 mnist=$3 mlp=$4 gpt=$5
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*"; echo "--- output:"; cat "$tmp/out" 2>/dev/null; exit 1; }
# A small tmpfs (a full disk) needs root and a private mount namespace; without them the case
# is skipped (exit 77, counted as a skip).
needs_private_tmpfs() {
  if [ "$(id -u)" != 0 ] || ! unshare -m true 2>/dev/null; then
    echo "SKIP: needs root and unshare -m (a private mount namespace for a small tmpfs)"
    exit 77
  fi
}

# expect CODE PATTERN COMMAND...: runs COMMAND (stdout and stderr to $tmp/out, 120 s at most) and
# checks its exit code and that its output holds PATTERN (a fixed string).
expect() {
  code=$1 pattern=$2
  shift 2
  timeout 120 "$@" >"$tmp/out" 2>&1
  rc=$?
  [ $rc -eq "$code" ] || fail "exit code $rc (expected $code) from: $*"
  grep -qF -- "$pattern" "$tmp/out" || fail "no '$pattern' in the output of: $*"
  echo "ok: $* -> $rc, '$pattern'"
}

# be32 N: N as 4 big-endian bytes. idx_images FILE COUNT / idx_labels FILE COUNT: valid IDX files
# (images of noise, labels i % 10).
be32() { printf "$(printf '\\%03o\\%03o\\%03o\\%03o' $(($1 >> 24 & 255)) $(($1 >> 16 & 255)) $(($1 >> 8 & 255)) $(($1 & 255)))"; }
idx_images() { { be32 2051; be32 "$2"; be32 28; be32 28; head -c $(($2 * 784)) /dev/urandom; } >"$1"; }
idx_labels() {
  { be32 2049; be32 "$2"; i=0; while [ $i -lt "$2" ]; do printf "\\$(printf %03o $((i % 10)))"; i=$((i + 1)); done; } >"$1"
}
mnist_dir() {  # mnist_dir DIR: a small valid MNIST directory (64 training, 32 test examples)
  mkdir -p "$1"
  idx_images "$1/train-images-idx3-ubyte" 64; idx_labels "$1/train-labels-idx1-ubyte" 64
  idx_images "$1/t10k-images-idx3-ubyte" 32; idx_labels "$1/t10k-labels-idx1-ubyte" 32
}

case $case_name in
options)
  for spec in "$mnist --epochs" "$mlp --steps" "$gpt --steps"; do
    program=${spec% *} count_flag=${spec##* }
    name=$(basename "$program")
    expect 0 "usage: $name" "$program" --help
    expect 1 "unknown option --bogus ($name --help lists them)" "$program" --bogus
    expect 1 "$count_flag needs a number, got '12abc'" "$program" "$count_flag" 12abc
    expect 1 "--lr needs a value" "$program" --lr
  done
  expect 0 "--keep-checkpoints K" "$mnist" --help
  expect 1 "std::invalid_argument: --epochs must be at least 1, got 0" "$mnist" --epochs 0
  expect 1 "--data $tmp/nonexistent does not exist" "$mnist" --data "$tmp/nonexistent"
  expect 1 "--global-batch 5 must divide by the world size" "$cpprun" --standalone --nproc_per_node=2 "$mlp" --global-batch 5
  expect 1 "--embed 64 must be a multiple of --heads 5" "$gpt" --heads 5
  expect 1 "cannot read --text $tmp/none.txt: No such file or directory" "$gpt" --text "$tmp/none.txt"
  expect 1 "--straggler-every must be at least 0, got -5" "$gpt" --straggler-every -5
  # Not a regular file: a FIFO blocked the read for ever, a directory read as an empty text.
  mkfifo "$tmp/fifo"
  expect 1 "cannot read --text $tmp/fifo: it is a FIFO (named pipe), not a regular file" "$gpt" --text "$tmp/fifo"
  expect 1 "cannot read --text $tmp: it is a directory" "$gpt" --text "$tmp"
  # Numbers: "inf" is no learning rate, and a count out of range is said to be one.
  expect 1 "--lr needs a finite number, got 'inf'" "$gpt" --lr inf
  expect 1 "--steps 99999999999 is out of range" "$gpt" --steps 99999999999
  expect 1 "--stage 3 is FSDP's ZeRO stage and goes with --mode fsdp; this run's --mode is ddp" "$gpt" --stage 3
  # A batch larger than a rank's windows an epoch: named, where the slice failed in ATen's words.
  expect 1 "--batch 100000 takes 100000 windows a step on each data-parallel rank, more than the" \
    "$gpt" --steps 2 --batch 100000
  # A run trained to NaN ends saying so, where sampling from it failed in ATen's words; train_mlp's
  # replicas diverged alike are in sync (their NaN checksums were compared as unequal).
  expect 1 "training diverged" "$gpt" --lr 1e6 --steps 10 --log-every 10 --straggler-every 0
  expect 0 "replicas in sync" "$mlp" --lr 1e30 --steps 20
  expect 1 "--straggler-every needs a number, got 'often'" "$gpt" --straggler-every often
  # What train_gpt writes after training is tried before the first step (nothing trained, then lost).
  touch "$tmp/a_file"
  refused() {  # refused PATTERN ARGS...: train_gpt --steps 2 ARGS exits 1 naming PATTERN, untrained
    refusal=$1
    shift
    expect 1 "$refusal" "$gpt" --steps 2 --log-every 1 "$@"
    ! grep -q "^step" "$tmp/out" || fail "train_gpt trained before refusing: $*"
  }
  refused "--save $tmp/a_file/ckpt: cannot make that directory (Not a directory)" --save "$tmp/a_file/ckpt"
  refused "--export $tmp/a_file: cannot make that directory" --export "$tmp/a_file"
  refused "--export /proc: cannot create a file in /proc" --export /proc
  refused "--losses-out $tmp/none/losses.txt: its directory $tmp/none does not exist" --losses-out "$tmp/none/losses.txt"
  refused "--logits-out /proc/logits.txt: cannot create a file in /proc" --logits-for 1,2 --logits-out /proc/logits.txt
  refused "--trace $tmp: that is a directory; name a file" --trace "$tmp"
  expect 1 "--out $tmp/a_file: cannot make that directory (Not a directory)" "$mnist" --epochs 1 --out "$tmp/a_file"
  ;;
mnist_files)
  mnist_dir "$tmp/good"
  # The checks accept valid files: a small set trains and exits 0.
  expect 0 "final test accuracy" "$mnist" --data "$tmp/good" --epochs 1 --out "$tmp/run"
  bad() { rm -rf "$tmp/bad"; cp -r "$tmp/good" "$tmp/bad"; }
  bad; truncate -s -100 "$tmp/bad/train-images-idx3-ubyte"
  expect 1 "$tmp/bad/train-images-idx3-ubyte is truncated: its header promises 64 items (50192 bytes) but it has 50092 bytes" \
    "$mnist" --data "$tmp/bad" --epochs 1 --out "$tmp/run"
  bad; printf '\012' | dd of="$tmp/bad/t10k-labels-idx1-ubyte" bs=1 seek=13 conv=notrunc 2>/dev/null  # item 5 := 10
  expect 1 "$tmp/bad/t10k-labels-idx1-ubyte: label 10 of item 5 is not a digit 0..9" \
    "$mnist" --data "$tmp/bad" --epochs 1 --out "$tmp/run"
  bad; idx_labels "$tmp/bad/train-labels-idx1-ubyte" 63
  expect 1 "$tmp/bad/train-images-idx3-ubyte holds 64 images but $tmp/bad/train-labels-idx1-ubyte holds 63 labels" \
    "$mnist" --data "$tmp/bad" --epochs 1 --out "$tmp/run"
  bad; cp "$tmp/good/train-labels-idx1-ubyte" "$tmp/bad/train-images-idx3-ubyte"
  expect 1 "$tmp/bad/train-images-idx3-ubyte starts with 0x00000801, not the IDX magic number 0x00000803" \
    "$mnist" --data "$tmp/bad" --epochs 1 --out "$tmp/run"
  bad; truncate -s +1 "$tmp/bad/t10k-labels-idx1-ubyte"
  expect 1 "$tmp/bad/t10k-labels-idx1-ubyte is too long" "$mnist" --data "$tmp/bad" --epochs 1 --out "$tmp/run"
  bad; gzip "$tmp/bad/t10k-images-idx3-ubyte"
  expect 1 "$tmp/bad/t10k-images-idx3-ubyte.gz is compressed: gunzip it" "$mnist" --data "$tmp/bad" --out "$tmp/run"
  bad; rm "$tmp/bad/t10k-images-idx3-ubyte"
  expect 1 "missing $tmp/bad/t10k-images-idx3-ubyte" "$mnist" --data "$tmp/bad" --out "$tmp/run"
  bad; rm "$tmp/bad/t10k-labels-idx1-ubyte"; mkfifo "$tmp/bad/t10k-labels-idx1-ubyte"  # read for ever, before
  expect 1 "$tmp/bad/t10k-labels-idx1-ubyte: it is a FIFO (named pipe)" "$mnist" --data "$tmp/bad" --out "$tmp/run"
  ;;
checkpoints)
  run="$tmp/run" args="--train-size 256 --batch 64"
  expect 0 "final test accuracy" "$mnist" $args --epochs 3 --out "$run"
  # The newest two are kept (--keep-checkpoints 2), each a directory of safetensors files.
  for e in 2 3; do
    for f in model.safetensors optimizer.safetensors trainer.json; do
      [ -f "$run/checkpoint_epoch$e/$f" ] || fail "checkpoint_epoch$e/$f is not there: $(ls -R "$run")"
    done
  done
  [ ! -e "$run/checkpoint_epoch1" ] || fail "checkpoint_epoch1 was kept beyond --keep-checkpoints 2"
  ls -R "$run" | grep -q '\.tmp$' && fail "a temporary file was left: $(ls -R "$run")"
  # A file copied in from another checkpoint (trainer.json, or the model beside the optimizer): the
  # checkpoint does not hold together, is named, and the one before it is used.
  for copied in trainer.json model.safetensors; do
    mixed="$tmp/mixed_$copied"
    cp -r "$run" "$mixed"
    cp "$mixed/checkpoint_epoch2/$copied" "$mixed/checkpoint_epoch3/$copied"
    expect 0 "resuming after epoch 2 from $mixed/checkpoint_epoch2" "$mnist" $args --epochs 3 --out "$mixed" --resume
    grep -qF "checkpoint $mixed/checkpoint_epoch3 does not hold together: trainer.json is from another save" \
      "$tmp/out" || fail "the mixed checkpoint ($copied copied) was not named: $(cat "$tmp/out")"
  done
  # A half-written checkpoint (the directory not yet renamed) is not taken for one.
  mkdir "$run/checkpoint_epoch9.tmp"
  # Flip bytes in the middle of the newest model: refused, named, and the one before used.
  size=$(stat -c %s "$run/checkpoint_epoch3/model.safetensors")
  printf 'XXXX' | dd of="$run/checkpoint_epoch3/model.safetensors" bs=1 seek=$((size / 2)) conv=notrunc 2>/dev/null
  expect 0 "resuming after epoch 2 from $run/checkpoint_epoch2" "$mnist" $args --epochs 4 --out "$run" --resume
  grep -qF "safetensors file $run/checkpoint_epoch3/model.safetensors is damaged: the CRC-32" "$tmp/out" ||
    fail "the damaged checkpoint was not named"
  grep -q "epoch 4/4  test accuracy" "$tmp/out" || fail "the resumed run did not train epoch 4"
  rm -r "$run/checkpoint_epoch9.tmp"
  # With --keep-checkpoints 1 only the newest stays; when every checkpoint is damaged, --resume stops.
  expect 0 "final test accuracy" "$mnist" $args --epochs 5 --out "$run" --resume --keep-checkpoints 1
  [ "$(ls "$run" | grep -c '^checkpoint_epoch')" -eq 1 ] || fail "not one checkpoint kept: $(ls "$run")"
  truncate -s -1 "$run/checkpoint_epoch5/optimizer.safetensors"
  expect 1 "none of the 1 checkpoints in $run passes its check" "$mnist" $args --epochs 6 --out "$run" --resume
  grep -qF "$run/checkpoint_epoch5/optimizer.safetensors is invalid" "$tmp/out" ||
    fail "the truncated checkpoint was not named"
  # A fresh run (no --resume) where an earlier, longer run left checkpoints: they are removed, said,
  # so that --resume continues this run (the earlier run's epoch 3 outranked this run's epoch 1, and
  # pruning removed this run's).
  again="$tmp/again"
  expect 0 "final test accuracy" "$mnist" $args --epochs 3 --out "$again"
  expect 0 "removed the 2 checkpoints an earlier run left in $again (checkpoint_epoch3, checkpoint_epoch2)" \
    "$mnist" $args --epochs 1 --out "$again"
  expect 0 "resuming after epoch 1 from $again/checkpoint_epoch1" "$mnist" $args --epochs 2 --out "$again" --resume
  # A checkpoint in the old format (a TorchScript archive) still loads, with a one-line notice.
  old="$tmp/old"
  expect 0 "final test accuracy" "$mnist" $args --epochs 2 --out "$old" --old-checkpoints
  [ -f "$old/checkpoint_epoch2.pt" ] || fail "--old-checkpoints wrote no checkpoint_epoch2.pt: $(ls "$old")"
  expect 0 "resuming after epoch 2 from $old/checkpoint_epoch2.pt" "$mnist" $args --epochs 3 --out "$old" --resume
  grep -qF "note: $old/checkpoint_epoch2.pt is in the old format" "$tmp/out" || fail "no notice of the old format"
  [ -f "$old/checkpoint_epoch3/model.safetensors" ] || fail "the resumed run did not save in the new format"
  ;;
full_disk)
  # A checkpoint that cannot be written (a full disk: a small tmpfs in a private mount namespace,
  # root only, else 77) stops the run with the system's reason, and its partial
  # checkpoint_epochE.tmp/ is removed rather than left to keep the disk full. The tmpfs holds
  # trainer.json and the model's file but not the optimizer's.
  needs_private_tmpfs
  mkdir "$tmp/disk"
  # shellcheck disable=SC2016
  expect 1 "No space left on device" unshare -m sh -c '
    mount -t tmpfs -o size=256k tmpfs "$1" || exit 99
    disk=$1
    shift
    "$@"
    rc=$?
    echo "left on the disk: [$(cd "$disk/run" && ls -A | tr "\n" " ")]"
    exit $rc' sh "$tmp/disk" "$mnist" --train-size 256 --batch 64 --epochs 1 --out "$tmp/disk/run"
  grep -q "left on the disk: \[\]" "$tmp/out" || fail "the partial checkpoint was left: $(grep 'left on the disk' "$tmp/out")"
  ;;
gpt_full_disk)
  # train_gpt --save over its own checkpoint on a disk that holds one checkpoint (about 380 KiB here)
  # but not a second beside it (a 560 KiB tmpfs in a private mount namespace; root only, else 77):
  # the second save fails with the system's reason, and the first stays whole, so --resume
  # continues it (Note [A failed save puts the previous files back]). Before, the model's new files
  # replaced the old ones, the optimizer's met the full disk, the undo removed the new model, and
  # --resume found no checkpoint.
  needs_private_tmpfs
  mkdir "$tmp/disk"
  # shellcheck disable=SC2016
  expect 0 "resumed from $tmp/disk/ck at step 2" unshare -m sh -c '
    mount -t tmpfs -o size=560k tmpfs "$1" || exit 99
    ck=$1/ck gpt=$2
    shift 2
    "$gpt" "$@" --steps 2 --save "$ck" || { echo "the first save failed"; exit 1; }
    "$gpt" "$@" --steps 4 --save "$ck" && { echo "the second save fitted: make the disk smaller"; exit 1; }
    echo "left after the failed save: [$(ls -A "$ck" | tr "\n" " ")]"
    "$gpt" "$@" --steps 4 --resume "$ck"' sh "$tmp/disk" "$gpt" --layers 2 --embed 32 --heads 4 --block 16 \
    --log-every 1 --sample 0 --straggler-every 0
  grep -q "No space left on device" "$tmp/out" || fail "the second save did not meet the full disk"
  grep -qF "left after the failed save: [model-00001-of-00001.safetensors model.safetensors.index.json optimizer-00001-of-00001.safetensors optimizer.safetensors.index.json trainer.json ]" "$tmp/out" ||
    fail "the failed save left other files: $(grep 'left after' "$tmp/out")"
  ;;
under_cpprun)
  # The root cause's error file, in cpprun's failure summary: the C++ type and the message.
  expect 1 "std::invalid_argument: --data $tmp/nonexistent does not exist" \
    "$cpprun" --standalone --nproc_per_node=2 "$mnist" --data "$tmp/nonexistent"
  grep -qF "error file (TORCHELASTIC_ERROR_FILE)" "$tmp/out" || fail "no error file in the failure summary"
  grep -qF '"message": "std::invalid_argument: --data' "$tmp/out" || fail "the error file does not carry the exception"
  grep -q "exited with code 1" "$tmp/out" || fail "the worker did not exit with code 1"
  grep -q "SIGABRT\|signal 6" "$tmp/out" && fail "a worker aborted"
  ;;
*)
  fail "unknown case $case_name"
  ;;
esac
echo PASS
