"""Rank 0 saves a checkpoint after steps 2 and 4; after step 4 rank 1 loads "the latest" without
waiting for rank 0 (no barrier) and gets the one of step 2, while rank 0 is still writing the new
one: the ranks train on from different weights (--right: a barrier before the load)."""
import sys
import time

import sdp_runtime.torch as sdp
import torch
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

sdp.init()
torch.manual_seed(0)
data = TensorDataset(torch.randn(64, 8), torch.randn(64, 1))
loader = DataLoader(data, batch_size=8, sampler=DistributedSampler(data, shuffle=False))
model = sdp.DistributedDataParallel(torch.nn.Linear(8, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.05)
for step, (x, y) in enumerate(loader, 1):
    opt.zero_grad()
    torch.nn.functional.mse_loss(model(x), y).backward()
    opt.step()
    if step in (2, 4) and sdp.rank() == 0:
        if step == 4:
            time.sleep(2.0)  # an evaluation before the save
        torch.save(model.state_dict(), "latest.pt")
    if step == 4:
        if "--right" in sys.argv:
            sdp.barrier()
        if sdp.rank() == 1:
            model.load_state_dict(torch.load("latest.pt"))
