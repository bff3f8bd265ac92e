"""The transforms, in the order they run.

All of them run in one traversal (see ``engine``); the order decides which transform's
``leave_*`` hook sees a node first, and in which order statements inserted after the same
statement appear.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .transforms import (
    add_runtime_init,
    allow_existing_dirs,
    barrier_before_reads,
    broadcast_initial_state,
    disable_step_xla,
    flag_manual_steps,
    guard_rank0_writes,
    migrate_horovod,
    migrate_smddp,
    migrate_smp,
    note_already_distributed,
    note_shared_seeds,
    order_downloads,
    pin_gpu_device,
    pin_tf_gpus,
    port_fit_generator,
    print_on_rank0,
    save_model_in_place,
    scale_keras_learning_rate,
    scale_learning_rate,
    seed_samplers_by_rank,
    shard_dataloader,
    shard_shared_loader,
    shard_tf_dataset,
    shard_token_stream,
    shard_torchtext_iterator,
    sync_loop_exits,
    update_keras2_calls,
    wrap_gradient_tape,
    wrap_keras_fit,
    wrap_model_ddp,
)

if TYPE_CHECKING:
    from .base import Transform

PIPELINE: tuple[type[Transform], ...] = (
    # First: every other transform's output calls the runtime this one imports and initialises.
    add_runtime_init.AddRuntimeInit,
    # PyTorch. pin_gpu_device and scale_learning_rate come before shard_dataloader, and
    # wrap_model_ddp after it.
    # pin_gpu_device inserts set_device after add_runtime_init's init(), the same anchor.
    pin_gpu_device.PinGpuDevice,
    scale_learning_rate.ScaleLearningRate,
    shard_dataloader.ShardDataLoader,
    # A sampler with replacement: its own stream per rank (shard_dataloader leaves it alone).
    seed_samplers_by_rank.SeedSamplersByRank,
    shard_shared_loader.ShardSharedLoader,
    shard_torchtext_iterator.ShardTorchtextIterator,
    shard_token_stream.ShardTokenStream,
    wrap_model_ddp.WrapModelDdp,
    # Reads wrap_model_ddp's notes of moves off the device, and repairs those it can.
    save_model_in_place.SaveModelInPlace,
    # TensorFlow / Keras. pin_tf_gpus inserts after add_runtime_init's init(), the same anchor;
    # scale_keras_learning_rate turns compile's string optimizer into an object (lr scaled) before
    # wrap_keras_fit wraps that object in DistributedOptimizer (both edit the same call).
    pin_tf_gpus.PinTfGpus,
    scale_keras_learning_rate.ScaleKerasLearningRate,
    shard_tf_dataset.ShardTfDataset,
    wrap_gradient_tape.WrapGradientTape,
    # Edits only the jit_compile= argument of the tf.function around the step wrapped above.
    disable_step_xla.DisableStepXla,
    broadcast_initial_state.BroadcastInitialState,
    # Edits only the tests of ``if``s that leave a training loop.
    sync_loop_exits.SyncLoopExits,
    # fit_generator becomes fit (arguments as keywords) before wrap_keras_fit edits that call.
    port_fit_generator.PortFitGenerator,
    wrap_keras_fit.WrapKerasFit,
    # Downloads run in ``with sdp.rank0_first():`` (a statement-level edit, like the guards).
    order_downloads.OrderDownloads,
    # Last: rank-0 guards wrap statements the transforms above may have edited, and the manual
    # notes describe what is left once everything else is converted.
    guard_rank0_writes.GuardRank0Writes,
    # After the guards: directories and output already on rank 0 only are left alone.
    allow_existing_dirs.AllowExistingDirs,
    print_on_rank0.PrintOnRank0,
    flag_manual_steps.FlagManualSteps,
    note_shared_seeds.NoteSharedSeeds,
    # Horovod / SMDDP / SMP / already distributed files only (the transforms above run on
    # single-process scripts), so their place here does not matter; migrate_smp after
    # migrate_horovod, which migrates the Horovod half of SMP's hybrid recipe.
    migrate_horovod.MigrateHorovod,
    migrate_smddp.MigrateSmddp,
    migrate_smp.MigrateSmp,
    note_already_distributed.NoteAlreadyDistributed,
    # Keras 2 spellings, also in the Horovod / SMDDP scripts above (edits calls no one else edits).
    update_keras2_calls.UpdateKeras2Calls,
    # After every rank-0 guard (guard_rank0_writes' and the migrations'): a file written there
    # and read back later needs a barrier before the read.
    barrier_before_reads.BarrierBeforeReads,
)


def transform_names() -> list[str]:
    return [t.NAME for t in PIPELINE]
