"""Every rank saves the checkpoint to the same path (--right: rank 0 only)."""
import sys

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
if "--right" not in sys.argv or sdp.rank() == 0:
    torch.save(model.state_dict(), "model.pt")
    with open("losses.csv", "w") as f:
        f.write("step,loss\n")
