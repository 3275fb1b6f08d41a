# The workers' store sealed behind the agents' link (Note [Store tunnel wired] in store_tunnel_io.h):
# two nodes in network namespaces of this test's own joined by a veth pair (10.213.0.1, 10.213.0.2),
# and a stranger in a third (10.214.0.2) that reaches node 0's address over a second veth. While the
# job runs, the workers' store (node 0's store keeper's, MASTER_ADDR=127.0.0.1) listens on node 0's
# loopback alone, a connection from the stranger to node 0's address at that port is refused (while
# the agents' port at that address answers it: the path is there), and node 1's workers reach the
# store through their agent: the library's collectives test passes across the nodes. Then the same
# with torch.distributed (env://) workers, whose rank 0 used to bind its own store on every
# interface: every rank is now a client of the keeper's store, and Gloo's all-reduce passes. Needs
# root and `ip netns`; skipped otherwise (the Python part without a python that has torch).
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

# The store's listener on node 0 while the job of ranks $1 (node 0) and $2 (node 1), whose
# environments are in $WORK/env.RANK, waits: at 127.0.0.1:MASTER_PORT alone, the store keeper's, out
# of the stranger's reach and of node 1's but through its agent. Sets $port.
expect_sealed() {  # rank_on_node0 rank_on_node1 what
  local rank store_at
  wait_for_files 60 "$WORK/env.$1" "$WORK/env.$2"
  port=$(sed -n 's/^MASTER_PORT=//p' "$WORK/env.$1")
  [ -n "$port" ] || fail "$3: rank $1 has no MASTER_PORT"
  for rank in "$1" "$2"; do
    grep -qxF MASTER_ADDR=127.0.0.1 "$WORK/env.$rank" ||
      fail "$3: rank $rank's MASTER_ADDR is not the loopback: $(grep '^MASTER_ADDR=' "$WORK/env.$rank")"
    grep -qxF TORCHELASTIC_USE_AGENT_STORE=True "$WORK/env.$rank" || fail "$3: rank $rank is not told the agent hosts the store"
  done
  # The keeper's socket listens from the round's start, before any worker: at 127.0.0.1:$port alone.
  ip netns exec "$ns0" ss -ltnpH >"$WORK/listening"
  store_at=$(awk '{print $4}' "$WORK/listening" | grep ":$port\$")
  [ "$store_at" = "127.0.0.1:$port" ] ||
    fail "$3: node 0's store listens at '$store_at', not 127.0.0.1:$port alone: $(cat "$WORK/listening")"
  grep ":$port " "$WORK/listening" | grep -qF '(("cpprun-store-ke",' ||
    fail "$3: the store's listener is not the store keeper's: $(grep ":$port " "$WORK/listening")"
  # The stranger reaches node 0's address (the agents' port answers), but not the store there.
  connects "$ns2" 10.213.0.1 29540 >"$WORK/stranger.agent" ||
    fail "$3: the stranger cannot reach node 0 at all (the test's network is wrong): $(cat "$WORK/stranger.agent")"
  if connects "$ns2" 10.213.0.1 "$port" >"$WORK/stranger.store"; then
    fail "$3: a stranger connected to node 0's address at the workers' store port $port"
  fi
  grep -q "refused" "$WORK/stranger.store" ||
    fail "$3: the stranger's connect to the store port was not refused: $(cat "$WORK/stranger.store")"
  if connects "$ns1" 10.213.0.1 "$port" >"$WORK/node1.store"; then
    fail "$3: node 1 connected to node 0's address at the workers' store port $port: not through its agent"
  fi
}

# Node 1's worker waits for $WORK/release before it starts the collectives test, so node 0's workers
# sit in init_process_group, the store listening, while the test looks at it.
worker='env >"$WORK/env.$RANK"
  [ "$GROUP_RANK" = 0 ] || while [ ! -e "$WORK/release" ]; do sleep 0.05; done
  exec "$0"'
unset GLOO_SOCKET_IFNAME NCCL_SOCKET_IFNAME
args=(--nnodes=2 --master_addr=10.213.0.1 --master_port=29540 --rdzv_conf timeout=30)
CPPRUN_TEST_TAG=$WORK ip netns exec "$ns1" "$CPPRUN" "${args[@]}" --node_rank=1 --nproc_per_node=1 \
  /bin/sh -c "$worker" "$collectives" >"$WORK/node1.out" 2>"$WORK/node1.err" &
node1=$!
CPPRUN_TEST_TAG=$WORK ip netns exec "$ns0" "$CPPRUN" "${args[@]}" --node_rank=0 --nproc_per_node=2 \
  /bin/sh -c "$worker" "$collectives" >"$WORK/node0.out" 2>"$WORK/node0.err" &
node0=$!
expect_sealed 0 2 "the library's ranks"
touch "$WORK/release"
wait_node "$node0" 80
expect_eq "$NODE_STATUS" 0 "node 0's exit code"
wait_node "$node1" 80
expect_eq "$NODE_STATUS" 0 "node 1's exit code"
expect_in_file "$WORK/node0.out" "[rank0]: All tests passed" "rank 0's result"
expect_in_file "$WORK/node0.out" "[rank1]: All tests passed" "rank 1's result"
expect_in_file "$WORK/node1.out" "[rank2]: All tests passed" "rank 2's result"
expect_no_leftovers

# torch.distributed's env://: before the store keeper its rank 0 bound the store on every interface.
find_torch_python_or_skip
rm -f "$WORK"/env.* "$WORK/release"
export TORCHINDUCTOR_CACHE_DIR=$WORK/inductor-cache
cat >"$WORK/sealed.py" <<'PY'
import datetime, os, sys, time, torch, torch.distributed as dist
if os.environ["GROUP_RANK"] != "0":  # node 1 waits, node 0's ranks wait in init_process_group for it
    while not os.path.exists(os.path.join(os.environ["WORK"], "release")):
        time.sleep(0.05)
dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
t = torch.tensor([float(dist.get_rank() + 1)])
dist.all_reduce(t)
print(f"world {dist.get_world_size()} sum {t.item():g}", flush=True)
dist.destroy_process_group()
sys.stdout.flush()
os._exit(0)  # PyTorch 2.15's Gloo threads may abort at finalization (see python_scripts.sh)
PY
worker='env >"$WORK/env.$RANK"; exec "$0" "$1"'
CPPRUN_TEST_TAG=$WORK ip netns exec "$ns1" "$CPPRUN" "${args[@]}" --node_rank=1 --nproc_per_node=1 \
  /bin/sh -c "$worker" "$python" "$WORK/sealed.py" >"$WORK/node1.out" 2>"$WORK/node1.err" &
node1=$!
CPPRUN_TEST_TAG=$WORK ip netns exec "$ns0" "$CPPRUN" "${args[@]}" --node_rank=0 --nproc_per_node=2 \
  /bin/sh -c "$worker" "$python" "$WORK/sealed.py" >"$WORK/node0.out" 2>"$WORK/node0.err" &
node0=$!
expect_sealed 0 2 "torch.distributed's ranks"
touch "$WORK/release"
wait_node "$node0" 120
expect_eq "$NODE_STATUS" 0 "node 0's exit code (Python)"
wait_node "$node1" 120
expect_eq "$NODE_STATUS" 0 "node 1's exit code (Python)"
for rank in 0 1; do expect_in_file "$WORK/node0.out" "[rank$rank]: world 3 sum 6" "Python rank $rank's all-reduce"; done
expect_in_file "$WORK/node1.out" "[rank2]: world 3 sum 6" "Python rank 2's all-reduce"
expect_no_leftovers
echo PASS
