# Learn y = 3x - 1 from noisy samples, on one process.
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

torch.manual_seed(0)
x = torch.rand(512, 1)
y = 3 * x - 1 + 0.1 * torch.randn(512, 1)
loader = DataLoader(TensorDataset(x, y), batch_size=32, shuffle=True)

model = nn.Linear(1, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)

for epoch in range(5):
    for xb, yb in loader:
        optimizer.zero_grad()
        loss = nn.functional.mse_loss(model(xb), yb)
        loss.backward()
        optimizer.step()
    print(f"epoch {epoch}: loss {loss.item():.4f}")

torch.save(model.state_dict(), "model.pt")
