# Multi-node: the workers' Gloo finds the right interface without being told. Two nodes in two
# network namespaces of this test's own, as a new user would try them: each namespace's host name
# resolves to 127.0.0.1 (its /etc/hosts says so, as Debian's and many containers' do), so left
# alone, rank 0's Gloo advertises the loopback and node 1's rank cannot connect. Two veth pairs join
# them: cpveth (10.213.0.0/24, fd00:213::/64), where the agents meet, and cpalt (10.214.0.0/24).
# (a) no interface variables: each node's workers get GLOO_SOCKET_IFNAME=cpveth and
#     NCCL_SOCKET_IFNAME==cpveth, each agent says so once, and a torch.distributed Gloo all-reduce
#     across the nodes succeeds; (b) the same over IPv6 (--master_addr=fd00:213::1); (c) the user's
#     GLOO_SOCKET_IFNAME=cpalt and NCCL_SOCKET_IFNAME=cpalt reach the workers untouched, cpprun says
#     nothing of interfaces, and the job succeeds. Needs root, `ip netns` and a python with torch.
. "$(dirname "$0")/common.sh"

netns_or_skip
find_torch_python_or_skip

ns0=cpprun-iface-$$-0
ns1=cpprun-iface-$$-1
remove_namespaces() {
  local ns pid
  for ns in "$ns0" "$ns1"; do
    for pid in $(ip netns pids "$ns" 2>/dev/null); do kill -KILL "$pid" 2>/dev/null; done
    ip netns delete "$ns" 2>/dev/null
    rm -rf "/etc/netns/$ns"
  done
  ip link delete "cpi$$a" 2>/dev/null  # only if it never made it into a namespace
  ip link delete "cpj$$a" 2>/dev/null
  rmdir /etc/netns 2>/dev/null  # if this test made it and no other uses it
}
trap 'remove_namespaces; cleanup' EXIT

# `ip netns exec` shows a namespace /etc/netns/NAME/hosts as /etc/hosts: there, this machine's
# host name is the loopback's.
pair() {  # veth name in the namespaces, IPv4 prefix, its temporary names' stem
  ip link add "${3}a" type veth peer name "${3}b" &&
    ip link set "${3}a" netns "$ns0" && ip link set "${3}b" netns "$ns1" &&
    ip -n "$ns0" link set "${3}a" name "$1" && ip -n "$ns1" link set "${3}b" name "$1" &&
    ip -n "$ns0" addr add "$2.1/24" dev "$1" && ip -n "$ns1" addr add "$2.2/24" dev "$1" &&
    ip -n "$ns0" link set "$1" up && ip -n "$ns1" link set "$1" up
}
setup() {
  local ns
  for ns in "$ns0" "$ns1"; do
    ip netns add "$ns" && ip -n "$ns" link set lo up && mkdir -p "/etc/netns/$ns" &&
      printf '127.0.0.1 localhost %s\n::1 localhost\n' "$(uname -n)" >"/etc/netns/$ns/hosts" || return 1
  done
  pair cpveth 10.213.0 "cpi$$" && pair cpalt 10.214.0 "cpj$$" &&
    ip -n "$ns0" addr add fd00:213::1/64 dev cpveth nodad && ip -n "$ns1" addr add fd00:213::2/64 dev cpveth nodad
}
if ! setup 2>"$WORK/setup.err"; then
  echo "SKIP: could not create the namespaces and veth pairs: $(cat "$WORK/setup.err")"
  exit 77
fi
ip netns exec "$ns1" getent hosts "$(uname -n)" | grep -q '^127\.0\.0\.1 ' ||
  fail "in the namespace the host name resolves to: $(ip netns exec "$ns1" getent hosts "$(uname -n)")"

# Each rank writes the variables it got, then all-reduces its rank + 1 over Gloo across the nodes.
cat >"$WORK/all_reduce.py" <<'EOF'
import datetime, os, sys
import torch
import torch.distributed as dist

rank = int(os.environ["RANK"])
with open(os.path.join(os.environ["WORK"], f"env.{rank}"), "w") as f:
    for name in ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME"):
        f.write(f"{name}={os.environ.get(name, '<unset>')}\n")
dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=20))
total = torch.tensor([float(rank + 1)])
dist.all_reduce(total)
print(f"all_reduce: {total.item():g}", flush=True)
dist.destroy_process_group()
sys.stdout.flush()
os._exit(0)  # PyTorch 2.15's Gloo threads may abort at finalization (see python_scripts.sh)
EOF

# One job: both nodes, one worker each; $1: --master_addr; then `env NAME=VALUE...` for the agents.
run_job() {
  local master=$1
  shift
  rm -f "$WORK"/env.*
  local args=(--nnodes=2 --nproc_per_node=1 --master_addr="$master" --master_port=29540
              --rdzv_conf timeout=60 "$python" "$WORK/all_reduce.py")
  CPPRUN_TEST_TAG=$WORK ip netns exec "$ns1" env "$@" "$CPPRUN" --node_rank=1 "${args[@]}" \
    >"$WORK/node1.out" 2>"$WORK/node1.err" &
  local node1=$!
  CPPRUN_TEST_TAG=$WORK ip netns exec "$ns0" env "$@" "$CPPRUN" --node_rank=0 "${args[@]}" \
    >"$WORK/node0.out" 2>"$WORK/node0.err" &
  local node0=$!
  wait_node "$node0" 100
  expect_eq "$NODE_STATUS" 0 "node 0's exit code (--master_addr=$master)"
  wait_node "$node1" 100
  expect_eq "$NODE_STATUS" 0 "node 1's exit code (--master_addr=$master)"
  expect_in_file "$WORK/node0.out" "[rank0]: all_reduce: 3" "rank 0's all-reduce"
  expect_in_file "$WORK/node1.out" "[rank1]: all_reduce: 3" "rank 1's all-reduce"
  expect_no_leftovers
}

expect_worker_env() {  # rank GLOO_SOCKET_IFNAME NCCL_SOCKET_IFNAME
  expect_eq "$(sed -n 's/^GLOO_SOCKET_IFNAME=//p' "$WORK/env.$1")" "$2" "rank $1's GLOO_SOCKET_IFNAME"
  expect_eq "$(sed -n 's/^NCCL_SOCKET_IFNAME=//p' "$WORK/env.$1")" "$3" "rank $1's NCCL_SOCKET_IFNAME"
}

expect_said_once() {  # node line
  expect_in_file "$WORK/node$1.err" "$2" "node $1's interface line"
  expect_eq "$(grep -c "workers' Gloo" "$WORK/node$1.err")" 1 "node $1's interface lines"
}

# (a) No variables: cpprun's choice, the veth the agents met over.
unset GLOO_SOCKET_IFNAME NCCL_SOCKET_IFNAME
run_job 10.213.0.1
expect_worker_env 0 cpveth =cpveth
expect_worker_env 1 cpveth =cpveth
override="; set GLOO_SOCKET_IFNAME (and NCCL_SOCKET_IFNAME) to choose another"
expect_said_once 0 "cpprun: node 0: workers' Gloo and NCCL use interface cpveth (10.213.0.1, the address the other \
nodes' agents reached this one at)$override"
expect_said_once 1 "cpprun: node 1: workers' Gloo and NCCL use interface cpveth (10.213.0.2, the address this node \
reaches the rendezvous host from)$override"

# (b) The agents meet over IPv6: the same interface, named by its IPv6 address.
run_job fd00:213::1
expect_worker_env 0 cpveth =cpveth
expect_worker_env 1 cpveth =cpveth
expect_said_once 0 "interface cpveth (fd00:213::1, the address the other nodes' agents reached this one at)"
expect_said_once 1 "interface cpveth (fd00:213::2, the address this node reaches the rendezvous host from)"

# (c) The user's choice, another interface than cpprun's: untouched, and not remarked on.
run_job 10.213.0.1 GLOO_SOCKET_IFNAME=cpalt NCCL_SOCKET_IFNAME=cpalt
expect_worker_env 0 cpalt cpalt
expect_worker_env 1 cpalt cpalt
for node in 0 1; do
  grep -q "interface" "$WORK/node$node.err" &&
    fail "node $node spoke of interfaces: $(grep interface "$WORK/node$node.err")"
done
echo PASS
