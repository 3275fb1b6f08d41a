# The failure summary ends with the root cause's last 20 stderr lines and its
# TORCHELASTIC_ERROR_FILE, which lives in a per-run temp dir that cpprun removes.
. "$(dirname "$0")/common.sh"

cpprun --nproc_per_node=2 /bin/sh -c '
  echo "$TORCHELASTIC_ERROR_FILE" > "$WORK/errfile.$RANK"
  if [ "$RANK" = 1 ]; then
    while [ ! -e "$WORK/up.0" ]; do sleep 0.02; done
    i=1; while [ $i -le 30 ]; do echo "err line $i" >&2; i=$((i+1)); done
    printf "{\"message\": \"boom from rank 1\"}\n" > "$TORCHELASTIC_ERROR_FILE"
    exit 3
  fi
  touch "$WORK/up.0"
  exec sleep 30'
expect_eq "$?" 3 "exit code"
case $(cat "$WORK/errfile.1") in
  "$TMPDIR"/cpprun-*/attempt_0.1.error.json) ;;
  *) fail "TORCHELASTIC_ERROR_FILE=$(cat "$WORK/errfile.1") is not in the run's temp dir" ;;
esac
[ "$(cat "$WORK/errfile.0")" != "$(cat "$WORK/errfile.1")" ] || fail "ranks share an error file"
expect_in_file "$WORK/err" "cpprun: last lines of rank 1's stderr:" "tail header"
expect_in_file "$WORK/err" "cpprun:   | err line 30" "last stderr line"
expect_in_file "$WORK/err" "cpprun:   | err line 11" "20th line from the end"
grep -qF "| err line 10" "$WORK/err" && fail "more than 20 lines of tail"
expect_in_file "$WORK/err" "cpprun: rank 1's error file (TORCHELASTIC_ERROR_FILE):" "error file header"
expect_in_file "$WORK/err" 'cpprun:   | {"message": "boom from rank 1"}' "error file contents"
# The summary comes after the worker's own output.
[ "$(grep -n 'failed first' "$WORK/err" | cut -d: -f1)" -gt "$(grep -n '^\[rank1\]: err line 30' "$WORK/err" | cut -d: -f1)" ] \
  || fail "summary printed before the worker's last output"
expect_no_leftovers  # includes: the temp dir is gone

# With stderr sent to files only, the summary is where the user sees it.
cpprun --redirects=2 --log_dir="$WORK/logs" /bin/sh -c 'echo "only in the file" >&2; exit 4'
expect_eq "$?" 4 "redirected exit code"
grep -q '^\[rank0\]: only in the file' "$WORK/err" && fail "redirected stderr reached the console"
expect_in_file "$WORK/err" "cpprun:   | only in the file" "tail of redirected stderr"
run=$(run_dir_in "$WORK/logs") || exit 1
expect_eq "$(cat "$run/attempt_0/0/stderr.log")" "only in the file" "stderr.log"

# torchrun's hand-over for schedulers: the root cause's error file is copied into the launcher's own
# TORCHELASTIC_ERROR_FILE, errorCode set to its exit code (-SIGNAL when killed), once the job gives up.
cpprun --nproc_per_node=2 --max_restarts=1 --restart_backoff=0 /bin/sh -c '
  [ "$RANK" = 1 ] || exit 0
  printf "{\"message\": {\"message\": \"E%s\", \"extraInfo\": {\"timestamp\": \"1\"}}}" \
    "$TORCHELASTIC_RESTART_COUNT" > "$TORCHELASTIC_ERROR_FILE"
  exit 3' </dev/null
expect_eq "$?" 3 "exit code without a launcher error file"
TORCHELASTIC_ERROR_FILE=$WORK/mine.json cpprun --nproc_per_node=2 --max_restarts=1 --restart_backoff=0 /bin/sh -c '
  [ "$RANK" = 1 ] || exit 0
  printf "{\"message\": {\"message\": \"E%s\", \"extraInfo\": {\"timestamp\": \"1\"}}}" \
    "$TORCHELASTIC_RESTART_COUNT" > "$TORCHELASTIC_ERROR_FILE"
  exit 3'
