"""``@smp.step`` and ``StepOutput`` for PyTorch (the logic is :mod:`sdp_runtime._smp_step`'s).

Each call splits the tensor arguments into ``microbatches`` pieces along dimension 0 (SMP's
``input_split_axes`` / ``non_split_inputs`` change that), runs the function on each piece and
returns ``StepOutput``s. Inside, ``model.backward(loss)`` gives each microbatch's gradient the
weight ``1 / microbatches`` and gradients are averaged across processes after the last
microbatch only, so one step on a batch equals one step of the plain model on the whole batch.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import torch

from ... import _smp_step
from . import model as _model
from . import state

StepOutput = _smp_step.StepOutput


class _TorchOps:
    def is_tensor(self, value: Any) -> bool:
        return isinstance(value, torch.Tensor)

    def length(self, tensor: Any, axis: int) -> int:
        return int(tensor.shape[axis])

    def slice(self, tensor: Any, axis: int, start: int, length: int) -> Any:
        return tensor.narrow(axis, start, length)

    def detach(self, tensor: Any) -> Any:
        return tensor.detach()

    def stack(self, tensors: list[Any]) -> Any:
        return torch.stack(tensors)

    def concat(self, tensors: list[Any], axis: int) -> Any:
        return torch.cat(tensors, dim=axis)

    def mean(self, tensors: list[Any]) -> Any:
        total = self.sum(tensors)
        return total / len(tensors)

    def sum(self, tensors: list[Any]) -> Any:
        return torch.stack(tensors).sum(dim=0)


_OPS = _TorchOps()


def _microbatches() -> int:
    return state.config().microbatches


@contextlib.contextmanager
def _hook(index: int, count: int) -> Iterator[None]:
    model = _model.current_model()
    if model is None:
        yield
        return
    with model.microbatch(index, count):
        yield


def step(func: Callable[..., Any] | None = None, **options: Any) -> Any:
    """Decorate the function that runs the forward and backward pass of one batch.

    Arguments:
        func: the function (``@smp.step``), or None (``@smp.step()``, ``@smp.step(...)``).
        non_split_inputs: names of arguments passed whole to every microbatch.
        input_split_axes: ``{argument name: axis}`` where the batch axis is not 0.
        detach_outputs: detach the returned tensors (default True).

    Example:
        >>> @smp.step
        ... def train_step(model, data, target):
        ...     loss = F.nll_loss(model(data), target)
        ...     model.backward(loss)
        ...     return loss
        >>> loss = train_step(model, data, target).reduce_mean()
    """
    return _smp_step.make_step(_OPS, _microbatches, _hook, func, **options)
