# Writes tests/data/sampler_indices.txt: the indices PyTorch's own DistributedSampler yields, for
# tests/unit/test_sampler.cpp to compare cpprun::DistributedSampler against. Made with the
# project's PyTorch (2.15; 1.13 gave the very same indices):
#   .venv/bin/python tests/data/make_sampler_indices.py > tests/data/sampler_indices.txt
# ctest's unit.sampler_reference runs it again and checks the file still matches.
# Each line: size replicas rank shuffle seed drop_last epoch : indices...
import itertools
import torch
from torch.utils.data.distributed import DistributedSampler

print(f"# torch {torch.__version__}: size replicas rank shuffle seed drop_last epoch : indices")
for size, replicas, shuffle, seed, drop_last in itertools.product(
        [1, 3, 7, 10, 12, 13, 100, 1001], [1, 2, 3, 4], [False, True], [0, 42], [False, True]):
    for rank in range(replicas):
        sampler = DistributedSampler(range(size), num_replicas=replicas, rank=rank,
                                     shuffle=shuffle, seed=seed, drop_last=drop_last)
        for epoch in (0, 1, 5):
            sampler.set_epoch(epoch)
            indices = " ".join(str(i) for i in sampler)
            print(f"{size} {replicas} {rank} {int(shuffle)} {seed} {int(drop_last)} {epoch} : {indices}")
