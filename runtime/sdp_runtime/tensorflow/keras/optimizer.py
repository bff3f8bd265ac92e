"""DistributedOptimizer for Keras 3 optimizers: gradients are reduced before every update.

The optimizer's class is swapped, in place, for a subclass made on the fly that overrides
``apply`` (which ``apply_gradients`` and ``model.fit`` both go through), so the optimizer keeps its
state, hyperparameters and ``isinstance`` checks. The subclass carries the original class's name
and module, so ``model.save("x.keras")`` records the original class and the saved model loads
without this package, as a plain (not distributed) optimizer; :func:`load_model` re-wraps it.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import keras
import tensorflow as tf

from sdp_runtime import _audit
from sdp_runtime._compat import check_process_set
from sdp_runtime.tensorflow._subclass import mixed_class
from sdp_runtime.tensorflow.collectives import gradient_options, grouped_allreduce
from sdp_runtime.tensorflow.compression import Compression, Compressor, ReduceOp


class _DistributedOptimizerMixin:
    """Overrides ``apply`` to reduce the gradients over all ranks first."""

    _sdp_distributed = True
    _sdp_options: dict[str, Any]

    @tf.autograph.experimental.do_not_convert
    def apply(self, grads: Any, trainable_variables: Any = None) -> Any:
        captured = _captured.get(id(self))
        if captured is not None:  # tracing the compiled half of a split step (see keras.xla)
            captured.append((list(grads), trainable_variables))
            return None
        audit = None
        if _audit.active():  # sdp-run --audit
            audit = _audit.tf_observer(
                trainable_variables if trainable_variables is not None
                else getattr(self, "_trainable_variables", None))
        grads = grouped_allreduce(list(grads), **self._sdp_options, audit=audit)
        return super().apply(grads, trainable_variables)  # type: ignore[misc]


#: id(optimizer) -> the (grads, variables) its ``apply`` was called with while capturing.
_captured: dict[int, list[tuple[list[Any], Any]]] = {}


@contextmanager
def capture_apply(optimizer: Any) -> Iterator[list[tuple[list[Any], Any]]]:
    """Within this block, ``optimizer.apply`` records its arguments instead of updating anything.

    Used while tracing the compiled half of a split training step: the gradients the step would
    apply become outputs of the XLA function, reduced and applied outside it.

    Arguments:
        optimizer: an optimizer wrapped by :func:`DistributedOptimizer`.

    Example:
        >>> with capture_apply(model.optimizer) as calls:
        ...     logs = model.train_step(data)
        >>> (grads, variables), = calls
    """
    calls: list[tuple[list[Any], Any]] = []
    _captured[id(optimizer)] = calls
    try:
        yield calls
    finally:
        del _captured[id(optimizer)]


def apply_reduced(optimizer: Any, grads: Any, trainable_variables: Any = None) -> Any:
    """Apply gradients that are already reduced: the wrapped optimizer's own ``apply``.

    Arguments:
        optimizer: an optimizer wrapped by :func:`DistributedOptimizer`.
        grads: the reduced gradients, one per variable (``None`` for none).
        trainable_variables: the variables, as for ``apply``.

    Example:
        >>> apply_reduced(opt, sdp.grouped_allreduce(grads), model.trainable_variables)
    """
    return super(_DistributedOptimizerMixin, optimizer).apply(grads, trainable_variables)


def is_distributed(optimizer: Any) -> bool:
    """Return whether ``optimizer`` was wrapped by :func:`DistributedOptimizer`."""
    return getattr(type(optimizer), "_sdp_distributed", False)


def DistributedOptimizer(  # noqa: N802 -- Horovod's name for what is a factory
    optimizer: keras.optimizers.Optimizer,
    name: str | None = None,
    device_dense: str = "",
    device_sparse: str = "",
    compression: type[Compressor] = Compression.none,
    sparse_as_dense: bool = False,
    gradient_predivide_factor: float = 1.0,
    op: ReduceOp | None = None,
    backward_passes_per_step: int = 1,
    average_aggregated_gradients: bool = False,
    num_groups: int = 0,
    groups: Any = None,
    bucket_cap_mb: float | None = None,
    process_set: Any = None,
    scale_local_gradients: bool = True,
) -> keras.optimizers.Optimizer:
    """Make a Keras 3 optimizer reduce gradients over all ranks before each update.

    Works with ``model.fit`` (eager or compiled) and with custom loops calling ``apply`` or
    ``apply_gradients``. Returns the same object, its class swapped for a distributed subclass;
    wrapping twice changes only the options. The wrapped optimizer's own ``clipnorm``,
    ``gradient_accumulation_steps``, EMA and loss scaling see the reduced gradients.

    Arguments:
        optimizer: a Keras 3 optimizer (built or not), e.g. ``keras.optimizers.SGD(0.01)``.
        compression: ``Compression.none`` or ``Compression.fp16``.
        sparse_as_dense: densify ``IndexedSlices`` gradients before reducing them.
        gradient_predivide_factor: Horovod's split of the average (see the tape).
        op: ``ReduceOp.AVERAGE`` (default), ``SUM``, ``MIN`` or ``MAX``.
        backward_passes_per_step: only 1; use the optimizer's ``gradient_accumulation_steps``.
        bucket_cap_mb: fusion bucket size in MiB (SMDDP); default 25 MB.
        process_set: None or ``global_process_set``; other sets are refused.
        scale_local_gradients: accepted for Horovod compatibility (there are no local
            gradients: every variable's gradient is reduced).
        name, device_dense, device_sparse, average_aggregated_gradients, num_groups, groups:
            accepted for Horovod compatibility, unused (the name would move the optimizer's
            variable paths and break checkpoints).

    Example:
        >>> opt = keras.optimizers.SGD(0.01 * sdp.size())
        >>> model.compile(optimizer=sdp.DistributedOptimizer(opt), loss="mse")
    """
    del name, device_dense, device_sparse, average_aggregated_gradients, num_groups, groups
    del scale_local_gradients
    check_process_set(process_set, "DistributedOptimizer")
    if not isinstance(optimizer, keras.optimizers.Optimizer):
        raise TypeError(f"expected a Keras 3 optimizer, got {type(optimizer).__name__}")
    if backward_passes_per_step != 1:
        raise NotImplementedError(
            "backward_passes_per_step > 1 is not supported; pass gradient_accumulation_steps "
            "to the Keras optimizer instead"
        )
    options = gradient_options(
        compression, sparse_as_dense, op, gradient_predivide_factor, bucket_cap_mb
    )
    if not is_distributed(optimizer):
        optimizer.__class__ = mixed_class(_DistributedOptimizerMixin, type(optimizer))
    optimizer._sdp_options = options
    return optimizer


def load_model(
    filepath: Any,
    custom_optimizers: list[type] | None = None,
    custom_objects: dict[str, Any] | None = None,
    compression: type[Compressor] = Compression.none,
    **kwargs: Any,
) -> keras.Model:
    """Load a model saved by ``model.save`` and wrap its optimizer in :func:`DistributedOptimizer`.

    Arguments:
        filepath: the ``.keras`` file.
        custom_optimizers: optimizer classes the file uses that Keras does not know.
        custom_objects: other custom objects, as for ``keras.models.load_model``.
        compression: compression for the wrapped optimizer.
        kwargs: passed on to ``keras.models.load_model``.

    Example:
        >>> model = sdp.load_model("model.keras")
    """
    objects = dict(custom_objects or {})
    for cls in custom_optimizers or []:
        objects.setdefault(cls.__name__, cls)
    model = keras.models.load_model(filepath, custom_objects=objects, **kwargs)
    if getattr(model, "optimizer", None) is not None:
        DistributedOptimizer(model.optimizer, compression=compression)
    return model
