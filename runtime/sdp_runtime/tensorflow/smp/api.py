"""The functions of :mod:`sdp_runtime.tensorflow.smp` (see its docstring)."""

from __future__ import annotations

import contextlib
import enum
import sys
import threading
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import keras
import tensorflow as tf

from ... import _comm, _smp_config, _smp_step
from ..._types import NotInitializedError
from .. import basics, collectives

StepOutput = _smp_step.StepOutput

__all__ = [
    # joining the job, and where this process stands
    "init", "is_initialized", "rank", "size", "local_rank", "local_size", "mp_rank", "mp_size",
    "dp_rank", "dp_size", "get_mp_group", "get_dp_group",
    # the model, its step and its checkpoints
    "DistributedModel", "StepOutput", "step", "get_gradients", "partition", "CheckpointManager",
    # communication on SMP's groups
    "CommGroup", "RankType", "WORLD", "MP_GROUP", "DP_GROUP", "barrier", "broadcast", "recv_from",
    "allgather",
]


class CommGroup(enum.Enum):
    """SMP's process groups; with data parallelism only, all three hold every process."""

    WORLD = 0
    MP_GROUP = 1
    DP_GROUP = 2


class RankType(enum.Enum):
    WORLD_RANK = 0
    MP_RANK = 1
    DP_RANK = 2


WORLD = CommGroup.WORLD
MP_GROUP = CommGroup.MP_GROUP
DP_GROUP = CommGroup.DP_GROUP

_config: _smp_config.Config | None = None
_local = threading.local()


def init(config: Mapping[str, Any] | None = None) -> None:
    """Join the job and read SMP's configuration (``config`` over ``SM_HP_MP_PARAMETERS``).

    Only ``microbatches`` changes anything: the model is trained data-parallel on every process
    (rank 0 says so on stderr when more than one partition is configured).

    Example:
        >>> import sdp_runtime.tensorflow.smp as smp
        >>> smp.init({"microbatches": 2})
    """
    global _config
    if _config is not None:
        return
    read = _smp_config.read(config)
    basics.init()
    if read.sharded and _comm.rank() == 0:
        print(
            f"sdp_runtime.tensorflow.smp: {read.partitions} partition(s) and tensor-parallel "
            f"degree {read.tensor_parallel_degree} configured; TensorFlow has no FSDP, so the "
            "whole model is trained on every process (data parallel)",
            file=sys.stderr,
        )
    _config = read


def _require(what: str) -> _smp_config.Config:
    if _config is None:
        raise NotInitializedError(f"smp.{what}")
    return _config


def is_initialized() -> bool:
    return _config is not None


def rank() -> int:
    """This process's rank."""
    _require("rank")
    return _comm.rank()


def size() -> int:
    """The number of processes."""
    _require("size")
    return _comm.size()


def local_rank() -> int:
    _require("local_rank")
    return _comm.local_rank()


def local_size() -> int:
    _require("local_size")
    return _comm.local_size()


def mp_rank() -> int:
    """0: every process holds the whole model."""
    _require("mp_rank")
    return 0


def mp_size() -> int:
    """1: every process holds the whole model."""
    _require("mp_size")
    return 1


def dp_rank() -> int:
    """``rank()``: every process is a data-parallel replica."""
    return rank()


def dp_size() -> int:
    """``size()``: every process is a data-parallel replica."""
    return size()


def get_mp_group() -> list[int]:
    return [rank()]


def get_dp_group() -> list[int]:
    return list(range(size()))


@contextlib.contextmanager
def partition(index: int) -> Iterator[None]:
    """SMP's manual placement; the whole model is on every process here, so this only runs the
    body."""
    yield


class DistributedModel(keras.Model):
    """SMP's model base class: a Keras model, the whole of it on every process.

    Every process starts from rank 0's weights, as under SMP: the first call, which creates the
    variables, is run twice, the variables broadcast from rank 0 in between (inside a
    ``tf.function`` this happens while it is traced).
    """

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if self.__dict__.get("_sdp_synced") or _comm.size() == 1:
            return super().__call__(*args, **kwargs)
        super().__call__(*args, **kwargs)
        with tf.init_scope():  # run now, eagerly, even while a tf.function is traced
            collectives.broadcast_variables(self.variables, root_rank=0)
        self.__dict__["_sdp_synced"] = True
        return super().__call__(*args, **kwargs)


