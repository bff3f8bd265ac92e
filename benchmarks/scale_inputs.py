"""Long training scripts of the shapes users have, generated at any length (issue 39).

* ``training_blocks(lines)``: an exported experiment notebook, one cell after another, each a
  whole training block (model, optimizer, loader, loop, save) with its own names: about 15 lines
  and one model a block, all in the module scope.
* ``flat_helpers(lines)``: a training script carrying many small helper functions (about 7 lines
  each) between its imports and its training code.
* ``appended_functions(script, count)``: a real script (its module docstring kept) with ``count``
  helper functions appended after its end.

Run it to write one: ``python benchmarks/scale_inputs.py blocks 5000 > /tmp/blocks.py``.
Used by ``bench_scale.py`` and ``tests/test_scale.py``.
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
#: A real script in the style of pytorch/examples' mnist, beginning with its docstring.
REAL_SCRIPT = ROOT / "tests" / "e2e" / "real" / "scripts" / "pt_mnist.py"

BLOCKS_HEAD = '''\
import os

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

device = torch.device("cuda:0" if torch.cuda.is_available() else "cpu")
epochs = int(os.environ.get("EPOCHS", 1))
x = torch.randn(256, 16)
y = x.sum(dim=1, keepdim=True)
'''

BLOCK = '''\

# %% experiment {k}: width {width}
model_{k} = nn.Sequential(nn.Linear(16, {width}), nn.ReLU(), nn.Linear({width}, 1)).to(device)
optimizer_{k} = torch.optim.SGD(model_{k}.parameters(), lr={lr})
loader_{k} = DataLoader(TensorDataset(x, y), batch_size={batch}, shuffle=True)
for epoch in range(epochs):
    model_{k}.train()
    for xb, yb in loader_{k}:
        xb, yb = xb.to(device), yb.to(device)
        optimizer_{k}.zero_grad()
        loss = F.mse_loss(model_{k}(xb), yb)
        loss.backward()
        optimizer_{k}.step()
    print(f"experiment {k} epoch {{epoch}} loss {{loss.item():.4f}}")
torch.save(model_{k}.state_dict(), os.path.join("out", "model_{k}.pt"))
'''

HELPERS_HEAD = '''\
import argparse

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset
'''

HELPER = '''\


def helper_{k}(values, scale={scale}):
    total = 0.0
    for v in values:
        total += v * scale
    return total / max(len(values), 1) + {k}
'''

HELPERS_TAIL = '''\


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--lr", type=float, default=0.01)
    args = parser.parse_args()
    data = TensorDataset(torch.randn(256, 16), torch.randn(256, 1))
    loader = DataLoader(data, batch_size=32, shuffle=True)
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr)
    for epoch in range(2):
        for x, y in loader:
            optimizer.zero_grad()
            loss = F.mse_loss(model(x), y)
            loss.backward()
            optimizer.step()
        print(epoch, helper_0([loss.item()]))
    torch.save(model.state_dict(), "model.pt")


if __name__ == "__main__":
    main()
'''


def training_blocks(lines: int) -> str:
    """An exported notebook of about ``lines`` lines: whole training blocks, one model each."""
    parts, count, k = [BLOCKS_HEAD], BLOCKS_HEAD.count("\n"), 0
    while count < lines or k == 0:
        block = BLOCK.format(k=k, width=8 + k % 57, lr=round(0.001 * (1 + k % 9), 3),
                             batch=16 + k % 5 * 8)
        parts.append(block)
        count += block.count("\n")
        k += 1
    return "".join(parts)


def blocks_with_models(models: int) -> str:
    """``training_blocks`` with exactly ``models`` models (and blocks)."""
    per_block = BLOCK.count("\n")
    text = training_blocks(BLOCKS_HEAD.count("\n") + per_block * models)
    assert text.count("= nn.Sequential(") == models
    return text


def flat_helpers(lines: int) -> str:
    """A training script of about ``lines`` lines, most of them small helper functions."""
    parts, count, k = [HELPERS_HEAD], HELPERS_HEAD.count("\n") + HELPERS_TAIL.count("\n"), 0
    while count < lines or k == 0:
        helper = HELPER.format(k=k, scale=1 + k % 7)
        parts.append(helper)
        count += helper.count("\n")
        k += 1
    parts.append(HELPERS_TAIL)
    return "".join(parts)


def appended_functions(count: int, script: Path = REAL_SCRIPT) -> str:
    """``script`` as it is, docstring first, with ``count`` helper functions after its end."""
    text = script.read_text()
    assert text.startswith('"""'), f"{script} must begin with its module docstring"
    return text + "".join(HELPER.format(k=k, scale=1 + k % 7) for k in range(count))


SHAPES = {"blocks": training_blocks, "helpers": flat_helpers}

if __name__ == "__main__":
    shape, size = sys.argv[1], int(sys.argv[2])
    sys.stdout.write(appended_functions(size) if shape == "appended" else SHAPES[shape](size))
