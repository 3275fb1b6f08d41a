# The Python side of syncbn_pytorch_parity.sh: what cpprun's SyncBatchNorm under DDP on 2 ranks
# (syncbn_pytorch_parity.cpp) must compute, by PyTorch's own BatchNorm in one process on the two
# ranks' batches together. PyTorch's torch.nn.SyncBatchNorm itself cannot run on the CPU (it
# refuses a CPU input, and its kernels batch_norm_stats / batch_norm_gather_stats_with_counts have
# no CPU implementation), so the reference is what it computes on a GPU: statistics over the
# global batch (each rank's examples weighed by their count), running statistics updated once per
# step from them, and DDP's gradient, the mean over the ranks of each rank's mean loss.
#   python syncbn_pytorch_parity.py init DIR              the parameters and the batches
#   python syncbn_pytorch_parity.py reference DIR MODEL   DIR/py_MODEL.safetensors
#   python syncbn_pytorch_parity.py compare DIR MODEL     PyTorch's parameters, running statistics
#                                                         and eval output against cpprun's (1e-10)
import sys

import torch
from safetensors.torch import load_file, save_file

STEPS, RANK_BATCH = 4, (5, 7)  # the ranks' batches differ in size: the statistics weigh them by count


def net(name):
    # syncbn_pytorch_parity.cpp's net(NAME), the same.
    nn = torch.nn
    if name == "cnn":  # BatchNorm2d, the default momentum and the cumulative average (momentum None)
        model = nn.Sequential(nn.Conv2d(1, 4, 3, padding=1, bias=False), nn.BatchNorm2d(4), nn.ReLU(),
                              nn.Conv2d(4, 6, 3, padding=1, bias=False), nn.BatchNorm2d(6, momentum=None),
                              nn.Flatten(), nn.Linear(6 * 8 * 8, 4))
    else:  # BatchNorm1d over [N, C, L] without affine parameters, then over [N, C]
        model = nn.Sequential(nn.Conv1d(3, 8, 3, padding=1), nn.BatchNorm1d(8, affine=False, momentum=0.3),
                              nn.Tanh(), nn.Flatten(), nn.Linear(8 * 6, 10), nn.BatchNorm1d(10), nn.Tanh(),
                              nn.Linear(10, 4))
    return model.double()


def shape(name, n):
    return (n, 1, 8, 8) if name == "cnn" else (n, 3, 6)


def main():
    mode, d = sys.argv[1], sys.argv[2]
    if mode == "init":
        torch.manual_seed(0)
        for name in ("cnn", "seq"):
            save_file({k: v.contiguous() for k, v in net(name).state_dict().items()}, f"{d}/init_{name}.safetensors")
            batches = {}
            for r, n in enumerate(RANK_BATCH):
                for s in range(STEPS):
                    batches[f"x{r}_{s}"] = torch.randn(*shape(name, n), dtype=torch.float64) * 2 + 1
                    batches[f"y{r}_{s}"] = torch.randint(4, (n,))
            batches["eval"] = torch.randn(*shape(name, 6), dtype=torch.float64)
            save_file(batches, f"{d}/batches_{name}.safetensors")
        return
    name = sys.argv[3]
    if mode == "compare":
        py, cpp = load_file(f"{d}/py_{name}.safetensors"), load_file(f"{d}/cpp_{name}.safetensors")
        init = load_file(f"{d}/init_{name}.safetensors")
        names = sorted(set(init) | {"eval_output"})
        missing = [k for k in names if k not in py or k not in cpp]
        if missing:
            print(f"{name}: missing from a side: {missing}")
            sys.exit(1)

        def gap(k):
            scale = py[k].double().abs().max().clamp(min=1e-300)
            return ((py[k].double() - cpp[k].double()).abs().max() / scale).item()
        worst = max(names, key=gap)
        print(f"{name}: cpprun's SyncBatchNorm against PyTorch's after {STEPS} DDP steps on batches of "
              f"{RANK_BATCH[0]} and {RANK_BATCH[1]}: parameters, running statistics and the eval output within "
              f"{gap(worst):.3g} ({worst})")
        sys.exit(0 if gap(worst) < 1e-10 else 1)
    model = net(name)
    model.load_state_dict(load_file(f"{d}/init_{name}.safetensors"))
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, foreach=False)
    # Fresh, aligned copies: tensors at an odd offset of the file take other vector paths, whose
    # sums round otherwise in the last bit (fsdp_controls_pytorch.py's hook case did).
    batches = {k: v.clone() for k, v in load_file(f"{d}/batches_{name}.safetensors").items()}
    ranks = range(len(RANK_BATCH))
    for s in range(STEPS):
        opt.zero_grad()
        logits = model(torch.cat([batches[f"x{r}_{s}"] for r in ranks]))
        per_rank = logits.split(list(RANK_BATCH))
        loss = sum(torch.nn.functional.cross_entropy(per_rank[r], batches[f"y{r}_{s}"]) for r in ranks) / len(ranks)
        loss.backward()
        opt.step()
    model.eval()
    with torch.no_grad():
        out = {k: v.contiguous() for k, v in model.state_dict().items()}
        out["eval_output"] = model(batches["eval"]).contiguous()
    save_file(out, f"{d}/py_{name}.safetensors")


if __name__ == "__main__":
    main()
