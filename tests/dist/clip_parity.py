# The Python side of clip_parity.sh: each DIR/caseK.safetensors holds gradients before and after
# cpprun's DDP clip_grad_norm and the norm it returned; Python's torch.nn.utils.clip_grad_norm_ on
# the same gradients must give the same gradients and norm, bit for bit. Exit 1 on a difference.
import glob
import sys

import torch
from safetensors.torch import load_file

failed = False
files = sorted(glob.glob(sys.argv[1] + "/case*.safetensors"), key=lambda f: int(f.rsplit("case", 1)[1].split(".")[0]))
if not files:
    sys.exit("no case files in " + sys.argv[1])
for path in files:
    t = {k: v.clone() for k, v in load_file(path).items()}  # aligned: see fsdp_controls_pytorch.py
    names = sorted(k[len("before."):] for k in t if k.startswith("before."))
    params = []
    for name in names:
        p = torch.nn.Parameter(torch.zeros_like(t["before." + name]))
        p.grad = t["before." + name].clone()
        params.append(p)
    max_norm, norm_type = t["max_norm"].item(), t["norm_type"].item()
    total = torch.nn.utils.clip_grad_norm_(params, max_norm, norm_type)
    same_grads = all(torch.equal(p.grad, t["after." + n]) for p, n in zip(params, names))
    worst = max(((p.grad - t["after." + n]).abs().max() / p.grad.abs().max()).item() for p, n in zip(params, names))
    same_norm = total.item() == t["norm"].item()
    print(f"{path.rsplit('/', 1)[-1]}: max_norm {max_norm:g} norm_type {norm_type:g}: PyTorch's norm "
          f"{total.item():.9g}, cpprun's {t['norm'].item():.9g}; gradients "
          f"{'equal' if same_grads else f'differ (largest relative {worst:.3g})'}")
    failed |= not (same_grads and same_norm)
sys.exit(1 if failed else 0)
