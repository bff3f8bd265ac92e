"""sdp_runtime: one Horovod/SMDDP-compatible data-parallel API on torch.distributed.

Framework APIs live in ``sdp_runtime.torch`` and ``sdp_runtime.tensorflow``; this package itself
imports no framework, so ``import sdp_runtime`` is cheap and has no side effects. It holds
``notebook_launcher`` (run a function on N processes from a notebook; torch is imported when it
is called).
"""

from __future__ import annotations

from ._notebook_launcher import LaunchError, notebook_launcher
from ._types import (
    AlreadyInitializedError,
    CommunicationError,
    MismatchError,
    NotInitializedError,
    NotProvidedError,
    ReduceOp,
)


def __getattr__(name: str) -> str:
    # The version is written once, in sdp_convert/__init__.py (the distribution's); read from the
    # installed metadata on first use, so that importing sdp_runtime stays cheap.
    if name == "__version__":
        from importlib.metadata import PackageNotFoundError, version

        try:
            return version("sdp-convert")
        except PackageNotFoundError:  # run from a source tree that was never installed
            return "unknown"
    raise AttributeError(f"module 'sdp_runtime' has no attribute {name!r}")


__all__ = [
    "AlreadyInitializedError",
    "CommunicationError",
    "LaunchError",
    "MismatchError",
    "NotInitializedError",
    "NotProvidedError",
    "ReduceOp",
    "__version__",
    "notebook_launcher",
]
