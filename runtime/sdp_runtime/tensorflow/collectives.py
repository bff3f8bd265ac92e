"""Collectives on TF tensors: allreduce, grouped_allreduce, broadcast, allgather, and friends.

Every function works in eager mode and inside ``tf.function``. The tensors of one call are
copied once, dtype by dtype, into a flat torch buffer (reused from call to call, see
:mod:`buffers`) on the tensors' device, reduced there by ``sdp_runtime._comm`` in one fused
collective, and handed back to TF as zero-copy views of that buffer. TF and torch share memory
through DLPack (:mod:`bridge`), both ways:

* eager: directly;
* ``tf.function``: ONE ``tf.py_function`` per call takes all the tensors; its body is the eager
  code above, given the tensors on the device the op runs on (a GPU's, for GPU gradients), so
  the data stays on the device (a call costs about 1.3 ms, so fusing matters).

The copy is deliberate: TF tensors are immutable and share memory with variables and cached
constants, so reducing in place would corrupt them. ``py_function`` calls are stateful and run in
program order inside a ``tf.function`` (automatic control dependencies), which keeps the
collectives in the same order on every rank. XLA (``jit_compile=True``) cannot compile a
``py_function``: there, use these functions outside the compiled function (Keras ``fit``:
:func:`sdp_runtime.tensorflow.keras.prepare_train_function` does it).
"""

from __future__ import annotations

import functools
import weakref
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import tensorflow as tf
import torch

from sdp_runtime import _comm
from sdp_runtime._compat import check_process_set
from sdp_runtime.tensorflow import buffers
from sdp_runtime.tensorflow.bridge import TF_ALIGNMENT, tf_to_torch, torch_to_tf
from sdp_runtime.tensorflow.compression import Compression, Compressor, ReduceOp, resolve_op
from sdp_runtime.torch.collectives import scale_

Work = Callable[[list[torch.Tensor]], None]

# Plain Python over Python values: AutoGraph has nothing to convert here, and skipping it makes
# tracing a user's tf.function faster.
_not_converted = tf.autograph.experimental.do_not_convert


def _refuse_xla() -> None:
    """Fail clearly, at trace time, where XLA would fail on the py_function obscurely."""
    try:
        from tensorflow.python.ops.control_flow_util import GraphOrParentsInXlaContext
    except ImportError:  # a TF without it: let XLA report the problem itself
        return
    if GraphOrParentsInXlaContext(tf.compat.v1.get_default_graph()):
        raise RuntimeError(
            "sdp_runtime collectives cannot run inside an XLA-compiled function "
            "(jit_compile=True): call them outside the compiled function, or compile it with "
            "jit_compile=False (sdp-convert writes jit_compile=sdp.size() == 1 for custom "
            "steps). Keras fit: give it sdp.keras.callbacks.BroadcastGlobalVariablesCallback(0) "
            "or call sdp.keras.prepare_train_function(model) after compile(), which keep XLA "
            "around the allreduce"
        )


#: The last collective made in each TF1 graph (``tf.compat.v1`` sessions), see ``py_collective``.
_last_in_graph: weakref.WeakKeyDictionary[Any, Any] = weakref.WeakKeyDictionary()


def py_collective(fn: Callable[..., Any], inputs: list[Any], dtypes: list[Any], name: str) -> Any:
    """``tf.py_function(fn, inputs, dtypes)`` that runs a collective, in the same order on every
    rank.

    Inside a ``tf.function``, TF's automatic control dependencies already run stateful ops in
    program order. A TF1 graph (a ``tf.compat.v1.Session``) has none: a session would run two
    independent collectives in any order, differently on each rank. There each one is made to
    depend on the previous one made in the same graph, so they run in the order the program made
    them, everywhere.

    Example:
        >>> out = py_collective(body, [t], [t.dtype], "sdp_allreduce")
    """
    graph = tf.compat.v1.get_default_graph()
    if getattr(graph, "building_function", False):
        return tf.py_function(fn, inputs, dtypes, name=name)
    previous = _last_in_graph.get(graph)
    with tf.control_dependencies([previous] if previous is not None else []):
        out = tf.py_function(fn, inputs, dtypes, name=name)
    first = out[0] if isinstance(out, (list, tuple)) else out
    _last_in_graph[graph] = first.op
    return out


