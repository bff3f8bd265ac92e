from __future__ import annotations

import ast
import textwrap
from pathlib import Path

import pytest
from sdp_convert.base import Options
from sdp_convert.engine import Result, convert
from sdp_convert.transforms.migrate_horovod import HOROVOD_MODULES
from sdp_convert.transforms.migrate_smddp import SMDDP_MODULES

from .helpers import check_noop, check_transformed, messages

ONLY = "migrate_horovod"
RUNTIME = Path(__file__).resolve().parents[2] / "runtime"


def migrate(source: str) -> Result:
    """The migration alone (the helpers add add_runtime_init, whose re-check of a converted Keras
    file does not yet know ``sdp_runtime.tensorflow.keras.init``)."""
    return convert(textwrap.dedent(source), Options(only=frozenset({ONLY})))


def manual(result: Result) -> list[tuple[int, str]]:
    return [(c.line, c.message) for c in result.changes if c.manual]


# -- imports, any style ---------------------------------------------------------------------------


def test_aliased_import_points_at_the_runtime_and_keeps_the_alias():
    result = check_transformed(
        """\
        import horovod.torch as hvd

        hvd.init()
        print(hvd.rank(), hvd.size(), hvd.local_rank())
        """,
        """\
        import sdp_runtime.torch as hvd

        hvd.init()
        print(hvd.rank(), hvd.size(), hvd.local_rank())
        """,
        only=ONLY,
    )
    assert messages(result, ONLY) == [
        "horovod.torch -> sdp_runtime.torch (same names)",
        "launch with `sdp-run -n N train.py` instead of horovodrun (or mpirun)",
    ]
    assert result.changes[0].line == 1 and not result.manual
    assert result.info.origin == "horovod"


def test_module_imported_from_its_package():
    check_transformed(
        """\
        from horovod import torch as hvd
        from horovod import keras

        hvd.init()
        """,
        """\
        from sdp_runtime import torch as hvd
        from sdp_runtime.tensorflow import keras

        hvd.init()
        """,
        only=ONLY,
    )


def test_names_imported_from_the_module_keep_their_names():
    check_transformed(
        """\
        import torch
        from horovod.torch import DistributedOptimizer, broadcast_parameters as bcast, init

        init()
        model = torch.nn.Linear(2, 1)
        bcast(model.state_dict(), root_rank=0)
        """,
        """\
        import torch
        from sdp_runtime.torch import DistributedOptimizer, broadcast_parameters as bcast, init

        init()
        model = torch.nn.Linear(2, 1)
        bcast(model.state_dict(), root_rank=0)
        """,
        only=ONLY,
    )


def test_star_import():
    check_transformed(
        "from horovod.tensorflow import *\ninit()\n",
        "from sdp_runtime.tensorflow import *\ninit()\n",
        only=ONLY,
    )


def test_names_spelled_in_full_follow_the_import():
    result = check_transformed(
        """\
        import horovod.torch

        horovod.torch.init()
        if horovod.torch.rank() == 0:
            print(horovod.torch.size())
        """,
        """\
        import sdp_runtime.torch

        sdp_runtime.torch.init()
        if sdp_runtime.torch.rank() == 0:
            print(sdp_runtime.torch.size())
        """,
        only=ONLY,
    )
    assert "horovod.torch.* -> sdp_runtime.torch.*" in messages(result, ONLY)


def test_keras_modules_and_callbacks():
    check_transformed(
        """\
        import horovod.tensorflow.keras as hvd
        import horovod.keras as hvd_keras
        from horovod.tensorflow.keras import callbacks
        from horovod.tensorflow.keras.callbacks import MetricAverageCallback

        hvd.init()
        extra = [hvd.callbacks.BroadcastGlobalVariablesCallback(0),
                 callbacks.MetricAverageCallback()]
        """,
        """\
        import sdp_runtime.tensorflow.keras as hvd
        import sdp_runtime.tensorflow.keras as hvd_keras
        from sdp_runtime.tensorflow.keras import callbacks
        from sdp_runtime.tensorflow.keras.callbacks import MetricAverageCallback

        hvd.init()
        extra = [hvd.callbacks.BroadcastGlobalVariablesCallback(0),
                 callbacks.MetricAverageCallback()]
        """,
        only=ONLY,
    )


