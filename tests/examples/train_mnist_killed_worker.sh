#!/bin/sh
# A worker of train_mnist is SIGKILLed mid-run under `cpprun --max_restarts=3`: cpprun restarts
# the group, the workers resume from the last checkpoint, the run finishes, and its final test
# accuracy is within 5 points of an uninterrupted run's (which must have learned: >= 50%).
# usage: train_mnist_killed_worker.sh CPPRUN TRAIN_MNIST
set -u
cpprun=$1 program=$2
tmp=$(mktemp -d)
launcher=
cleanup() {
  [ -n "$launcher" ] && kill -9 "$launcher" 2>/dev/null
  pkill -9 -f "$tmp" 2>/dev/null
  rm -rf "$tmp"
}
trap cleanup EXIT
fail() { echo "FAIL: $*"; echo "--- interrupted run:"; cat "$tmp/killed.log" 2>/dev/null; exit 1; }
args="--epochs 3 --train-size 8000"

"$cpprun" --standalone --nproc_per_node=2 "$program" $args --out "$tmp/plain" >"$tmp/plain.log" 2>&1 ||
  { cat "$tmp/plain.log"; fail "the uninterrupted run failed"; }

"$cpprun" --standalone --max_restarts=3 --nproc_per_node=2 "$program" $args --out "$tmp/killed" --resume \
  >"$tmp/killed.log" 2>&1 &
launcher=$!
# Once the first epoch's checkpoint is written, kill a worker while the second epoch runs.
i=0
while [ ! -d "$tmp/killed/checkpoint_epoch1" ]; do
  i=$((i + 1)); [ $i -gt 1200 ] && fail "no checkpoint after 60 s"
  sleep 0.05
done
victim=$(pgrep -P "$launcher" | tail -n 1)
[ -n "$victim" ] || fail "no worker to kill"
kill -9 "$victim" || fail "could not kill worker $victim"
wait "$launcher"; rc=$?
launcher=
[ $rc -eq 0 ] || fail "cpprun exited $rc after the worker was killed"
grep -q "restarting all workers" "$tmp/killed.log" || fail "cpprun did not restart the workers"
grep -q "resuming after epoch" "$tmp/killed.log" || fail "the workers did not resume from the checkpoint"

accuracy() { sed -n 's/.*final test accuracy \([0-9.]*\)%.*/\1/p' "$1" | tail -n 1; }
plain=$(accuracy "$tmp/plain.log") killed=$(accuracy "$tmp/killed.log")
echo "final accuracy: uninterrupted $plain%, with a killed worker $killed%"
[ -n "$plain" ] && [ -n "$killed" ] || fail "no final accuracy printed"
# Comparing two runs that learned nothing would prove nothing: chance is 10%.
awk -v a="$plain" 'BEGIN { exit !(a >= 50) }' || fail "the uninterrupted run did not learn ($plain%)"
awk -v a="$plain" -v b="$killed" 'BEGIN { d = a - b; if (d < 0) d = -d; exit !(d <= 5) }' ||
  fail "accuracies differ by more than 5 points"
echo "PASS"
