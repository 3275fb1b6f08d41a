# The Python side of powersgd_resume.sh.
#   python powersgd_resume.py init DIR            the parameters and every rank's batches
#   python powersgd_resume.py compare DIR CONFIG  resumed runs equal the uninterrupted one, bit for bit;
#                                                 resumed without the state, they differ
#   python powersgd_resume.py craft DIR           the warm step-5 states re-saved by torch.save with
#                                                 strided and expanded tensors (see craft)
#   python powersgd_resume.py compare_strided DIR the run resumed from the strided files equals the
#                                                 uninterrupted one, bit for bit
#   cpprun --nproc_per_node=2 powersgd_resume.py pytorch DIR    PyTorch's DDP and PowerSGDState trained
#        5 steps: each rank's state against cpprun's file of that rank (torch.load'ed): the same
#        names (PowerSGDState's slots), hyperparameters, iter, rng state, errors and P/Q (1e-10)
import os
import sys

import torch
import torch.distributed as dist
from safetensors.torch import load_file

# The model and the init mode are powersgd_parity.py's (this directory, sys.path[0]); its RANKS too.
from powersgd_parity import RANKS, net, write_init

STEPS, SAVED_AT = 8, 5
# What each configuration sets of PowerSGDState (powersgd_resume.cpp's kConfigs, the same); not
# its "buckets": PyTorch 2.15's hook over several buckets on Gloo issues its chained all-reduces
# from Gloo's threads in an order that differs between ranks (a collective mismatch: Gloo aborts
# "Received data size doesn't match expected size", or it hangs).
CONFIGS = {
    "warm": dict(matrix_approximation_rank=1, start_powerSGD_iter=3),
    "cold": dict(matrix_approximation_rank=3, start_powerSGD_iter=3, min_compression_rate=1, warm_start=False,
                 random_seed=5),
}
# PowerSGDState's slots that cpprun keeps no value for: the process group (which __getstate__
# drops too) and the compression statistics (cpprun logs none).
NOT_KEPT = {"process_group", "total_numel_before_compression", "total_numel_after_compression",
            "compression_stats_logging_frequency", "next_stats_report"}


def relative(a, b):
    return ((a - b).abs().max() / b.abs().max().clamp_min(1e-300)).item()


def compare(d, config):
    full = load_file(f"{d}/{config}_full.safetensors")
    ok = True
    for k in (2, SAVED_AT):
        resumed = load_file(f"{d}/{config}_resumed_{k}.safetensors")
        cold = load_file(f"{d}/{config}_resumed_{k}_nostate.safetensors")
        equal = all(torch.equal(full[n], resumed[n]) for n in full)
        worst = max(relative(resumed[n], full[n]) for n in full)
        apart = max(relative(cold[n], full[n]) for n in full)
        print(f"{config}: resumed after step {k} with the PowerSGD state: {'bitwise equal' if equal else 'DIFFERENT'}"
              f" to the uninterrupted run (largest relative difference {worst:.3g}); without it: {apart:.3g} apart")
        ok = ok and equal and apart > 1e-6
    return ok


