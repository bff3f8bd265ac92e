"""Each rank trains on a random half of the data that it draws itself: the halves overlap
(--right: a DistributedSampler splits the data)."""
import sys

import sdp_runtime.torch as sdp
import torch
from torch.utils.data import DataLoader, DistributedSampler, Subset, TensorDataset

sdp.init()
torch.manual_seed(0)
data = TensorDataset(torch.randn(64, 8), torch.randn(64, 1))
if "--right" in sys.argv:
    loader = DataLoader(data, batch_size=8, sampler=DistributedSampler(data))
else:
    half = torch.randperm(64, generator=torch.Generator().manual_seed(sdp.rank()))[:32]
    loader = DataLoader(Subset(data, half.tolist()), batch_size=8)
model = sdp.DistributedDataParallel(torch.nn.Linear(8, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.05)
for x, y in loader:
    opt.zero_grad()
    torch.nn.functional.mse_loss(model(x), y).backward()
    opt.step()
