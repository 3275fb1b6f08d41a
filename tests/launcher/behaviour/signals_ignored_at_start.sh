# A cpprun started with signals ignored, as a script's `cpprun ... &` starts it (a non-interactive
# shell ignores SIGINT and SIGQUIT in background jobs) or under `trap '' ...`: torchrun stops at
# the script's `kill -INT`, and so does cpprun (it once kept them ignored and ran to the end). Its
# workers start with SIGINT, SIGTERM, SIGQUIT and SIGPIPE at their defaults, as torchrun's; SIGHUP
# ignored (nohup) stays ignored, for cpprun and its workers (Note [Signals ignored at startup]).
. "$(dirname "$0")/common.sh"

# Bits of /proc/PID/status's SigIgn: 1 << (signal - 1).
hup=0x1 int=0x2 quit=0x4 pipe=0x1000 term=0x4000
(
  trap '' HUP INT QUIT PIPE TERM
  exec env CPPRUN_TEST_TAG="$WORK" "$CPPRUN" --nproc_per_node=2 /bin/sh -c '
    sed -n "s/^SigIgn:[[:space:]]*//p" /proc/$$/status >"$WORK/ignored.$LOCAL_RANK"
    touch "$WORK/ready.$LOCAL_RANK"
    exec sleep 30'
) >"$WORK/out" 2>"$WORK/err" &
launcher=$!
wait_for_files 20 "$WORK/ready.0" "$WORK/ready.1"
for rank in 0 1; do
  ignored=$((0x$(cat "$WORK/ignored.$rank")))
  expect_eq "$((ignored & (int | quit | pipe | term)))" 0 "rank $rank: SIGINT, SIGQUIT, SIGPIPE, SIGTERM not ignored"
  expect_eq "$((ignored & hup))" "$((hup))" "rank $rank: SIGHUP still ignored (nohup)"
done
kill -HUP "$launcher"  # ignored, as nohup asks: the job runs on
sleep 1
kill -0 "$launcher" 2>/dev/null || fail "SIGHUP ended a cpprun that started with it ignored"
started=$(date +%s)
kill -INT "$launcher"
wait "$launcher"
expect_eq "$?" 130 "exit code after SIGINT"
[ $(($(date +%s) - started)) -lt 15 ] || fail "the job did not end at SIGINT (ran on to the workers' end)"
expect_in_file "$WORK/err" "received SIGINT" "summary"
expect_no_leftovers
echo PASS