def pytorch(d):
    import numpy as np
    from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as powersgd
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    # Fresh, aligned copies: tensors at an odd offset of the file take other vector paths, whose
    # sums round otherwise in the last bit (fsdp_controls_pytorch.py's hook case did).
    batches = {k: v.clone() for k, v in load_file(f"{d}/batches.safetensors").items()}
    ok = True
    for config, options in CONFIGS.items():
        model = net()
        model.load_state_dict(load_file(f"{d}/init.safetensors"))
        ddp = torch.nn.parallel.DistributedDataParallel(model)
        state = powersgd.PowerSGDState(process_group=None, **options)
        ddp.register_comm_hook(state, powersgd.powerSGD_hook)
        opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
        for s in range(SAVED_AT):
            opt.zero_grad()
            torch.nn.functional.mse_loss(ddp(batches[f"x{rank}_{s}"]), batches[f"y{rank}_{s}"]).backward()
            opt.step()
        theirs = state.__getstate__()
        mine = torch.load(f"{d}/{config}_powersgd_{SAVED_AT}_rank{rank}.pt")  # weights_only, the default
        problems = []
        # A dict's entries are its keys (error_dict.0, ...): an empty one (P/Q without warm_start) has none.
        names = {n.split(".")[0] for n in mine if not n.startswith("cpprun.")}
        names |= {slot for slot in ("error_dict", "p_memory_dict", "q_memory_dict") if not theirs[slot]}
        if names != set(theirs) - NOT_KEPT:
            problems.append(f"names {sorted(names)} against PowerSGDState's {sorted(set(theirs) - NOT_KEPT)}")
        for slot in ("matrix_approximation_rank", "start_powerSGD_iter", "min_compression_rate",
                     "orthogonalization_epsilon", "use_error_feedback", "warm_start", "batch_tensors_with_same_shape",
                     "iter"):
            if mine[slot].item() != theirs[slot]:
                problems.append(f"{slot} {mine[slot].item()} against {theirs[slot]}")
        rng = theirs["rng"].get_state(legacy=False)["state"]
        if not (np.array_equal(mine["rng.key"].numpy(), rng["key"]) and mine["rng.pos"].item() == rng["pos"]):
            problems.append(f"rng: pos {mine['rng.pos'].item()} against {rng['pos']}, or another key")
        worst = 0.0
        for slot in ("error_dict", "p_memory_dict", "q_memory_dict"):
            held = {int(n.split(".")[1]): t for n, t in mine.items() if n.startswith(slot + ".")}
            if set(held) != set(theirs[slot]):
                problems.append(f"{slot}: buckets {sorted(held)} against {sorted(theirs[slot])}")
                continue
            for b, t in held.items():
                if t.shape != theirs[slot][b].shape:
                    problems.append(f"{slot}[{b}]: shape {tuple(t.shape)} against {tuple(theirs[slot][b].shape)}")
                else:
                    worst = max(worst, relative(t, theirs[slot][b]))
        if worst > 1e-10:
            problems.append(f"errors or P/Q differ by {worst:.3g}")
        print(f"rank {rank} {config}: cpprun's file after step {SAVED_AT} against PyTorch's PowerSGDState: "
              + ("; ".join(problems) if problems else
                 f"same names and values (iter {theirs['iter']}, rng pos {rng['pos']}, errors and P/Q within {worst:.3g})"))
        ok = ok and not problems
    dist.destroy_process_group()
    # PyTorch 2.15's Gloo threads can abort a rank at interpreter finalization: leave now.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0 if ok else 1)


def craft(d):
    """Each rank's warm step-5 state saved again by torch.save with every tensor of more than one
    element as a strided view (stride 2, the other elements junk; a reader that takes the storage as
    contiguous meets the junk), and one whose bucket shapes are an expanded zero (1,000 elements of
    one 8-byte storage; a reader that takes the storage as contiguous reads past its end)."""
    for rank in range(RANKS):
        state = torch.load(f"{d}/warm_powersgd_{SAVED_AT}_rank{rank}.pt")
        strided = {}
        for name, t in state.items():
            if t.numel() > 1:
                junk = torch.full_like(t, -7)  # a negative length where a shape's length is read
                t = torch.stack([t, junk], dim=1)[:, 0]
                assert t.stride() == (2,) and torch.equal(t, state[name])
            strided[name] = t
        torch.save(strided, f"{d}/warm_powersgd_{SAVED_AT}_rank{rank}_strided.pt")
        expanded = dict(state)
        expanded["cpprun.bucket_shapes.0"] = torch.zeros(1, dtype=torch.long).expand(1000)
        torch.save(expanded, f"{d}/expanded_rank{rank}.pt")


def main():
    mode, d = sys.argv[1], sys.argv[2]
    if mode == "init":
        write_init(d, STEPS)
    elif mode == "compare":
        sys.exit(0 if compare(d, sys.argv[3]) else 1)
    elif mode == "craft":
        craft(d)
    elif mode == "compare_strided":
        full = load_file(f"{d}/warm_full.safetensors")
        resumed = load_file(f"{d}/warm_resumed_{SAVED_AT}_strided.safetensors")
        equal = all(torch.equal(full[n], resumed[n]) for n in full)
        print(f"warm: resumed after step {SAVED_AT} from torch.save's strided state files: "
              f"{'bitwise equal' if equal else 'DIFFERENT'} to the uninterrupted run")
        sys.exit(0 if equal else 1)
    else:
        pytorch(d)


if __name__ == "__main__":
    main()
