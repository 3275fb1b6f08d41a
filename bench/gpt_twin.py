# The PyTorch side of scripts/bench_gpt.sh: examples/train_gpt.cpp's GPT in Python, op for op, so
# that the two stacks train the same network on the same batches with the same optimizer and their
# losses can be compared step by step:
#   model      GPT-2's layout under GPT2LMHeadModel's names (Conv1D weights [in, out], applied as
#              linear(x, W.t(), b)); causal attention through scaled_dot_product_attention, or with
#              --attention math by matmul, a causal mask and softmax (train_gpt --attention's two);
#              GELU exact or tanh; LayerNorm eps from config.json; the head tied to the token
#              embedding; no dropout (train_gpt has none)
#   init       --write-init DIR writes GPT-2's initialisation (normal 0.02, residual projections
#              0.02/sqrt(2 * layers), zero biases, LayerNorms 1 and 0) as DIR/model.safetensors and
#              DIR/config.json; both sides then start from it (train_gpt --init-from DIR, this
#              script --init-from DIR)
#   data       the text's bytes, ids in sorted order; windows from the first nine tenths, chosen by
#              torch's DistributedSampler (seed 0; a new epoch when a pass runs short), which is
#              what cpprun::DistributedSampler reproduces index for index
#   optimizer  AdamW (betas 0.9/0.999, eps 1e-8), weight decay 0.1 on 2-D tensors and 0 on the
#              rest, constant --lr, no clipping: train_gpt's. --optimizer fused (default):
#              torch.optim.AdamW(fused=True), the kernel cpprun::FusedAdamW (train_gpt's default)
#              runs; libtorch steps it as LibTorch's torch::optim::AdamW does, operation for
#              operation (train_gpt --optimizer libtorch); torch: PyTorch's torch.optim.AdamW
#              (foreach), whose arithmetic differs in rounding from both (lerp for the first
#              moment), a difference that training amplifies: fp32 losses 1.7e-5 apart by step 21
#              and 2.5% by step 177 on the tiny model (scripts/bench_gpt.sh --steps 200)
#   modes      none (no wrapper), ddp (torch DDP), fsdp2 (fully_shard on every block, then the root;
#              reshard after forward: ZeRO-3); --amp bf16: the forward under torch.autocast
#   dtype      --dtype float64: the parameters (cast from the float32 file), activations, loss and
#              optimizer in float64, as train_gpt --dtype float64, so that a comparison of the two
#              does not depend on how a CPU rounds float32
# Timing as train_gpt: the clock starts after --warmup steps; each step all-reduces its loss, which
# stays on the device until the warm-up's end, the traced steps' end or the last step reads the
# steps' losses since the last reading in one copy (train_gpt's Note [Reading the loss]; bench_gpt
# runs train_gpt with --log-every STEPS, so it reads at the same steps). The step's windows reach
# the device from pinned memory without a wait (non_blocking), as nanoGPT's. Prints one RESULT
# line; --losses-out FILE gets every step's loss (%.17g), the format of train_gpt --losses-out.
# Run under cpprun (or torchrun) for ddp/fsdp2; none also runs as a plain process.
import argparse, ctypes, json, math, os, resource, struct, sys, time

import torch
import torch.distributed as dist
import torch.nn.functional as F
# Loaded now rather than by the first optimizer step (which imports torch._dynamo, seconds of
# Python loading the C++ side has no counterpart of), as bench/dp_bench.py does.
import torch._dynamo

p = argparse.ArgumentParser(description=__doc__)
p.add_argument("--write-init", metavar="DIR", help="write the initial GPT-2 (model.safetensors, config.json) and exit")
p.add_argument("--init-from", metavar="DIR", help="start from this GPT-2 (what --write-init wrote)")
p.add_argument("--text", default="/usr/share/common-licenses/GPL-3")
p.add_argument("--mode", default="none", choices=["none", "ddp", "fsdp2"])
p.add_argument("--steps", type=int, default=20)
p.add_argument("--warmup", type=int, default=0, help="steps left out of tokens/s")
p.add_argument("--batch", type=int, default=16, help="windows per rank and forward pass")
p.add_argument("--grad-accum", type=int, default=1,
               help="forward and backward passes per step, the gradients reduced after the last (train_gpt's)")
p.add_argument("--block", type=int, default=64)
p.add_argument("--lr", type=float, default=3e-3)
p.add_argument("--layers", type=int, default=2)
p.add_argument("--embed", type=int, default=64)
p.add_argument("--heads", type=int, default=4)
p.add_argument("--vocab", type=int, default=0, help="--write-init: vocab_size (default: the text's characters)")
p.add_argument("--gelu", default="exact", choices=["exact", "tanh"])
p.add_argument("--seed", type=int, default=0, help="--write-init's generator seed")
p.add_argument("--amp", default="fp32", choices=["fp32", "bf16"])
p.add_argument("--dtype", default="float32", choices=["float32", "float64"],
               help="the parameters' and activations' type (float64: with --amp fp32 only)")
