"""``smp.amp.GradScaler``: torch's GradScaler, with the overflow check agreed by all processes
(a sharded model's shards may overflow on one rank only)."""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

from ... import _comm


class GradScaler(torch.amp.GradScaler):
    """``torch.amp.GradScaler`` on this process's device; a step skipped for an overflow is
    skipped on every process.

    Example:
        >>> scaler = smp.amp.GradScaler()
        >>> model.backward(scaler.scale(loss))
        >>> scaler.step(optimizer); scaler.update()
    """

    def __init__(self, device: str | None = None, **kwargs: Any) -> None:
        super().__init__(device or _comm.device().type, **kwargs)

    def unscale_(self, optimizer: torch.optim.Optimizer) -> None:
        super().unscale_(optimizer)
        if _comm.size() > 1 and self.is_enabled():
            found = self._per_optimizer_states[id(optimizer)]["found_inf_per_device"]
            for flag in found.values():
                dist.all_reduce(flag, op=dist.ReduceOp.MAX)


__all__ = ["GradScaler"]
