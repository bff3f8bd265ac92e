from __future__ import annotations

import textwrap

from sdp_convert.base import Options
from sdp_convert.engine import Result, convert

from .helpers import messages

ONLY = "migrate_smp"


def migrate(before: str, after: str | None = None, only: frozenset[str] | None = None) -> Result:
    result = convert(textwrap.dedent(before), Options(only=only or frozenset({ONLY})))
    if after is not None:
        assert result.output.decode() == textwrap.dedent(after)
    return result


def full(before: str) -> Result:
    """The whole pipeline, as ``sdp-convert`` runs it."""
    return convert(textwrap.dedent(before), Options())


TORCH_SCRIPT = """\
    import smdistributed.modelparallel.torch as smp
    import torch
    import torch.nn.functional as F

    smp.init()
    model = smp.DistributedModel(torch.nn.Linear(4, 2))
    optimizer = smp.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1))
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.ones(8, 4)), batch_size=4)

    @smp.step()
    def train_step(model, data):
        loss = model(data).sum()
        model.backward(loss)
        return loss

    for (data,) in loader:
        optimizer.zero_grad()
        loss = train_step(model, data).reduce_mean()
        optimizer.step()
    """


def test_torch_import_points_at_the_runtime_and_keeps_the_alias():
    result = migrate(TORCH_SCRIPT)
    out = result.output.decode()
    assert out.splitlines()[0] == "import sdp_runtime.torch.smp as smp"
    assert out.replace("import sdp_runtime.torch.smp as smp", "") == textwrap.dedent(
        TORCH_SCRIPT
    ).replace("import smdistributed.modelparallel.torch as smp", "")


def test_smp_script_is_detected_as_smp_not_single_gpu():
    info = full(TORCH_SCRIPT).info
    assert info.origin == "smp"
    assert info.framework == "torch"
    assert not info.convertible


def test_smp_script_gets_no_ddp_wrapping_sharding_or_lr_scaling():
    result = full(TORCH_SCRIPT)
    out = result.output.decode()
    assert "DistributedDataParallel" not in out
    assert "DistributedSampler" not in out
    assert "lr=0.1" in out and "size()" not in out
    assert {c.transform for c in result.changes} == {"migrate_smp"}
    assert not [m for m in messages(result, manual=True)]


def test_from_import_and_amp():
    migrate(
        """\
        from smdistributed.modelparallel.torch import DistributedModel, step
        from smdistributed.modelparallel.torch.amp import GradScaler
        import smdistributed.modelparallel.torch as smp

        smp.init()
        scaler = smp.amp.GradScaler()
        other = GradScaler()
        """,
        """\
        from sdp_runtime.torch.smp import DistributedModel, step
        from sdp_runtime.torch.smp.amp import GradScaler
        import sdp_runtime.torch.smp as smp

        smp.init()
        scaler = smp.amp.GradScaler()
        other = GradScaler()
        """,
    )


def test_unsupported_api_gets_a_manual_note_naming_the_call():
    result = migrate(
        """\
        import smdistributed.modelparallel.torch as smp

        smp.init()
        layer = smp.nn.DistributedTransformerLMHead()
        norm = smp.nn.FusedLayerNorm(8)
        smp.save_checkpoint("/ckpt", tag="t", model=model)
        smp.send(obj, 1, smp.RankType.WORLD_RANK)
        """
    )
    notes = messages(result, manual=True)
    assert notes == [
        "smp.nn.DistributedTransformerLMHead: not provided by sdp_runtime; use the torch.nn "
        "layer it replaces (FSDP shards it like any other module)",
        "smp.send: not provided by sdp_runtime; use broadcast/recv_from, or torch.distributed on "
        "get_world_process_group()",
    ]  # FusedLayerNorm and save_checkpoint are provided
    assert "smdistributed" not in result.output.decode().splitlines()[0]


def test_provided_nn_module_and_checkpoint_names_are_imported_from_the_runtime():
    result = migrate(
        """        from smdistributed.modelparallel.torch import init, resume_from_checkpoint, save_checkpoint
        from smdistributed.modelparallel.torch.nn import FusedLayerNorm as LayerNorm
        from smdistributed.modelparallel.torch.nn.huggingface.gpt2 import translate_state_dict_to_hf_gpt2

        init()
        save_checkpoint("/ckpt", tag="t")
        """
    )
    lines = result.output.decode().splitlines()
    assert lines[:2] == [
        "from sdp_runtime.torch.smp import init, resume_from_checkpoint, save_checkpoint",
        "from sdp_runtime.torch.smp.nn import FusedLayerNorm as LayerNorm",
    ]
    assert messages(result, manual=True) == [
        "smdistributed.modelparallel.torch.nn.huggingface.gpt2: not provided by sdp_runtime, "
        "left as is; the model here stays the Hugging Face model (no SMP distributed transformer "
        "replaces it), so its state dict already has Hugging Face's names: drop the translation"
    ]