p.add_argument("--device", default="cpu", choices=["cpu", "cuda"], help="cuda: GPU LOCAL_RANK")
p.add_argument("--losses-out", metavar="FILE")
p.add_argument("--optimizer", default="fused", choices=["fused", "libtorch", "torch"],
               help="AdamW: torch.optim.AdamW(fused=True) (train_gpt's default), LibTorch's arithmetic step for "
                    "step (train_gpt --optimizer libtorch), or torch.optim.AdamW's default (foreach)")
p.add_argument("--trace", metavar="FILE", help="profile the 3 steps after --warmup into FILE (Chrome trace; rank 0)")
p.add_argument("--attention", default="sdpa", choices=["sdpa", "math"],
               help="scaled_dot_product_attention, or matmul + mask + softmax (train_gpt --attention)")
a = p.parse_args()


# safetensors by hand (8-byte header length, JSON header, raw little-endian data), float32 only:
# the GPU machines' Python has torch but not necessarily the safetensors package, nor numpy.
def save_safetensors(tensors, path):
    header, offset = {"__metadata__": {"format": "pt"}}, 0
    tensors = {k: v.detach().to("cpu", torch.float32).contiguous() for k, v in tensors.items()}
    for name, t in tensors.items():
        header[name] = {"dtype": "F32", "shape": list(t.shape), "data_offsets": [offset, offset + 4 * t.numel()]}
        offset += 4 * t.numel()
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)  # the data 8-byte aligned, as the safetensors package writes it
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text)
        for t in tensors.values():
            f.write(ctypes.string_at(t.data_ptr(), 4 * t.numel()))


