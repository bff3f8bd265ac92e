"""sdp_runtime: one Horovod/SMDDP-compatible data-parallel API on torch.distributed.

Framework APIs live in ``sdp_runtime.torch`` and ``sdp_runtime.tensorflow``; this package itself
imports no framework, so ``import sdp_runtime`` is cheap and has no side effects.
"""

from __future__ import annotations

from ._types import (
    AlreadyInitializedError,
    CommunicationError,
    MismatchError,
    NotInitializedError,
    ReduceOp,
)

__version__ = "0.1.0"

__all__ = [
    "AlreadyInitializedError",
    "CommunicationError",
    "MismatchError",
    "NotInitializedError",
    "ReduceOp",
    "__version__",
]
