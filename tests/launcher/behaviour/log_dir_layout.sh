# --redirects/--tee write torchrun's LOG_DIR/RUN_ID_XXXXXXXX/attempt_N/LOCAL_RANK/{stdout,stderr}.log
# (verbatim, no prefix), a run dir per run; --redirects keeps the stream off the console, --tee copies
# it there too; without --log_dir they go to a torchelastic_XXXXXX temp dir that stays.
. "$(dirname "$0")/common.sh"
logs=$WORK/logs/run1  # parents are created

worker='echo "out $RANK"; printf "err $RANK\n" >&2; printf "tail $RANK"'
cpprun --nproc_per_node=2 --master_port=29512 --rdzv_id=job5 --redirects 3 --log_dir "$logs" /bin/sh -c "$worker"
expect_eq "$?" 0 "exit code"
grep -q '^\[rank' "$WORK/out" "$WORK/err" && fail "--redirects 3 let worker output reach the console"
run=$(run_dir_in "$logs" job5) || exit 1
for rank in 0 1; do
  dir=$run/attempt_0/$rank
  expect_eq "$(cat "$dir/stdout.log")" "out $rank
tail $rank" "rank $rank stdout.log"
  expect_eq "$(cat "$dir/stderr.log")" "err $rank" "rank $rank stderr.log"
done
# The same log dir again: a second run dir beside the first, which is left alone.
cpprun --nproc_per_node=1 --master_port=29512 --rdzv_id=job5 --redirects 3 --log_dir "$logs" /bin/true
expect_eq "$(find "$logs" -mindepth 1 -maxdepth 1 -name 'job5_*' | wc -l)" 2 "run dirs after two runs"
[ -f "$run/attempt_0/1/stdout.log" ] || fail "the second run touched the first's files"

# --tee 1 with --redirects 2: stdout to file and console, stderr to file only. -r/-t, --log-dir.
# No --master_port: one node runs under a random run id (a uuid4), which names the run dir.
rm -rf "$WORK/logs"
cpprun --nproc_per_node=2 -t 1 -r 2 --log-dir="$logs" /bin/sh -c "$worker; echo \$TORCHELASTIC_RUN_ID > \"\$WORK/id\""
expect_eq "$?" 0 "tee exit code"
run_id=$(cat "$WORK/id")
printf '%s\n' "$run_id" | grep -qE '^[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$' ||
  fail "TORCHELASTIC_RUN_ID=$run_id is not a uuid4"
run=$(run_dir_in "$logs" "$run_id") || exit 1
# A tee'd stream's console lines carry torchrun's TailLog prefix, [ROLE LOCAL_RANK]:, as torchrun's.
expect_in_file "$WORK/out" "[default1]:out 1" "teed stdout on the console"
expect_in_file "$run/attempt_0/1/stdout.log" "out 1" "teed stdout in the file"
grep -q 'err [01]' "$WORK/err" && fail "--redirects 2 let stderr reach the console"
expect_in_file "$run/attempt_0/0/stderr.log" "err 0" "redirected stderr in the file"

# Per-rank map: only local rank 0's stdout is redirected; no files for the rest.
rm -rf "$WORK/logs"
cpprun --nproc_per_node=2 --redirects 0:1 --log_dir "$logs" /bin/sh -c "$worker"
expect_eq "$?" 0 "map exit code"
grep -q '^\[rank0\]: out' "$WORK/out" && fail "rank 0's redirected stdout on the console"
expect_in_file "$WORK/out" "[rank1]: out 1" "rank 1's stdout on the console"
run=$(run_dir_in "$logs") || exit 1
expect_in_file "$run/attempt_0/0/stdout.log" "out 0" "rank 0's stdout.log"
[ ! -e "$run/attempt_0/1/stdout.log" ] || fail "a stdout.log for rank 1, which was not redirected"

# Restarts get attempt_1; error files are kept beside the logs, as torchrun keeps them.
rm -rf "$WORK/logs"
cpprun --max_restarts=1 --restart_backoff=0 --tee 3 --log_dir "$logs" /bin/sh -c '
  echo "attempt $TORCHELASTIC_RESTART_COUNT"; echo "{}" > "$TORCHELASTIC_ERROR_FILE"; exit 5'
