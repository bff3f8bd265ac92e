"""Migrate a Horovod script to sdp_runtime: the same calls, through another import.

Before::

    import horovod.torch as hvd

    hvd.init()
    optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters())
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)

After::

    import sdp_runtime.torch as hvd

    hvd.init()
    optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters())
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)

Why: sdp_runtime has Horovod's names (``init``, ``size``, ``rank``, ``DistributedOptimizer``,
``broadcast_parameters``, Keras callbacks, ...), so a Horovod script runs on it once its imports
point there, in any style (``import horovod.torch as hvd``, ``from horovod import torch as hvd``,
``from horovod.torch import DistributedOptimizer``, ``horovod.torch.init()`` spelled in full), and
is launched with ``sdp-run`` instead of ``horovodrun``/``mpirun``. The user's alias is kept, so
every other line stays as it was.

What sdp_runtime does not provide (elastic training, process sets, ``join``, Adasum, async handles,
build queries, ...) gets a manual report entry at each use, saying what to do instead; the rest of
the script is migrated all the same. Names the runtime lacks are dropped from ``from horovod.X
import ...`` lines (reported), so that the script fails only where they are used.

The usual mistakes of Horovod scripts are fixed where that is safe and reported otherwise:

* no broadcast of the initial state: ``hvd.broadcast_parameters(model.state_dict(), root_rank=0)``
  is added after a ``hvd.DistributedOptimizer(..., named_parameters=model.named_parameters())``
  (PyTorch); TensorFlow and Keras scripts get a note;
* checkpoints written on every rank (``torch.save``, ``model.save``, ``checkpoint.save``, ... not
  under a rank check) are put under ``if hvd.rank() == 0:``; Keras ``ModelCheckpoint`` and other
  writing callbacks get a note;
* a learning rate not scaled by ``hvd.size()`` gets a note only: it may be deliberate.

The machinery is ``sdp_convert.migration.Migration``; ``migrate_smddp`` is the same with
SageMaker's module table.
"""

from __future__ import annotations

from collections.abc import Mapping

from ..migration import RUNTIME_CALLBACK_NAMES, RUNTIME_KERAS_NAMES, Migration, Target, names

# -- the Horovod table ----------------------------------------------------------------------------

_BUILD = "mpi_built gloo_built nccl_built gloo_enabled mpi_enabled mpi_threads_supported " \
    "ccl_built ddl_built cuda_built rocm_built"
_TORCH = names(
    """init shutdown is_initialized size local_size rank local_rank cross_rank cross_size
    allreduce allreduce_ allreduce_async allreduce_async_ grouped_allreduce grouped_allreduce_
    grouped_allreduce_async grouped_allreduce_async_ sparse_allreduce_async allgather
    allgather_async grouped_allgather grouped_allgather_async broadcast broadcast_ broadcast_async
    broadcast_async_ alltoall alltoall_async reducescatter reducescatter_async
    grouped_reducescatter grouped_reducescatter_async poll synchronize barrier
    broadcast_parameters broadcast_optimizer_state broadcast_object allgather_object
    DistributedOptimizer DistributedDataParallel Compression ReduceOp Average Sum Min Max
    global_process_set HorovodInternalError """ + _BUILD
)
_TF = names(
    """init shutdown is_initialized size local_size rank local_rank cross_rank cross_size
    is_homogeneous size_op local_size_op rank_op local_rank_op process_set_included_op allreduce
    grouped_allreduce oob_allreduce allgather grouped_allgather broadcast broadcast_
    broadcast_variables broadcast_object broadcast_object_fn allgather_object alltoall
    reducescatter grouped_reducescatter barrier overlap DistributedGradientTape
    DistributedOptimizer Compression ReduceOp Average Sum Min Max global_process_set
    HorovodInternalError keras """ + _BUILD
)

HOROVOD_MODULES: Mapping[str, Target] = {
    "horovod.torch": Target("sdp_runtime.torch", _TORCH),
    "horovod.tensorflow": Target("sdp_runtime.tensorflow", _TF),
    "horovod.tensorflow.keras": Target("sdp_runtime.tensorflow.keras", RUNTIME_KERAS_NAMES),
    "horovod.keras": Target("sdp_runtime.tensorflow.keras", RUNTIME_KERAS_NAMES),
    "horovod.tensorflow.keras.callbacks": Target(
        "sdp_runtime.tensorflow.keras.callbacks", RUNTIME_CALLBACK_NAMES
    ),
    "horovod.keras.callbacks": Target(
        "sdp_runtime.tensorflow.keras.callbacks", RUNTIME_CALLBACK_NAMES
    ),
}


class MigrateHorovod(Migration):
    DESCRIPTION = "Point Horovod imports at sdp_runtime (same names); report what it lacks."
    FRAMEWORKS = frozenset({"torch", "tensorflow"})
    ROOT = "horovod"
    LIBRARY = "Horovod"
    MODULES = HOROVOD_MODULES
    LAUNCH = "launch with `sdp-run -n N train.py` instead of horovodrun (or mpirun)"
