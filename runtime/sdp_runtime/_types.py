"""Names shared by every framework layer that need no framework: reduction ops and error types."""

from __future__ import annotations

import enum


class ReduceOp(enum.Enum):
    """How ``allreduce`` combines the ranks' values (Horovod's ``hvd.Average`` etc.)."""

    AVERAGE = "average"
    SUM = "sum"
    MIN = "min"
    MAX = "max"

    @classmethod
    def parse(cls, op: ReduceOp | str) -> ReduceOp:
        """Accept a ``ReduceOp`` or its name in any case (``"sum"``, ``"AVERAGE"``, ``"avg"``)."""
        if isinstance(op, cls):
            return op
        name = str(op).strip().upper()
        name = {"AVG": "AVERAGE", "MEAN": "AVERAGE"}.get(name, name)
        try:
            return cls[name]
        except KeyError:
            raise ValueError(
                f"unknown reduce op {op!r}; expected one of AVERAGE, SUM, MIN, MAX"
            ) from None


class NotInitializedError(RuntimeError):
    """A collective or a rank query ran before ``sdp.init()``."""

    def __init__(self, what: str = "this call") -> None:
        super().__init__(
            f"sdp_runtime is not initialized: call sdp.init() (hvd.init() style) before {what}"
        )


class AlreadyInitializedError(RuntimeError):
    """``init()`` ran a second time without ``shutdown()`` in between."""


class CommunicationError(RuntimeError):
    """A collective failed: a peer died, did not answer within ``SDP_TIMEOUT``, or never arrived."""


class MismatchError(CommunicationError, ValueError):
    """Ranks called the same collective with different tensors (number, shapes or dtypes)."""


class NotProvidedError(AttributeError, NotImplementedError):
    """A Horovod or SMDDP API that sdp_runtime does not provide; the message says what to use.

    Raised when a script looks such a name up (``hvd.join``) or passes what the runtime cannot do
    (``process_set=`` a subset). An ``AttributeError``, so ``hasattr(hvd, "join")`` stays False.
    """