expect_eq "$?" 5 "restart exit code"
run=$(run_dir_in "$logs") || exit 1
expect_eq "$(cat "$run/attempt_0/0/stdout.log")" "attempt 0" "attempt_0 stdout.log"
expect_eq "$(cat "$run/attempt_1/0/stdout.log")" "attempt 1" "attempt_1 stdout.log"
expect_eq "$(cat "$run/attempt_1/0/error.json")" "{}" "error.json kept under --log_dir"

# Files without --log_dir: as torchrun, a torchelastic_XXXXXX dir in $TMPDIR that stays, named on stderr.
cpprun --redirects 3 --rdzv_id=job6 --master_port=29512 /bin/sh -c 'echo "to the temp dir"'
expect_eq "$?" 0 "--redirects without --log_dir"
temp_logs=$(find "$TMPDIR" -mindepth 1 -maxdepth 1 -name 'torchelastic_*')
[ -n "$temp_logs" ] || fail "no torchelastic_* dir in \$TMPDIR"
run=$(run_dir_in "$temp_logs" job6) || exit 1
expect_in_file "$WORK/err" "the workers' files go to $run" "the temp log dir named"
expect_eq "$(cat "$run/attempt_0/0/stdout.log")" "to the temp dir" "stdout.log in the temp log dir"
grep -q 'to the temp dir' "$WORK/out" && fail "--redirects 3 output reached the console"
rm -rf "$temp_logs"
cpprun --tee=0:2 /bin/sh -c 'echo "teed" >&2'
expect_eq "$?" 0 "--tee without --log_dir"
expect_in_file "$WORK/err" "[default0]:teed" "teed stderr on the console"
rm -rf "$TMPDIR"/torchelastic_*

# --duplicate_stdout_filters: tee'd lines holding a needle also go, prefixed, to attempt_N/filtered_stdout.log.
rm -rf "$WORK/logs"
cpprun --nproc_per_node=2 --tee=1 --duplicate-stdout-filters='loss,,x,step' --log_dir "$logs" /bin/sh -c '
  echo "loss,x $RANK"; echo "other $RANK"; echo "step $RANK"'
expect_eq "$?" 0 "filters exit code"
run=$(run_dir_in "$logs") || exit 1
expect_eq "$(sort "$run/attempt_0/filtered_stdout.log" | tr '\n' '|')" \
  "[default0]:loss,x 0|[default0]:step 0|[default1]:loss,x 1|[default1]:step 1|" "filtered_stdout.log"
[ ! -e "$run/attempt_0/filtered_stderr.log" ] || fail "a filtered_stderr.log without --duplicate_stderr_filters"
# torchrun opens the filtered log of every filter given (elastic/multiprocessing/api.py), stderr not
# --tee'd included: an empty filtered_stderr.log.
rm -rf "$logs"
cpprun --nproc_per_node=2 --tee=1 --duplicate_stderr_filters=boom --log_dir "$logs" /bin/sh -c 'echo boom >&2'
expect_eq "$?" 0 "stderr filters without stderr tee'd: exit code"
run=$(run_dir_in "$logs") || exit 1
[ -f "$run/attempt_0/filtered_stderr.log" ] && [ ! -s "$run/attempt_0/filtered_stderr.log" ] ||
  fail "no empty filtered_stderr.log for --duplicate_stderr_filters without stderr tee'd"

# A --log_dir that cannot be created.
touch "$WORK/a-file"
cpprun --tee 1 --log_dir "$WORK/a-file/logs" /bin/sh -c 'touch "$WORK/started"'
expect_eq "$?" 1 "unusable --log_dir"
expect_in_file "$WORK/err" "--log_dir=$WORK/a-file/logs: cannot create" "message"
[ ! -e "$WORK/started" ] || fail "a worker started although --log_dir is unusable"
expect_no_leftovers
echo PASS
