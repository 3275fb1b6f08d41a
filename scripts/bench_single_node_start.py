# One rank of scripts/bench_single_node_start.sh: a torch.distributed env:// start as a training
# script makes it (init_process_group("gloo") from the launcher's environment, one barrier).
# Under torchrun the agent hosts the c10d store (TORCHELASTIC_USE_AGENT_STORE=True); so does cpprun's,
# through its store keeper (before it, rank 0 hosted it, and a rank that connected before rank 0 had
# bound it waited out c10d's connect retry). Writes "RANK imported barrier_done" (time.time(), seconds,
# comparable across one host's processes) to $BENCH_START_OUT/rank.RANK.
import time
import os
import sys

import torch.distributed as dist

imported = time.time()
dist.init_process_group("gloo")
dist.barrier()
barrier_done = time.time()
with open(os.path.join(os.environ["BENCH_START_OUT"], f"rank.{os.environ['RANK']}"), "w") as out:
    out.write(f"{os.environ['RANK']} {imported:.6f} {barrier_done:.6f}\n")
dist.destroy_process_group()
# PyTorch 2.15's Gloo threads may abort at interpreter finalization (tests/launcher/behaviour/python_scripts.sh)
sys.stdout.flush()
sys.stderr.flush()
os._exit(0)
