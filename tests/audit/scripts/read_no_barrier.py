"""Rank 0 writes a file that rank 1 reads without waiting for it (--right: after a barrier)."""
import os
import sys
import time

import sdp_runtime.torch as sdp
import torch
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

sdp.init()
torch.manual_seed(0)
data = TensorDataset(torch.randn(32, 8), torch.randn(32, 1))
loader = DataLoader(data, batch_size=8, sampler=DistributedSampler(data))
model = sdp.DistributedDataParallel(torch.nn.Linear(8, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.05)
for x, y in loader:
    opt.zero_grad()
    torch.nn.functional.mse_loss(model(x), y).backward()
    opt.step()
if sdp.rank() == 0:
    with open("vocab.txt", "w") as f:  # a slow write, in two parts
        f.write("first half\n")
        f.flush()
        time.sleep(1.5)
        f.write("second half\n")
if "--right" in sys.argv:
    sdp.barrier()
elif sdp.rank() == 1:
    while not os.path.exists("vocab.txt"):
        time.sleep(0.01)
if sdp.rank() == 1:
    with open("vocab.txt") as f:
        print("rank 1 read", len(f.read().splitlines()), "lines")
sdp.barrier()
