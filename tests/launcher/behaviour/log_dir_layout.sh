# --redirects/--tee write DIR/attempt_N/LOCAL_RANK/{stdout,stderr}.log (verbatim, no prefix);
# --redirects keeps the stream off the console, --tee copies it there too.
. "$(dirname "$0")/common.sh"
logs=$WORK/logs/run1  # parents are created

worker='echo "out $RANK"; printf "err $RANK\n" >&2; printf "tail $RANK"'
cpprun --nproc_per_node=2 --redirects 3 --log_dir "$logs" /bin/sh -c "$worker"
expect_eq "$?" 0 "exit code"
grep -q '^\[rank' "$WORK/out" "$WORK/err" && fail "--redirects 3 let worker output reach the console"
for rank in 0 1; do
  dir=$logs/attempt_0/$rank
  expect_eq "$(cat "$dir/stdout.log")" "out $rank
tail $rank" "rank $rank stdout.log"
  expect_eq "$(cat "$dir/stderr.log")" "err $rank" "rank $rank stderr.log"
done

# --tee 1 with --redirects 2: stdout to file and console, stderr to file only. -r/-t, --log-dir.
rm -rf "$WORK/logs"
cpprun --nproc_per_node=2 -t 1 -r 2 --log-dir="$logs" /bin/sh -c "$worker"
expect_eq "$?" 0 "tee exit code"
expect_in_file "$WORK/out" "[rank1]: out 1" "teed stdout on the console"
expect_in_file "$logs/attempt_0/1/stdout.log" "out 1" "teed stdout in the file"
grep -q '^\[rank' "$WORK/err" && fail "--redirects 2 let stderr reach the console"
expect_in_file "$logs/attempt_0/0/stderr.log" "err 0" "redirected stderr in the file"

# Per-rank map: only local rank 0's stdout is redirected; no files for the rest.
rm -rf "$WORK/logs"
cpprun --nproc_per_node=2 --redirects 0:1 --log_dir "$logs" /bin/sh -c "$worker"
expect_eq "$?" 0 "map exit code"
grep -q '^\[rank0\]: out' "$WORK/out" && fail "rank 0's redirected stdout on the console"
expect_in_file "$WORK/out" "[rank1]: out 1" "rank 1's stdout on the console"
expect_in_file "$logs/attempt_0/0/stdout.log" "out 0" "rank 0's stdout.log"
[ ! -e "$logs/attempt_0/1/stdout.log" ] || fail "a stdout.log for rank 1, which was not redirected"

# Restarts get attempt_1; error files are kept beside the logs, as torchrun keeps them.
rm -rf "$WORK/logs"
cpprun --max_restarts=1 --tee 3 --log_dir "$logs" /bin/sh -c '
  echo "attempt $TORCHELASTIC_RESTART_COUNT"; echo "{}" > "$TORCHELASTIC_ERROR_FILE"; exit 5'
expect_eq "$?" 5 "restart exit code"
expect_eq "$(cat "$logs/attempt_0/0/stdout.log")" "attempt 0" "attempt_0 stdout.log"
expect_eq "$(cat "$logs/attempt_1/0/stdout.log")" "attempt 1" "attempt_1 stdout.log"
expect_eq "$(cat "$logs/attempt_1/0/error.json")" "{}" "error.json kept under --log_dir"

# Mistakes: files without --log_dir; a --log_dir that cannot be created.
cpprun --redirects 3 /bin/true
expect_eq "$?" 2 "--redirects without --log_dir"
expect_in_file "$WORK/err" "--redirects=3 needs --log_dir" "message"
cpprun --tee=0:2 /bin/true
expect_eq "$?" 2 "--tee without --log_dir"
expect_in_file "$WORK/err" "--tee=0:2 needs --log_dir" "message"
touch "$WORK/a-file"
cpprun --tee 1 --log_dir "$WORK/a-file/logs" /bin/sh -c 'touch "$WORK/started"'
expect_eq "$?" 1 "unusable --log_dir"
expect_in_file "$WORK/err" "--log_dir=$WORK/a-file/logs: cannot create" "message"
[ ! -e "$WORK/started" ] || fail "a worker started although --log_dir is unusable"
expect_no_leftovers
echo PASS
