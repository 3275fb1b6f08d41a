# Each worker's lines reach the console whole, prefixed [rankN]:, stdout on stdout and stderr on
# stderr, even when 4 workers write thousands of long lines at once; once, where the worker wrote it.
. "$(dirname "$0")/common.sh"

# awk writes to a pipe in 4 KiB blocks, which cut lines anywhere: the launcher must put them together.
OMP_NUM_THREADS=1 cpprun --nproc_per_node=4 /bin/sh -c '
  exec awk -v r="$RANK" "BEGIN {
    pad = sprintf(\"%189s\", \"\"); gsub(/ /, \"x\", pad)
    for (i = 0; i < 2000; i++) { printf \"r%s l%05d %s\n\", r, i, pad; if (i % 4 == 0) printf \"e%s l%05d %s\n\", r, i, pad > \"/dev/stderr\" }
  }"'
expect_eq "$?" 0 "exit code"
expect_eq "$(wc -l <"$WORK/out")" 8000 "stdout lines"
expect_eq "$(wc -l <"$WORK/err")" 2000 "stderr lines"
# Backreference: the prefix's rank is the rank that wrote the line, and the line is complete.
expect_all_lines "$WORK/out" '^\[rank([0-3])\]: r\1 l[0-9]{5} x{189}$' "stdout"
expect_all_lines "$WORK/err" '^\[rank([0-3])\]: e\1 l[0-9]{5} x{189}$' "stderr"
for rank in 0 1 2 3; do
  # Each rank's lines arrive in order.
  grep "^\[rank$rank\]" "$WORK/out" | awk -v r="$rank" '{ if ($3 != sprintf("l%05d", NR - 1)) { print "rank " r " line " NR ": " $3; exit 1 } }' \
    || fail "rank $rank's stdout lines out of order"
done

# torch.distributed's excepthook already writes "[rankN]: " before each traceback line: such a line
# is prefixed once, not twice; another rank's prefix, or one not at the start, is not this worker's.
# Tee'd, every line gets torchrun's prefix, as torchrun writes it.
cpprun --nproc_per_node=2 /bin/sh -c 'printf "[rank%s]: Traceback\n[rank0]: of rank 0\nsee [rank%s]: \n" "$RANK" "$RANK" >&2'
expect_eq "$?" 0 "already prefixed exit code"
expect_eq "$(grep -cxF '[rank1]: Traceback' "$WORK/err")" 1 "rank 1's own prefix printed once"
expect_eq "$(grep -cxF '[rank0]: Traceback' "$WORK/err")" 1 "rank 0's own prefix printed once"
expect_in_file "$WORK/err" "[rank1]: [rank0]: of rank 0" "another rank's prefix kept"
expect_in_file "$WORK/err" "[rank0]: see [rank0]: " "a prefix inside the line kept"
cpprun --tee=2 --log_dir "$WORK/logs" /bin/sh -c 'echo "[rank0]: Traceback" >&2'
expect_in_file "$WORK/err" "[default0]:[rank0]: Traceback" "--tee's prefix on every line"

# Under a template the prefix is the user's: a line starting with the same text gets it all the same.
cpprun --log-line-prefix-template='[rank${rank}]: ' /bin/sh -c 'echo "[rank0]: mine"'
expect_in_file "$WORK/out" "[rank0]: [rank0]: mine" "a template's prefix on every line"

# torchrun's --log_line_prefix_template (and its variable) replace the [rankN]: prefix.
cpprun --nproc_per_node=2 --role=trainer --log-line-prefix-template='${role_name}/${rank}/${local_rank}@${hostname}| ' \
  /bin/sh -c 'echo "hi $RANK"'
expect_eq "$?" 0 "template exit code"
expect_in_file "$WORK/out" "trainer/1/1@$(hostname)| hi 1" "--log_line_prefix_template"
TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE='<$rank> ' cpprun /bin/sh -c 'echo "hi"'
expect_in_file "$WORK/out" "<0> hi" "TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE"
expect_no_leftovers
echo PASS
