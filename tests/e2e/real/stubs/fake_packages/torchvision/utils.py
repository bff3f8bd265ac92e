"""``save_image`` writes a small ``.npy``-encoded file under the given name; ``make_grid``."""

from __future__ import annotations

import numpy as np
import torch


def make_grid(tensor, nrow=8, padding=2, normalize=False, **kwargs):
    return torch.cat(list(tensor), dim=-1) if tensor.dim() == 4 else tensor


def save_image(tensor, fp, nrow=8, padding=2, normalize=False, **kwargs):
    with open(fp, "wb") as f:
        np.save(f, make_grid(tensor.detach().cpu()).numpy())