def test_unsupported_name_is_dropped_from_a_from_import_with_a_note():
    result = migrate(
        """\
        from smdistributed.modelparallel.torch import init, send

        init()
        send(obj, 1)
        """
    )
    out = result.output.decode()
    assert out.splitlines()[0] == "from sdp_runtime.torch.smp import init"
    assert any("send: not provided by sdp_runtime" in n
               for n in messages(result, manual=True))


def test_unguarded_torch_save_becomes_smp_save_written_once():
    result = migrate(
        textwrap.dedent(TORCH_SCRIPT) + 'torch.save(model.state_dict(), "model.pt")\n'
        'if smp.dp_rank() == 0:\n    torch.save(optimizer.state_dict(), "opt.pt")\n'
    )
    out = result.output.decode()
    assert 'smp.save(model.state_dict(), "model.pt", partial=False)' in out
    assert 'smp.save(optimizer_state, "opt.pt", partial=False)' in out


def test_state_dict_under_a_rank_test_moves_before_it_onto_every_rank():
    migrate(
        TORCH_SCRIPT + """\

    # SMP: the whole model, once.
    if smp.rank() == 0:
        print("saving")
        smp.save({"model": model.state_dict(), "opt": optimizer.state_dict()}, "m.pt", partial=False)
    if smp.dp_rank() == 0:
        # the weights
        weights = model.state_dict()
        torch.save(weights, "w.pt")
    """,
        TORCH_SCRIPT.replace("import smdistributed.modelparallel.torch as smp",
                             "import sdp_runtime.torch.smp as smp") + """\

    # SMP: the whole model, once.
    model_state = model.state_dict()
    optimizer_state = optimizer.state_dict()
    if smp.rank() == 0:
        print("saving")
        smp.save({"model": model_state, "opt": optimizer_state}, "m.pt", partial=False)
    # the weights
    weights = model.state_dict()
    if smp.dp_rank() == 0:
        smp.save(weights, "w.pt", partial=False)
    """,
    )


def test_state_dict_that_cannot_move_before_its_rank_test_is_noted():
    result = migrate(
        TORCH_SCRIPT + """
    if smp.rank() == 0 and loss.item() < 1:
        smp.save(model.state_dict(), "best.pt", partial=False)
    if smp.mp_rank() == 0:
        model.eval()
        smp.save(model.state_dict(), "eval.pt", partial=False)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, 1)
    if smp.rank() == 0:
        smp.save(scheduler.state_dict(), "sched.pt", partial=False)
    """
    )
    notes = messages(result, manual=True)
    assert len(notes) == 2, notes
    assert notes[0].startswith("model.state_dict() under `if smp.rank() == 0 and loss.item() < 1:` "
                               "(the test is not only `smp.<x>_rank() == 0`): when the "
                               "configuration shards the model")
    assert "(code before it in the test's body uses model)" in notes[1]
    assert "raises CommunicationError naming the call" in notes[1]
    assert "model_state" not in result.output.decode()


def test_state_dict_under_a_rank_test_in_a_function_moves_within_the_function():
    result = migrate(
        TORCH_SCRIPT + """
    def save(path):
        if smp.rank() == 0:
            smp.save(model.state_dict(), path, partial=False)
    """
    )
    assert result.output.decode().endswith(
        "def save(path):\n    model_state = model.state_dict()\n    if smp.rank() == 0:\n"
        "        smp.save(model_state, path, partial=False)\n")


def test_tf_get_gradients_in_a_step_uses_the_runtime_and_partitions_are_noted():
    result = migrate(
        """\
        import smdistributed.modelparallel.tensorflow as smp
        import tensorflow as tf

        smp.init()

        class Model(smp.DistributedModel):
            def call(self, x):
                with smp.partition(0):
                    return self.dense(x)

        @smp.step
        def forward_backward(images, labels):
            loss = loss_obj(labels, model(images))
            return optimizer.get_gradients(loss, model.trainable_variables), loss

        def elsewhere(loss):
            return optimizer.get_gradients(loss, model.trainable_variables)
        """
    )
    out = result.output.decode()
    assert "import sdp_runtime.tensorflow.smp as smp" in out
    assert "return smp.get_gradients(loss, model.trainable_variables), loss" in out
    assert "    return optimizer.get_gradients(loss, model.trainable_variables)\n" in out
    assert any(n.startswith("smp.partition(0): TensorFlow has no FSDP")
               for n in messages(result, manual=True))


def test_horovod_hybrid_migrates_both_imports():
    result = full(
        """\
        import horovod.tensorflow as hvd
        import smdistributed.modelparallel.tensorflow as smp
        import tensorflow as tf

        smp.init()
        grads = [hvd.allreduce(g) for g in grads]
        """
    )
    out = result.output.decode()
    assert "import sdp_runtime.tensorflow as hvd" in out
    assert "import sdp_runtime.tensorflow.smp as smp" in out
    assert "smdistributed" not in out and "import horovod" not in out


