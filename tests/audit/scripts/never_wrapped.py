"""A model never wrapped: each rank trains its own copy on its own shard (--right: wrapped)."""
import sys

import sdp_runtime.torch as sdp
import torch
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

sdp.init()
torch.manual_seed(0)
data = TensorDataset(torch.randn(64, 8), torch.randn(64, 1))
loader = DataLoader(data, batch_size=8, sampler=DistributedSampler(data, shuffle=False))
model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
if "--right" in sys.argv:
    model = sdp.DistributedDataParallel(model)
opt = torch.optim.SGD(model.parameters(), lr=0.05)
for x, y in loader:
    opt.zero_grad()
    torch.nn.functional.mse_loss(model(x), y).backward()
    opt.step()
