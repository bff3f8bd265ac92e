"""The model lives in a trainer object (``trainer.model``, its layers ``body`` and ``head``), its
loader and optimizer too. The model is never wrapped and the loader never split: each rank
trains its own copy on the whole data set, read in its own random order (--right: the model
wrapped, the optimizer made over the wrapper, a DistributedSampler)."""
import sys

import sdp_runtime.torch as sdp
import torch
from torch.utils.data import DataLoader, DistributedSampler, RandomSampler, TensorDataset


class Net(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.body = torch.nn.Linear(8, 16)
        self.head = torch.nn.Linear(16, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(torch.relu(self.body(x)))


class Trainer:
    def __init__(self, data: TensorDataset, split: bool) -> None:
        self.model = Net()
        sampler = DistributedSampler(data) if split else RandomSampler(data)
        self.loader = DataLoader(data, batch_size=8, sampler=sampler)
        self.optimizer = torch.optim.SGD(self.model.parameters(), lr=0.05)

    def fit(self) -> None:
        for x, y in self.loader:
            self.optimizer.zero_grad()
            torch.nn.functional.mse_loss(self.model(x), y).backward()
            self.optimizer.step()


sdp.init()
torch.manual_seed(0)
trainer = Trainer(TensorDataset(torch.randn(64, 8), torch.randn(64, 1)), "--right" in sys.argv)
if "--right" in sys.argv:
    trainer.model = sdp.DistributedDataParallel(trainer.model)
    trainer.optimizer = torch.optim.SGD(trainer.model.parameters(), lr=0.05)
torch.manual_seed(1 + sdp.rank())  # the same weights everywhere, but each rank its own order
trainer.fit()
