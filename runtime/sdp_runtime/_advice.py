"""What to do instead of each Horovod / SMDDP name sdp_runtime does not provide (data only).

One table for the runtime's errors (:mod:`sdp_runtime._compat`, raised when a script looks the
name up) and for ``sdp-convert``'s report (``sdp_convert.migration``, which reads it without
importing any framework), so that both say the same.
"""

from __future__ import annotations

from collections.abc import Mapping

PROCESS_SETS = (
    "process sets are not supported: sdp_runtime collectives always run over all processes; drop "
    "process_set= (or pass hvd.global_process_set), or call torch.distributed with a group of "
    "your own"
)

#: What to do instead of each Horovod/SMDDP name the runtime does not provide.
_ADVICE_GROUPS: Mapping[tuple[str, ...], str] = {
    ("elastic", "HostsUpdatedInterrupt", "run_elastic"): "for Horovod elastic, drop "
    "@hvd.elastic.run and the State object (keep its fields as plain variables), checkpoint every "
    "epoch and restart a failed job from the last checkpoint (sdp-run --max-restarts N)",
    ("join",): "for uneven inputs, give every rank the same number of batches "
    "(DistributedSampler(..., drop_last=True) or dataset.shard) and remove the join() call",
    ("Adasum",): "use op=Average (the default) with the learning rate scaled by size()",
    ("Product",): "use Sum, Min, Max or Average (a product: multiply the rows of allgather(x))",
    ("ProcessSet", "add_process_set", "remove_process_set"): PROCESS_SETS,
    ("start_timeline", "stop_timeline"): "remove the call and profile with torch.profiler or "
    "tf.profiler",
    ("SyncBatchNorm", "SyncBatchNormalization"): "use "
    "torch.nn.SyncBatchNorm.convert_sync_batchnorm(model) under DistributedDataParallel on GPUs, "
    "keras.layers.BatchNormalization(synchronized=True) under a tf.distribute strategy, or plain "
    "batch norm",
    ("broadcast_global_variables", "BroadcastGlobalVariablesHook"): "call "
    "broadcast_variables(model.variables, root_rank=0) (and the optimizer's variables) after the "
    "first step, or use callbacks.BroadcastGlobalVariablesCallback(0) in fit",
    ("PartialDistributedGradientTape", "PartialDistributedOptimizer"): "use "
    "DistributedGradientTape / DistributedOptimizer, and reduce the local layers' gradients "
    "yourself if they must stay local",
    ("mpi_ops", "mpi_lib", "mpi_lib_v2"): "Horovod's compiled ops library has no counterpart: "
    "use the functions of the package itself",
}

ADVICE: Mapping[str, str] = {name: text for group, text in _ADVICE_GROUPS.items() for name in group}
