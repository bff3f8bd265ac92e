from __future__ import annotations

import textwrap

from sdp_convert.base import Options
from sdp_convert.engine import Result, convert

from .helpers import check_noop, check_transformed, messages

ONLY = "migrate_smddp"


def migrate(before: str, after: str | None = None) -> Result:
    """The migration alone (the helpers add add_runtime_init, whose re-check of a converted file
    does not yet know ``sdp_runtime.torch.distributed.init_process_group``)."""
    result = convert(textwrap.dedent(before), Options(only=frozenset({ONLY})))
    if after is not None:
        assert result.output.decode() == textwrap.dedent(after)
    return result


def manual(result: Result) -> list[tuple[int, str]]:
    return [(c.line, c.message) for c in result.changes if c.manual]


# -- PyTorch, the v1 API --------------------------------------------------------------------------


def test_v1_pytorch_api_points_at_the_runtime():
    result = migrate(
        """\
        import torch
        import smdistributed.dataparallel.torch.distributed as dist
        from smdistributed.dataparallel.torch.parallel.distributed import DistributedDataParallel

        dist.init_process_group()
        torch.cuda.set_device(dist.get_local_rank())
        model = DistributedDataParallel(torch.nn.Linear(2, 1))
        print(dist.get_rank(), dist.get_world_size(), dist.get_local_size())
        """,
        """\
        import torch
        import sdp_runtime.torch.distributed as dist
        from sdp_runtime.torch.parallel.distributed import DistributedDataParallel

        dist.init_process_group()
        torch.cuda.set_device(dist.get_local_rank())
        model = DistributedDataParallel(torch.nn.Linear(2, 1))
        print(dist.get_rank(), dist.get_world_size(), dist.get_local_size())
        """,
    )
    assert messages(result, ONLY) == [
        "smdistributed.dataparallel.torch.distributed -> sdp_runtime.torch.distributed "
        "(same names)",
        "from smdistributed.dataparallel.torch.parallel.distributed import ... -> from "
        "sdp_runtime.torch.parallel.distributed import ...",
        "launch with `sdp-run -n N train.py` (N processes per machine) instead of SageMaker's "
        "smdistributed launcher",
    ]
    assert result.info.origin == "smddp" and not result.manual


def test_v1_modules_imported_from_their_package():
    check_transformed(
        """\
        from smdistributed.dataparallel.torch import distributed as dist
        from smdistributed.dataparallel.torch.parallel import DistributedDataParallel

        dist.barrier()
        """,
        """\
        from sdp_runtime.torch import distributed as dist
        from sdp_runtime.torch.parallel import DistributedDataParallel

        dist.barrier()
        """,
        only=ONLY,
    )


def test_v1_names_the_runtime_lacks_keep_working_through_torch_distributed():
    result = check_transformed(
        """\
        import smdistributed.dataparallel.torch.distributed as dist

        group = dist.new_group([0, 1])
        dist.destroy_process_group()
        """,
        """\
        import sdp_runtime.torch.distributed as dist
        import torch.distributed
        import sdp_runtime.torch as sdp

        group = torch.distributed.new_group([0, 1])
        sdp.shutdown()
        """,
        only=ONLY,
    )
    assert manual(result) == [
        (3, "dist.new_group: not in sdp_runtime.torch.distributed; now "
            "torch.distributed.new_group, which works on the runtime's process group")
    ]
    assert "dist.destroy_process_group -> sdp.shutdown (the same, in sdp_runtime)" in messages(
        result, ONLY
    )


def test_v1_unknown_name_is_reported():
    result = check_transformed(
        "import smdistributed.dataparallel.torch.distributed as dist\ndist.get_node_rank()\n",
        "import sdp_runtime.torch.distributed as dist\ndist.get_node_rank()\n",
        only=ONLY,
    )
    assert manual(result) == [
        (2, "dist.get_node_rank: not provided by sdp_runtime; rewrite this part by hand")
    ]


# -- PyTorch, the smddp backend -------------------------------------------------------------------


def test_backend_form_becomes_the_runtime():
    result = migrate(
        """\
        import torch
        # SageMaker data parallel: Import the library PyTorch API
        import smdistributed.dataparallel.torch.torch_smddp

        # SageMaker data parallel: Import PyTorch's distributed API
        import torch.distributed as dist
        from torch.nn.parallel import DistributedDataParallel as DDP

        dist.init_process_group(backend="smddp")
        model = DDP(torch.nn.Linear(2, 1))
        if dist.get_rank() == 0:
            print(dist.get_world_size())
        """,
        """\
        import torch

        # SageMaker data parallel: Import PyTorch's distributed API
        import sdp_runtime.torch.distributed as dist
        from sdp_runtime.torch.parallel import DistributedDataParallel as DDP

        dist.init_process_group()
        model = DDP(torch.nn.Linear(2, 1))
        if dist.get_rank() == 0:
            print(dist.get_world_size())
        """,
    )
    assert [c.line for c in result.changes] == [3, 6, 7, 9, 9]
    assert 'init_process_group("smddp") -> init_process_group(): sdp_runtime picks NCCL on GPUs ' \
        "and Gloo on CPUs" in messages(result, ONLY)


