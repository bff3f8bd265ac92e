"""What Horovod's API maps to: the names ``sdp_runtime`` provides as Horovod's Keras API does,
and what to do instead of each Horovod (or SMDDP) API the runtime does not provide. The module
table itself is ``transforms/migrate_horovod``'s."""

from __future__ import annotations

from collections.abc import Mapping

from .common import names

#: What ``sdp_runtime/tensorflow/keras/__init__.py`` exports.
RUNTIME_KERAS_NAMES = names(
    """init shutdown is_initialized size local_size rank local_rank allreduce allgather broadcast
    broadcast_variables broadcast_object DistributedOptimizer load_model callbacks Compression
    ReduceOp Average Sum Min Max nccl_built gloo_built mpi_built"""
)


RUNTIME_CALLBACK_NAMES = names(
    """BroadcastGlobalVariablesCallback MetricAverageCallback LearningRateWarmupCallback
    LearningRateScheduleCallback"""
)


#: What to do instead of each Horovod/SMDDP API the runtime does not provide.
_ADVICE_GROUPS: Mapping[tuple[str, ...], str] = {
    ("elastic",): "for Horovod elastic, drop @hvd.elastic.run and the State object (keep its "
    "fields as plain variables), checkpoint every epoch and restart a failed job from the last "
    "checkpoint",
    ("join",): "for uneven inputs, give every rank the same number of batches "
    "(DistributedSampler(..., drop_last=True) or dataset.shard) and remove the join() call",
    ("barrier",): "an allreduce of a dummy value waits for every process as a barrier does",
    ("Adasum",): "use op=Average (the default) with the learning rate scaled by size()",
    ("Product",): "use Sum, Min, Max or Average",
    ("ProcessSet", "global_process_set", "add_process_set", "remove_process_set"): "process sets "
    "are not supported: sdp_runtime collectives always run over all processes; remove it",
    (
        "allreduce_async", "allreduce_async_", "allgather_async", "broadcast_async",
        "broadcast_async_", "grouped_allreduce_async", "grouped_allreduce_async_",
        "sparse_allreduce_async", "alltoall_async", "reducescatter_async", "poll", "synchronize",
    ): "there are no asynchronous handles: call the synchronous collective (allreduce, allgather, "
    "broadcast) instead",
    (
        "alltoall", "reducescatter", "grouped_reducescatter", "grouped_allgather",
        "grouped_allreduce_", "all_to_all_single",
    ): "express it with allreduce/allgather, or call torch.distributed's on the runtime's "
    "process group",
    ("start_timeline", "stop_timeline"): "remove the call and profile with torch.profiler or "
    "tf.profiler",
    (
        "mpi_threads_supported", "mpi_enabled", "mpi_built", "gloo_enabled", "gloo_built",
        "nccl_built", "ddl_built", "ccl_built", "cuda_built", "rocm_built",
    ): "sdp_runtime always uses NCCL on GPUs and Gloo on CPUs: replace this build query with "
    "torch.cuda.is_available() (or a constant) where the answer matters",
    ("cross_rank", "cross_size", "is_homogeneous"): "use rank() // local_size() and "
    "size() // local_size() (sdp-run starts as many processes on every node)",
    ("SyncBatchNorm", "SyncBatchNormalization"): "use "
    "torch.nn.SyncBatchNorm.convert_sync_batchnorm(model) under DistributedDataParallel, or plain "
    "batch norm",
    ("broadcast_global_variables", "BroadcastGlobalVariablesHook"): "call "
    "broadcast_variables(model.variables, root_rank=0) (and the optimizer's variables) after the "
    "first step, or use callbacks.BroadcastGlobalVariablesCallback(0) in fit",
    ("PartialDistributedGradientTape", "PartialDistributedOptimizer"): "use "
    "DistributedGradientTape / DistributedOptimizer for all variables",
    ("BestModelCheckpoint",): "use keras.callbacks.ModelCheckpoint(save_best_only=True), added on "
    "rank 0 only",
    ("size_op", "local_size_op", "rank_op", "local_rank_op", "process_set_included_op"): "call "
    "size()/rank() (plain ints) instead",
}


ADVICE: Mapping[str, str] = {name: text for group, text in _ADVICE_GROUPS.items() for name in group}
