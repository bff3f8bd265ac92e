"""A loader that draws with replacement (RandomSampler(replacement=True), minGPT's shape) from
a torch generator seeded alike on every rank: every rank draws the same batches (--right: each
rank's sampler has a generator of its own, seeded with the rank, as the converter gives it; the
ranks then meet some of the same samples by chance, which is what drawing with replacement is)."""
import sys

import sdp_runtime.torch as sdp
import torch
from torch.utils.data import DataLoader, RandomSampler, TensorDataset

sdp.init()
torch.manual_seed(0)
data = TensorDataset(torch.randn(32, 8), torch.randn(32, 1))
generator = None
if "--right" in sys.argv:
    generator = torch.Generator().manual_seed(torch.initial_seed() + sdp.rank())
sampler = RandomSampler(data, replacement=True, num_samples=10_000, generator=generator)
loader = DataLoader(data, batch_size=8, sampler=sampler)
model = sdp.DistributedDataParallel(
    torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1)))
opt = torch.optim.SGD(model.parameters(), lr=0.05)
batches = iter(loader)
for _ in range(6):
    x, y = next(batches)
    opt.zero_grad()
    torch.nn.functional.mse_loss(model(x), y).backward()
    opt.step()