def test_backend_form_with_names_spelled_in_full():
    migrate(
        """\
        import torch
        from smdistributed.dataparallel.torch import torch_smddp
        import torch.distributed as dist

        torch.distributed.init_process_group("smddp", timeout=None)
        model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(2, 1))
        torch.distributed.barrier()
        """,
        """\
        import torch
        import sdp_runtime.torch.distributed as dist
        import sdp_runtime.torch.parallel

        dist.init_process_group(timeout=None)
        model = sdp_runtime.torch.parallel.DistributedDataParallel(torch.nn.Linear(2, 1))
        dist.barrier()
        """,
    )


def test_backend_form_keeps_torch_names_it_cannot_move():
    migrate(
        """\
        import smdistributed.dataparallel.torch.torch_smddp
        from torch.distributed import get_rank, init_process_group, new_group
        from torch.nn.parallel import DataParallel, DistributedDataParallel

        init_process_group(backend="smddp")
        """,
        """\
        from sdp_runtime.torch.distributed import get_rank, init_process_group
        from torch.distributed import new_group
        from torch.nn.parallel import DataParallel
        from sdp_runtime.torch.parallel import DistributedDataParallel

        init_process_group()
        """,
    )


def test_plain_torch_ddp_is_not_migrated():
    # No SMDDP import: the file is already distributed and left to note_already_distributed.
    check_noop(
        """\
        import torch
        import torch.distributed as dist

        dist.init_process_group(backend="nccl")
        model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(2, 1))
        """,
        only=ONLY,
    )


# -- TensorFlow ----------------------------------------------------------------------------------


def test_tensorflow_api_points_at_the_runtime():
    result = check_transformed(
        """\
        import tensorflow as tf
        import smdistributed.dataparallel.tensorflow as smdp
        from smdistributed.dataparallel.tensorflow.keras import callbacks

        smdp.init()
        print(smdp.rank(), smdp.local_rank(), smdp.size(), smdp.local_size())
        loss = smdp.oob_allreduce(tf.constant(1.0))
        """,
        """\
        import tensorflow as tf
        import sdp_runtime.tensorflow as smdp
        from sdp_runtime.tensorflow.keras import callbacks

        smdp.init()
        print(smdp.rank(), smdp.local_rank(), smdp.size(), smdp.local_size())
        loss = smdp.oob_allreduce(tf.constant(1.0))
        """,
        only=ONLY,
    )
    assert not result.manual


def test_tensorflow_graph_mode_broadcast_is_reported():
    result = check_transformed(
        """\
        import smdistributed.dataparallel.tensorflow as sdp

        sdp.init()
        hooks = [sdp.BroadcastGlobalVariablesHook(0)]
        """,
        """\
        import sdp_runtime.tensorflow as sdp

        sdp.init()
        hooks = [sdp.BroadcastGlobalVariablesHook(0)]
        """,
        only=ONLY,
    )
    assert manual(result) == [
        (4, "sdp.BroadcastGlobalVariablesHook: not provided by sdp_runtime; call "
            "broadcast_variables(model.variables, root_rank=0) (and the optimizer's variables) "
            "after the first step, or use callbacks.BroadcastGlobalVariablesCallback(0) in fit")
    ]


# -- SageMaker's environment --------------------------------------------------------------------


def test_sagemaker_variables_are_left_and_reported():
    result = check_transformed(
        """\
        import os
        import smdistributed.dataparallel.tensorflow as sdp

        sdp.init()
        model_dir = os.environ["SM_MODEL_DIR"]
        train_dir = os.environ.get("SM_CHANNEL_TRAIN", "data")
        """,
        """\
        import os
        import sdp_runtime.tensorflow as sdp

        sdp.init()
        model_dir = os.environ["SM_MODEL_DIR"]
        train_dir = os.environ.get("SM_CHANNEL_TRAIN", "data")
        """,
        only=ONLY,
    )
    assert manual(result) == [
        (5, "reads SageMaker's SM_CHANNEL_TRAIN, SM_MODEL_DIR: left as is; outside SageMaker set "
            "them (or pass the matching arguments) when launching with sdp-run")
    ]


def test_sagemaker_variables_with_defaults_are_a_plain_note():
    result = check_transformed(
        """\
        import os
        import smdistributed.dataparallel.tensorflow as sdp

        model_dir = os.environ.get("SM_MODEL_DIR", ".")
        """,
        """\
        import os
        import sdp_runtime.tensorflow as sdp

        model_dir = os.environ.get("SM_MODEL_DIR", ".")
        """,
        only=ONLY,
    )
    assert not result.manual
    assert "reads SageMaker's SM_MODEL_DIR: left as is; outside SageMaker set it (or pass the " \
        "matching arguments) when launching with sdp-run" in messages(result, ONLY)


