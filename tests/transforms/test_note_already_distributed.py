from __future__ import annotations

import pytest

from .helpers import check_noop, messages, run

ONLY = "note_already_distributed"


def note(source: str) -> tuple[int, str]:
    result = check_noop(source)  # the whole pipeline: nothing else may touch the file either
    assert [c.transform for c in result.changes] == [ONLY]
    assert not result.manual
    (change,) = result.changes
    return change.line, change.message


def test_torch_ddp_names_what_it_uses():
    assert note(
        """\
        import torch
        import torch.distributed as dist
        from torch.nn.parallel import DistributedDataParallel as DDP

        dist.init_process_group("nccl")
        model = DDP(torch.nn.Linear(2, 1))
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        model(torch.ones(2, 2)).sum().backward()
        opt.step()
        """
    ) == (5, "left unchanged: already distributed with torch.distributed + torch "
             "DistributedDataParallel; launch it as before")


def test_fsdp():
    line, message = note(
        """\
        import torch
        from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

        model = FSDP(torch.nn.Linear(2, 1))
        opt = torch.optim.Adam(model.parameters())
        model(torch.ones(2, 2)).sum().backward()
        opt.step()
        """
    )
    assert (line, message) == (4, "left unchanged: already distributed with torch FSDP; launch "
                                  "it as before")


@pytest.mark.parametrize(
    "strategy",
    ["tf.distribute.MirroredStrategy()", "tf.distribute.MultiWorkerMirroredStrategy()"],
)
def test_tf_distribute_strategies(strategy: str):
    line, message = note(
        f"""\
        import tensorflow as tf

        strategy = {strategy}
        with strategy.scope():
            model = tf.keras.Sequential([tf.keras.layers.Dense(1)])
            model.compile(loss="mse", optimizer="sgd")
        model.fit(tf.ones((4, 2)), tf.ones((4, 1)))
        """
    )
    name = strategy.removesuffix("()")
    assert (line, message) == (3, f"left unchanged: already distributed with {name}; launch it "
                                  "as before")


@pytest.mark.parametrize(
    ("imports", "label"),
    [
        ("import deepspeed", "DeepSpeed"),
        ("from accelerate import Accelerator", "Hugging Face Accelerate"),
        ("import pytorch_lightning as pl", "PyTorch Lightning"),
        ("import lightning as L", "PyTorch Lightning"),
    ],
)
def test_libraries(imports: str, label: str):
    line, message = note(
        f"""\
        import torch
        {imports}

        model = torch.nn.Linear(2, 1)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        model(torch.ones(2, 2)).sum().backward()
        opt.step()
        """
    )
    assert (line, message) == (2, f"left unchanged: already distributed with {label}; launch it "
                                  "as before")


def test_bytes_are_kept_exactly():
    source = (
        "import deepspeed  \r\nimport torch\r\n\r\n"
        "engine = deepspeed.initialize(model=torch.nn.Linear(2, 1))\r\n"
    )
    result = run(source, ONLY)
    assert result.output == source.encode()
    assert messages(result, ONLY) == [
        "left unchanged: already distributed with DeepSpeed; launch it as before"
    ]


def test_horovod_and_plain_scripts_get_no_such_note():
    for source in (
        "import horovod.torch as hvd\nhvd.init()\n",
        "import torch\nmodel = torch.nn.Linear(2, 1)\nprint(model)\n",
    ):
        assert not messages(run(source, ONLY), ONLY)


