# A static multi-node job on IPv6 loopback: --master_addr=::1 (or torchrun's bracketed form) starts,
# node 0's agent listens at [::1]:--master_port alone (not 127.0.0.1, not every interface), its
# store keeper at [::1] too, and the workers, told MASTER_ADDR=::1, reach that store there, node 1's
# through their agent's listener on [::1] (the store tunnel; torch's TCPStore client, when a Python
# with torch is at hand). Also --rdzv_endpoint=[::1]:PORT.
. "$(dirname "$0")/common.sh"
require_private_netns
ip -6 addr show dev lo 2>/dev/null | grep -q 'inet6 ::1' || { echo "SKIP: no IPv6 loopback (::1)"; exit 77; }

worker='env >"$WORK/env.$RANK"
  if [ "$RANK" = 0 ]; then ss -ltnH >"$WORK/listening.part" && mv "$WORK/listening.part" "$WORK/listening"; fi
  [ "$GROUP_RANK" = 1 ] || while [ ! -e "$WORK/release" ]; do sleep 0.05; done'
start_node node0 --nnodes=2 --node_rank=0 --nproc_per_node=1 --master_addr=::1 --master_port=29520 \
  --rdzv_conf=timeout=20 /bin/sh -c "$worker"
node0=$NODE_PID
start_node node1 --nnodes=2 --node_rank=1 --nproc_per_node=1 --master_addr='[0:0:0:0:0:0:0:1]' --master_port=29520 \
  --rdzv_conf=timeout=20 /bin/sh -c "$worker"
node1=$NODE_PID
wait_for_files 30 "$WORK/env.0" "$WORK/env.1" "$WORK/listening"
# Node 0's agent at [::1]:29520; nothing of the job on IPv4.
local_addresses=$(awk '{print $4}' "$WORK/listening")
printf '%s\n' "$local_addresses" | grep -qxF '[::1]:29520' ||
  fail "node 0's agent does not listen at [::1]:29520: $(cat "$WORK/listening")"
printf '%s\n' "$local_addresses" | grep -vq '^\[::1\]:' && fail "node 0 listens beyond [::1]: $(cat "$WORK/listening")"
touch "$WORK/release"
wait_node "$node0" 20
expect_eq "$NODE_STATUS" 0 "node 0's exit code"
wait_node "$node1" 20
expect_eq "$NODE_STATUS" 0 "node 1's exit code"
expect_in_file "$WORK/node0.err" "all 2 nodes joined at [::1]:29520" "node 0's rendezvous line"
# Node 0's store keeper serves the workers' store on a port node 0's agent bound at [::1] before the
# workers started (--master_port is the agents'), node 1's workers reach it through their agent's own
# port on [::1] (on one host node 0's is the keeper's), and every worker is told the agent hosts it.
master_port=$(sed -n 's/^MASTER_PORT=//p' "$WORK/env.0")
[ -n "$master_port" ] && [ "$master_port" != 29520 ] || fail "rank 0's MASTER_PORT is '$master_port', not a port of its own"
printf '%s\n' "$local_addresses" | grep -qxF "[::1]:$master_port" ||
  fail "nothing listened at the store's [::1]:$master_port when rank 0 started: $(cat "$WORK/listening")"
tunnel_port=$(sed -n 's/^MASTER_PORT=//p' "$WORK/env.1")
[ -n "$tunnel_port" ] && [ "$tunnel_port" != "$master_port" ] || fail "rank 1's MASTER_PORT is '$tunnel_port', not its agent's"
for rank in 0 1; do
  for var in "RANK=$rank" WORLD_SIZE=2 MASTER_ADDR=::1 TORCHELASTIC_USE_AGENT_STORE=True; do
    grep -qxF "$var" "$WORK/env.$rank" || fail "rank $rank: $var missing"
  done
done

# --rdzv_endpoint=[::1]:PORT, and torch's own store client in the workers over IPv6.
python=
for candidate in ${CPPRUN_TORCH_PYTHON:-} python3; do
  if "$candidate" -c 'import torch.distributed' 2>/dev/null; then python=$(command -v "$candidate"); break; fi
done
rm -f "$WORK"/env.*
if [ -n "$python" ]; then
  cat >"$WORK/store.py" <<'PY'
import datetime, os
from torch.distributed import TCPStore
rank = int(os.environ["RANK"])
# As torch's env:// does: rank 0 hosts unless the agent says it does (cpprun's does).
hosts = rank == 0 and os.environ["TORCHELASTIC_USE_AGENT_STORE"] != "True"
store = TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), is_master=hosts,
                 timeout=datetime.timedelta(seconds=30))
store.set(f"ipv6-{rank}", str(rank))
print("peer says", store.get(f"ipv6-{1 - rank}").decode(), flush=True)
PY
  worker="$python $WORK/store.py"
else
  echo "note: no Python with torch; the workers' TCPStore part is not run"
  worker='env >"$WORK/env.$RANK"'
fi
start_node node0 --nnodes=2 --node_rank=0 --rdzv_endpoint='[::1]:29521' --rdzv_conf=timeout=20 /bin/sh -c "$worker"
node0=$NODE_PID
start_node node1 --nnodes=2 --node_rank=1 --rdzv_endpoint='[::1]:29521' --rdzv_conf=timeout=20 /bin/sh -c "$worker"
node1=$NODE_PID
wait_node "$node0" 60
expect_eq "$NODE_STATUS" 0 "node 0's exit code (--rdzv_endpoint)"
wait_node "$node1" 60
expect_eq "$NODE_STATUS" 0 "node 1's exit code (--rdzv_endpoint)"
if [ -n "$python" ]; then
  expect_in_file "$WORK/node0.out" "[rank0]: peer says 1" "rank 0 read rank 1's key from node 0's store at [::1]"
  expect_in_file "$WORK/node1.out" "[rank1]: peer says 0" "rank 1 read rank 0's key from node 0's store at [::1]"
fi
expect_no_leftovers
# A partial skip is a skip (77), counted as one, never a pass with a part missing.
[ -n "$python" ] || { echo "SKIP: no Python with torch: the workers' TCPStore part over IPv6 was not run"; exit 77; }
echo PASS
