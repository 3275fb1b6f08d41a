# Strangers at the agents' ports (issue 16): without the job secret nobody can take a node's place,
# end the job, or learn its settings; a node with another secret is refused and told why; silent
# connections cannot fill the host; a job whose nodes are all on this host listens on the loopback
# only. A multi-node job that may span hosts does not start without a secret unless told to
# (--no_job_secret); one whose endpoint is the loopback shares this user's (Note [A job on one host]
# in launcher/common/host_secret.cpp), and an agent that cannot read it is refused.
. "$(dirname "$0")/common.sh"
require_private_netns
stranger() { python3 "$(dirname "$0")/stranger.py" "$@"; }

# ---- a multi-node job that may span hosts needs a secret (refused before anything listens) ----
CPPRUN_JOB_SECRET= cpprun --nnodes=2 --node_rank=0 --master_addr=10.0.0.1 --master_port=29570 /bin/true
expect_eq $? 2 "exit code without a secret"
expect_in_file "$WORK/err" "a multi-node job needs a job secret" "the refusal"
expect_in_file "$WORK/err" "--no_job_secret" "the way out"

# ---- on the loopback without a secret: this user's agents share one, kept where only they read ----
# As PyTorch's launcher tests run torchrun (test_launch_elastic_multiple_agents). An agent given
# another folder stands for another user's, who cannot read this one's: refused as a stranger.
endpoint=127.0.0.1:29574
mkdir -p "$WORK/xdg" "$WORK/xdg-other"
chmod 700 "$WORK/xdg" "$WORK/xdg-other"  # else not taken as this user's runtime folders
CPPRUN_JOB_SECRET= XDG_RUNTIME_DIR=$WORK/xdg start_node h0 --nnodes=2 --rdzv_backend=c10d --rdzv_endpoint=$endpoint \
  --rdzv_id=on-one-host --rdzv_conf join_timeout=40 /bin/sh -c 'echo "worker $RANK done"'
h0=$NODE_PID
wait_for_listener "$h0" 29574 10
CPPRUN_JOB_SECRET= XDG_RUNTIME_DIR=$WORK/xdg-other start_node hx --nnodes=2 --rdzv_backend=c10d \
  --rdzv_endpoint=$endpoint --rdzv_id=on-one-host /bin/true
wait_node "$NODE_PID" 20
expect_eq "$NODE_STATUS" 1 "the agent that cannot read this user's secret"
expect_in_file "$WORK/hx.err" "different secrets" "its reason"
CPPRUN_JOB_SECRET= XDG_RUNTIME_DIR=$WORK/xdg start_node h1 --nnodes=2 --rdzv_backend=c10d --rdzv_endpoint=$endpoint \
  --rdzv_id=on-one-host /bin/sh -c 'echo "worker $RANK done"'