@pytest.mark.parametrize(
    ("source", "line", "what"),
    [
        (  # timm: its own helpers set the group up; one torch.distributed call shows it
            "import torch\nimport utils\n\nargs = utils.parse()\nutils.init_distributed_device(args)\n"
            "opt = torch.optim.SGD(model.parameters(), lr=0.1)\nmodel(x).sum().backward()\n"
            "opt.step()\ntorch.distributed.destroy_process_group()\n",
            9,
            "torch.distributed.destroy_process_group()",
        ),
        (  # its own DistributedSampler, no other sign
            "import torch\nfrom torch.utils.data.distributed import DistributedSampler\n\n"
            "loader = torch.utils.data.DataLoader(ds, sampler=DistributedSampler(ds))\n"
            "opt = torch.optim.SGD(model.parameters(), lr=0.1)\nfor x in loader:\n"
            "    model(x).sum().backward()\n    opt.step()\n",
            4,
            "its own DistributedSampler",
        ),
        (  # torchrun's variables read by the script
            "import os\nimport torch\n\nrank = int(os.environ['RANK'])\n"
            "opt = torch.optim.SGD(model.parameters(), lr=0.1)\nmodel(x).sum().backward()\n"
            "opt.step()\n",
            4,
            "its own launcher set-up (reads RANK from the environment)",
        ),
        (
            "import os\nimport torch\n\nlocal_rank = int(os.getenv('LOCAL_RANK', '0'))\n"
            "opt = torch.optim.SGD(model.parameters(), lr=0.1)\nmodel(x).sum().backward()\n"
            "opt.step()\n",
            4,
            "its own launcher set-up (reads LOCAL_RANK from the environment)",
        ),
        (  # Hogwild: processes sharing one model
            "import torch\nimport torch.multiprocessing as mp\n\nmodel = Net()\n"
            "model.share_memory()\np = mp.Process(target=train, args=(model,))\np.start()\n",
            5,
            "torch.multiprocessing (Hogwild: processes sharing one model)",
        ),
    ],
    ids=["torch-distributed-call", "distributed-sampler", "environ-rank", "getenv-local-rank",
         "hogwild"],
)
def test_distribution_set_up_by_the_script_itself(source: str, line: int, what: str):
    assert note(source) == (line, f"left unchanged: already distributed with {what}; launch it "
                                  "as before")


def test_a_set_up_behind_a_test_whose_value_is_unknown_says_so():
    # torch.distributed.launch's --local_rank convention, with no parser to read its default
    # from: the note names the test, never "launch it as before".
    assert note(
        "import torch\n\nif args.local_rank != -1:\n    setup(args.local_rank)\n"
        "opt = torch.optim.SGD(model.parameters(), lr=0.1)\nmodel(x).sum().backward()\n"
        "opt.step()\n"
    ) == (3, "left unchanged: already distributed with its own distributed set-up "
             "(args.local_rank), but only when `args.local_rank != -1`, whose value as the "
             "script is usually started is unknown here (if it is false, it runs on one "
             "process): launch it so that it holds")


def test_an_imported_module_named_like_the_convention_is_not_a_sign():
    # ``distributed`` bound by an import (torch.distributed, a module) is not args.distributed.
    result = run(
        "import torch\nimport mylib.distributed as distributed\n\nprint(distributed.local_rank)\n"
        "opt = torch.optim.SGD(model.parameters(), lr=0.1)\nmodel(x).sum().backward()\n"
        "opt.step()\n"
    )
    assert not messages(result, ONLY) and result.changed


def test_keras_distribution_data_parallel_is_distributed_already():
    line, message = note(
        """\
        import keras
        import numpy as np

        keras.distribution.set_distribution(keras.distribution.DataParallel())
        model = keras.Sequential([keras.layers.Dense(1)])
        model.compile(optimizer="adam", loss="mse")
        model.fit(np.zeros((8, 2)), np.zeros((8, 1)), epochs=1)
        """
    )
    assert message == "left unchanged: already distributed with keras.distribution; launch it as before"


@pytest.mark.parametrize(
    "setting",
    [
        'os.environ["KERAS_BACKEND"] = "jax"',
        'os.environ.setdefault("KERAS_BACKEND", "torch")',
    ],
)
def test_keras_on_another_backend_is_refused_with_a_note(setting):
    source = f"""\
import os

{setting}

import keras
import numpy as np

model = keras.Sequential([keras.layers.Dense(1)])
model.compile(optimizer="adam", loss="mse")
model.fit(np.zeros((8, 2)), np.zeros((8, 1)), epochs=1)
"""
    result = run(source)
    assert result.output == result.source  # byte for byte
    backend = "jax" if "jax" in setting else "torch"
    assert result.info.label == f"not converted (Keras on the {backend} backend)"
    (change,) = result.manual
    assert change.transform == ONLY
    assert change.message.startswith(f"not converted: Keras runs on the {backend} backend here")
    # The TensorFlow backend (Keras' default) is converted as usual.
    converted = run(source.replace(backend, "tensorflow"))
    assert b"sdp.init()" in converted.output
