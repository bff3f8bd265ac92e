"""DistributedOptimizer for custom loops: Keras 3 optimizers and ``tf.compat.v1`` optimizers."""

from __future__ import annotations

from typing import Any

import tensorflow as tf

from sdp_runtime._compat import check_process_set
from sdp_runtime.tensorflow._subclass import mixed_class
from sdp_runtime.tensorflow.collectives import gradient_options, grouped_allreduce
from sdp_runtime.tensorflow.compression import Compression, Compressor, ReduceOp


class _DistributedLegacyMixin:
    """Overrides ``compute_gradients`` of a ``tf.compat.v1.train.Optimizer``."""

    _sdp_distributed = True
    _sdp_options: dict[str, Any]

    @tf.autograph.experimental.do_not_convert
    def compute_gradients(self, *args: Any, **kwargs: Any) -> list[tuple[Any, Any]]:
        pairs = super().compute_gradients(*args, **kwargs)  # type: ignore[misc]
        grads = grouped_allreduce([g for g, _ in pairs], **self._sdp_options)
        return list(zip(grads, [v for _, v in pairs], strict=True))


def DistributedOptimizer(  # noqa: N802 -- Horovod's name for what is a factory
    optimizer: Any,
    name: str | None = None,
    use_locking: bool = False,
    device_dense: str = "",
    device_sparse: str = "",
    compression: type[Compressor] = Compression.none,
    sparse_as_dense: bool = False,
    backward_passes_per_step: int = 1,
    op: ReduceOp | None = None,
    gradient_predivide_factor: float = 1.0,
    average_aggregated_gradients: bool = False,
    num_groups: int = 0,
    groups: Any = None,
    bucket_cap_mb: float | None = None,
    process_set: Any = None,
    scale_local_gradients: bool = True,
) -> Any:
    """Make an optimizer reduce gradients over all ranks before applying them.

    A Keras 3 optimizer is handled by :func:`sdp_runtime.tensorflow.keras.DistributedOptimizer`
    (its ``apply``/``apply_gradients`` reduce first); a ``tf.compat.v1.train.Optimizer`` gets a
    ``compute_gradients`` (hence ``minimize``) that reduces. The object is returned with its
    class swapped for a distributed subclass, keeping its state.

    Arguments:
        optimizer: a Keras 3 optimizer or a ``tf.compat.v1.train.Optimizer``.
        compression: ``Compression.none`` or ``Compression.fp16``.
        sparse_as_dense: densify ``IndexedSlices`` gradients before reducing them.
        backward_passes_per_step: only 1.
        op: ``ReduceOp.AVERAGE`` (default), ``SUM``, ``MIN`` or ``MAX``.
        gradient_predivide_factor: Horovod's split of the average.
        bucket_cap_mb: fusion bucket size in MiB (SMDDP); default 25 MB.
        process_set: None or ``global_process_set``; other sets are refused.
        scale_local_gradients: accepted for Horovod compatibility (there are no local
            gradients: every variable's gradient is reduced).
        name, use_locking, device_dense, device_sparse: accepted for Horovod/SMDDP
            compatibility, unused.
        average_aggregated_gradients, num_groups, groups: the same.

    Example:
        >>> opt = sdp.DistributedOptimizer(keras.optimizers.Adam(1e-3 * sdp.size()))
        >>> opt.apply_gradients(zip(grads, model.trainable_variables))  # grads averaged first
    """
    del name, use_locking, device_dense, device_sparse, average_aggregated_gradients
    del scale_local_gradients
    check_process_set(process_set, "DistributedOptimizer")
    del num_groups, groups
    if isinstance(optimizer, tf.compat.v1.train.Optimizer):
        if backward_passes_per_step != 1:
            raise NotImplementedError("backward_passes_per_step > 1 is not supported")
        if not getattr(type(optimizer), "_sdp_distributed", False):
            optimizer.__class__ = mixed_class(_DistributedLegacyMixin, type(optimizer))
        optimizer._sdp_options = gradient_options(
            compression, sparse_as_dense, op, gradient_predivide_factor, bucket_cap_mb
        )
        return optimizer
    from sdp_runtime.tensorflow.keras.optimizer import DistributedOptimizer as keras_optimizer

    return keras_optimizer(
        optimizer,
        compression=compression,
        sparse_as_dense=sparse_as_dense,
        gradient_predivide_factor=gradient_predivide_factor,
        op=op,
        backward_passes_per_step=backward_passes_per_step,
        bucket_cap_mb=bucket_cap_mb,
    )