def test_import_inside_a_function_and_a_try():
    check_transformed(
        """\
        try:
            import horovod.torch as hvd
        except ImportError:
            hvd = None


        def setup():
            import horovod.tensorflow as htf
            htf.init()
        """,
        """\
        try:
            import sdp_runtime.torch as hvd
        except ImportError:
            hvd = None


        def setup():
            import sdp_runtime.tensorflow as htf
            htf.init()
        """,
        only=ONLY,
    )


def test_unrelated_imports_on_the_same_line_stay():
    check_transformed(
        "import os, horovod.torch as hvd\nhvd.init()\n",
        "import os, sdp_runtime.torch as hvd\nhvd.init()\n",
        only=ONLY,
    )


def test_bare_import_whose_uses_are_all_rewritten_is_dropped():
    """Issue 18: horovod's own examples also ``import horovod``; left in, the converted file died
    with ModuleNotFoundError before anything ran."""
    result = check_transformed(
        """\
        import argparse

        import horovod
        import horovod.torch as hvd
        import torch

        print("horovod", horovod.__version__)
        hvd.init()
        horovod.torch.broadcast_object(1, root_rank=0)
        """,
        """\
        import argparse

        import sdp_runtime.torch as hvd
        import torch
        import sdp_runtime

        print("horovod", sdp_runtime.__version__)
        hvd.init()
        hvd.broadcast_object(1, root_rank=0)
        """,
        only=ONLY,
    )
    assert "import horovod removed: its uses now point at sdp_runtime" in messages(result, ONLY)
    assert "horovod.__version__ -> sdp_runtime.__version__" in messages(result, ONLY)
    assert not result.manual


def test_bare_import_with_attribute_chains_only():
    check_transformed(
        """\
        import horovod

        horovod.tensorflow.init()
        print(horovod.tensorflow.rank())
        """,
        """\
        import sdp_runtime.tensorflow

        sdp_runtime.tensorflow.init()
        print(sdp_runtime.tensorflow.rank())
        """,
        only=ONLY,
    )


def test_bare_import_with_uses_the_runtime_lacks_is_dropped_and_each_use_noted():
    result = migrate(
        """\
        import horovod
        import horovod.torch as hvd

        hvd.init()
        horovod.run(print, np=2)
        """
    )
    code = result.output.decode()
    assert "import horovod\n" not in code and "import sdp_runtime.torch as hvd" in code
    found = manual(result)
    assert found[0] == (
        1, "import horovod removed: 1 use(s) are not provided by sdp_runtime (see their notes)"
    )
    assert found[1][0] == 5 and found[1][1].startswith("horovod.run: not provided by sdp_runtime")


def test_aliased_bare_import_is_left_with_a_note():
    result = migrate(
        """\
        import horovod as hv
        import horovod.torch as hvd

        hvd.init()
        """
    )
    assert "import horovod as hv" in result.output.decode()
    assert "sdp_runtime has no equivalent of horovod" in manual(result)[0][1]


# -- what the runtime does not provide ------------------------------------------------------------


def test_unsupported_apis_are_reported_at_each_use_and_left_as_is():
    source = """\
        import torch
        import horovod.torch as hvd

        hvd.init()
        model = torch.nn.Linear(2, 1)
        opt = torch.optim.SGD(model.parameters(), lr=0.1 * hvd.size())
        opt = hvd.DistributedOptimizer(opt, model.named_parameters(), op=hvd.Adasum)
        hvd.broadcast_parameters(model.state_dict(), root_rank=0)


        @hvd.elastic.run
        def train(state):
            for _ in range(2):
                opt.zero_grad()
                model(torch.ones(1, 2)).sum().backward()
                opt.step()
            hvd.join()


        train(hvd.elastic.TorchState(model, opt))
        print(hvd.nccl_built(), hvd.start_timeline("timeline.json"))
        """
    result = check_transformed(
        source, source.replace("import horovod.torch", "import sdp_runtime.torch"), only=ONLY
    )
    found = manual(result)
    assert [line for line, _ in found] == [7, 11, 17, 20, 21]
    assert "hvd.Adasum: not provided by sdp_runtime; use op=Average" in found[0][1]
    assert found[1][1].startswith(
        "hvd.elastic: not provided by sdp_runtime; for Horovod elastic, drop @hvd.elastic.run"
    )
    assert "hvd.join: not provided by sdp_runtime; for uneven inputs" in found[2][1]
    assert found[3][1].startswith("hvd.elastic:")
    assert found[4][1].startswith("hvd.start_timeline: not provided by sdp_runtime; remove the call")
    # nccl_built is provided: no note for it.
    assert not any("nccl_built" in m for _, m in found)


