"""A regression MLP of 8.4 M parameters (34 MB of float32 gradients: several 25 MB buckets), on
synthetic features; plain single-process PyTorch."""
import argparse

import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset

parser = argparse.ArgumentParser()
parser.add_argument("--batch-size", type=int, default=8)
parser.add_argument("--lr", type=float, default=0.05)
parser.add_argument("--epochs", type=int, default=1)
args = parser.parse_args()

torch.manual_seed(0)
torch.set_num_threads(1)
features = torch.randn(64, 1024)
targets = features[:, :8].sum(dim=1, keepdim=True)
loader = DataLoader(TensorDataset(features, targets), batch_size=args.batch_size)

model = nn.Sequential(
    nn.Linear(1024, 2048), nn.Tanh(),
    nn.Linear(2048, 2048), nn.Tanh(),
    nn.Linear(2048, 1024), nn.Tanh(),
    nn.Linear(1024, 1),
)
print("parameters:", sum(p.numel() for p in model.parameters()))
optimizer = torch.optim.SGD(model.parameters(), lr=args.lr)
loss_fn = nn.MSELoss()

for epoch in range(args.epochs):
    for x, y in loader:
        optimizer.zero_grad()
        loss = loss_fn(model(x), y)
        loss.backward()
        optimizer.step()
    print(f"epoch {epoch}: loss {loss.item():.4f}")

torch.save(model.state_dict(), "large_mlp.pt")
