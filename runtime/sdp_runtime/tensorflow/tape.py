"""DistributedGradientTape: a ``tf.GradientTape`` whose ``gradient`` averages across ranks."""

from __future__ import annotations

from typing import Any

import tensorflow as tf

from sdp_runtime import _audit
from sdp_runtime._compat import check_process_set
from sdp_runtime.tensorflow._subclass import mixed_class
from sdp_runtime.tensorflow.collectives import gradient_options, grouped_allreduce
from sdp_runtime.tensorflow.compression import Compression, Compressor, ReduceOp


class DistributedGradientTape(tf.GradientTape):
    """Wrap a ``tf.GradientTape`` so that ``gradient()`` returns gradients reduced over all ranks.

    All gradients of one ``gradient()`` call are fused into one communication per dtype bucket
    (one ``tf.py_function`` inside ``tf.function``). ``None`` gradients pass through, nested
    structures of sources are kept, ``IndexedSlices`` (e.g. from an embedding lookup) are gathered
    or, with ``sparse_as_dense=True``, densified first. The wrapper shares the wrapped tape's
    state, so it can be made inside or after the ``with`` block, or around a fresh tape.

    Arguments:
        gradtape: the ``tf.GradientTape`` (or subclass) to wrap.
        compression: ``Compression.none`` or ``Compression.fp16``.
        sparse_as_dense: densify ``IndexedSlices`` gradients before reducing them.
        op: ``ReduceOp.AVERAGE`` (default), ``SUM``, ``MIN`` or ``MAX``.
        gradient_predivide_factor: divide by this before the sum and by ``size()/factor`` after
            (AVERAGE only), as in Horovod.
        bucket_cap_mb: fusion bucket size in MiB (SMDDP); default 25 MB.
        process_set: None or ``global_process_set``; other sets are refused.
        scale_local_gradients: accepted for Horovod compatibility (there are no local
            gradients: every variable's gradient is reduced).
        device_dense, device_sparse, num_groups, groups: accepted for Horovod compatibility,
            unused (all gradients are always fused).

    Example:
        >>> with tf.GradientTape() as tape:
        ...     loss = loss_fn(y, model(x, training=True))
        >>> tape = sdp.DistributedGradientTape(tape)
        >>> grads = tape.gradient(loss, model.trainable_variables)
    """

    def __new__(cls, gradtape: tf.GradientTape, *args: Any, **kwargs: Any) -> Any:
        base = type(gradtape)
        if base is tf.GradientTape or issubclass(base, DistributedGradientTape):
            return super().__new__(cls)
        # Keep the methods of a user's GradientTape subclass.
        return super().__new__(mixed_class(cls, base))

    def __init__(
        self,
        gradtape: tf.GradientTape,
        device_dense: str = "",
        device_sparse: str = "",
        compression: type[Compressor] = Compression.none,
        sparse_as_dense: bool = False,
        op: ReduceOp | None = None,
        gradient_predivide_factor: float = 1.0,
        num_groups: int = 0,
        groups: Any = None,
        bucket_cap_mb: float | None = None,
    process_set: Any = None,
    scale_local_gradients: bool = True,
    ) -> None:
        del device_dense, device_sparse, num_groups, groups
        del scale_local_gradients
        check_process_set(process_set, "DistributedGradientTape")
        # Share (not copy) the wrapped tape's state: entering or leaving either is seen by both.
        self.__dict__ = gradtape.__dict__
        self._sdp_options = gradient_options(
            compression, sparse_as_dense, op, gradient_predivide_factor, bucket_cap_mb
        )

    @tf.autograph.experimental.do_not_convert
    def gradient(
        self,
        target: Any,
        sources: Any,
        output_gradients: Any = None,
        unconnected_gradients: tf.UnconnectedGradients = tf.UnconnectedGradients.NONE,
    ) -> Any:
        """Return the gradients of ``target`` w.r.t. ``sources``, reduced over all ranks."""
        grads = super().gradient(target, sources, output_gradients, unconnected_gradients)
        flat = tf.nest.flatten(grads)
        audit = _audit.tf_observer(sources) if _audit.active() else None
        reduced = grouped_allreduce(flat, **self._sdp_options, audit=audit)
        return tf.nest.pack_sequence_as(grads, reduced)
