# The Python side of grad_scaler_interop.sh: torch.amp.GradScaler on the CPU through the steps
# grad_scaler_interop.cpp takes with cpprun::GradScaler; its scale after each update and the
# parameters after each step, compared with cpprun's.
#   python grad_scaler_interop.py run DIR        DIR/py.safetensors
#   python grad_scaler_interop.py compare DIR    PyTorch's against DIR/cpp.safetensors
import sys

import torch
from safetensors.torch import load_file, save_file

STEPS = 12
INF_AT, NAN_AT, CLIP_AT = (3, 7), (5,), (9,)  # grad_scaler_interop.cpp's, the same


def main():
    mode, d = sys.argv[1], sys.argv[2]
    if mode == "compare":
        py, cpp = load_file(f"{d}/py.safetensors"), load_file(f"{d}/cpp.safetensors")
        same_scales = torch.equal(py["scales"], cpp["scales"])
        gap = ((py["params"] - cpp["params"]).abs().max() / py["params"].abs().max()).item()
        print(f"GradScaler over {STEPS} steps (inf at {INF_AT}, NaN at {NAN_AT}, unscale_ and clipping at {CLIP_AT}): "
              f"scales {'equal' if same_scales else 'differ'} (PyTorch {py['scales'].tolist()}, "
              f"cpprun {cpp['scales'].tolist()}); parameters within {gap:.3g}")
        sys.exit(0 if same_scales and gap < 1e-6 else 1)
    w = torch.nn.Parameter(torch.tensor([0.5, -1.0, 2.0, 0.25]))
    opt = torch.optim.SGD([w], lr=0.1, foreach=False)
    scaler = torch.amp.GradScaler("cpu", init_scale=8.0, growth_factor=2.0, backoff_factor=0.5, growth_interval=2)
    scales, params = [], []
    for s in range(STEPS):
        opt.zero_grad()
        x = torch.arange(4, dtype=torch.float32) + s
        scaler.scale((w * x).sum() ** 2 / 100).backward()
        if s in INF_AT:
            w.grad[0] = float("inf")
        if s in NAN_AT:
            w.grad[1] = float("nan")
        if s in CLIP_AT:
            scaler.unscale_(opt)
            torch.nn.utils.clip_grad_norm_([w], 0.5)
        scaler.step(opt)
        scaler.update()
        scales.append(scaler.get_scale())
        params.append(w.detach().clone())
    save_file({"scales": torch.tensor(scales, dtype=torch.float64), "params": torch.stack(params)}, f"{d}/py.safetensors")


if __name__ == "__main__":
    main()
