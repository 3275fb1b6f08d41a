# The launcher's diagnosis from its workers' flight recorders (issue 27): when a worker fails, the
# others are asked for a dump before they are stopped, and cpprun prints which rank is behind, where
# and since when, and writes it as JSON in --log_dir; `cpprun --diagnose PID` asks a running job and
# prints the same; programs that record nothing get no diagnosis and no wait. The workers here speak
# the protocol from Python (fake_recorder.py); tests/dist runs it with the library itself.
. "$(dirname "$0")/common.sh"
recorder="python3 $(dirname "$0")/fake_recorder.py"
command -v python3 >/dev/null || { echo "SKIP: no python3"; exit 77; }

# ---- a failure: rank 1 fails in all_gather #6; rank 0 is still in all_reduce #5 ----
# Rank 1 fails once rank 0 is up and answers requests (it says so): an event, not a delay.
FAIL_ON=$WORK/go FAULT_MARK=$WORK/failed_ms start_node node_failing --nproc_per_node=2 --log_dir "$WORK/logs" \
  /bin/sh -c 'if [ "$RANK" = 0 ]; then exec '"$recorder"' behind; else exec '"$recorder"' fails; fi'
wait_for_text 30 "$WORK/node_failing.out" "rank 0 playing behind"
touch "$WORK/go"
wait_node "$NODE_PID" 30
ended=$(now_ms)
expect_eq "$NODE_STATUS" 3 "exit code of the failing job"
expect_in_file "$WORK/node_failing.err" "cpprun: diagnosis (rank 1 (local_rank 1" "the diagnosis header"
expect_in_file "$WORK/node_failing.err" "rank 0 is in all_reduce #5 (float32[4096], sum) since" "the rank behind, where it is"
expect_in_file "$WORK/node_failing.err" "rank 1 failed in all_gather #6 (float32[1024])" "the failed rank, where it failed"
json=$(ls "$WORK"/logs/*/attempt_0/diagnosis.json 2>/dev/null)
[ -n "$json" ] || fail "no diagnosis.json in the log dir: $(find "$WORK/logs")"
python3 -c 'import json, sys; d = json.load(open(sys.argv[1])); assert d["format"] == "cpprun-hang-diagnosis", d
ranks = {r["rank"]: r for g in d["groups"] for r in g["ranks"]}
assert ranks[0]["seq"] == 5 and ranks[0]["state"] == "started", ranks
assert ranks[1]["seq"] == 6 and ranks[1]["state"] == "failed", ranks' "$json" || fail "diagnosis.json: $(cat "$json")"
# The failure is not held up: dumps take milliseconds, and the launcher waits for them at most
# 2 s (kDumpWait) before it stops the others. Timed from rank 1's failure, not the job's start.
latest_mark "the failing job" "$WORK/failed_ms"
elapsed=$((ended - MARK))
[ "$elapsed" -lt 3000 ] || fail "the failing job took $elapsed ms to end after rank 1 failed"

# ---- on request: cpprun --diagnose PID against a running job ----
start_node job --nproc_per_node=2 /bin/sh -c \
  'if [ "$RANK" = 0 ]; then exec '"$recorder"' ahead; else exec '"$recorder"' behind; fi'
job=$NODE_PID
wait_for_text 20 "$WORK/job.out" "rank 1 playing behind"
wait_for_text 20 "$WORK/job.out" "rank 0 playing ahead"
"$CPPRUN" --diagnose "$job" >"$WORK/asked.out" 2>"$WORK/asked.err"
expect_eq $? 0 "cpprun --diagnose's exit code"
expect_in_file "$WORK/asked.out" "rank 1 is in all_reduce #5 (float32[4096], sum) since 5" "the answer names the rank behind"
expect_in_file "$WORK/asked.out" "rank 0 waits in all_gather #6 (float32[1024]) since" "the answer names where rank 0 waits"
expect_in_file "$WORK/job.err" "rank 1 is in all_reduce #5" "the job's own console has it too"
alive "$job" || fail "cpprun --diagnose stopped the job"
# The guardian keeps cpprun's command line (pgrep -a cpprun lists both, pgrep -nf names it): asked,
# it passes the request to its cpprun. It used to die of the request's signal, leaving the job
# unguarded: a SIGKILL of cpprun then left the workers' children running.
guardian=""
for p in $(pgrep -x cpprun-guardian); do
  { tr '\0' '\n' <"/proc/$p/environ"; } 2>/dev/null | grep -qxF "CPPRUN_TEST_TAG=$WORK" && guardian=$p
done
[ -n "$guardian" ] || fail "no guardian of the job found (pgrep -x cpprun-guardian: $(pgrep -x cpprun-guardian))"
kill -s RTMIN+2 "$guardian"  # the request's signal itself (diagnose_signal(): SIGRTMIN + 2)
sleep 0.2
alive "$guardian" || fail "the request's signal ended the guardian"
"$CPPRUN" --diagnose "$guardian" >"$WORK/asked.out" 2>"$WORK/asked.err"
expect_eq $? 0 "cpprun --diagnose's exit code, given the guardian's pid"
expect_in_file "$WORK/asked.err" "that process is the guardian of cpprun $job" "what the asker says of the guardian"
expect_in_file "$WORK/asked.out" "rank 1 is in all_reduce #5 (float32[4096], sum) since 5" "the answer, asked through the guardian"
alive "$guardian" || fail "cpprun --diagnose ended the guardian"
alive "$job" || fail "cpprun --diagnose through the guardian stopped the job"
kill -TERM "$job"
wait_node "$job" 20
expect_eq "$NODE_STATUS" 143 "the job after SIGTERM"

# Bad requests are refused with a reason.
"$CPPRUN" --diagnose notapid >"$WORK/out" 2>"$WORK/err"
expect_eq $? 2 "--diagnose with no pid"
expect_in_file "$WORK/err" "needs the process id of a running cpprun" "the usage"
"$CPPRUN" --diagnose $$ >"$WORK/out" 2>"$WORK/err"
expect_eq $? 2 "--diagnose of a process that is not cpprun"
expect_in_file "$WORK/err" "not cpprun" "the refusal"

# ---- programs that record nothing: no diagnosis, no wait ----
rm -f "$WORK/failed_ms"
cpprun --nproc_per_node=2 /bin/sh -c '[ "$RANK" = 1 ] && { date +%s%3N >"$WORK/failed_ms"; exit 4; }; sleep 30'
status=$?
ended=$(now_ms)
expect_eq "$status" 4 "exit code of a failing shell job"
grep -q "diagnosis" "$WORK/err" && fail "a diagnosis for programs that record nothing"
# Timed from rank 1's failure: waiting for dumps (kDumpWait, 2 s) would take longer than this.
latest_mark "a failing shell job" "$WORK/failed_ms"
elapsed=$((ended - MARK))
[ "$elapsed" -lt 1500 ] || fail "a failing shell job took $elapsed ms to end after rank 1 failed (waited for dumps that cannot come?)"

# ---- a dump that is there but cannot be read: said, not dropped ----
# With no dump readable the diagnosis used to vanish without a word (a dump over the launcher's
# 64 MiB, which CPPRUN_FLIGHT_RECORDER_ENTRIES near its maximum writes, or a damaged one).
cpprun --nproc_per_node=2 /bin/sh -c '[ "$RANK" = 1 ] || exec sleep 30
  d=$CPPRUN_FLIGHT_RECORDER_DIR; mkdir -p "$d" && : >"$d/rank_1.listening" && printf "{\"format\": broken" >"$d/rank_1.json"
  exit 3'
expect_eq $? 3 "exit code of a job whose failing rank left a damaged dump"
expect_in_file "$WORK/err" "cpprun: diagnosis (rank 1" "a diagnosis despite no readable dump"
expect_in_file "$WORK/err" "its dump could not be read: " "why rank 1's dump is missing"
# A running rank, asked, that answers with a damaged dump: not "none came".
FAIL_ON=$WORK/go2 start_node garbled --nproc_per_node=2 /bin/sh -c \
  'if [ "$RANK" = 0 ]; then exec '"$recorder"' garbled; else exec '"$recorder"' fails; fi'
wait_for_text 30 "$WORK/garbled.out" "rank 0 playing garbled"
touch "$WORK/go2"
wait_node "$NODE_PID" 30
expect_eq "$NODE_STATUS" 3 "exit code of the job with a garbled dump"
expect_in_file "$WORK/garbled.err" "its dump could not be read: " "why rank 0's asked-for dump is missing"
grep -q "none came within" "$WORK/garbled.err" && fail "a damaged dump reported as none came"
expect_no_leftovers
echo PASS
