"""The model is wrapped, but the step calls a method of it that bypasses the wrapper's forward:
``model.module.compute_loss(x, y)`` (--encode: ``model.encode(x)``, which the runtime's wrapper
hands to the module; --right: ``model(x, y)``, whose forward computes the loss)."""
import io
import sys

import sdp_runtime.torch as sdp
import torch
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset


class Net(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.body = torch.nn.Linear(8, 16)
        self.head = torch.nn.Linear(16, 1)

    def encode(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.body(x))

    def compute_loss(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.mse_loss(self.head(self.encode(x)), y)

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return self.compute_loss(x, y)


sdp.init()
torch.manual_seed(0)
data = TensorDataset(torch.randn(64, 8), torch.randn(64, 1))
loader = DataLoader(data, batch_size=8, sampler=DistributedSampler(data, shuffle=False))
model = sdp.DistributedDataParallel(Net())
opt = torch.optim.SGD(model.parameters(), lr=0.05)
for x, y in loader:
    opt.zero_grad()
    if "--right" in sys.argv:
        loss = model(x, y)
    elif "--encode" in sys.argv:
        loss = torch.nn.functional.mse_loss(model.head(model.encode(x)), y)
    else:
        loss = model.module.compute_loss(x, y)
    loss.backward()
    opt.step()
torch.save(model.module, io.BytesIO())  # the whole model pickles (the audit hooks none of it)