class CheckpointManager(tf.train.CheckpointManager):
    """SMP's checkpoint manager: ``tf.train.CheckpointManager`` that writes on rank 0 only (every
    process holds the whole model) and restores on every process.

    Arguments:
        checkpoint: the ``tf.train.Checkpoint`` to save and restore.
        directory: where the checkpoints go (SMP's default ``/opt/ml/checkpoints``).
        max_to_keep, checkpoint_name: as ``tf.train.CheckpointManager``'s (default: keep all).

    Example:
        >>> manager = smp.CheckpointManager(tf.train.Checkpoint(model=model), "ckpt")
        >>> manager.save()          # on every process; rank 0 writes
        >>> manager.restore()       # on every process: the newest checkpoint
    """

    def __init__(self, checkpoint: Any, directory: str = "/opt/ml/checkpoints",
                 max_to_keep: int | None = None, checkpoint_name: str = "ckpt",
                 **kwargs: Any) -> None:
        super().__init__(checkpoint, directory, max_to_keep=max_to_keep,
                         checkpoint_name=checkpoint_name, **kwargs)

    def save(self, checkpoint_number: Any = None, **kwargs: Any) -> str | None:
        """Write a checkpoint on rank 0; every process gets its path (all must call it)."""
        path = super().save(checkpoint_number, **kwargs) if _comm.rank() == 0 else None
        if _comm.size() > 1:
            path = _comm.broadcast_object(path, root_rank=0)
        return path

    def restore(self, checkpoint: str | None = None) -> Any:
        """Restore ``checkpoint`` (default: the newest in the directory) on this process."""
        path = checkpoint or tf.train.latest_checkpoint(self.directory)
        if path is None:
            raise FileNotFoundError(f"smp.CheckpointManager: no checkpoint in {self.directory}")
        return self.checkpoint.restore(path)


# -- the step -------------------------------------------------------------------------------------

class _TfOps:
    def is_tensor(self, value: Any) -> bool:
        return tf.is_tensor(value) or isinstance(value, tf.Variable)

    def length(self, tensor: Any, axis: int) -> int:
        known = tensor.shape[axis]
        return int(known) if known is not None else 0  # unknown: tf.split checks at run time

    def slice(self, tensor: Any, axis: int, start: int, length: int) -> Any:
        return tf.gather(tensor, tf.range(start, start + length), axis=axis)

    def detach(self, tensor: Any) -> Any:
        return tf.stop_gradient(tensor)

    def stack(self, tensors: list[Any]) -> Any:
        return tf.stack(tensors)

    def concat(self, tensors: list[Any], axis: int) -> Any:
        return tf.concat(tensors, axis=axis)

    def mean(self, tensors: list[Any]) -> Any:
        if isinstance(tensors[0], tf.IndexedSlices):
            tensors = [tf.convert_to_tensor(t) for t in tensors]
        return tf.add_n(tensors) / len(tensors)

    def sum(self, tensors: list[Any]) -> Any:
        return tf.add_n(tensors)


_OPS = _TfOps()


@contextlib.contextmanager
def _hook(index: int, count: int) -> Iterator[None]:
    with tf.GradientTape() as tape:
        _local.tape = tape
        try:
            yield
        finally:
            _local.tape = None


def step(func: Callable[..., Any] | None = None, **options: Any) -> Any:
    """Decorate the function that runs the forward pass and computes the gradients of a batch.

    Arguments:
        func: the function (``@smp.step``), or None (``@smp.step()``).
        non_split_inputs, input_split_axes: as SMP's.

    Example:
        >>> @smp.step
        ... def forward_backward(images, labels):
        ...     loss = loss_obj(labels, model(images, training=True))
        ...     return smp.get_gradients(loss, model.trainable_variables), loss
    """
    options.pop("input_signature", None)
    options.pop("jit_compile", None)
    options.pop("experimental_compile", None)
    options.setdefault("detach_outputs", False)
    return _smp_step.make_step(_OPS, lambda: _require("step").microbatches, _hook, func,
                               **options)


def get_gradients(loss: Any, variables: Any) -> list[Any]:
    """The gradients of ``loss`` for ``variables`` in this microbatch, averaged over the
    processes (Keras 2's ``optimizer.get_gradients``, which Keras 3 lacks).

    Example:
        >>> grads = smp.get_gradients(loss, model.trainable_variables)
    """
    tape = getattr(_local, "tape", None)
    if tape is None:
        raise RuntimeError("smp.get_gradients() works inside an @smp.step function only")
    with tape.stop_recording():
        grads = tape.gradient(loss, list(variables))
    if _comm.size() > 1:
        present = [g for g in grads if g is not None]
        reduced = iter(collectives.grouped_allreduce(present))
        grads = [None if g is None else next(reduced) for g in grads]
    return grads


# -- communication --------------------------------------------------------------------------------

def barrier(group: CommGroup = CommGroup.WORLD) -> None:
    collectives.barrier()


def broadcast(obj: Any, group: CommGroup = CommGroup.WORLD) -> None:
    """Send ``obj`` to every process, which receive it with ``recv_from``."""
    _comm.broadcast_object(obj, root_rank=rank())


def recv_from(src_rank: int, rank_type: RankType = RankType.WORLD_RANK) -> Any:
    return _comm.broadcast_object(None, root_rank=src_rank)


def allgather(obj: Any, group: CommGroup = CommGroup.WORLD) -> list[Any]:
    return _comm.allgather_object(obj)
