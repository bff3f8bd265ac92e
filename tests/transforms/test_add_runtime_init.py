from __future__ import annotations

import textwrap

from .helpers import check_noop, check_transformed, messages, run


def test_import_and_init_after_the_import_block():
    result = check_transformed(
        '''\
        """Docstring."""
        import torch
        from torch import optim

        model = torch.nn.Linear(2, 1)
        opt = optim.SGD(model.parameters(), lr=0.1)
        model(torch.ones(1, 2)).sum().backward()
        opt.step()
        ''',
        '''\
        """Docstring."""
        import torch
        from torch import optim
        import sdp_runtime.torch as sdp

        sdp.init()

        model = torch.nn.Linear(2, 1)
        opt = optim.SGD(model.parameters(), lr=0.1)
        model(torch.ones(1, 2)).sum().backward()
        opt.step()
        ''',
        only="add_runtime_init",
    )
    assert messages(result, "add_runtime_init") == [
        "import sdp_runtime.torch as sdp and call sdp.init()"
    ]
    assert result.changes[0].line == 3


def test_existing_init_is_kept_once():
    check_noop(
        """\
        import torch
        import sdp_runtime.torch as sdp

        sdp.init()
        model = torch.nn.Linear(2, 1)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        model(torch.ones(1, 2)).sum().backward()
        opt.step()
        """,
        only="add_runtime_init",
    )


def test_not_a_training_script_is_untouched():
    check_noop(
        """\
        import torch

        x = torch.ones(3)
        print(x.sum())
        """
    )


def test_sdp_name_taken_uses_another_alias():
    result = check_transformed(
        """\
        import torch
        sdp = 3
        model = torch.nn.Linear(2, 1)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        model(torch.ones(1, 2)).sum().backward()
        opt.step()
        """,
        """\
        import torch
        import sdp_runtime.torch as sdp_rt

        sdp_rt.init()
        sdp = 3
        model = torch.nn.Linear(2, 1)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        model(torch.ones(1, 2)).sum().backward()
        opt.step()
        """,
        only="add_runtime_init",
    )
    assert result.changes


def test_init_goes_after_the_environment_settings_that_precede_the_framework_import():
    # OMP_NUM_THREADS / KERAS_BACKEND are read when torch / Keras and the runtime start.
    check_transformed(
        """\
        import os

        os.environ["OMP_NUM_THREADS"] = "1"
        os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
        import torch

        model = torch.nn.Linear(2, 1)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        model(x).sum().backward()
        opt.step()
        """,
        """\
        import os

        os.environ["OMP_NUM_THREADS"] = "1"
        os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
        import torch

        import sdp_runtime.torch as sdp

        sdp.init()

        model = torch.nn.Linear(2, 1)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        model(x).sum().backward()
        opt.step()
        """,
        only="add_runtime_init",
    )


def test_keras_backend_setting_stays_before_the_runtime_import_and_converting_again_is_a_noop():
    source = textwrap.dedent(
        """\
        import os

        os.environ["KERAS_BACKEND"] = "tensorflow"

        import keras
        import numpy as np

        model = keras.Sequential([keras.layers.Dense(1)])
        model.compile(optimizer="sgd", loss="mse")
        model.fit(np.zeros((8, 2)), np.zeros((8, 1)), epochs=1)
        """
    )
    out = run(source).output.decode()
    lines = out.splitlines()
    assert lines.index('os.environ["KERAS_BACKEND"] = "tensorflow"') < lines.index(
        "import sdp_runtime.tensorflow as sdp"
    ) < lines.index("sdp.init()")
    # TensorFlow (for the GPU pinning) is imported after the setting too, and only once.
    assert lines.index("import tensorflow as tf") > lines.index("sdp.init()")
    assert out.count("import sdp_runtime.tensorflow as sdp") == 1
    check_noop(out)
