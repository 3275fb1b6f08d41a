# (c) A worker killed by SIGKILL makes cpprun exit 128+9, like a shell.
. "$(dirname "$0")/common.sh"

cpprun --nproc_per_node=2 /bin/sh -c 'if [ "$LOCAL_RANK" = 0 ]; then kill -KILL $$; fi; exec sleep 30'
expect_eq "$?" 137 "exit code"
expect_in_file "$WORK/err" "killed by SIGKILL" "summary names the signal"
expect_no_leftovers
echo PASS