def test_first_host_guard_is_left_and_reported():
    result = migrate(
        """\
        import torch
        import smdistributed.dataparallel.torch.distributed as dist
        from smdistributed.dataparallel.torch.parallel.distributed import DistributedDataParallel

        dist.init_process_group()
        model = DistributedDataParallel(torch.nn.Linear(2, 1))
        opt = torch.optim.SGD(model.parameters(), lr=0.1 * dist.get_world_size())
        model(torch.ones(2, 2)).sum().backward()
        opt.step()
        if args.current_host == args.hosts[0]:
            torch.save(model.state_dict(), "model.pt")
        """
    )
    assert manual(result) == [
        (10, "`args.current_host == args.hosts[0]` is true on every process of the first host, so "
             "all of them run what it guards; use rank() == 0 to do it once (left as is)")
    ]
    assert "torch.save" in result.output.decode().splitlines()[-1]  # not guarded again


def test_save_on_every_rank_is_guarded_with_the_runtime():
    migrate(
        """\
        import torch
        import smdistributed.dataparallel.torch.distributed as dist
        from smdistributed.dataparallel.torch.parallel.distributed import DistributedDataParallel

        dist.init_process_group()
        model = DistributedDataParallel(torch.nn.Linear(2, 1))
        opt = torch.optim.SGD(model.parameters(), lr=0.1 * dist.get_world_size())
        model(torch.ones(2, 2)).sum().backward()
        opt.step()
        torch.save(model.state_dict(), "model.pt")
        """,
        """\
        import torch
        import sdp_runtime.torch.distributed as dist
        from sdp_runtime.torch.parallel.distributed import DistributedDataParallel
        import sdp_runtime.torch as sdp

        dist.init_process_group()
        model = DistributedDataParallel(torch.nn.Linear(2, 1))
        opt = torch.optim.SGD(model.parameters(), lr=0.1 * dist.get_world_size())
        model(torch.ones(2, 2)).sum().backward()
        opt.step()
        if sdp.rank() == 0:
            torch.save(model.state_dict(), "model.pt")
        """,
    )


# -- both libraries in one file, and stable output ------------------------------------------------


def test_a_file_switching_between_smddp_and_horovod_gets_both_migrations_once():
    result = convert(
        textwrap.dedent(
            """\
            import os

            if os.environ.get("SM_TRAINING_ENV"):
                import smdistributed.dataparallel.tensorflow.keras as dist
            else:
                import horovod.keras as dist

            dist.init()
            """
        ),
        Options(only=frozenset({ONLY, "migrate_horovod"})),
    )
    assert result.output.decode().count("import sdp_runtime.tensorflow.keras as dist") == 2
    launch = [c for c in result.changes if c.message.startswith("launch with")]
    assert len(launch) == 1


def test_the_converted_file_converts_to_itself():
    first = migrate(
        """\
        import smdistributed.dataparallel.torch.torch_smddp
        import torch.distributed as dist

        dist.init_process_group(backend="smddp")
        dist.destroy_process_group()
        """
    )
    again = convert(first.output, Options(only=frozenset({ONLY})))
    assert again.output == first.output and not again.changes
    assert again.info.origin == "sdp"


# -- what else names SageMaker ------------------------------------------------------------------


def test_the_smddp_backend_string_becomes_nccl_and_deepspeed_keeps_torch_distributed():
    migrate(
        """\
        import deepspeed
        import torch
        import smdistributed.dataparallel.torch.torch_smddp

        backend = 'smddp'
        deepspeed.init_distributed(dist_backend=backend)
        print(torch.distributed.get_rank())
        engine, opt, _, _ = deepspeed.initialize(model=model, config="ds.json")
        engine.backward(loss)
        engine.step()
        """,
        """\
        import deepspeed
        import torch

        backend = 'nccl'
        deepspeed.init_distributed(dist_backend=backend)
        print(torch.distributed.get_rank())
        engine, opt, _, _ = deepspeed.initialize(model=model, config="ds.json")
        engine.backward(loss)
        engine.step()
        """,
    )


def test_arithmetic_for_eight_gpus_per_instance_is_reported():
    result = migrate(
        """\
        import torch
        import smdistributed.dataparallel.torch.distributed as dist

        dist.init_process_group()
        world_size = dist.get_world_size()
        batch_size = 64 // (world_size // 8)
        if dist.get_local_size() == 8:
            print("a full instance")
        steps = len(data) // 8
        opt = torch.optim.SGD(model.parameters(), lr=0.1 * world_size)
        model(x).sum().backward()
        opt.step()
        """
    )
    lines = [line for line, message in manual(result) if "8 GPUs per instance" in message]
    assert lines == [6, 7]  # not len(data) // 8
