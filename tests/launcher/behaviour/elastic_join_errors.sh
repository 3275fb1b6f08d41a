# c10d rendezvous: agents that cannot join. A different --rdzv_id (or --nnodes) is refused with both
# values; too few nodes by join_timeout fail on every agent, saying how many of MIN came; a member
# waits for a host that starts last (--rdzv_conf is_host); at a port that is no agent's (it closes
# every connection, or answers in HTTP) a member does not reconnect in a tight loop, and says what
# it found, in lines that start with "cpprun: ".
. "$(dirname "$0")/common.sh"
require_private_netns

worker='touch "$WORK/started.$GROUP_RANK.$LOCAL_RANK"'
c10d="--rdzv_backend=c10d --rdzv_endpoint=127.0.0.1:29620"

# (1) Another job's agent (--rdzv_id=other) is refused at once, naming both ids; the job goes on.
start_node nodeA $c10d --rdzv_id=job1 --nnodes=1:2 --rdzv_conf last_call_timeout=3 /bin/sh -c "$worker"
a=$NODE_PID
wait_for_text 10 "$WORK/nodeA.err" "this agent hosts the c10d rendezvous"  # A hosts: it is node 0
start_node nodeB $c10d --rdzv_id=other --nnodes=1:2 /bin/sh -c "$worker"
wait_node "$NODE_PID" 10
expect_eq "$NODE_STATUS" 2 "the refused agent's exit code"
expect_in_file "$WORK/nodeB.err" "cpprun: the agent hosting the rendezvous at 127.0.0.1:29620 refused this agent: it has --rdzv_id=other but the job at 127.0.0.1:29620 has --rdzv_id=job1; every node of a job needs the same --rdzv_id" \
  "the refused agent's message"
expect_in_file "$WORK/nodeA.err" "refused the agent at 127.0.0.1:" "the host's note"
# So is one with other --nnodes.
start_node nodeC $c10d --rdzv_id=job1 --nnodes=1:3 /bin/sh -c "$worker"
wait_node "$NODE_PID" 10
expect_eq "$NODE_STATUS" 2 "the agent with other --nnodes"
expect_in_file "$WORK/nodeC.err" "it has --nnodes=1:3 but the job at 127.0.0.1:29620 has --nnodes=1:2" "other --nnodes"
wait_node "$a" 20
expect_eq "$NODE_STATUS" 0 "the host's exit code, alone after the last call"
[ -e "$WORK/started.0.0" ] || fail "the host's worker did not run"
ls "$WORK"/started.1.* >/dev/null 2>&1 && fail "a refused agent ran a worker"
expect_no_leftovers

# (2) --nnodes=3:4 and only two agents: both give up after join_timeout=2, saying 2 of at least 3
# came, and start no worker.
rm -f "$WORK"/started.*
started=$(now_ms)
start_node nodeA $c10d --rdzv_id=job2 --nnodes=3:4 --rdzv_conf join_timeout=2 /bin/sh -c "$worker"
a=$NODE_PID
wait_for_text 10 "$WORK/nodeA.err" "this agent hosts the c10d rendezvous"
start_node nodeB $c10d --rdzv_id=job2 --nnodes=3:4 --rdzv_conf join_timeout=2 /bin/sh -c "$worker"
b=$NODE_PID
wait_node "$a" 20
expect_eq "$NODE_STATUS" 1 "the host's exit code after the join timeout"
wait_node "$b" 20
expect_eq "$NODE_STATUS" 1 "the member's exit code after the join timeout"
elapsed=$(($(now_ms) - started))
[ "$elapsed" -ge 1900 ] || fail "gave up after $elapsed ms, before join_timeout=2"
for node in A B; do
  expect_in_file "$WORK/node$node.err" "rendezvous timed out after 2 s (--rdzv_conf join_timeout): 2 of the at least 3 nodes that --nnodes=3:4 needs joined at 127.0.0.1:29620 (--rdzv_id=job2)" \
    "node $node's message"
done
ls "$WORK"/started.* >/dev/null 2>&1 && fail "a worker started"
expect_no_leftovers

# (3) The member starts first and waits (is_host=0: it never hosts); the host (is_host=1) comes later.
start_node nodeB $c10d --rdzv_id=job3 --nnodes=2 --rdzv_conf is_host=0,join_timeout=20 /bin/sh -c "$worker"
b=$NODE_PID
# The member is seen trying to reach the host, and keeps trying: then the host comes.
wait_for_connect_attempt 29620 15
wait_for_text 10 "$WORK/nodeB.err" "closed this node's connection before the handshake completed; trying again"
alive "$b" || fail "the member gave up before its host came"
start_node nodeA $c10d --rdzv_id=job3 --nnodes=2 --rdzv_conf is_host=1 /bin/sh -c "$worker"
a=$NODE_PID
wait_node "$a" 20
expect_eq "$NODE_STATUS" 0 "the late host's exit code"
wait_node "$b" 20
expect_eq "$NODE_STATUS" 0 "the early member's exit code"
[ -e "$WORK/started.0.0" ] && [ -e "$WORK/started.1.0" ] || fail "both nodes' workers should have run"
expect_in_file "$WORK/nodeB.err" "node 1 of 2" "the member's numbering"
expect_no_leftovers

