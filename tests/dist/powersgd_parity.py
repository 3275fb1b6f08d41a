# The Python side of powersgd_parity.sh: PyTorch's DDP with its own powerSGD_hook trains what
# powersgd_parity.cpp trains with cpprun's, from the same parameters on the same batches.
#   python powersgd_parity.py init DIR           the parameters and every rank's batches
#   cpprun --nproc_per_node=2 powersgd_parity.py train DIR CONFIG    DIR/py_CONFIG.safetensors
#   python powersgd_parity.py compare DIR CONFIG   PyTorch's final parameters against cpprun's (1e-10)
import os
import sys

import torch
import torch.distributed as dist
from safetensors.torch import load_file, save_file

STEPS, RANKS = 6, 2
# What each configuration sets of PowerSGDState (powersgd_parity.cpp's kConfigs, the same).
CONFIGS = {
    "rank1": dict(matrix_approximation_rank=1, start_powerSGD_iter=2),
    "qr_cold": dict(matrix_approximation_rank=3, start_powerSGD_iter=3, min_compression_rate=1, warm_start=False),
    "batched": dict(matrix_approximation_rank=2, start_powerSGD_iter=2, batch_tensors_with_same_shape=True,
                    orthogonalization_epsilon=1e-8, random_seed=7),
    "no_feedback": dict(matrix_approximation_rank=1, start_powerSGD_iter=1, use_error_feedback=False,
                        warm_start=False, random_seed=3),
}


def net():
    return torch.nn.Sequential(
        torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 16), torch.nn.Tanh(),
        torch.nn.Linear(16, 16), torch.nn.Tanh(), torch.nn.Linear(16, 4)).double()


def write_init(d, steps=STEPS):
    """DIR/init.safetensors, the parameters, and DIR/batches.safetensors, each rank's batches for
    `steps` steps (powersgd_resume.py's init mode too, with its own number of steps)."""
    torch.manual_seed(0)
    save_file({k: v.contiguous() for k, v in net().state_dict().items()}, f"{d}/init.safetensors")
    batches = {}
    for r in range(RANKS):
        for s in range(steps):
            batches[f"x{r}_{s}"] = torch.randn(12, 8, dtype=torch.float64)
            batches[f"y{r}_{s}"] = torch.randn(12, 4, dtype=torch.float64)
    save_file(batches, f"{d}/batches.safetensors")


def main():
    mode, d = sys.argv[1], sys.argv[2]
    if mode == "init":
        write_init(d)
        return
    config = sys.argv[3]
    if mode == "compare":
        py, cpp = load_file(f"{d}/py_{config}.safetensors"), load_file(f"{d}/cpp_{config}.safetensors")
        init = load_file(f"{d}/init.safetensors")
        worst = max(((py[k] - cpp[k]).abs().max() / py[k].abs().max()).item() for k in py)
        moved = min(((py[k] - init[k]).abs().max() / init[k].abs().max()).item() for k in py)
        print(f"{config}: cpprun's parameters against PyTorch's after {STEPS} steps: largest relative "
              f"difference {worst:.3g} (each moved at least {moved:.3g} from the start)")
        sys.exit(0 if worst < 1e-10 and moved > 1e-4 else 1)
    from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as powersgd
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    model = net()
    model.load_state_dict(load_file(f"{d}/init.safetensors"))
    ddp = torch.nn.parallel.DistributedDataParallel(model)
    state = powersgd.PowerSGDState(process_group=None, **CONFIGS[config])
    ddp.register_comm_hook(state, powersgd.powerSGD_hook)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
    # Fresh, aligned copies: tensors at an odd offset of the file take other vector paths, whose
    # sums round otherwise in the last bit (fsdp_controls_pytorch.py's hook case did).
    batches = {k: v.clone() for k, v in load_file(f"{d}/batches.safetensors").items()}
    for s in range(STEPS):
        opt.zero_grad()
        torch.nn.functional.mse_loss(ddp(batches[f"x{rank}_{s}"]), batches[f"y{rank}_{s}"]).backward()
        opt.step()
    if rank == 0:
        save_file({k: v.contiguous() for k, v in model.state_dict().items()}, f"{d}/py_{config}.safetensors")
    dist.destroy_process_group()
    # PyTorch 2.15's Gloo threads can abort a rank at interpreter finalization ('terminate called
    # without an active exception'), as the other Python workers of the tests meet it: leave now.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
