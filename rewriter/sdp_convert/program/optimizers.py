"""torch.optim names as data, and the questions about optimizer calls."""

from __future__ import annotations

import libcst as cst

from ..base import Transform
from .syntax import arg_named

_SCHEDULER_MODULES = ("torch.optim.lr_scheduler", "torch.optim.swa_utils")


def optimizer_class(transform: Transform, call: cst.Call) -> str | None:
    """``SGD`` when ``call`` (original) constructs a ``torch.optim`` optimizer, however imported
    (``torch.optim.SGD``, ``optim.SGD``, ``from torch.optim.sgd import SGD``)."""
    for qname in transform.qualified_names(call.func):
        parts = qname.split(".")
        if parts[:2] != ["torch", "optim"] or len(parts) not in (3, 4):
            continue
        if len(parts) == 4 and ".".join(parts[:3]) in _SCHEDULER_MODULES:
            continue
        name = parts[-1]
        if name[:1].isupper() and name != "Optimizer":
            return name
    return None


def params_argument(call: cst.Call) -> cst.Arg | None:
    """The ``params`` argument of an optimizer constructor."""
    return arg_named(call, "params", 0)
