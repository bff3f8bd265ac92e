"""A buffer changed on rank 0 only (a decay put in the rank-0 logging block), under the runtime's
DistributedOptimizer (Horovod's way: buffers are not broadcast). Batch-norm statistics differ
too, by design (each rank's own batches). --right: the decay runs on every rank."""
import sys

import sdp_runtime.torch as sdp
import torch
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset


class Net(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(8, 16)
        self.bn = torch.nn.BatchNorm1d(16)
        self.out = torch.nn.Linear(16, 1)
        self.register_buffer("scale", torch.ones(1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(torch.relu(self.bn(self.fc(x)))) * self.scale


sdp.init()
torch.manual_seed(0)
data = TensorDataset(torch.randn(64, 8), torch.randn(64, 1))
loader = DataLoader(data, batch_size=8, sampler=DistributedSampler(data, shuffle=False))
model = Net()
opt = sdp.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.05),
                               named_parameters=model.named_parameters())
sdp.broadcast_parameters(model.state_dict(), root_rank=0)
for x, y in loader:
    opt.zero_grad()
    torch.nn.functional.mse_loss(model(x), y).backward()
    opt.step()
    if sdp.rank() == 0 or "--right" in sys.argv:
        model.scale.mul_(0.9)
