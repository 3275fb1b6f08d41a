# One rank of scripts/bench_multi_node_start.sh: starts as a torch.distributed env:// job starts
# (the c10d TCPStore at MASTER_ADDR:MASTER_PORT: with TORCHELASTIC_USE_AGENT_STORE=True, cpprun's and
# torchrun's, every rank a client of the agent's store under /worker/attempt_N; else rank 0 hosts it
# and waits for every rank to connect; Gloo's process group on that store; one barrier), then exits.
# Writes one line to $BENCH_START_OUT/rank.RANK:
#   RANK started imported store_connected group_ready barrier_done ready_s agent_store
# the first five wall-clock times (time.time(), seconds: comparable across the processes of one
# host) at the start of the script, after `import torch`, after the TCPStore, after
# init_process_group and after the barrier; ready_s is time.perf_counter() from "import done" to
# "barrier done" on this rank; agent_store is 1 when the agent hosted the store.
import time

started = time.time()

import datetime  # noqa: E402
import os  # noqa: E402
import sys  # noqa: E402

import torch.distributed as dist  # noqa: E402

imported = time.time()
ready_from = time.perf_counter()
rank = int(os.environ["RANK"])
world = int(os.environ["WORLD_SIZE"])
timeout = datetime.timedelta(seconds=60)
# What env:// does (torch.distributed.rendezvous's _create_c10d_store, then init_process_group's
# PrefixStore); its default wait_for_workers=True makes a hosting rank 0 wait for every rank's connection.
agent_store = os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True"
if agent_store:
    store = dist.PrefixStore(f"/worker/attempt_{os.environ['TORCHELASTIC_RESTART_COUNT']}",
                             dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), world_size=world,
                                           is_master=False, timeout=timeout))
else:
    store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), world_size=world,
                          is_master=rank == 0, timeout=timeout, wait_for_workers=True, multi_tenant=True)
store_connected = time.time()
dist.init_process_group("gloo", store=dist.PrefixStore("default_pg", store), rank=rank, world_size=world,
                        timeout=timeout)
group_ready = time.time()
dist.barrier()
barrier_done = time.time()
ready_s = time.perf_counter() - ready_from
with open(os.path.join(os.environ["BENCH_START_OUT"], f"rank.{rank}"), "w") as out:
    out.write(f"{rank} {started:.6f} {imported:.6f} {store_connected:.6f} {group_ready:.6f} {barrier_done:.6f} "
              f"{ready_s:.6f} {int(agent_store)}\n")
dist.destroy_process_group()
# PyTorch 2.15's Gloo threads may abort at interpreter finalization (tests/launcher/behaviour/python_scripts.sh)
sys.stdout.flush()
sys.stderr.flush()
os._exit(0)
