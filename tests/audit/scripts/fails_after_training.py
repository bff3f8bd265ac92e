"""A correct data-parallel script that fails after its training (its evaluation raises)."""
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

dist.init_process_group("gloo")
torch.manual_seed(0)
model = DDP(torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1)))
data = TensorDataset(torch.randn(96, 8), torch.randn(96, 1))
sampler = DistributedSampler(data, shuffle=True, seed=1)
loader = DataLoader(data, batch_size=8, sampler=sampler)
opt = torch.optim.Adam(model.parameters(), lr=1e-2)
for x, y in loader:
    opt.zero_grad()
    torch.nn.functional.mse_loss(model(x), y).backward()
    opt.step()
raise RuntimeError("the evaluation data is missing")