def load_safetensors(path):
    with open(path, "rb") as f:
        data = f.read()
    n = struct.unpack("<Q", data[:8])[0]
    header, base, out = json.loads(data[8:8 + n]), 8 + n, {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        if info["dtype"] != "F32":
            sys.exit(f"gpt_twin.py: {path}: {name} is {info['dtype']}; this reader takes float32 (F32) only")
        begin, end = info["data_offsets"]
        out[name] = torch.frombuffer(bytearray(data[base + begin:base + end]), dtype=torch.float32).reshape(info["shape"])
    return out


class LibTorchAdamW(torch.optim.Optimizer):
    """torch::optim::AdamW::step (torch/csrc/api/src/optim/adamw.cpp) in Python, the same tensor
    operations in the same order, so that the two sides' parameters stay equal to the last bit."""

    def __init__(self, groups, lr, betas, eps):
        super().__init__(groups, {"lr": lr, "betas": betas, "eps": eps, "weight_decay": 0.0})

    @torch.no_grad()
    def step(self):
        for group in self.param_groups:
            lr, (beta1, beta2), eps, weight_decay = group["lr"], group["betas"], group["eps"], group["weight_decay"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                grad = p.grad
                if weight_decay != 0:
                    p.mul_(1 - lr * weight_decay)
                state = self.state[p]
                if not state:
                    state.update(step=0, exp_avg=torch.zeros_like(p), exp_avg_sq=torch.zeros_like(p))
                state["step"] += 1
                bias_correction1 = 1 - beta1 ** state["step"]
                bias_correction2 = 1 - beta2 ** state["step"]
                state["exp_avg"].mul_(beta1).add_(grad, alpha=1 - beta1)
                state["exp_avg_sq"].mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
                denom = (state["exp_avg_sq"].sqrt() / math.sqrt(bias_correction2)).add_(eps)
                p.addcdiv_(state["exp_avg"], denom, value=-(lr / bias_correction1))


def text_ids(path, block):
    """The text's bytes as ids (their rank among the distinct bytes) and the number of distinct bytes."""
    with open(path, "rb") as f:
        data = f.read()
    if len(data) < 10 * (block + 2):
        sys.exit(f"gpt_twin.py: --text {path} has {len(data)} characters; --block {block} needs at least {10 * (block + 2)}")
    vocab = sorted(set(data))
    index = {c: i for i, c in enumerate(vocab)}
    return torch.tensor([index[c] for c in data], dtype=torch.long), len(vocab)


class Conv1D(torch.nn.Module):  # Hugging Face's: y = x W + b, W [in, out]
    def __init__(self, n_in, n_out):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.empty(n_in, n_out))
        self.bias = torch.nn.Parameter(torch.zeros(n_out))

    def forward(self, x):
        return F.linear(x, self.weight.t(), self.bias)


class Attention(torch.nn.Module):
    def __init__(self, c):
        super().__init__()
        self.heads = c["n_head"]
        self.fused = a.attention == "sdpa"
        self.c_attn = Conv1D(c["n_embd"], 3 * c["n_embd"])
        self.c_proj = Conv1D(c["n_embd"], c["n_embd"])

    def forward(self, x):
        B, T, _ = x.shape
        qkv = self.c_attn(x)
        D = qkv.size(2) // (3 * self.heads)
        q, k, v = qkv.view(B, T, 3, self.heads, D).permute(2, 0, 3, 1, 4)
        if self.fused:
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            return self.c_proj(y.transpose(1, 2).reshape(B, T, self.heads * D))
        scores = torch.matmul(q, k.transpose(-2, -1)) / math.sqrt(D)
        future = torch.ones(T, T, dtype=torch.bool, device=x.device).triu(1)
        att = torch.softmax(scores.masked_fill(future, -math.inf), -1)
        return self.c_proj(torch.matmul(att, v).transpose(1, 2).reshape(B, T, self.heads * D))


class Mlp(torch.nn.Module):
    def __init__(self, c):
        super().__init__()
        self.c_fc = Conv1D(c["n_embd"], 4 * c["n_embd"])
        self.c_proj = Conv1D(4 * c["n_embd"], c["n_embd"])
        self.approximate = "none" if c["activation_function"] == "gelu" else "tanh"

    def forward(self, x):
        return self.c_proj(F.gelu(self.c_fc(x), approximate=self.approximate))


class Block(torch.nn.Module):
    def __init__(self, c):
        super().__init__()
        eps = c["layer_norm_epsilon"]
        self.ln_1 = torch.nn.LayerNorm(c["n_embd"], eps=eps)
        self.attn = Attention(c)
        self.ln_2 = torch.nn.LayerNorm(c["n_embd"], eps=eps)
        self.mlp = Mlp(c)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class Transformer(torch.nn.Module):
    def __init__(self, c):
        super().__init__()
        self.wte = torch.nn.Embedding(c["vocab_size"], c["n_embd"])
        self.wpe = torch.nn.Embedding(c["n_positions"], c["n_embd"])
        self.h = torch.nn.ModuleList(Block(c) for _ in range(c["n_layer"]))
        self.ln_f = torch.nn.LayerNorm(c["n_embd"], eps=c["layer_norm_epsilon"])


class Gpt(torch.nn.Module):  # GPT2LMHeadModel's names; lm_head.weight is transformer.wte.weight
    def __init__(self, c):
        super().__init__()
        self.transformer = Transformer(c)

    def forward(self, idx):
        t = self.transformer
        x = t.wte(idx) + t.wpe(torch.arange(idx.size(1), device=idx.device))
        for block in t.h:
            x = block(x)
        return torch.matmul(t.ln_f(x), t.wte.weight.t())


def config_for(vocab):
    return {"architectures": ["GPT2LMHeadModel"], "model_type": "gpt2", "vocab_size": vocab,
            "n_positions": a.block, "n_embd": a.embed, "n_layer": a.layers, "n_head": a.heads, "n_inner": None,
            "activation_function": "gelu" if a.gelu == "exact" else "gelu_new", "layer_norm_epsilon": 1e-5,
            "resid_pdrop": 0.0, "embd_pdrop": 0.0, "attn_pdrop": 0.0, "initializer_range": 0.02,
            "scale_attn_weights": True, "scale_attn_by_inverse_layer_idx": False, "reorder_and_upcast_attn": False,
            "tie_word_embeddings": True, "bos_token_id": 50256 if vocab > 50256 else None,
            "eos_token_id": 50256 if vocab > 50256 else None, "dtype": "float32"}


def write_init(directory):
    """GPT-2's initialisation (transformers' _init_weights, as nanoGPT does it) into directory."""
    _, text_vocab = text_ids(a.text, a.block)
    vocab = a.vocab or text_vocab
    if vocab < text_vocab:
        sys.exit(f"gpt_twin.py: --vocab {vocab} is below the text's {text_vocab} characters")
    if a.embed % a.heads:
        sys.exit(f"gpt_twin.py: --embed {a.embed} must be a multiple of --heads {a.heads}")
    c = config_for(vocab)
    model = Gpt(c)
    g = torch.Generator().manual_seed(a.seed)
    with torch.no_grad():
        for name, t in model.named_parameters():
            if name.endswith("ln_1.weight") or name.endswith("ln_2.weight") or name.endswith("ln_f.weight"):
                t.fill_(1)
            elif name.endswith(".bias"):
                t.zero_()
            else:  # embeddings and Conv1D weights; the residual projections scaled down by depth
                std = 0.02 / math.sqrt(2 * a.layers) if name.endswith("c_proj.weight") else 0.02
                t.normal_(0, std, generator=g)
    os.makedirs(directory, exist_ok=True)
    # Hugging Face's files leave out the tied lm_head.weight, as save_pretrained does.
    save_safetensors(model.state_dict(), os.path.join(directory, "model.safetensors"))
    with open(os.path.join(directory, "config.json"), "w") as f:
        json.dump(c, f, indent=2)
    print(f"gpt_twin.py: wrote {directory}/model.safetensors and config.json "
          f"({sum(t.numel() for t in model.parameters())} parameters, vocab {vocab})")


if a.dtype == "float64" and a.amp != "fp32":
    sys.exit(f"gpt_twin.py: --dtype float64 goes with --amp fp32 only, got --amp {a.amp}")
if a.write_init:
    write_init(a.write_init)
    sys.exit(0)
if not a.init_from:
    sys.exit("gpt_twin.py: give --init-from DIR (what --write-init DIR wrote; train_gpt --init-from DIR starts from it too)")

torch.manual_seed(0)
distributed = "RANK" in os.environ
if a.device == "cuda":
    if not torch.cuda.is_available():
        sys.exit("gpt_twin.py: --device cuda: this torch sees no CUDA GPU")
    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
    torch.cuda.set_device(device)
else:
    device = torch.device("cpu")
if distributed:
    dist.init_process_group("nccl" if a.device == "cuda" else "gloo")
rank, world = (dist.get_rank(), dist.get_world_size()) if distributed else (0, 1)
if a.mode != "none" and not distributed:
    sys.exit(f"gpt_twin.py: --mode {a.mode} needs a launcher (cpprun or torchrun) to set RANK and WORLD_SIZE")
if a.mode == "none" and world > 1:
    sys.exit(f"gpt_twin.py: --mode none on {world} ranks would train {world} separate models; run one rank")

with open(os.path.join(a.init_from, "config.json")) as f:
    config = json.load(f)
if config["n_positions"] < a.block:
    sys.exit(f"gpt_twin.py: --block {a.block} exceeds {a.init_from}/config.json's n_positions {config['n_positions']}")
ids, text_vocab = text_ids(a.text, a.block)
if config["vocab_size"] < text_vocab:
    sys.exit(f"gpt_twin.py: {a.init_from}'s vocab_size {config['vocab_size']} is below the text's {text_vocab} characters")
net = Gpt(config)
missing, unexpected = net.load_state_dict(load_safetensors(os.path.join(a.init_from, "model.safetensors")), strict=False)
if missing or unexpected:
    sys.exit(f"gpt_twin.py: {a.init_from}/model.safetensors: missing {missing}, unexpected {unexpected}")
dtype = torch.float64 if a.dtype == "float64" else torch.float32
net.to(device, dtype)
params = sum(t.numel() for t in net.parameters())  # unique: the tied head counts once

if a.mode == "ddp":
    from torch.nn.parallel import DistributedDataParallel
    model = DistributedDataParallel(net, device_ids=[device.index] if a.device == "cuda" else None)
elif a.mode == "fsdp2":
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    mesh = init_device_mesh(device.type, (world,))
    for block in net.transformer.h:  # one unit per block, as train_gpt's --mode fsdp
        fully_shard(block, mesh=mesh)
    model = fully_shard(net, mesh=mesh)
else:
    model = net

# AdamW as train_gpt builds it: decay on 2-D tensors (matmuls, embeddings), none on biases and norms.
decay = [t for t in model.parameters() if t.dim() >= 2]
no_decay = [t for t in model.parameters() if t.dim() < 2]
groups = [{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}]
if a.optimizer == "libtorch":
    optimizer = LibTorchAdamW(groups, lr=a.lr, betas=(0.9, 0.999), eps=1e-8)
else:
    optimizer = torch.optim.AdamW(groups, lr=a.lr, betas=(0.9, 0.999), eps=1e-8, fused=a.optimizer == "fused")

# Windows: train_gpt's split and sampler (cpprun::DistributedSampler is torch's, index for index).
ids = ids.to(device)
split = ids.numel() * 9 // 10
windows = split - a.block - 1
sampler = torch.utils.data.DistributedSampler(range(windows), num_replicas=world, rank=rank, shuffle=True, seed=0)
epoch, order, position = 0, list(sampler), 0
offsets = torch.arange(a.block, device=device)


rank_batch = a.batch * a.grad_accum  # windows per rank and step


def next_starts():
    global epoch, order, position
    if len(order) - position < rank_batch:  # train_gpt drops a short batch and starts a new pass
        epoch += 1
        sampler.set_epoch(epoch)
        order, position = list(sampler), 0
    starts = order[position:position + rank_batch]
    position += rank_batch
    if device.type != "cuda":
        return torch.tensor(starts)
    # From pageable memory the copy would first wait for the device: pinned, it is queued.
    return torch.tensor(starts).pin_memory().to(device, non_blocking=True)


def gradient_sync(on):  # train_gpt's no_sync for all but the last pass of a step
    if a.mode == "ddp":
        model.require_backward_grad_sync = on
    elif a.mode == "fsdp2":
        model.set_requires_gradient_sync(on)


amp = torch.autocast(device.type, dtype=torch.bfloat16, enabled=a.amp == "bf16")
losses = []
unread_losses = []  # steps since the last reading, on the device


def read_losses():  # waits for those steps' work
    if unread_losses:
        losses.extend(torch.stack(unread_losses).double().cpu().tolist())
        unread_losses.clear()


started = time.perf_counter()
tracing = a.trace and rank == 0
trace_first, trace_last = a.warmup + 1, min(a.steps, a.warmup + 3)
profile = None
for step in range(1, a.steps + 1):
    if step == a.warmup + 1:
        read_losses()  # the clock starts once the device has finished the warm-up
        started = time.perf_counter()
    if tracing and step == trace_first:  # as train_gpt --trace: CPU and, on a GPU, CUDA activities
        activities = [torch.profiler.ProfilerActivity.CPU]
        if device.type == "cuda":
            activities.append(torch.profiler.ProfilerActivity.CUDA)
        profile = torch.profiler.profile(activities=activities)
        profile.__enter__()
    index = next_starts()[:, None] + offsets
    step_x, step_y = ids[index], ids[index + 1]
    optimizer.zero_grad()
    loss = 0
    for micro in range(a.grad_accum):
        x, y = step_x[micro * a.batch:(micro + 1) * a.batch], step_y[micro * a.batch:(micro + 1) * a.batch]
        gradient_sync(micro + 1 == a.grad_accum)
        with amp:
            logits = model(x)
        micro_loss = F.cross_entropy(logits.view(-1, logits.size(-1)).to(dtype), y.view(-1))
        if a.grad_accum > 1:
            micro_loss = micro_loss / a.grad_accum
        micro_loss.backward()
        loss = micro_loss.detach() + loss if micro else micro_loss.detach()
    optimizer.step()
    mean = loss.detach().clone()
    if distributed:
        dist.all_reduce(mean)  # SUM: Gloo has no AVG
        mean /= world
    unread_losses.append(mean)
    if step == a.steps:
        read_losses()
    if profile is not None and step == trace_last:
        read_losses()  # the traced steps' work finished, so that the trace holds all of it
        profile.__exit__(None, None, None)
        profile.export_chrome_trace(a.trace)
        profile = None
seconds = time.perf_counter() - started

tokens = (a.steps - a.warmup) * rank_batch * a.block * world
peak_rss = torch.tensor([resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024], dtype=torch.float64)
peak_gpu = torch.tensor([torch.cuda.max_memory_allocated(device) / 2**20 if a.device == "cuda" else -1.0],
                        dtype=torch.float64)
if distributed:  # the largest rank's, as train_gpt prints
    peaks = torch.cat([peak_rss, peak_gpu]).to(device)
    dist.all_reduce(peaks, op=dist.ReduceOp.MAX)
    peak_rss, peak_gpu = peaks.cpu()[0:1], peaks.cpu()[1:2]
if rank == 0:
    if a.losses_out:
        with open(a.losses_out, "w") as f:
            f.writelines(f"{v:.17g}\n" for v in losses)
    print(f"RESULT impl=pytorch mode={a.mode} device={a.device} amp={a.amp} dtype={a.dtype} params={params} world={world} "
          f"tokens_per_s={tokens / seconds:.1f} peak_rss_mb={peak_rss.item():.1f} peak_gpu_mb={peak_gpu.item():.1f} "
          f"first_loss={losses[0]:.6f} last_loss={losses[-1]:.6f}", flush=True)
if distributed:
    dist.barrier()  # no rank tears Gloo down while rank 0 still writes (tests/dist/dcp_interop.py's flake)
    dist.destroy_process_group()
    # PyTorch 2.15's Gloo threads may abort at interpreter finalization (tests/launcher/behaviour/python_scripts.sh)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
