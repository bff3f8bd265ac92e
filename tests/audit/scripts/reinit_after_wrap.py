"""torch DDP by hand; the head is re-initialised on each rank after the wrap (--right: before)."""
import os
import sys

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

dist.init_process_group("gloo")
rank = dist.get_rank()
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
if "--right" in sys.argv:
    model[2].reset_parameters()  # before the wrap: DDP broadcasts rank 0's weights
ddp = DDP(model)
if "--right" not in sys.argv:
    torch.manual_seed(100 + rank)
    model[2].reset_parameters()  # after the wrap: each rank its own head, forever
data = TensorDataset(torch.randn(64, 8), torch.randn(64, 1))
loader = DataLoader(data, batch_size=8, sampler=DistributedSampler(data))
opt = torch.optim.SGD(ddp.parameters(), lr=0.05)
for x, y in loader:
    opt.zero_grad()
    torch.nn.functional.mse_loss(ddp(x), y).backward()
    opt.step()
dist.destroy_process_group()
print("done", os.getpid())
