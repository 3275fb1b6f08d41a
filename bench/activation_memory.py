"""PyTorch's side of bench/activation_memory.cpp: the same blocks, forward + backward, with and
without torch.utils.checkpoint (use_reentrant=False), peak resident memory growth during the step.

    python bench/activation_memory.py --blocks 8 --checkpoint 1 [--width 256 --batch 4096]
"""
import argparse

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint


def peak_rss():
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    return 0


def reset_peak_rss():
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")


class Block(nn.Module):
    def __init__(self, width):
        super().__init__()
        self.up = nn.Linear(width, 4 * width)
        self.down = nn.Linear(4 * width, width)
        self.drop = nn.Dropout(0.1)

    def forward(self, x):
        return x + self.drop(self.down(F.gelu(self.up(x))))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--blocks", type=int, default=8)
    parser.add_argument("--width", type=int, default=256)
    parser.add_argument("--batch", type=int, default=4096)
    parser.add_argument("--checkpoint", type=int, default=0)
    args = parser.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    stack = [Block(args.width) for _ in range(args.blocks)]
    x = torch.randn(args.batch, args.width, requires_grad=True)

    def run():
        h = x
        for block in stack:
            h = checkpoint(block, h, use_reentrant=False) if args.checkpoint else block(h)
        h.pow(2).mean().backward()

    run()
    reset_peak_rss()
    base = peak_rss()
    run()
    growth = peak_rss() - base
    print(f"RESULT impl=py blocks={args.blocks} checkpoint={args.checkpoint} peak_growth_mb={growth / 1e6:.1f}")


if __name__ == "__main__":
    main()
