# The workers' store sealed behind the agents' link (Note [Store tunnel wired] in store_tunnel_io.h):
# two nodes in network namespaces of this test's own joined by a veth pair (10.213.0.1, 10.213.0.2),
# and a stranger in a third (10.214.0.2) that reaches node 0's address over a second veth. While the
# job runs, worker rank 0's store (the library's, MASTER_ADDR=127.0.0.1) listens on node 0's loopback
# alone, a connection from the stranger to node 0's address at that port is refused (while the
# agents' port at that address answers it: the path is there), and node 1's workers reach the store
# through their agent: the library's collectives test passes across the nodes. Needs root and
# `ip netns`; skipped otherwise.
. "$(dirname "$0")/common.sh"
collectives=${2:?usage: $0 PATH/TO/cpprun PATH/TO/cpprun_dist_collectives}

netns_or_skip

ns0=cpprun-test-$$-0
ns1=cpprun-test-$$-1
ns2=cpprun-test-$$-2
veth=cpv$$
stranger=cps$$
remove_namespaces() {
  local ns pid
  for ns in "$ns0" "$ns1" "$ns2"; do
    for pid in $(ip netns pids "$ns" 2>/dev/null); do kill -KILL "$pid" 2>/dev/null; done
    ip netns delete "$ns" 2>/dev/null
  done
  ip link delete "${veth}a" 2>/dev/null  # only if it never made it into a namespace
  ip link delete "${stranger}a" 2>/dev/null
}
trap 'remove_namespaces; cleanup' EXIT

setup() {
  ip netns add "$ns0" && ip netns add "$ns1" && ip netns add "$ns2" &&
    ip link add "${veth}a" type veth peer name "${veth}b" &&
    ip link set "${veth}a" netns "$ns0" && ip link set "${veth}b" netns "$ns1" &&
    ip -n "$ns0" link set "${veth}a" name cpveth && ip -n "$ns1" link set "${veth}b" name cpveth &&
    ip -n "$ns0" addr add 10.213.0.1/24 dev cpveth && ip -n "$ns1" addr add 10.213.0.2/24 dev cpveth &&
    ip link add "${stranger}a" type veth peer name "${stranger}b" &&
    ip link set "${stranger}a" netns "$ns0" && ip link set "${stranger}b" netns "$ns2" &&
    ip -n "$ns0" addr add 10.214.0.1/24 dev "${stranger}a" && ip -n "$ns2" addr add 10.214.0.2/24 dev "${stranger}b" &&
    for ns in "$ns0" "$ns1" "$ns2"; do ip -n "$ns" link set lo up || return 1; done &&
    ip -n "$ns0" link set cpveth up && ip -n "$ns1" link set cpveth up &&
    ip -n "$ns0" link set "${stranger}a" up && ip -n "$ns2" link set "${stranger}b" up &&
    ip -n "$ns2" route add 10.213.0.0/24 via 10.214.0.1
}
if ! setup 2>"$WORK/setup.err"; then
  echo "SKIP: could not create the namespaces and veth pairs: $(cat "$WORK/setup.err")"
  exit 77
fi

# Whether a TCP connection from namespace $1 to $2:$3 is accepted (exit 0) or not.
connects() {  # namespace address port
  ip netns exec "$1" python3 - "$2" "$3" <<'PY'
import socket, sys
try:
    socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=5).close()
except OSError as e:
    print(f"connect to {sys.argv[1]}:{sys.argv[2]}: {e}")
    sys.exit(1)
PY
}

# Node 1's worker waits for $WORK/release before it starts the collectives test, so worker rank 0
# sits in init_process_group, its store listening, while the test looks at it.
worker='env >"$WORK/env.$RANK"
  [ "$GROUP_RANK" = 0 ] || while [ ! -e "$WORK/release" ]; do sleep 0.05; done
  exec "$0"'
unset GLOO_SOCKET_IFNAME NCCL_SOCKET_IFNAME
args=(--nnodes=2 --master_addr=10.213.0.1 --master_port=29540 --rdzv_conf join_timeout=30)
CPPRUN_TEST_TAG=$WORK ip netns exec "$ns1" "$CPPRUN" "${args[@]}" --node_rank=1 --nproc_per_node=1 \
  /bin/sh -c "$worker" "$collectives" >"$WORK/node1.out" 2>"$WORK/node1.err" &
node1=$!
CPPRUN_TEST_TAG=$WORK ip netns exec "$ns0" "$CPPRUN" "${args[@]}" --node_rank=0 --nproc_per_node=2 \
  /bin/sh -c "$worker" "$collectives" >"$WORK/node0.out" 2>"$WORK/node0.err" &
node0=$!
wait_for_files 30 "$WORK/env.0" "$WORK/env.2"
port=$(sed -n 's/^MASTER_PORT=//p' "$WORK/env.0")
[ -n "$port" ] || fail "rank 0 has no MASTER_PORT"
for rank in 0 2; do
  grep -qxF MASTER_ADDR=127.0.0.1 "$WORK/env.$rank" ||
    fail "rank $rank's MASTER_ADDR is not the loopback: $(grep '^MASTER_ADDR=' "$WORK/env.$rank")"
done

# Worker rank 0's store comes up at 127.0.0.1:$port, and nowhere else on node 0.
deadline=$((SECONDS + 30))
until ip netns exec "$ns0" ss -ltnH | awk '{print $4}' | grep -q ":$port\$"; do
  [ "$SECONDS" -lt "$deadline" ] || fail "worker rank 0's store never listened at port $port on node 0"
  sleep 0.05
done
ip netns exec "$ns0" ss -ltnH >"$WORK/listening"
store_at=$(awk '{print $4}' "$WORK/listening" | grep ":$port\$")
[ "$store_at" = "127.0.0.1:$port" ] || fail "node 0's store listens at '$store_at', not 127.0.0.1:$port alone: $(cat "$WORK/listening")"

# The stranger reaches node 0's address (the agents' port answers), but not the store there.
connects "$ns2" 10.213.0.1 29540 >"$WORK/stranger.agent" ||
  fail "the stranger cannot reach node 0 at all (the test's network is wrong): $(cat "$WORK/stranger.agent")"
if connects "$ns2" 10.213.0.1 "$port" >"$WORK/stranger.store"; then
  fail "a stranger connected to node 0's address at the workers' store port $port"
fi
grep -q "refused" "$WORK/stranger.store" || fail "the stranger's connect to the store port was not refused: $(cat "$WORK/stranger.store")"
if connects "$ns1" 10.213.0.1 "$port" >"$WORK/node1.store"; then
  fail "node 1 connected to node 0's address at the workers' store port $port: not through its agent"
fi

touch "$WORK/release"
wait_node "$node0" 80
expect_eq "$NODE_STATUS" 0 "node 0's exit code"
wait_node "$node1" 80
expect_eq "$NODE_STATUS" 0 "node 1's exit code"
expect_in_file "$WORK/node0.out" "[rank0]: All tests passed" "rank 0's result"
expect_in_file "$WORK/node0.out" "[rank1]: All tests passed" "rank 1's result"
expect_in_file "$WORK/node1.out" "[rank2]: All tests passed" "rank 2's result"
expect_no_leftovers
echo PASS