def test_unsupported_name_is_dropped_from_a_from_import():
    result = check_transformed(
        """\
        from horovod.torch import init, join, rank

        init()
        join()
        """,
        """\
        from sdp_runtime.torch import init, rank

        init()
        join()
        """,
        only=ONLY,
    )
    assert manual(result) == [
        (1, "join: not provided by sdp_runtime, removed from this import (see its uses)"),
        (4, "join: not provided by sdp_runtime; for uneven inputs, give every rank the same "
            "number of batches (DistributedSampler(..., drop_last=True) or dataset.shard) and "
            "remove the join() call"),
    ]


def test_import_of_only_unsupported_names_is_left_with_a_note():
    result = check_noop(
        """\
        from horovod.torch import join

        join()
        """,
        only=ONLY,
    )
    assert manual(result)[0][0] == 1
    assert "from horovod.torch import join: not provided by sdp_runtime, left as is" in (
        manual(result)[0][1]
    )


def test_unsupported_modules_are_left_with_a_note():
    result = check_noop(
        """\
        import horovod.spark
        from horovod.torch.elastic import run

        horovod.spark.run(run)
        """,
        only=ONLY,
    )
    notes = manual(result)
    assert [line for line, _ in notes] == [1, 2, 4]
    assert notes[1][1].startswith("horovod.torch.elastic: not provided by sdp_runtime, left as is; "
                                  "for Horovod elastic")
    assert notes[2][1] == "horovod.spark: not provided by sdp_runtime"


def test_process_sets_are_reported():
    result = migrate(
        """\
        import horovod.tensorflow as hvd

        hvd.init()
        even = hvd.add_process_set([0, 2])
        total = hvd.allreduce(1.0, process_set=even)
        """
    )
    notes = manual(result)
    assert [line for line, _ in notes] == [4, 5]
    assert notes[0][1].startswith("hvd.add_process_set: not provided by sdp_runtime; process sets")
    assert notes[1][1].startswith("process_set=: process sets are not supported")


def test_horovods_best_model_checkpoint_migrates_and_is_noted_as_writing_on_every_rank():
    result = migrate(
        """\
        import horovod.tensorflow.keras as hvd
        import keras

        hvd.init()
        model = keras.Sequential([keras.layers.Dense(1)])
        model.compile(optimizer=hvd.DistributedOptimizer(keras.optimizers.SGD(0.1)), loss="mse")
        callbacks = [hvd.callbacks.BestModelCheckpoint("best.keras", monitor="val_loss")]
        model.fit(x, y, callbacks=callbacks)
        """
    )
    assert [m for m in manual(result) if "BestModelCheckpoint" in m[1]] == [
        (7, "BestModelCheckpoint writes files on every rank: add it to the callbacks on rank 0 "
            "only (if rank() == 0: callbacks.append(...))")
    ]


def test_horovods_learning_rate_callbacks_and_build_queries_migrate_by_the_import_alone():
    result = migrate(
        """\
        import horovod.tensorflow.keras as hvd

        hvd.init()
        print(hvd.nccl_built(), hvd.gloo_built(), hvd.mpi_built())
        callbacks = [
            hvd.callbacks.LearningRateWarmupCallback(initial_lr=0.1 * hvd.size(), warmup_epochs=5),
            hvd.callbacks.LearningRateScheduleCallback(0.1 * hvd.size(), 1e-1, start_epoch=30),
        ]
        """
    )
    assert not manual(result)
    assert result.output.decode().startswith("import sdp_runtime.tensorflow.keras as hvd\n")


