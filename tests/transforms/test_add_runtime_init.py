from __future__ import annotations

from .helpers import check_noop, check_transformed, messages


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
