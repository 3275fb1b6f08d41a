# --dry_run prints each rank's command line and the variables cpprun sets for it, starts nothing,
# creates nothing, and exits 0.
. "$(dirname "$0")/common.sh"

cpprun --dry_run --nproc_per_node=2 --master_port=29511 --tee 1 --log_dir "$WORK/logs" \
  /bin/sh -c 'touch "$WORK/started"' 'arg with spaces'
expect_eq "$?" 0 "exit code"
[ ! -e "$WORK/started" ] || fail "a worker ran"
[ ! -e "$WORK/logs" ] || fail "--log_dir was created"
expect_eq "$(grep -c '^rank [01] (local_rank [01]):$' "$WORK/out")" 2 "one block per rank"
expect_in_file "$WORK/out" "  command: /bin/sh -c 'touch \"\$WORK/started\"' 'arg with spaces'" "quoted command"
# torchrun's layout: LOG_DIR/RUN_ID_XXXXXXXX/attempt_N/LOCAL_RANK; the random part is not drawn yet.
plan="  stdout: console, lines prefixed '[default1]:'; $WORK/logs/none_XXXXXXXX/attempt_0/1/stdout.log"
expect_in_file "$WORK/out" "$plan" "stdout plan"
for var in RANK=1 LOCAL_RANK=1 WORLD_SIZE=2 MASTER_PORT=29511 \
           "TORCHELASTIC_ERROR_FILE=$WORK/logs/none_XXXXXXXX/attempt_0/1/error.json"; do
  expect_in_file "$WORK/out" "    $var" "$var"
done
grep -q "    PATH=" "$WORK/out" && fail "inherited PATH listed as set by cpprun"

# Without --log_dir, no temp dir is made; a missing program is still reported.
cpprun --dry-run /bin/true
expect_eq "$?" 0 "plain dry run"
expect_in_file "$WORK/out" "1 worker would start; nothing was started" "header"
expect_in_file "$WORK/out" "TORCHELASTIC_ERROR_FILE=$TMPDIR/cpprun-XXXXXX/attempt_0.0.error.json" "placeholder"
# --tee without --log_dir: the temp log dir torchrun would make, not made either.
cpprun --dry-run --tee=3 --master_port=29511 /bin/true
expect_eq "$?" 0 "dry run of --tee without --log_dir"
expect_in_file "$WORK/out" "$TMPDIR/torchelastic_XXXXXX/none_XXXXXXXX/attempt_0/0/stdout.log" "temp log dir placeholder"
cpprun --dry_run cpprun-no-such-program
expect_eq "$?" 127 "dry run of a missing program"
expect_no_leftovers
echo PASS
