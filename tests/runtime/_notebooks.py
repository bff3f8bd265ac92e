"""The notebooks the notebook tests convert and run: one that trains at the top level (for
``sdp-run``), one that trains in a function (for a Jupyter kernel and ``notebook_launcher``).

Both have IPython lines (``%env``, ``!`` shell lines; the first also ``%pip`` and a ``%%bash``
cell), a ``display`` and a training loop; both learn the same regression on deterministic data
with the batch size and learning rate given, so that 2 processes at batch B can be compared with
one at 2B.
"""

from __future__ import annotations

import json
import textwrap
from pathlib import Path


def _cell(text: str) -> str:
    return textwrap.dedent(text).strip("\n")


#: The training loop, the same at the top level and in a function.
LOOP = _cell("""
    for epoch in range(2):
        for xb, yb in loader:
            optimizer.zero_grad()
            loss = nn.functional.mse_loss(model(xb), yb)
            loss.backward()
            optimizer.step()
        print(f"epoch {epoch} loss {loss.item():.4f}")
    """)

TOP_LEVEL = [
    ("markdown", "# A small regression\n\nTrained at the top level of the notebook."),
    ("code", _cell("""
        %pip install -q torch
        %env SDP_NB_MARK=set by %env
        import os

        import torch
        from torch import nn
        from torch.utils.data import DataLoader, TensorDataset
        """)),
    ("code", _cell("""
        torch.manual_seed(0)
        x = torch.randn(256, 8)
        y = x @ torch.arange(8.0).unsqueeze(1)
        batch_size = int(os.environ["BATCH_SIZE"])
        loader = DataLoader(TensorDataset(x, y), batch_size=batch_size, shuffle=False)
        model = nn.Linear(8, 1)
        optimizer = torch.optim.SGD(model.parameters(), lr=float(os.environ["LR"]))
        display(model)
        !nvidia-smi -L
        """)),
    ("code", LOOP),
    ("code", "%%bash\necho this cell is shell"),
    ("code", _cell("""
        s = '''
        %not a magic: a line of a string
        '''
        weights = torch.cat([p.detach().flatten() for p in model.parameters()])
        print("weights", " ".join(f"{w:.6f}" for w in weights.tolist()))
        print("mark", os.environ["SDP_NB_MARK"], s.strip())
        if os.environ.get("FAIL_ONE"):
            try:
                os.close(os.open("failed", os.O_CREAT | os.O_EXCL))
            except FileExistsError:
                pass  # the first process here fails, the other goes on
            else:
                raise ValueError("planned failure in the last cell")
        len(weights)
        """)),
]

IN_A_FUNCTION = [
    ("markdown", "# A small regression\n\nTrained in a function."),
    ("code", _cell("""
        %env SDP_NB_MARK=set by %env
        !echo a shell line
        import os

        import torch
        from torch import nn
        from torch.utils.data import DataLoader, TensorDataset
        """)),
    ("code", "def train(batch_size, lr):\n" + textwrap.indent(_cell("""
        torch.manual_seed(0)
        x = torch.randn(256, 8)
        y = x @ torch.arange(8.0).unsqueeze(1)
        loader = DataLoader(TensorDataset(x, y), batch_size=batch_size, shuffle=False)
        model = nn.Linear(8, 1)
        optimizer = torch.optim.SGD(model.parameters(), lr=lr)
        display(model)
        """) + "\n" + LOOP + "\n" + _cell("""
        weights = torch.cat([p.detach().flatten() for p in model.parameters()])
        return weights.tolist()
        """), "    ")),
    ("code", "single = train(32, 0.02)"),
]

#: What a person adds to the converted notebook, as the converter's hint says: the same training
#: on 2 processes, from the notebook.
LAUNCH = [
    ("code", _cell("""
        from sdp_runtime import notebook_launcher

        weights = notebook_launcher(train, args=(16, 0.01), num_processes=2, audit="strict")
        """)),
    ("code", _cell("""
        print("ranks agree", weights[0] == weights[1])
        gap = max(abs(a - b) for a, b in zip(weights[0], single))
        print("as one process at twice the batch", gap < 1e-5)
        print("mark", os.environ["SDP_NB_MARK"])
        """)),
]


def write(path: Path, cells: list[tuple[str, str]]) -> Path:
    """An nbformat 4 notebook with these (cell type, source) cells."""
    doc = {
        "cells": [
            {"cell_type": kind, "id": f"cell-{n}", "metadata": {},
             "source": source.splitlines(keepends=True),
             **({"execution_count": None, "outputs": []} if kind == "code" else {})}
            for n, (kind, source) in enumerate(cells, start=1)
        ],
        "metadata": {"kernelspec": {"name": "python3", "display_name": "Python 3",
                                    "language": "python"}},
        "nbformat": 4,
        "nbformat_minor": 5,
    }
    path.write_text(json.dumps(doc, indent=1) + "\n", encoding="utf-8")
    return path
