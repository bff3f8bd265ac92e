"""``DistributedOptimizer``: average gradients over all processes before each step (Horovod's).

The optimizer you pass is turned into a distributed one in place (its class becomes a subclass
that adds the averaging), so ``isinstance`` checks, LR schedulers already attached to it and
``state_dict()`` keep working, and the returned object is the one you passed.

All gradients are reduced in one fused call when ``step()`` (or ``synchronize()``) runs;
sparse gradients (``nn.Embedding(sparse=True)``) travel dense and come back sparse, as optimizers
such as ``SparseAdam`` need them. Gradients
accumulated over several backward passes are reduced once, which is what
``backward_passes_per_step`` describes. A parameter without a gradient on this process but with
one elsewhere gets the average of the others (zeros counted for this process), as in Horovod; a
parameter that has no gradient anywhere keeps ``grad = None``, so the optimizer skips it as it
would on one process.
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Iterator
from typing import Any

import torch

from .. import _comm
from .._compat import check_process_set
from .._types import ReduceOp
from .collectives import reduce_in_place
from .compression import Compression

_classes: dict[type, type] = {}


class _DistributedMixin:
    """Methods added to the optimizer's own class by ``DistributedOptimizer``."""

    param_groups: list[dict[str, Any]]

    def _sdp_setup(self, names: dict[int, str], compression: Any, passes: int, op: ReduceOp,
                   predivide: float) -> None:
        self._sdp_names = names
        self._sdp_compression = compression
        self.backward_passes_per_step = passes
        self._sdp_op = op
        self._sdp_predivide = predivide
        self._sdp_synchronized = False
        self._sdp_skip = False

    def synchronize(self) -> None:
        """Average the gradients now (e.g. before clipping them); ``step()`` will not do it again.

        Example:
            >>> loss.backward()
            >>> optimizer.synchronize()
            >>> torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            >>> with optimizer.skip_synchronize():
            ...     optimizer.step()
        """
        params = [p for g in self.param_groups for p in g["params"] if p.requires_grad]
        if params and not _comm.alone():
            self._sdp_reduce(params)
        self._sdp_synchronized = True

    def _sdp_reduce(self, params: list[torch.Tensor]) -> None:
        present = [p.grad is not None for p in params]
        sparse = [p.grad is not None and p.grad.is_sparse for p in params]
        grads = []
        for p, is_sparse in zip(params, sparse, strict=True):
            if is_sparse:
                p.grad = p.grad.to_dense()
            grads.append(p.grad if p.grad is not None else torch.zeros_like(p))
        # Which parameters have a gradient somewhere, and a sparse one somewhere, travels in the
        # same fused call.
        n = len(params)
        mask = torch.tensor(present + sparse, dtype=torch.float32)
        scale = self._sdp_predivide if self._sdp_op is ReduceOp.AVERAGE else 1.0
        reduce_in_place([*grads, mask], self._sdp_op, self._sdp_compression, 1.0 / scale, scale)
        flags = mask.tolist()
        for p, g, had, anywhere, sparse_somewhere in zip(params, grads, present, flags[:n],
                                                         flags[n:], strict=True):
            if not had and anywhere > 0:
                p.grad = g
            if sparse_somewhere > 0:  # SparseAdam & co. take their gradients sparse, as Horovod
                p.grad = g.to_sparse()

    @contextlib.contextmanager
    def skip_synchronize(self) -> Iterator[None]:
        """Within this block ``step()`` does not average (after an explicit ``synchronize()``).

        Example:
            >>> with optimizer.skip_synchronize():
            ...     optimizer.step()
        """
        self._sdp_skip = True
        try:
            yield
        finally:
            self._sdp_skip = False

    def step(self, closure: Any = None) -> Any:
        """Average the gradients over all processes, then take the wrapped optimizer's step.

        Arguments:
            closure: as for the wrapped optimizer; it is evaluated once, before the averaging.

        Example:
            >>> optimizer.step()
        """
        loss = None
        if closure is not None:
            if isinstance(self, torch.optim.LBFGS):
                raise NotImplementedError(
                    "LBFGS re-evaluates its closure inside step(), so its gradients cannot be "
                    "averaged before it; average them in the closure with sdp.allreduce_ instead"
                )
            with torch.enable_grad():
                loss = closure()
        if self._sdp_synchronized and not self._sdp_skip:
            warnings.warn(  # Horovod's warning; the gradients are not averaged a second time
                "optimizer.step() called without optimizer.skip_synchronize() context after "
                "optimizer.synchronize(). This can cause training slowdown. You may want to "
                "consider using optimizer.skip_synchronize() context if you use "
                "optimizer.synchronize() in your code.", stacklevel=2)
        if not self._sdp_skip and not self._sdp_synchronized:
            self.synchronize()
        self._sdp_synchronized = False
        result = super().step()  # type: ignore[misc]
        return loss if closure is not None else result