# -- the usual mistakes ---------------------------------------------------------------------------

TRAIN = """\
    import torch
    import horovod.torch as hvd

    hvd.init()
    model = torch.nn.Linear(2, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1 * hvd.size())
    optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters())
    {broadcast}for _ in range(3):
        optimizer.zero_grad()
        model(torch.ones(4, 2)).sum().backward()
        optimizer.step()
    {save}
    """


def train(broadcast: str = "", save: str = "") -> str:
    return TRAIN.format(broadcast=broadcast, save=save)


def test_missing_broadcast_is_added_after_the_distributed_optimizer():
    source = train()
    result = check_transformed(
        source,
        train().replace(
            "import horovod.torch", "import sdp_runtime.torch"
        ).replace(
            "model.named_parameters())\n",
            "model.named_parameters())\n"
            "    hvd.broadcast_parameters(model.state_dict(), root_rank=0)\n",
        ),
        only=ONLY,
    )
    assert (7, "added hvd.broadcast_parameters(model.state_dict(), root_rank=0): every rank starts "
               "from rank 0's weights (the script never broadcast them)") in [
        (c.line, c.message) for c in result.changes
    ]


def test_broadcast_present_is_left_alone():
    broadcast = "hvd.broadcast_parameters(model.state_dict(), root_rank=0)\n    "
    result = migrate(train(broadcast=broadcast))
    assert not any("broadcast" in m for m in messages(result, ONLY))


def test_missing_broadcast_without_a_model_name_is_reported():
    result = migrate(
        """\
        import torch
        import horovod.torch as hvd

        hvd.init()
        model = torch.nn.Linear(2, 1)
        sgd = torch.optim.SGD(model.parameters(), lr=0.1 * hvd.size())
        optimizer = hvd.DistributedOptimizer(sgd)
        model(torch.ones(4, 2)).sum().backward()
        optimizer.step()
        """
    )
    assert manual(result) == [
        (7, "no broadcast of the initial state: add broadcast_parameters(model.state_dict(), "
            "root_rank=0) and broadcast_optimizer_state(optimizer, root_rank=0) before training")
    ]


def test_missing_broadcast_in_a_tape_loop_is_reported():
    result = migrate(
        """\
        import tensorflow as tf
        import horovod.tensorflow as hvd

        hvd.init()
        model = tf.keras.Sequential([tf.keras.layers.Dense(1)])
        opt = tf.keras.optimizers.SGD(0.01 * hvd.size())
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(model(tf.ones((2, 2))))
        tape = hvd.DistributedGradientTape(tape)
        grads = tape.gradient(loss, model.trainable_variables)
        opt.apply_gradients(zip(grads, model.trainable_variables))
        """
    )
    assert manual(result) == [
        (9, "no broadcast of the initial variables: after the first training step call "
            "broadcast_variables(model.variables, root_rank=0) and "
            "broadcast_variables(optimizer.variables, root_rank=0)")
    ]


def test_missing_broadcast_callback_in_keras_fit_is_reported():
    result = migrate(
        """\
        import tensorflow as tf
        import horovod.tensorflow.keras as hvd

        hvd.init()
        model = tf.keras.Sequential([tf.keras.layers.Dense(1)])
        opt = hvd.DistributedOptimizer(tf.keras.optimizers.Adam(1e-3 * hvd.size()))
        model.compile(loss="mse", optimizer=opt)
        x, y = tf.ones((4, 2)), tf.ones((4, 1))
        model.fit(x, y, callbacks=[hvd.callbacks.MetricAverageCallback()])
        """
    )
    assert manual(result) == [
        (6, "no broadcast of the initial variables: add "
            "callbacks.BroadcastGlobalVariablesCallback(0) to the callbacks of fit")
    ]


