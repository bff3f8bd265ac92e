"""SMP's ``@smp.step`` and ``StepOutput``, for any framework given its tensor operations.

``@smp.step`` splits every tensor argument of the decorated function along its batch axis into
``microbatches`` equal pieces (lists, tuples and dicts of tensors piece by piece, objects with an
``smp_slice(num_mb, mb, axis)`` method by calling it), calls the function once per piece, and
returns what the function returned with every tensor replaced by a ``StepOutput`` holding that
tensor's value for each microbatch. The framework modules (``sdp_runtime.torch.smp``,
``sdp_runtime.tensorflow.smp``) give the tensor operations and the per-microbatch hook (gradient
synchronisation on the last microbatch only, the gradient scale ``1 / microbatches``).

Nothing here imports torch or TensorFlow.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import AbstractContextManager
from typing import Any, Protocol


class Ops(Protocol):
    """The tensor operations a framework gives ``step`` and ``StepOutput``."""

    def is_tensor(self, value: Any) -> bool: ...
    def length(self, tensor: Any, axis: int) -> int: ...
    def slice(self, tensor: Any, axis: int, start: int, length: int) -> Any: ...
    def detach(self, tensor: Any) -> Any: ...
    def stack(self, tensors: list[Any]) -> Any: ...
    def concat(self, tensors: list[Any], axis: int) -> Any: ...
    def mean(self, tensors: list[Any]) -> Any: ...
    def sum(self, tensors: list[Any]) -> Any: ...


class StepOutput:
    """One value of a ``@step`` function, for every microbatch.

    ``outputs`` is the list of the microbatches' values, which the object also reads as: it
    iterates over them, has their number as ``len`` and is indexed by microbatch
    (``torch.cat(tuple(logits_mb.outputs))``, ``sum(loss_mb)``, ``loss_mb[0]`` all work).

    Example:
        >>> loss_mb = train_step(model, images, labels)
        >>> loss = loss_mb.reduce_mean()   # the loss of the whole batch
    """

    def __init__(self, outputs: list[Any], ops: Ops) -> None:
        self.outputs = outputs
        self._ops = ops

    def __iter__(self) -> Iterator[Any]:
        return iter(self.outputs)

    def __len__(self) -> int:
        return len(self.outputs)

    def __getitem__(self, index: int) -> Any:
        return self.outputs[index]

    def reduce_mean(self) -> Any:
        """The mean over microbatches (of a loss: the batch's loss)."""
        return self._ops.mean(self.outputs)

    def reduce_sum(self) -> Any:
        """The sum over microbatches."""
        return self._ops.sum(self.outputs)

    def concat(self) -> Any:
        """The microbatches' values joined along the batch axis (predictions of the batch)."""
        return self._ops.concat(self.outputs, 0)

    def stack(self) -> Any:
        """The microbatches' values stacked along a new first axis."""
        return self._ops.stack(self.outputs)

    def merge(self) -> Any:
        """TensorFlow SMP's name for ``concat``."""
        return self.concat()

    def accumulate(self, method: str = "variable", var: Any = None) -> Any:
        """TensorFlow SMP's memory-saving ``reduce_mean`` (the same value)."""
        return self.reduce_mean()

    def __repr__(self) -> str:
        return f"StepOutput({len(self.outputs)} microbatches)"


MicrobatchHook = Callable[[int, int], AbstractContextManager[Any]]


def make_step(
    ops: Ops,
    microbatches: Callable[[], int],
    hook: MicrobatchHook,
    func: Callable[..., Any] | None = None,
    *,
    non_split_inputs: Iterable[str] | None = None,
    input_split_axes: Mapping[str, int] | None = None,
    detach_outputs: bool = True,
    **ignored: Any,
) -> Any:
    """``@step`` / ``@step()`` / ``@step(non_split_inputs=[...])`` for one framework."""
    if func is None:
        return functools.partial(
            make_step, ops, microbatches, hook, non_split_inputs=non_split_inputs,
            input_split_axes=input_split_axes, detach_outputs=detach_outputs, **ignored,
        )
    signature = inspect.signature(func)
    keep = set(non_split_inputs or ())
    axes = dict(input_split_axes or {})

    @functools.wraps(func)
    def run(*args: Any, **kwargs: Any) -> Any:
        count = microbatches()
        bound = signature.bind(*args, **kwargs)
        pieces: dict[str, list[Any]] = {}
        for name, value in bound.arguments.items():
            kind = signature.parameters[name].kind
            if name in keep:
                pieces[name] = [value] * count
            elif kind is inspect.Parameter.VAR_POSITIONAL:
                split = [_split(v, count, axes.get(name, 0), ops, name) for v in value]
                pieces[name] = [tuple(s[i] for s in split) for i in range(count)]
            elif kind is inspect.Parameter.VAR_KEYWORD:
                split_kw = {k: _split(v, count, axes.get(k, 0), ops, k) for k, v in value.items()}
                pieces[name] = [{k: s[i] for k, s in split_kw.items()} for i in range(count)]
            else:
                pieces[name] = _split(value, count, axes.get(name, 0), ops, name)
        results = []
        for i in range(count):
            bound.arguments.update({name: values[i] for name, values in pieces.items()})
            with hook(i, count):
                results.append(func(*bound.args, **bound.kwargs))
        return _gather(results, ops, detach_outputs)

    run.__wrapped_step__ = True  # type: ignore[attr-defined]
    return run


def _split(value: Any, count: int, axis: int, ops: Ops, name: str) -> list[Any]:
    if count == 1:
        return [value]
    if ops.is_tensor(value):
        total = ops.length(value, axis)
        if total % count:
            raise ValueError(
                f"smp.step: argument {name!r} has {total} elements along axis {axis}, which "
                f"{count} microbatches do not divide; make every batch a multiple of "
                f"{count} (drop_last=True / drop_remainder=True)"
            )
        each = total // count
        return [ops.slice(value, axis, i * each, each) for i in range(count)]
    if hasattr(value, "smp_slice"):
        return [value.smp_slice(count, i, axis) for i in range(count)]
    if isinstance(value, (list, tuple)):
        split = [_split(v, count, axis, ops, name) for v in value]
        return [type(value)(s[i] for s in split) if not _namedtuple(value)
                else type(value)(*(s[i] for s in split)) for i in range(count)]
    if isinstance(value, dict):
        split_d = {k: _split(v, count, axis, ops, name) for k, v in value.items()}
        return [type(value)({k: s[i] for k, s in split_d.items()}) for i in range(count)]
    return [value] * count


def _namedtuple(value: Any) -> bool:
    return isinstance(value, tuple) and hasattr(value, "_fields")


def _gather(results: list[Any], ops: Ops, detach: bool) -> Any:
    first = results[0]
    if ops.is_tensor(first):
        return StepOutput([ops.detach(r) if detach else r for r in results], ops)
    if isinstance(first, (list, tuple)):
        parts = [_gather([r[i] for r in results], ops, detach) for i in range(len(first))]
        return type(first)(*parts) if _namedtuple(first) else type(first)(parts)
    if isinstance(first, dict):
        return type(first)({k: _gather([r[k] for r in results], ops, detach) for k in first})
    if first is None:
        return None
    # Anything else (Python numbers: ``loss.item()``, strings): as SMP returns it, a list with
    # one item per microbatch (``total += sum(test_step(model, x, y))``).
    return list(results)