def DistributedOptimizer(  # noqa: N802 (Horovod's name for a factory)
    optimizer: torch.optim.Optimizer,
    named_parameters: Any = None,
    compression: Any = Compression.none,
    backward_passes_per_step: int = 1,
    op: ReduceOp | str = ReduceOp.AVERAGE,
    gradient_predivide_factor: float = 1.0,
    num_groups: int = 0,
    groups: Any = None,
    sparse_as_dense: bool = False,
    process_set: Any = None,
) -> torch.optim.Optimizer:
    """Make ``optimizer`` average gradients over all processes before each step.

    Arguments:
        optimizer: any ``torch.optim.Optimizer``; it is changed in place and returned.
        named_parameters: ``model.named_parameters()``; only checked (names unique, every
            parameter of the optimizer named).
        compression: ``Compression.none`` or ``Compression.fp16`` (gradients travel as float16).
        backward_passes_per_step: backward passes accumulated locally between steps; the sum is
            averaged over processes once per ``step()``.
        op: ``Average`` (default) or ``Sum``.
        gradient_predivide_factor: divide by this before the sum and by ``size / factor`` after
            (Average only); the result is the same average, computed in another order.
        num_groups, groups, sparse_as_dense: accepted for Horovod compatibility; gradients are
            always fused and sparse gradients made dense.
        process_set: None or ``global_process_set``; other sets are refused.

    Example:
        >>> optimizer = torch.optim.SGD(model.parameters(), lr=0.01 * sdp.size())
        >>> optimizer = sdp.DistributedOptimizer(optimizer, model.named_parameters())
    """
    check_process_set(process_set, "DistributedOptimizer")
    if isinstance(optimizer, _DistributedMixin):
        raise ValueError("this optimizer is already a DistributedOptimizer")
    if backward_passes_per_step < 1:
        raise ValueError("backward_passes_per_step must be at least 1")
    reduce_op = ReduceOp.parse(op)
    if reduce_op not in (ReduceOp.AVERAGE, ReduceOp.SUM):
        raise ValueError(f"DistributedOptimizer supports Average and Sum, not {reduce_op.name}")
    if gradient_predivide_factor != 1.0 and reduce_op is not ReduceOp.AVERAGE:
        raise ValueError("gradient_predivide_factor needs op=Average")
    names = _check_names(named_parameters)
    unnamed = [p for g in optimizer.param_groups for p in g["params"] if id(p) not in names]
    if names and unnamed:
        raise ValueError("named_parameters was given, but the optimizer has parameters it does not "
                         f"name ({len(unnamed)} of them): pass model.named_parameters() of the "
                         "whole model the optimizer trains (Horovod refuses it too)")
    _comm.size()  # raises NotInitializedError before init()
    optimizer.__class__ = _distributed_class(type(optimizer))
    _keep_step_wrapper(optimizer)
    optimizer._sdp_setup(names, compression, backward_passes_per_step, reduce_op,  # type: ignore[attr-defined]
                         gradient_predivide_factor)
    return optimizer


# torch wraps ``type(optimizer).step`` in its hook-calling wrapper when a step function is not
# marked ``hooked`` (``Optimizer._patch_step_function``, run again by ``load_state_dict``, e.g.
# in ``broadcast_optimizer_state`` on the other ranks). Our ``step`` ends in the base class's own
# wrapped ``step``: wrapping it too would run every step hook twice.
_DistributedMixin.step.hooked = True  # type: ignore[attr-defined]


def _distributed_class(base: type) -> type:
    if base not in _classes:
        namespace = {"__module__": base.__module__}
        _classes[base] = type(base.__name__, (_DistributedMixin, base), namespace)
    return _classes[base]


def _keep_step_wrapper(optimizer: torch.optim.Optimizer) -> None:
    """Re-point a ``step`` wrapper set on the instance (an LR scheduler made earlier) at ours.

    torch's LR schedulers replace ``optimizer.step`` with a wrapper around the class's original
    function; left alone, it would skip the averaging.
    """
    patched = vars(optimizer).pop("step", None)
    if patched is None:
        return
    own = optimizer.step

    def step(*args: Any, **kwargs: Any) -> Any:
        optimizer._opt_called = True  # type: ignore[attr-defined]  # what the scheduler records
        return own(*args, **kwargs)

    step.__dict__.update(getattr(patched, "__dict__", {}))
    optimizer.step = step  # type: ignore[method-assign]


def _check_names(named_parameters: Any) -> dict[int, str]:
    if named_parameters is None:
        return {}
    pairs = list(named_parameters)
    if any(not (isinstance(p, tuple) and len(p) == 2) for p in pairs):
        raise ValueError("named_parameters must be (name, parameter) pairs, "
                         "e.g. model.named_parameters()")
    names = [name for name, _ in pairs]
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        raise ValueError(f"named_parameters has duplicate names: {duplicates}")
    return {id(p): name for name, p in pairs}