def test_checkpoint_written_by_every_rank_is_guarded():
    broadcast = "hvd.broadcast_parameters(model.state_dict(), root_rank=0)\n    "
    source = train(broadcast, 'torch.save(model.state_dict(), "model.pt")')
    result = check_transformed(
        source,
        source.replace("import horovod.torch", "import sdp_runtime.torch").replace(
            'torch.save(model.state_dict(), "model.pt")',
            'if hvd.rank() == 0:\n        torch.save(model.state_dict(), "model.pt")',
        ),
        only=ONLY,
    )
    assert (13, "torch.save(...) now runs on rank 0 only (every rank wrote the same file)") in [
        (c.line, c.message) for c in result.changes if not c.manual
    ]


def test_guard_imports_the_runtime_when_the_file_has_no_alias_for_it():
    check_transformed(
        """\
        import torch
        from horovod.torch import DistributedOptimizer, broadcast_parameters, init, size

        init()
        model = torch.nn.Linear(2, 1)
        optimizer = DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1 * size()))
        broadcast_parameters(model.state_dict(), root_rank=0)
        model(torch.ones(4, 2)).sum().backward()
        optimizer.step()
        torch.save(model.state_dict(), "model.pt")
        """,
        """\
        import torch
        from sdp_runtime.torch import DistributedOptimizer, broadcast_parameters, init, size
        import sdp_runtime.torch as sdp

        init()
        model = torch.nn.Linear(2, 1)
        optimizer = DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1 * size()))
        broadcast_parameters(model.state_dict(), root_rank=0)
        model(torch.ones(4, 2)).sum().backward()
        optimizer.step()
        if sdp.rank() == 0:
            torch.save(model.state_dict(), "model.pt")
        """,
        only=ONLY,
    )


@pytest.mark.parametrize(
    "save",
    [
        'if hvd.rank() == 0:\n        torch.save(model.state_dict(), "model.pt")',
        'if hvd.local_rank() == 0 and hvd.rank() == 0:\n        torch.save(model, "m.pt")',
        'is_chief = hvd.rank() == 0\n    if is_chief:\n        torch.save(model, "m.pt")',
        'torch.save(model.state_dict(), f"model-{hvd.rank()}.pt")',
        'if hvd.rank() != 0:\n        raise SystemExit\n    torch.save(model.state_dict(), "m.pt")',
    ],
    ids=["rank-check", "and", "flag", "per-rank-file", "early-exit"],
)
def test_saves_that_run_on_some_ranks_only_are_left_alone(save: str):
    broadcast = "hvd.broadcast_parameters(model.state_dict(), root_rank=0)\n    "
    result = migrate(train(broadcast, save))
    assert not any("save" in c.message for c in result.changes)


def test_save_inside_an_expression_is_reported():
    result = migrate(
        """\
        import tensorflow as tf
        import horovod.tensorflow as hvd

        hvd.init()
        model = tf.keras.Sequential([tf.keras.layers.Dense(1)])
        opt = tf.keras.optimizers.SGD(0.01 * hvd.size())
        manager = tf.train.CheckpointManager(tf.train.Checkpoint(model=model), "ckpt", 3)
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(model(tf.ones((2, 2))))
        grads = hvd.DistributedGradientTape(tape).gradient(loss, model.trainable_variables)
        opt.apply_gradients(zip(grads, model.trainable_variables))
        hvd.broadcast_variables(model.variables, root_rank=0)
        path = manager.save()
        """
    )
    assert manual(result) == [
        (13, "manager.save(...) runs on every rank: write it on rank 0 only (if rank() == 0:)")
    ]


def test_keras_callbacks_that_write_on_every_rank_are_reported():
    result = migrate(
        """\
        import tensorflow as tf
        import horovod.tensorflow.keras as hvd

        hvd.init()
        model = tf.keras.Sequential([tf.keras.layers.Dense(1)])
        opt = hvd.DistributedOptimizer(tf.keras.optimizers.SGD(0.1 * hvd.size()))
        model.compile(loss="mse", optimizer=opt)
        callbacks = [hvd.callbacks.BroadcastGlobalVariablesCallback(0)]
        if hvd.rank() == 0:
            callbacks.append(tf.keras.callbacks.ModelCheckpoint("ckpt-{epoch}.keras"))
        callbacks.append(tf.keras.callbacks.TensorBoard("logs"))
        model.fit(tf.ones((4, 2)), tf.ones((4, 1)), callbacks=callbacks)
        """
    )
    assert manual(result) == [
        (11, "TensorBoard writes files on every rank: add it to the callbacks on rank 0 only "
             "(if rank() == 0: callbacks.append(...))")
    ]


