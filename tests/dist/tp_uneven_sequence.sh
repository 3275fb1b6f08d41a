# A sequence the tensor-parallel size does not divide (x.chunk(2, 1) of 5 tokens: shards of 3 and
# 2) fails on both ranks with an error naming the cause and the fix, which the program catches:
# the job ends with the program's own exit status (3), not a signal (until 2026-12 the error was
# the collective mismatch alone; the audit's program, which caught nothing, ended by SIGABRT).
# usage: tp_uneven_sequence.sh CPPRUN PROBE
. "$(dirname "$0")/../launcher/behaviour/common.sh"
PROBE=${2:?usage: tp_uneven_sequence.sh CPPRUN PROBE}

cpprun --standalone --nproc_per_node=2 "$PROBE" "$WORK"
status=$?
expect_eq "$status" 3 "cpprun's exit status (the ranks' own 3; 134 would be SIGABRT)"
for rank in 0 1; do
  line=$(grep -F "[rank$rank]: rank $rank caught: " "$WORK/err") || fail "rank $rank did not catch an error"
  for text in "hold shards of different shapes to gather along dimension 1" \
              "Make the sequence length a multiple of 2 (pad it) before splitting it"; do
    case $line in *"$text"*) ;; *) fail "rank $rank's error does not say '$text'" ;; esac
  done
  # The mismatch's own text follows on the next line, naming each rank's shape.
  grep -qF "[rank$rank]: cpprun: collective #" "$WORK/err" || fail "rank $rank's error lacks the collective mismatch"
done
grep -q "SIGABRT\|terminate called" "$WORK/err" && fail "a rank aborted"
expect_no_leftovers
echo "PASS: both ranks refused the uneven sequence shards and exited 3"
