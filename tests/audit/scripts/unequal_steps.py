"""Rank 1 gets fewer batches than rank 0 (--right: the same number)."""
import sys

import sdp_runtime.torch as sdp
import torch

sdp.init()
torch.manual_seed(0)
model = sdp.DistributedDataParallel(torch.nn.Linear(8, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.05)
g = torch.Generator().manual_seed(sdp.rank())
steps = 5 if "--right" in sys.argv or sdp.rank() == 0 else 4
for _ in range(steps):
    x, y = torch.randn(8, 8, generator=g), torch.randn(8, 1, generator=g)
    opt.zero_grad()
    torch.nn.functional.mse_loss(model(x), y).backward()
    opt.step()