def test_converted_file_is_left_alone():
    once = migrate(textwrap.dedent(TORCH_SCRIPT) + 'torch.save(model.state_dict(), "m.pt")\n').output.decode()
    again = full(once)
    assert again.output.decode() == once


def test_names_imported_from_smp_get_the_module_spelled_in_full():
    result = migrate(
        """\
        import torch
        from smdistributed.modelparallel.torch import DistributedModel, init, step

        init()
        model = DistributedModel(torch.nn.Linear(4, 2))

        @step
        def train_step(model, data):
            loss = model(data).sum()
            model.backward(loss)
            return loss

        for data in torch.ones(2, 4, 4):
            train_step(model, data)
            torch.optim.SGD(model.parameters(), lr=0.1).step()
        torch.save(model.state_dict(), "model.pt")
        """
    )
    out = result.output.decode()
    assert "from sdp_runtime.torch.smp import DistributedModel, init, step" in out
    assert "import sdp_runtime.torch.smp\n" in out
    assert 'sdp_runtime.torch.smp.save(model.state_dict(), "model.pt", partial=False)' in out
    compile(out, "train.py", "exec")


def test_tf_checkpoint_manager_is_provided():
    result = migrate(
        """\
        import smdistributed.modelparallel.tensorflow as smp

        smp.init()
        manager = smp.CheckpointManager(checkpoint, "/opt/ml/checkpoints")
        """
    )
    assert messages(result, manual=True) == []
    assert "smp.CheckpointManager(checkpoint" in result.output.decode()


def test_tf_seed_seeds_keras_initializers_too():
    result = migrate(
        """\
        import smdistributed.modelparallel.tensorflow as smp
        import tensorflow as tf

        tf.random.set_seed(1234)
        smp.init()
        """
    )
    assert "tf.keras.utils.set_random_seed(1234)\n" in result.output.decode()
    assert any(n.startswith("tf.random.set_seed(...) -> tf.keras.utils.set_random_seed(...): "
                            "Keras 3's initializers ignore TensorFlow's seed")
               for n in messages(result))


def test_tensor_parallelism_says_it_is_emulated_with_fsdp():
    result = migrate(
        """\
        import smdistributed.modelparallel.torch as smp
        import torch

        smp.init()
        with smp.tensor_parallelism():
            net = torch.nn.Linear(4, 2)
        smp.tp_register(torch.nn.Linear, None)
        """
    )
    infos = messages(result, manual=False)
    assert any(n.startswith("smp.tensor_parallelism(): tensor parallelism is emulated with FSDP "
                            "here: no layer is split across processes") for n in infos), infos
    notes = messages(result, manual=True)
    assert any(n.startswith("smp.tp_register: not provided by sdp_runtime; tensor parallelism is "
                            "emulated with FSDP") and n.endswith(": remove the call")
               for n in notes), notes


def test_partial_save_under_a_rank_test_loses_the_test():
    migrate(
        TORCH_SCRIPT + """
    # every shard
    if smp.dp_rank() == 0:
        smp.save(model.local_state_dict(), "p.pt", partial=True)
        smp.save(optimizer.local_state_dict(), "o.pt")
    if smp.rank() == 0:
        smp.save(model.local_state_dict(), "whole.pt", partial=False)
    """,
        TORCH_SCRIPT.replace("import smdistributed.modelparallel.torch as smp",
                             "import sdp_runtime.torch.smp as smp") + """
    # every shard
    smp.save(model.local_state_dict(), "p.pt", partial=True)
    smp.save(optimizer.local_state_dict(), "o.pt")
    if smp.rank() == 0:
        smp.save(model.local_state_dict(), "whole.pt", partial=False)
    """,
    )


def test_partial_save_that_keeps_its_rank_test_is_noted():
    result = migrate(
        TORCH_SCRIPT + """
    if smp.dp_rank() == 0:
        print("saving")
        smp.save(model.local_state_dict(), "p.pt", partial=True)
    """
    )
    (note,) = messages(result, manual=True)
    assert note.startswith("smp.save(..., partial=True) under `if smp.dp_rank() == 0:` (the test "
                           "guards more than smp.save(..., partial=True) calls): it writes each "
                           "shard's file on the ranks of the first replica")
    assert 'if smp.dp_rank() == 0:\n    print("saving")' in result.output.decode()


def test_guide_partial_save_with_local_state_dicts_loses_its_rank_test():
    result = migrate(
        textwrap.dedent(TORCH_SCRIPT) + """\
if smp.dp_rank() == 0:
    model_dict = model.local_state_dict()
    opt_dict = optimizer.local_state_dict()
    smp.save({"model": model_dict, "optimizer": opt_dict}, "ckpt.pt", partial=True)
"""
    )
    out = result.output.decode()
    assert "if smp.dp_rank() == 0:" not in out
    assert "\nmodel_dict = model.local_state_dict()\n" in out
    assert messages(result, manual=True) == []