h1=$NODE_PID
wait_node "$h0" 30
expect_eq "$NODE_STATUS" 0 "the first agent on one host"
wait_node "$h1" 30
expect_eq "$NODE_STATUS" 0 "the second agent on one host"
expect_in_file "$WORK/h0.out" "worker 0 done" "rank 0 on one host"
expect_in_file "$WORK/h1.out" "worker 1 done" "rank 1 on one host"
[ "$(stat -c %a "$WORK/xdg/cpprun")" = 700 ] || fail "the secrets' folder has mode $(stat -c %a "$WORK/xdg/cpprun"), not 700"
secrets=("$WORK"/xdg/cpprun/*)
[ ${#secrets[@]} = 1 ] || fail "expected one secret file, found: ${secrets[*]}"
[ "$(stat -c %a "${secrets[0]}")" = 600 ] || fail "the secret file has mode $(stat -c %a "${secrets[0]}"), not 600"
expect_in_file "$WORK/h0.err" "share this user's secret in ${secrets[0]}" "where the shared secret is kept"
# A dry run of such a job writes no secret.
rm -rf "$WORK/xdg/cpprun"
CPPRUN_JOB_SECRET= XDG_RUNTIME_DIR=$WORK/xdg cpprun --dry_run --nnodes=2 --rdzv_backend=c10d --rdzv_endpoint=$endpoint /bin/true
expect_eq $? 0 "dry run without a secret"
[ ! -e "$WORK/xdg/cpprun" ] || fail "a dry run wrote a secret: $(ls -la "$WORK/xdg/cpprun")"
# One c10d agent (--nnodes=1), no secret given, its endpoint on no loopback name: its own secret.
CPPRUN_JOB_SECRET= cpprun --rdzv_backend=c10d --nnodes=1 --rdzv_endpoint=127.0.0.1:29575 /bin/sh -c 'echo "alone $RANK"'
expect_eq $? 0 "one c10d agent without a secret"
expect_in_file "$WORK/out" "alone 0" "its worker ran"

# ---- static: node 0 waits for node 1; strangers come first ----
port=29571
start_node node0 --nnodes=2 --node_rank=0 --master_port=$port --rdzv_id=run-id-not-for-strangers \
  --max_restarts=1 --rdzv_conf timeout=40 /bin/sh -c 'echo "worker $RANK done"'
node0=$NODE_PID
# Node 0's agent listens for the agents' links at --master_port, and nowhere else.
link_port=$port
wait_for_listener "$node0" "$link_port" 10

# Every listener of a job whose nodes are all on this host is on the loopback.
listening=$(ss -ltnpH | grep "pid=$node0," | awk '{print $4}')
for address in $listening; do
  case $address in
    127.0.0.1:* | \[::ffff:127.0.0.1\]:*) ;;
    *) fail "node 0's agent listens at $address, not on the loopback alone (all: $listening)" ;;
  esac
done

# A hello in the clear, then a forged failure: refused before a word is read.
stranger hello 127.0.0.1 "$link_port" >"$WORK/stranger_hello.out"
grep -qE '^cpprun-auth 1 [0-9a-f]{32}$' "$WORK/stranger_hello.out" || fail "no challenge: $(cat "$WORK/stranger_hello.out")"
expect_in_file "$WORK/stranger_hello.out" "cpprun-auth-refused" "the stranger's refusal"
[ "$(wc -l <"$WORK/stranger_hello.out")" = 2 ] || fail "the agent told the stranger more: $(cat "$WORK/stranger_hello.out")"
grep -q "run-id-not-for-strangers\|max_restarts" "$WORK/stranger_hello.out" && fail "the refusal revealed the job's settings"
# A made-up proof, and a flood without a newline.
stranger proof 127.0.0.1 "$link_port" >"$WORK/stranger_proof.out"
expect_in_file "$WORK/stranger_proof.out" "cpprun-auth-refused" "the made-up proof's refusal"
stranger flood 127.0.0.1 "$link_port" >"$WORK/stranger_flood.out"
# Silent connections, more than the host keeps pending.
python3 "$(dirname "$0")/stranger.py" hold 127.0.0.1 "$link_port" 40 >"$WORK/stranger_hold.out" &
holder=$!
trap 'kill "$holder" 2>/dev/null; cleanup' EXIT
wait_for_text 10 "$WORK/stranger_hold.out" "holding 40 connections"
expect_in_file "$WORK/node0.err" "refused a connection from 127.0.0.1:" "node 0's warning"
expect_in_file "$WORK/node0.err" "did not prove that it holds this job's secret" "node 0's reason"
grep -q "pwned" "$WORK/node0.err" && fail "node 0 printed what the stranger said"

# A node with another job's secret is refused, and says why, as a line of cpprun's.
CPPRUN_JOB_SECRET=another-jobs-secret-0123456789 start_node node1bad --nnodes=2 --node_rank=1 --master_port=$port \
  --rdzv_id=run-id-not-for-strangers --max_restarts=1 /bin/true
wait_node "$NODE_PID" 20
expect_eq "$NODE_STATUS" 1 "the node with another secret"
expect_in_file "$WORK/node1bad.err" "different secrets" "its reason"
grep -q "^cpprun: the agent of node 0 (127.0.0.1:$port) refused this agent's proof of the job secret" "$WORK/node1bad.err" ||
  fail "the node with another secret: its error does not start with 'cpprun: ': $(cat "$WORK/node1bad.err")"

# The real node 1 still gets its place: the job runs and succeeds.
start_node node1 --nnodes=2 --node_rank=1 --master_port=$port --rdzv_id=run-id-not-for-strangers --max_restarts=1 \
  /bin/sh -c 'echo "worker $RANK done"'
node1=$NODE_PID
wait_node "$node0" 30
expect_eq "$NODE_STATUS" 0 "node 0's exit code"
wait_node "$node1" 30
expect_eq "$NODE_STATUS" 0 "node 1's exit code"
expect_in_file "$WORK/node0.out" "worker 0 done" "rank 0 ran"
expect_in_file "$WORK/node1.out" "worker 1 done" "rank 1 ran"
kill "$holder" 2>/dev/null
wait "$holder" 2>/dev/null

# ---- c10d: the endpoint itself is the link port; refusals reveal nothing ----
endpoint=127.0.0.1:29572
start_node c0 --nnodes=2 --rdzv_backend=c10d --rdzv_endpoint=$endpoint --rdzv_id=run-id-not-for-strangers \
  --rdzv_conf join_timeout=40 /bin/sh -c 'echo "worker $RANK done"'
c0=$NODE_PID
wait_for_listener "$c0" 29572 10
# A stranger that sends half a proof and falls silent is dropped after 10 s, while nobody else
# connects (Note [Pending links on the agent's clock]); it used to keep its place for as long as the
# agent ran.
stranger partial 127.0.0.1 29572 20 >"$WORK/stranger_partial.out"
closed_after=$(sed -n 's/^closed after \([0-9]*\)\.[0-9] s$/\1/p' "$WORK/stranger_partial.out")
[ -n "$closed_after" ] && [ "$closed_after" -ge 8 ] && [ "$closed_after" -lt 14 ] ||
  fail "the silent half-proof's connection: $(cat "$WORK/stranger_partial.out") (expected closed after about 10 s)"
alive "$c0" || fail "the c10d host is gone after the half-proof"
stranger hello 127.0.0.1 29572 >"$WORK/stranger_c10d.out"
expect_in_file "$WORK/stranger_c10d.out" "cpprun-auth-refused" "the c10d stranger's refusal"
grep -q "run-id-not-for-strangers\|rdzv_id\|nnodes" "$WORK/stranger_c10d.out" && fail "the c10d refusal revealed the job's settings"
start_node c1 --nnodes=2 --rdzv_backend=c10d --rdzv_endpoint=$endpoint --rdzv_id=run-id-not-for-strangers \
  /bin/sh -c 'echo "worker $RANK done"'
c1=$NODE_PID
wait_node "$c0" 30
expect_eq "$NODE_STATUS" 0 "c10d host's exit code"
wait_node "$c1" 30
expect_eq "$NODE_STATUS" 0 "c10d member's exit code"

# ---- --no_job_secret: runs, says what that exposes, and the workers reach the store directly ----
open_worker='echo "$MASTER_ADDR:$MASTER_PORT" >"$WORK/open.$RANK"'
CPPRUN_JOB_SECRET= start_node open0 --nnodes=2 --node_rank=0 --master_port=29573 --no_job_secret /bin/sh -c "$open_worker"
open0=$NODE_PID
CPPRUN_JOB_SECRET= start_node open1 --nnodes=2 --node_rank=1 --master_port=29573 --no_job_secret /bin/sh -c "$open_worker"
wait_node "$open0" 30
expect_eq "$NODE_STATUS" 0 "node 0 without a secret"
wait_node "$NODE_PID" 30
expect_eq "$NODE_STATUS" 0 "node 1 without a secret"
expect_in_file "$WORK/open0.err" "warning: --no_job_secret: the agents do not authenticate each other" "the warning"
expect_in_file "$WORK/open0.err" "the workers' c10d store (node 0's, at MASTER_ADDR:MASTER_PORT) is reachable directly" \
  "the warning's store part"
# Not tunnelled: both nodes' workers are given rank 0's own address and port (through an agent, a
# node on the host's machine would get a port of its agent's).
[ "$(cat "$WORK/open.0")" = "$(cat "$WORK/open.1")" ] ||
  fail "--no_job_secret: the workers' store endpoints differ: $(cat "$WORK/open.0") and $(cat "$WORK/open.1")"
expect_no_leftovers
echo PASS
