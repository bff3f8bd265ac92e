"""``smdistributed.dataparallel.torch.parallel.distributed``: the DistributedDataParallel class."""

from __future__ import annotations

from ..ddp import DistributedDataParallel

__all__ = ["DistributedDataParallel"]