def _check_dtype(dtype: tf.DType) -> None:
    if not (dtype.is_floating or dtype.is_integer or dtype == tf.bool):
        raise TypeError(f"cannot communicate tensors of dtype {dtype.name}")


def _run_packed(views: list[torch.Tensor], work: Work, reuse: bool) -> list[torch.Tensor]:
    """Copy ``views`` into one flat buffer per dtype, run ``work`` on the buffers, return views.

    Each tensor starts at a TF-aligned offset, so that its result can go back to TF as a
    zero-copy view; the gaps are zeroed. With ``reuse``, buffers come from :mod:`buffers` (no page
    faults once warm); otherwise they are fresh (for results TF may keep, e.g. variables).
    """
    groups: dict[torch.dtype, list[int]] = {}
    for i, view in enumerate(views):
        groups.setdefault(view.dtype, []).append(i)
    out: list[Any] = [None] * len(views)
    with buffers.lock:
        packed = []
        for dtype, idx in groups.items():
            step = max(1, TF_ALIGNMENT // views[idx[0]].element_size())
            offsets, total = [], 0
            for i in idx:
                offsets.append(total)
                total += -(-views[i].numel() // step) * step
            device = views[idx[0]].device
            flat = (
                buffers.flat_buffer(dtype, device, total)
                if reuse
                else torch.empty(total, dtype=dtype, device=device)
            )
            for i, start, end in zip(idx, offsets, offsets[1:] + [total], strict=True):
                n = views[i].numel()
                flat[start : start + n].view(views[i].shape).copy_(views[i])
                flat[start + n : end].zero_()
            packed.append((flat, offsets, idx))
        work([flat for flat, _, _ in packed])
        for flat, offsets, idx in packed:
            for i, start in zip(idx, offsets, strict=True):
                out[i] = flat[start : start + views[i].numel()].view(views[i].shape)
    return out


def _fused(
    tensors: Sequence[tf.Tensor], work: Work, name: str, reuse: bool = True
) -> list[tf.Tensor]:
    """Run ``work`` on the tensors packed into flat torch buffers; return the results in TF.

    Eager: zero-copy DLPack both ways. In a ``tf.function``: ONE ``py_function`` takes every
    tensor and runs the eager path on them, on the device it is placed on.
    """
    for t in tensors:
        _check_dtype(t.dtype)
    if not tensors:
        return []
    if tf.executing_eagerly():
        return _handover(tensors, work, reuse)

    _refuse_xla()

    def body(*eager: tf.Tensor) -> list[tf.Tensor]:
        return _handover(eager, work, reuse)

    # py_function has no GPU kernel for int32 (TF keeps int32 in host memory): int32 tensors
    # get their own call, so that they do not pull the others off the GPU.
    out: list[Any] = [None] * len(tensors)
    for int32 in (False, True):
        idx = [i for i, t in enumerate(tensors) if (t.dtype == tf.int32) == int32]
        if not idx:
            continue
        ins = [tensors[i] for i in idx]
        outs = py_collective(body, ins, [t.dtype for t in ins], name)
        for i, result in zip(idx, outs, strict=True):
            result.set_shape(tensors[i].shape)
            out[i] = result
    return out


def _handover(tensors: Sequence[tf.Tensor], work: Work, reuse: bool) -> list[tf.Tensor]:
    """The eager path: DLPack views into torch, ``work`` on packed buffers, DLPack views back."""
    if trace is not None:
        trace.append([(t.backing_device, t.dtype.name) for t in tensors])
    results = _run_packed([tf_to_torch(t) for t in tensors], work, reuse)
    return [torch_to_tf(r) for r in results]


#: When a list, each hand-over appends the (device, dtype) of the TF tensors it got: tests use it
#: to see where a ``tf.function``'s collective ran.
trace: list[list[tuple[str, str]]] | None = None


def _reduce_work(
    op: ReduceOp, compression: str, bucket_bytes: int | None, prescale: float, postscale: float,
    observe: Callable[[list[torch.Tensor]], None] | None = None,
) -> Work:
    def work(flats: list[torch.Tensor]) -> None:
        if observe is not None:  # the audit (sdp-run --audit): the local values, before reducing
            observe(flats)
        if prescale != 1.0:
            for f in flats:
                scale_(f, prescale)
        _comm.allreduce_(flats, op=op, compression=compression, bucket_bytes=bucket_bytes)
        if postscale != 1.0:
            for f in flats:
                scale_(f, postscale)

    return work


def _broadcast_work(root_rank: int) -> Work:
    def work(flats: list[torch.Tensor]) -> None:
        _comm.broadcast_(flats, root_rank=root_rank)  # every dtype travels as bytes, together

    return work


def _scale(tensor: tf.Tensor, factor: float) -> tf.Tensor:
    """``tensor * factor`` as Horovod scales: integers in float64 (truncated toward zero),
    float16 / bfloat16 in float32 (the same rule as ``sdp_runtime.torch``'s ``scale_``)."""
    if factor == 1.0:
        return tensor
    if tensor.dtype == tf.bool:
        raise TypeError("bool tensors cannot be scaled (prescale_factor / postscale_factor)")
    if tensor.dtype in (tf.float32, tf.float64):
        return tensor * tf.cast(factor, tensor.dtype)
    wide = tf.float32 if tensor.dtype.is_floating else tf.float64
    return tf.cast(tf.cast(tensor, wide) * tf.cast(factor, wide), tensor.dtype)


def _allreduce_sparse(slices: tf.IndexedSlices, op: ReduceOp, factor: float) -> tf.IndexedSlices:
    """Reduce IndexedSlices by gathering every rank's values and indices (no densifying)."""
    if op not in (ReduceOp.AVERAGE, ReduceOp.SUM):
        raise ValueError(f"{op} of IndexedSlices needs sparse_as_dense=True")
    if op is ReduceOp.AVERAGE:
        factor /= _comm.size()
    values = _scale(allgather(slices.values), factor)
    return tf.IndexedSlices(values, allgather(slices.indices), dense_shape=slices.dense_shape)


@_not_converted
def grouped_allreduce(
    tensors: Iterable[Any],
    compression: type[Compressor] = Compression.none,
    op: ReduceOp | None = None,
    *,
    average: bool | None = None,
    sparse_as_dense: bool = False,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
    bucket_cap_mb: float | None = None,
    name: str | None = None,
    device_dense: str = "",
    device_sparse: str = "",
    process_set: Any = None,
    audit: Callable[[list[int], list[torch.Tensor]], None] | None = None,
) -> list[Any]:
    """Allreduce many tensors at once, fused into one communication per dtype bucket.

    ``None`` entries pass through; ``tf.IndexedSlices`` are gathered (values and indices from all
    ranks, values scaled for AVERAGE) unless ``sparse_as_dense`` turns them into dense tensors.
    On one process nothing is communicated and the tensors come back unchanged (scaled, if asked).

    Arguments:
        tensors: tensors, variables, ``IndexedSlices`` or ``None``, same shapes on every rank.
        compression: ``Compression.none`` or ``Compression.fp16`` (or a Horovod-style compressor).
        op: ``ReduceOp.AVERAGE`` (default), ``SUM``, ``MIN`` or ``MAX``.
        average: Horovod's older spelling: ``True`` is AVERAGE, ``False`` is SUM.
        sparse_as_dense: densify ``IndexedSlices`` and reduce them with the dense tensors.
        prescale_factor: multiply inputs by this before reducing (integers in float64, truncated,
            as in Horovod).
        postscale_factor: multiply results by this after reducing (the same way).
        bucket_cap_mb: fusion bucket size in MiB; default is ``_comm``'s (25 MB).
        name, device_dense, device_sparse: accepted for Horovod compatibility, unused.
        process_set: None or ``global_process_set``; other sets are refused.
        audit: the runtime audit's observer of gradients (``_audit.tf_observer``), called with
            the positions and the local values of the dense tensors before they are reduced.

    Example:
        >>> grads = sdp.grouped_allreduce(tape.gradient(loss, model.trainable_variables))
    """
    del name, device_dense, device_sparse
    check_process_set(process_set, "grouped_allreduce")
    op = resolve_op(op, average)
    out = list(tensors)
    single = _comm.size() == 1
    factor = prescale_factor * postscale_factor
    dense: list[int] = []
    for i, t in enumerate(out):
        if t is None:
            continue
        if isinstance(t, tf.IndexedSlices) and not sparse_as_dense:
            out[i] = (
                tf.IndexedSlices(_scale(t.values, factor), t.indices, t.dense_shape)
                if single
                else _allreduce_sparse(t, op, factor)
            )
        else:
            out[i] = tf.convert_to_tensor(t)
            dense.append(i)
    if single:  # nothing to reduce; the two scalings as they would apply around the reduction
        for i in dense:
            out[i] = _scale(_scale(out[i], prescale_factor), postscale_factor)
        return out
    values = [out[i] for i in dense]
    wire = compression.wire
    contexts: list[Any] = []
    if wire is None:  # a user-defined compressor: run it in TF
        compressed = [compression.compress(t) for t in values]
        values = [c for c, _ in compressed]
        contexts = [ctx for _, ctx in compressed]
        wire = "none"
    bucket_bytes = None if bucket_cap_mb is None else int(bucket_cap_mb * 1024 * 1024)
    observe = None if audit is None else functools.partial(audit, list(dense))
    work = _reduce_work(op, wire, bucket_bytes, prescale_factor, postscale_factor, observe)
    reduced = _fused(values, work, "sdp_allreduce")
    if contexts:
        reduced = [compression.decompress(t, ctx) for t, ctx in zip(reduced, contexts, strict=True)]
    for i, t in zip(dense, reduced, strict=True):
        out[i] = t
    return out


def gradient_options(
    compression: type[Compressor] = Compression.none,
    sparse_as_dense: bool = False,
    op: ReduceOp | None = None,
    gradient_predivide_factor: float = 1.0,
    bucket_cap_mb: float | None = None,
) -> dict[str, Any]:
    """Turn the options of the gradient wrappers into :func:`grouped_allreduce` keywords.

    Horovod's ``gradient_predivide_factor`` f sums grads/f and multiplies by f/size afterwards:
    still an average, split in two to keep float16 sums in range.
    """
    op = resolve_op(op, None)
    if gradient_predivide_factor != 1.0 and op is not ReduceOp.AVERAGE:
        raise ValueError("gradient_predivide_factor needs op=ReduceOp.AVERAGE")
    return {
        "compression": compression,
        "op": op,
        "sparse_as_dense": sparse_as_dense,
        "prescale_factor": 1.0 / gradient_predivide_factor,
        "postscale_factor": gradient_predivide_factor,
        "bucket_cap_mb": bucket_cap_mb,
    }


@_not_converted
def allreduce(
    tensor: Any,
    param_index: int = 0,
    num_params: int = 1,
    compression: type[Compressor] = Compression.none,
    op: ReduceOp | None = None,
    *,
    average: bool | None = None,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
    name: str | None = None,
    device_dense: str = "",
    device_sparse: str = "",
    process_set: Any = None,
) -> Any:
    """Allreduce one tensor (or ``IndexedSlices``) across all processes.

    SMDDP's signature, plus Horovod's ``average=``, ``prescale_factor`` and
    ``postscale_factor``. Each call communicates on its own: to fuse many gradients, use
    :func:`grouped_allreduce` or :class:`DistributedGradientTape`.

    Arguments:
        tensor: a tensor, variable or ``tf.IndexedSlices``; same shape on every rank.
        param_index, num_params: SMDDP's gradient bookkeeping; accepted, unused.
        compression: ``Compression.none`` or ``Compression.fp16``.
        op: ``ReduceOp.AVERAGE`` (default), ``SUM``, ``MIN`` or ``MAX``.
        average: Horovod's older spelling: ``True`` is AVERAGE, ``False`` is SUM.
        prescale_factor, postscale_factor: scale before / after reducing (floating point).
        name, device_dense, device_sparse: accepted for Horovod compatibility, unused.
        process_set: None or ``global_process_set``; other sets are refused.

    Example:
        >>> total = sdp.allreduce(tf.constant(local_count), op=sdp.ReduceOp.SUM)
    """
    del param_index, num_params, name, device_dense, device_sparse
    return grouped_allreduce(
        [tensor],
        compression,
        op,
        average=average,
        prescale_factor=prescale_factor,
        postscale_factor=postscale_factor,
        process_set=process_set,
    )[0]


@_not_converted
def oob_allreduce(
    tensor: Any,
    compression: type[Compressor] = Compression.none,
    op: ReduceOp | None = ReduceOp.AVERAGE,
) -> Any:
    """Allreduce a tensor that is not a gradient (a loss, a metric): SMDDP's "out of band" call.

    Arguments:
        tensor: a tensor or variable, same shape on every rank.
        compression: ``Compression.none`` or ``Compression.fp16``.
        op: ``ReduceOp.AVERAGE`` (default), ``SUM``, ``MIN`` or ``MAX``.

    Example:
        >>> mean_loss = sdp.oob_allreduce(loss)
    """
    return grouped_allreduce([tensor], compression, op)[0]


@_not_converted
def allgather(tensor: Any, name: str | None = None, process_set: Any = None) -> tf.Tensor:
    """Concatenate every rank's tensor along the first dimension, in rank order.

    The first dimension may differ between ranks; the others must agree. A scalar is treated
    as a one-element vector.

    Arguments:
        tensor: a tensor or variable.
        name: accepted for Horovod compatibility, unused.
        process_set: None or ``global_process_set``.

    Example:
        >>> all_labels = sdp.allgather(labels)  # shape [sum of every rank's batch, ...]
    """
    del name
    check_process_set(process_set, "allgather")
    tensor = tf.convert_to_tensor(tensor)
    _check_dtype(tensor.dtype)
    if tensor.shape.rank == 0:
        tensor = tf.reshape(tensor, [1])
    if tf.executing_eagerly():
        return torch_to_tf(_comm.allgather(tf_to_torch(tensor)))

    _refuse_xla()

    def body(eager: tf.Tensor) -> tf.Tensor:
        return torch_to_tf(_comm.allgather(tf_to_torch(eager)))

    (result,) = py_collective(body, [tensor], [tensor.dtype], "sdp_allgather")
    result.set_shape(tf.TensorShape([None]).concatenate(tensor.shape[1:]))
    return result


@_not_converted
def broadcast(tensor: Any, root_rank: int = 0, name: str | None = None,
              process_set: Any = None) -> tf.Tensor:
    """Return ``root_rank``'s value of ``tensor`` on every rank (the input is not modified).

    Arguments:
        tensor: a tensor or variable, same shape and dtype on every rank.
        root_rank: the rank whose value is sent.
        name: accepted for Horovod compatibility, unused.
        process_set: None or ``global_process_set``.

    Example:
        >>> seed = sdp.broadcast(tf.constant(local_seed), root_rank=0)
    """
    del name
    check_process_set(process_set, "broadcast")
    tensor = tf.convert_to_tensor(tensor)
    return _fused([tensor], _broadcast_work(root_rank), "sdp_broadcast", reuse=False)[0]


def _unique_variables(variables: Any) -> list[Any]:
    if isinstance(variables, tf.Variable) or hasattr(variables, "assign"):
        variables = [variables]
    seen: set[int] = set()
    unique = []
    for var in variables:
        # A Keras 3 variable is unhashable and has no .ref(); its .value is the tf.Variable.
        inner = var if isinstance(var, tf.Variable) else getattr(var, "value", var)
        if id(inner) not in seen:
            seen.add(id(inner))
            unique.append(var)
    return unique


@_not_converted
def broadcast_variables(variables: Any, root_rank: int = 0, process_set: Any = None,
                        inplace: bool = False) -> None:
    """Overwrite ``variables`` on every rank with ``root_rank``'s values, in one fused broadcast.

    Accepts ``tf.Variable``s and Keras 3 variables, e.g. ``model.variables`` and
    ``optimizer.variables``. A Keras 3 optimizer creates its slot variables on its first
    ``apply``; call ``optimizer.build(model.trainable_variables)`` before broadcasting them.

    Arguments:
        variables: a variable or an iterable of variables (duplicates are sent once).
        root_rank: the rank whose values are kept.
        process_set: None or ``global_process_set``.
        inplace: accepted for Horovod compatibility (the variables are always assigned).

    Example:
        >>> optimizer.build(model.trainable_variables)
        >>> sdp.broadcast_variables(model.variables, root_rank=0)
        >>> sdp.broadcast_variables(optimizer.variables, root_rank=0)
    """
    check_process_set(process_set, "broadcast_variables")
    unique = _unique_variables(variables)
    if not unique or _comm.size() == 1:
        return
    values = [tf.convert_to_tensor(v) for v in unique]
    # Fresh buffers: an assigned variable may keep the result's memory as its own.
    results = _fused(values, _broadcast_work(root_rank), "sdp_broadcast", reuse=False)
    for var, value in zip(unique, results, strict=True):
        var.assign(value)


def broadcast_object(obj: Any, root_rank: int = 0, session: Any = None, name: str | None = None,
                     process_set: Any = None) -> Any:
    """Return ``root_rank``'s picklable ``obj`` on every rank.

    Arguments:
        obj: any picklable object (only ``root_rank``'s is used).
        root_rank: the rank whose object is sent.
        session: Horovod's TF1 session; must be None (eager only).
        name: accepted for Horovod compatibility, unused.
        process_set: None or ``global_process_set``.

    Example:
        >>> start_epoch = sdp.broadcast_object(start_epoch, root_rank=0)
    """
    del name
    _no_session(session, "broadcast_object")
    check_process_set(process_set, "broadcast_object")
    return _comm.broadcast_object(obj, root_rank=root_rank)


def barrier(process_set: Any = None) -> None:
    """Wait until every process gets here (eager code only, as in Horovod).

    Use it before a rank reads a file that rank 0 has just written: ``sdp-convert`` inserts it
    between a write guarded by ``if sdp.rank() == 0:`` and a later read of the same path.

    Arguments:
        process_set: None or ``global_process_set`` (every process takes part).

    Example:
        >>> if sdp.rank() == 0:
        ...     model.save_weights("w.weights.h5")
        >>> sdp.barrier()
        >>> model.load_weights("w.weights.h5")
    """
    check_process_set(process_set, "barrier")
    if not tf.executing_eagerly():
        raise RuntimeError(
            "sdp.barrier() runs in eager code only: inside a tf.function it would wait once, "
            "while tracing; call it outside the function"
        )
    _comm.barrier()


def allgather_object(obj: Any, session: Any = None, name: str | None = None,
                     process_set: Any = None) -> list[Any]:
    """Return the list of every rank's picklable ``obj``, in rank order.

    Arguments:
        obj: any picklable object.
        session: Horovod's TF1 session; must be None (eager only).
        name: accepted for Horovod compatibility, unused.
        process_set: None or ``global_process_set``.

    Example:
        >>> counts = sdp.allgather_object(len(local_files))
    """
    del name
    _no_session(session, "allgather_object")
    check_process_set(process_set, "allgather_object")
    return _comm.allgather_object(obj)


def _no_session(session: Any, what: str) -> None:
    if session is not None:
        raise NotImplementedError(f"{what}(session=...): TF1 sessions are not supported; call it "
                                  "in eager code without session=")


def broadcast_object_fn(root_rank: int = 0, session: Any = None, name: str | None = None,
                        process_set: Any = None) -> Callable[[Any], Any]:
    """Return a function that broadcasts a picklable object from ``root_rank`` (Horovod's).

    Arguments:
        root_rank: the rank whose object is sent.
        session, name, process_set: as in :func:`broadcast_object`.

    Example:
        >>> bcast = sdp.broadcast_object_fn(root_rank=0)
        >>> config = bcast(config)
    """
    _no_session(session, "broadcast_object_fn")
    check_process_set(process_set, "broadcast_object_fn")
    return functools.partial(broadcast_object, root_rank=root_rank)


def broadcast_(variables: Any, root_rank: int = 0, name: str | None = None,
               process_set: Any = None) -> list[tf.Tensor]:
    """Overwrite ``variables`` with ``root_rank``'s values, in place; return their new values.

    Arguments:
        variables: a list of variables.
        root_rank: the rank whose values are kept.
        name: accepted for Horovod compatibility, unused.
        process_set: None or ``global_process_set``.

    Example:
        >>> (w,) = sdp.broadcast_([model.kernel], root_rank=0)
    """
    variables = list(variables)
    broadcast_variables(variables, root_rank, process_set)
    return [tf.convert_to_tensor(v) for v in variables]


def overlap(tensor: Any) -> Any:
    """Identity: SMDDP's hint for overlapping communication under XLA, which needs no hint here.

    Arguments:
        tensor: any tensor.

    Example:
        >>> x = sdp.overlap(tf.nn.dropout(x, 0.1))
    """
    return tensor
