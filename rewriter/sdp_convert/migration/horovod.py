"""What Horovod's API maps to: the names ``sdp_runtime`` provides as Horovod's Keras API does,
and what to do instead of each Horovod (or SMDDP) API the runtime does not provide. The module
table itself is ``transforms/migrate_horovod``'s."""

from __future__ import annotations

from collections.abc import Mapping

from sdp_runtime._advice import ADVICE as _RUNTIME_ADVICE

from .common import names

#: What ``sdp_runtime/tensorflow/keras/__init__.py`` exports.
RUNTIME_KERAS_NAMES = names(
    """init shutdown is_initialized size local_size rank local_rank cross_rank cross_size allreduce
    allgather allgather_object broadcast broadcast_variables broadcast_object reducescatter barrier
    DistributedOptimizer load_model callbacks Compression ReduceOp Average Sum Min Max nccl_built
    gloo_built mpi_built gloo_enabled mpi_enabled mpi_threads_supported ccl_built ddl_built
    cuda_built rocm_built global_process_set HorovodInternalError"""
)


RUNTIME_CALLBACK_NAMES = names(
    """BroadcastGlobalVariablesCallback MetricAverageCallback LearningRateWarmupCallback
    LearningRateScheduleCallback BestModelCheckpoint"""
)


#: What to do instead of each Horovod/SMDDP API the runtime does not provide: the runtime's own
#: table (data only, no framework imported), so that the report and the error a script gets at
#: run time say the same.
ADVICE: Mapping[str, str] = _RUNTIME_ADVICE
