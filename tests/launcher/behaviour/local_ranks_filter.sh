# --local_ranks_filter: only the listed local ranks reach the console; log files get every rank,
# and a hidden rank's failure still shows its stderr in the summary.
. "$(dirname "$0")/common.sh"

cpprun --nproc_per_node=3 --local_ranks_filter=0,2 --tee 3 --log_dir "$WORK/logs" /bin/sh -c '
  echo "out $RANK"; echo "err $RANK" >&2'
expect_eq "$?" 0 "exit code"
# (Tee'd: torchrun's prefix, [ROLE LOCAL_RANK]:.)
expect_eq "$(grep '^\[default' "$WORK/out" | sort | tr '\n' '|')" "[default0]:out 0|[default2]:out 2|" "stdout shown"
expect_eq "$(grep '^\[default' "$WORK/err" | sort | tr '\n' '|')" "[default0]:err 0|[default2]:err 2|" "stderr shown"
run=$(run_dir_in "$WORK/logs") || exit 1
expect_eq "$(cat "$run/attempt_0/1/stdout.log")" "out 1" "hidden rank's stdout.log"
expect_eq "$(cat "$run/attempt_0/1/stderr.log")" "err 1" "hidden rank's stderr.log"

cpprun --nproc_per_node=2 --local-ranks-filter 0 /bin/sh -c '
  [ "$RANK" = 1 ] || exit 0
  echo "hidden failure" >&2; exit 6'
expect_eq "$?" 6 "hidden rank's exit code"
grep -q '^\[rank1\]' "$WORK/err" && fail "rank 1 reached the console"
expect_in_file "$WORK/err" "cpprun:   | hidden failure" "hidden rank's stderr in the summary"

cpprun --nproc_per_node=2 --local_ranks_filter=2 /bin/true
expect_eq "$?" 2 "filter naming a rank that does not exist"
expect_in_file "$WORK/err" "--local_ranks_filter=2" "message"
expect_no_leftovers
echo PASS