expect_eq "$?" 3 "exit code with a launcher error file"
expect_eq "$(cat "$WORK/mine.json")" \
  '{"message": {"message": "E1", "extraInfo": {"timestamp": "1"}, "errorCode": 3}}' "launcher's error file"
rm -f "$WORK/mine.json"
TORCHELASTIC_ERROR_FILE=$WORK/mine.json cpprun /bin/sh -c '
  echo "{\"message\": {\"message\": \"K\"}}" > "$TORCHELASTIC_ERROR_FILE"; kill -KILL $$'
expect_eq "$?" 137 "exit code of a killed worker"
expect_eq "$(cat "$WORK/mine.json")" '{"message": {"message": "K", "errorCode": -9}}' "killed worker's error file"
rm -f "$WORK/mine.json"
TORCHELASTIC_ERROR_FILE=$WORK/mine.json cpprun /bin/sh -c 'exit 5'
expect_eq "$?" 5 "exit code of a worker without an error file"
[ ! -e "$WORK/mine.json" ] || fail "a launcher error file although the worker wrote none"
TORCHELASTIC_ERROR_FILE=$WORK/mine.json cpprun /bin/true
[ ! -e "$WORK/mine.json" ] || fail "a launcher error file after success"

# A job ended by a signal removes its temp dir too.
CPPRUN_TEST_TAG=$WORK "$CPPRUN" /bin/sh -c 'touch "$WORK/ready"; exec sleep 30' >"$WORK/out" 2>"$WORK/err" &
launcher=$!
wait_for_files 20 "$WORK/ready"
kill -TERM "$launcher"
wait "$launcher"
expect_eq "$?" 143 "exit code after SIGTERM"
# The root cause by report time: rank 0 reports first (cpprun::record's cpprun_failed_at_ms) but
# exits after rank 1, whose report came later (a peer that went away); rank 0 is named, with its
# own exit code. With torch's whole-second timestamp alone the first to exit stays the root cause.
report_first() {  # report_first STAMP_KEY: rank 0 reports, then rank 1, which is reaped first
  cpprun --nproc_per_node=2 /bin/sh -c '
    report() { printf "{\"message\": {\"message\": \"E%s\", \"extraInfo\": {\"timestamp\": \"%s\", \"%s\": \"%s\"}}}\n" \
                 "$RANK" "$(date +%s)" "$1" "$(date +%s%3N)" >"$TORCHELASTIC_ERROR_FILE"; }
    if [ "$RANK" = 0 ]; then
      trap "" TERM  # still dumping when cpprun asks it to stop: it ends on its own
      report "$0"; touch "$WORK/reported.0"
      # Exits only once cpprun has reaped rank 1 (a zombie still answers kill -0).
      while [ ! -s "$WORK/reported.1" ]; do sleep 0.01; done
      while kill -0 "$(cat "$WORK/reported.1")" 2>/dev/null; do sleep 0.01; done
      exit 5
    fi
    while [ ! -e "$WORK/reported.0" ]; do sleep 0.01; done
    sleep 0.01; report "$0"; echo $$ >"$WORK/reported.1.tmp"; mv "$WORK/reported.1.tmp" "$WORK/reported.1"; exit 6' "$1"
}
report_first cpprun_failed_at_ms
expect_eq "$?" 5 "exit code of the rank that reported first"
expect_in_file "$WORK/err" "cpprun: rank 0 (local_rank 0, pid" "root cause line"
grep -q "rank 0 (local_rank 0, pid [0-9]*) failed first (root cause): exited with code 5" "$WORK/err" ||
  fail "rank 0, which reported first, is not the root cause: $(grep 'failed first' "$WORK/err")"
expect_in_file "$WORK/err" "also failed: exited with code 6" "rank 1's fate"
rm -f "$WORK/reported.0" "$WORK/reported.1"
report_first not_cpprun_failed_at_ms
expect_eq "$?" 6 "exit code without cpprun's report times"
grep -q "rank 1 (local_rank 1, pid [0-9]*) failed first (root cause): exited with code 6" "$WORK/err" ||
  fail "without report times the first to exit is not the root cause: $(grep 'failed first' "$WORK/err")"
expect_no_leftovers
echo PASS
