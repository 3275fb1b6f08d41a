# One rank of scripts/bench_store_tunnel.sh: times c10d TCPStore `set` and `get` of 64-byte values on
# this rank's own keys, and `add` (a write that waits for the store's answer: c10d's `set` does not,
# so it times the client's send alone), as the workers' store is reached under cpprun
# (MASTER_ADDR:MASTER_PORT: the agent's store keeper hosts it, TORCHELASTIC_USE_AGENT_STORE=True; without
# that variable rank 0 hosts it, as torch's env:// does without an agent store). Writes
# one line, "RANK set_p50 set_p99 get_p50 get_p99 add_p50 add_p99" in microseconds, to
# $BENCH_STORE_OUT/rank.RANK.
import datetime
import os
import time

from torch.distributed import TCPStore

WARMUP = 200
OPS = int(os.environ.get("BENCH_STORE_OPS", "2000"))

rank = int(os.environ["RANK"])
world = int(os.environ["WORLD_SIZE"])
hosts = rank == 0 and os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True"
store = TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), world_size=world, is_master=hosts,
                 timeout=datetime.timedelta(seconds=60), wait_for_workers=True)
value = b"x" * 64


def timed(op, n):
    times = []
    for i in range(n):
        start = time.perf_counter_ns()
        op(i)
        times.append(time.perf_counter_ns() - start)
    times.sort()
    return times[len(times) // 2] / 1000, times[min(len(times) - 1, len(times) * 99 // 100)] / 1000


def set_op(i):
    store.set(f"bench/{rank}/{i % 64}", value)


def get_op(i):
    store.get(f"bench/{rank}/{i % 64}")


def add_op(i):
    store.add(f"bench/{rank}/count", 1)


for op in (set_op, get_op, add_op):
    timed(op, WARMUP)
figures = []
for op in (set_op, get_op, add_op):
    figures += timed(op, OPS)
with open(os.path.join(os.environ["BENCH_STORE_OUT"], f"rank.{rank}"), "w") as out:
    out.write(f"{rank} " + " ".join(f"{f:.1f}" for f in figures) + "\n")
# Rank 0 hosts the store: it stays until every rank is done with it.
store.add("bench/done", 1)
if rank == 0:
    while int(store.add("bench/done", 0)) < world:
        time.sleep(0.01)
