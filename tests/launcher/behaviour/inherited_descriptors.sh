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
echo PASS
