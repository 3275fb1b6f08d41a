# PyTorch's side of device_mesh_pytorch_parity.sh: with no process group yet, each rank calls
# init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp")), writes its groups' ranks and its
# coordinate to DIR/py.RANK, then which of CASES it refuses; and checks the calls the docs say
# PyTorch accepts where cpprun refuses (a mesh smaller than the world, an empty shape) and where it
# fails with a bare assertion (a size of 0), so that docs/process_groups.md stays true of PyTorch.
#   cpprun --nproc_per_node=4 python device_mesh_pytorch_parity.py DIR
import os
import sys

import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh

CASES = [  # the same, in the same order, as device_mesh_pytorch_parity.cpp's
    ("repeated_names", lambda: init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "dp"))),
    ("fewer_names", lambda: init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp",))),
    ("more_names", lambda: init_device_mesh("cpu", (4,), mesh_dim_names=("dp", "tp"))),
    ("bigger_than_world", lambda: init_device_mesh("cpu", (2, 4))),
    ("device_index", lambda: init_device_mesh("cuda:0", (4,))),
    ("negative_size", lambda: init_device_mesh("cpu", (-2, -2))),
    ("one_d", lambda: init_device_mesh("cpu", (4,))),
    ("three_d", lambda: init_device_mesh("cpu", (1, 2, 2), mesh_dim_names=("pp", "dp", "tp"))),
]


def outcome(call):
    try:
        call()
        return "accepted"
    except (RuntimeError, AssertionError, ValueError):
        return "refused"


def main():
    initialized_before = dist.is_initialized()
    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
    rank = dist.get_rank()
    dp = dist.get_process_group_ranks(mesh["dp"].get_group())
    tp = dist.get_process_group_ranks(mesh["tp"].get_group())
    lines = [f"initialized before {initialized_before} after {dist.is_initialized()}",
             f"rank {rank} dp {dp} tp {tp} coordinate {list(mesh.get_coordinate())}"]
    lines += [f"{name} {outcome(call)}" for name, call in CASES]
    with open(os.path.join(sys.argv[1], f"py.{rank}"), "w") as f:
        f.write("\n".join(lines) + "\n")
    # Where cpprun refuses and PyTorch does not (docs/process_groups.md, "DeviceMesh").
    smaller = init_device_mesh("cpu", (2,))
    assert (smaller.get_coordinate() is None) == (rank >= 2), (rank, smaller.get_coordinate())
    assert outcome(lambda: init_device_mesh("cpu", ())) == "accepted"
    try:
        init_device_mesh("cpu", (0, 4))
        raise SystemExit("PyTorch accepted mesh_shape (0, 4)")
    except AssertionError:
        pass
    dist.barrier()
    dist.destroy_process_group()
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