# (4) Nothing ever answers: a member alone (is_host=0) says so after join_timeout.
start_node nodeB $c10d --rdzv_id=job4 --nnodes=2 --rdzv_conf is_host=0,join_timeout=1 /bin/sh -c "$worker"
wait_node "$NODE_PID" 10
expect_eq "$NODE_STATUS" 1 "the lonely member's exit code"
expect_in_file "$WORK/nodeB.err" "rendezvous timed out after 1 s (--rdzv_conf join_timeout): nothing answered at 127.0.0.1:29620 (--rdzv_endpoint)" \
  "the lonely member's message"
expect_no_leftovers

# (5) What listens at the endpoint is no agent: it closes every connection at once, without a word.
# The member tries again until join_timeout, pausing between tries (5 ms, doubling to 100 ms: a few
# dozen connections in 3 s, where a tight loop made tens of thousands), and then says that what is
# there may not be a cpprun agent, not that something floods node 0's.
squat() {  # mode: a stranger listening at the endpoint; its pid in $squatter, its output in $WORK/squat.out
  : >"$WORK/squat.out"  # not only by the redirection below, which may run after wait_for_text has read
  python3 "$(dirname "$0")/stranger.py" squat 127.0.0.1 29620 "$1" >"$WORK/squat.out" 2>&1 &
  squatter=$!
  trap 'kill "$squatter" 2>/dev/null; cleanup' EXIT
  wait_for_text 10 "$WORK/squat.out" "listening"
}
rm -f "$WORK"/started.*
squat close
start_node nodeB $c10d --rdzv_id=job5 --nnodes=2 --rdzv_conf join_timeout=3 /bin/sh -c "$worker"
wait_node "$NODE_PID" 20
expect_eq "$NODE_STATUS" 1 "the member's exit code at a port that closes every connection"
kill "$squatter"
wait "$squatter"
expect_in_file "$WORK/nodeB.err" "cpprun: what listens at 127.0.0.1:29620 (--rdzv_endpoint) closed every one of this node's connections before the handshake, without a word of cpprun's protocol" \
  "the member's message at a port that closes every connection"
expect_in_file "$WORK/nodeB.err" "it may not be a cpprun agent, or it is another job's port" "what the member makes of it"
grep -q "flooding" "$WORK/nodeB.err" && fail "the member blamed a flood at node 0's agent: $(cat "$WORK/nodeB.err")"
expect_all_lines "$WORK/nodeB.err" '^cpprun: ' "the member's lines at a port that closes every connection"
ls "$WORK"/started.* >/dev/null 2>&1 && fail "a worker started"
accepted=$(sed -n 's/^accepted \([0-9]*\) connections$/\1/p' "$WORK/squat.out")
[ -n "$accepted" ] && [ "$accepted" -ge 2 ] && [ "$accepted" -le 100 ] ||
  fail "the member connected '$accepted' times in 3 s: expected a few dozen, 5-100 ms apart ($(cat "$WORK/squat.out"))"
expect_no_leftovers

# (6) An endpoint that answers in HTTP: refused at its first line, said in a line of cpprun's own.
squat http
start_node nodeB $c10d --rdzv_id=job6 --nnodes=2 --rdzv_conf join_timeout=10 /bin/sh -c "$worker"
wait_node "$NODE_PID" 20
expect_eq "$NODE_STATUS" 1 "the member's exit code at an HTTP port"
kill "$squatter"
wait "$squatter"
expect_in_file "$WORK/nodeB.err" "cpprun: the agent hosting the c10d rendezvous at 127.0.0.1:29620 (127.0.0.1:29620) sent a line that is not a cpprun agent message: 'HTTP/1.0 400 Bad Request?'" \
  "the member's message at an HTTP port"
expect_all_lines "$WORK/nodeB.err" '^cpprun: ' "the member's lines at an HTTP port"
ls "$WORK"/started.* >/dev/null 2>&1 && fail "a worker started"
expect_no_leftovers

# (7) What listens at the endpoint accepts and never says a word, and the join timeout ends before
# the member's 10 s wait for a first word: the message still says what was there (it once said
# "1 of the at least 2 nodes joined (as its host last reported)", of a host that reported nothing).
squat silent
start_node nodeB $c10d --rdzv_id=job7 --nnodes=2 --rdzv_conf join_timeout=2 /bin/sh -c "$worker"
wait_node "$NODE_PID" 20
expect_eq "$NODE_STATUS" 1 "the member's exit code at a port that never answers"
kill "$squatter"
wait "$squatter"
expect_in_file "$WORK/nodeB.err" "cpprun: 127.0.0.1:29620, reached through 127.0.0.1:29620, accepted a connection but did not answer as a cpprun rendezvous host within" \
  "the member's message at a port that never answers"
grep -q "as its host last reported" "$WORK/nodeB.err" && fail "the member quoted a host that said nothing: $(cat "$WORK/nodeB.err")"
expect_all_lines "$WORK/nodeB.err" '^cpprun: ' "the member's lines at a port that never answers"
ls "$WORK"/started.* >/dev/null 2>&1 && fail "a worker started"
expect_no_leftovers
echo PASS
