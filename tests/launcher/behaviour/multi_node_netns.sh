# Multi-node (3): two nodes in two network namespaces of this test's own, joined by a veth pair
# (10.213.0.1 and 10.213.0.2); node 1 reaches node 0 only over the veth, at --master_addr=10.213.0.1.
# Runs the library's collectives test across them, with no interface variables. Needs root and
# `ip netns`; skipped otherwise.
. "$(dirname "$0")/common.sh"
collectives=${2:?usage: $0 PATH/TO/cpprun PATH/TO/cpprun_dist_collectives}

netns_or_skip

ns0=cpprun-test-$$-0
ns1=cpprun-test-$$-1
veth=cpv$$
remove_namespaces() {
  local ns pid
  for ns in "$ns0" "$ns1"; do
    for pid in $(ip netns pids "$ns" 2>/dev/null); do kill -KILL "$pid" 2>/dev/null; done
    ip netns delete "$ns" 2>/dev/null
  done
  ip link delete "${veth}a" 2>/dev/null  # only if it never made it into a namespace
}
trap 'remove_namespaces; cleanup' EXIT

setup() {
  ip netns add "$ns0" && ip netns add "$ns1" &&
    ip link add "${veth}a" type veth peer name "${veth}b" &&
    ip link set "${veth}a" netns "$ns0" && ip link set "${veth}b" netns "$ns1" &&
    ip -n "$ns0" link set "${veth}a" name cpveth && ip -n "$ns1" link set "${veth}b" name cpveth &&
    ip -n "$ns0" addr add 10.213.0.1/24 dev cpveth && ip -n "$ns1" addr add 10.213.0.2/24 dev cpveth &&
    ip -n "$ns0" link set lo up && ip -n "$ns1" link set lo up &&
    ip -n "$ns0" link set cpveth up && ip -n "$ns1" link set cpveth up
}
if ! setup 2>"$WORK/setup.err"; then
  echo "SKIP: could not create the namespaces and veth pair: $(cat "$WORK/setup.err")"
  exit 77
fi

# No GLOO_SOCKET_IFNAME: cpprun names cpveth to each node's workers (the library's Gloo would bind
# the address the host name resolves to, 127.0.0.1 on many hosts, and node 1's rank could not
# connect); multi_node_interface.sh tests the choice itself.
unset GLOO_SOCKET_IFNAME NCCL_SOCKET_IFNAME
args=(--nnodes=2 --master_addr=10.213.0.1 --master_port=29530 --rdzv_conf timeout=30)
CPPRUN_TEST_TAG=$WORK ip netns exec "$ns1" "$CPPRUN" "${args[@]}" --node_rank=1 --nproc_per_node=1 "$collectives" \
  >"$WORK/node1.out" 2>"$WORK/node1.err" &
node1=$!
CPPRUN_TEST_TAG=$WORK ip netns exec "$ns0" "$CPPRUN" "${args[@]}" --node_rank=0 --nproc_per_node=2 "$collectives" \
  >"$WORK/node0.out" 2>"$WORK/node0.err" &
node0=$!
wait_node "$node0" 80
expect_eq "$NODE_STATUS" 0 "node 0's exit code"
wait_node "$node1" 80
expect_eq "$NODE_STATUS" 0 "node 1's exit code"
expect_in_file "$WORK/node0.err" "all 2 nodes joined at 10.213.0.1:29530; 3 workers" "node 0's rendezvous line"
expect_in_file "$WORK/node0.out" "[rank0]: All tests passed" "rank 0's result"
expect_in_file "$WORK/node0.out" "[rank1]: All tests passed" "rank 1's result"
expect_in_file "$WORK/node1.out" "[rank2]: All tests passed" "rank 2's result"
expect_in_file "$WORK/node1.err" "cpprun: node 1: workers' Gloo and NCCL use interface cpveth (10.213.0.2," \
  "node 1's interface line"
expect_no_leftovers
echo PASS
