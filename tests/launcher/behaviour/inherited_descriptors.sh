# A worker inherits stdin, stdout, stderr and its flight recorder's request descriptor (3), nothing
# else of cpprun's or of cpprun's caller (Note [Descriptors a worker inherits]), as torchrun's
# workers (Python's subprocess closes the rest): a caller's open file or pipe stayed open in every
# worker. The worker is ls itself (a shell keeps descriptors of its own: dash saves stdout in 10).
. "$(dirname "$0")/common.sh"

exec 7>"$WORK/held" 9>"$WORK/held_too"
CPPRUN_TEST_TAG=$WORK "$CPPRUN" --nproc_per_node=2 ls /proc/self/fd >"$WORK/out" 2>"$WORK/err"
expect_eq "$?" 0 "exit code"
exec 7>&- 9>&-
for rank in 0 1; do
  # 0-2, the recorder's 3, and 4: the directory ls itself opened to list them.
  expect_eq "$(sed -n "s/^\[rank$rank\]: //p" "$WORK/out" | sort -n | tr '\n' ' ')" "0 1 2 3 4 " \
    "rank $rank's open descriptors"
done
expect_no_leftovers

# Many workers under a low soft open-file limit: cpprun raises its own to the hard limit (it holds
# about three descriptors a worker, six while starting them: 40 workers under 64 failed in pipe2(),
# where torchrun starts them), and each worker keeps the caller's soft limit.
(ulimit -Sn 64 && CPPRUN_TEST_TAG=$WORK "$CPPRUN" --nproc_per_node=40 sh -c 'ulimit -Sn') >"$WORK/out" 2>"$WORK/err"
expect_eq "$?" 0 "exit code of 40 workers under ulimit -Sn 64 (hard limit $(ulimit -Hn))"
expect_eq "$(sed -n 's/^\[rank[0-9]*\]: //p' "$WORK/out" | sort -u | tr '\n' ' ')" "64 " "the workers' soft limit"
# A hard limit too low for them: refused, naming the limit and what to do.
(ulimit -n 64 && CPPRUN_TEST_TAG=$WORK "$CPPRUN" --nproc_per_node=40 true) >"$WORK/out" 2>"$WORK/err"
expect_eq "$?" 1 "exit code of 40 workers under ulimit -n 64"
grep -q "open-file limit is 64, hard limit 64" "$WORK/err" || fail "no limit named: $(cat "$WORK/err")"  # any pipe2()
expect_no_leftovers
echo PASS
