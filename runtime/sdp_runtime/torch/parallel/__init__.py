"""``smdistributed.dataparallel.torch.parallel``: the DistributedDataParallel class."""

from __future__ import annotations

from ..ddp import DistributedDataParallel

__all__ = ["DistributedDataParallel"]