def test_unscaled_learning_rate_is_noted_only():
    source = train("hvd.broadcast_parameters(model.state_dict(), root_rank=0)\n    ").replace(
        "lr=0.1 * hvd.size()", "lr=0.1"
    )
    result = check_transformed(
        source, source.replace("import horovod.torch", "import sdp_runtime.torch"), only=ONLY
    )
    assert manual(result) == [
        (6, "the learning rate is not scaled by size(): each step now averages N processes' "
            "batches, which usually wants lr * size(); left as is, as it may be deliberate")
    ]


@pytest.mark.parametrize(
    "scaling",
    [
        "lr_scaler = hvd.size()\n    lr = 0.1 * lr_scaler",
        "workers = hvd.size()\n    args_lr = 0.1 * workers",
        "batch_size = 64 // hvd.size()\n    lr = 0.1",
    ],
    ids=["scaler", "through-a-name", "batch-scaled-instead"],
)
def test_learning_rate_scaled_indirectly_is_not_noted(scaling: str):
    source = f"""\
    import torch
    import horovod.torch as hvd

    hvd.init()
    {scaling}
    model = torch.nn.Linear(2, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters())
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    model(torch.ones(4, 2)).sum().backward()
    optimizer.step()
    """
    assert not manual(migrate(source))


def test_a_helper_module_is_migrated_without_notes_about_training():
    result = check_transformed(
        """\
        import horovod.torch as hvd


        def is_chief():
            return hvd.rank() == 0
        """,
        """\
        import sdp_runtime.torch as hvd


        def is_chief():
            return hvd.rank() == 0
        """,
        only=ONLY,
    )
    assert messages(result, ONLY) == ["horovod.torch -> sdp_runtime.torch (same names)"]


# -- stable output ------------------------------------------------------------------------------


def test_the_converted_file_converts_to_itself():
    source = textwrap.dedent(train(save='torch.save(model.state_dict(), "model.pt")'))
    first = convert(source, Options(only=frozenset({ONLY})))
    again = convert(first.output, Options(only=frozenset({ONLY})))
    assert again.output == first.output and not again.changes
    assert again.info.origin == "sdp"


def test_plain_torch_files_are_not_touched():
    check_noop(
        """\
        import torch

        model = torch.nn.Linear(2, 1)
        print(model)
        """,
        only=ONLY,
    )


# -- the tables and the runtime --------------------------------------------------------------------


def _exported(module: str) -> set[str]:
    """``__all__`` of a runtime module, else its public classes and functions (read, not imported:
    no torch/tensorflow needed)."""
    path = RUNTIME.joinpath(*module.split("."))
    source = path / "__init__.py" if path.is_dir() else path.with_suffix(".py")
    tree = ast.parse(source.read_text())
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets
        ):
            return set(ast.literal_eval(node.value))
    return {
        node.name
        for node in tree.body
        if isinstance(node, (ast.ClassDef, ast.FunctionDef)) and not node.name.startswith("_")
    }


@pytest.mark.parametrize(
    "old", sorted({**HOROVOD_MODULES, **SMDDP_MODULES}), ids=lambda m: m.replace(".", "/")
)
def test_every_name_the_table_maps_exists_in_the_runtime(old: str):
    target = {**HOROVOD_MODULES, **SMDDP_MODULES}[old]
    submodules = {n for n in target.names if f"{old}.{n}" in {**HOROVOD_MODULES, **SMDDP_MODULES}}
    missing = target.names - submodules - _exported(target.module)
    assert not missing, f"{target.module} does not export {sorted(missing)}"
