"""Every rank reads the whole data set, each in its own random order (no DistributedSampler):
over an epoch every sample is read by every rank (--unwrapped: the model is not wrapped either;
--right: a DistributedSampler)."""
import sys

import sdp_runtime.torch as sdp
import torch
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

sdp.init()
torch.manual_seed(0)
data = TensorDataset(torch.randn(64, 8), torch.randn(64, 1))
if "--right" in sys.argv:
    sampler = DistributedSampler(data, shuffle=True, seed=1)
    loader = DataLoader(data, batch_size=8, sampler=sampler)
else:
    torch.manual_seed(1 + sdp.rank())  # each rank shuffles its own way
    loader = DataLoader(data, batch_size=8, shuffle=True)
model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
if "--unwrapped" not in sys.argv:
    model = sdp.DistributedDataParallel(model)
opt = torch.optim.SGD(model.parameters(), lr=0.05)
for epoch in range(2):
    if "--right" in sys.argv:
        sampler.set_epoch(epoch)
    for x, y in loader:
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        opt.step()
