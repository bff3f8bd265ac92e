from __future__ import annotations

import pytest

from .helpers import check_noop, check_transformed, messages, run

ONLY = "scale_learning_rate"
HEAD = "import torch\n"
# A training loop over a DataLoader (shard_dataloader would shard it): the rate is scaled.
TAIL = """\
for x in torch.utils.data.DataLoader(data):
    model(x).sum().backward()
    opt.step()
"""
CONVERTED_HEAD = """\
import torch
import sdp_runtime.torch as sdp

sdp.init()
"""


def convert(body: str, **options: object):
    """``body`` after ``import torch``, converted; returns (output body, result)."""
    result = run(HEAD + body + TAIL, ONLY, **options)
    output = result.output.decode()
    if output.startswith(CONVERTED_HEAD):
        output = output[len(CONVERTED_HEAD) :]
    return output.removesuffix(TAIL), result


def test_keyword_lr_any_import_style():
    result = check_transformed(
        """\
        import torch
        import torch.optim as optim
        from torch.optim import Adam
        from torch.optim.sgd import SGD as PlainSGD

        a = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        b = optim.RMSprop(model.parameters(), lr=args.lr)
        c = Adam(model.parameters(), lr=lr)
        d = PlainSGD(model.parameters(), lr=cfg["lr"])
        for x in torch.utils.data.DataLoader(data):
            model(x).sum().backward()
        a.step()
        """,
        """\
        import torch
        import torch.optim as optim
        from torch.optim import Adam
        from torch.optim.sgd import SGD as PlainSGD
        import sdp_runtime.torch as sdp

        sdp.init()

        a = torch.optim.SGD(model.parameters(), lr=0.1 * sdp.size(), momentum=0.9)
        b = optim.RMSprop(model.parameters(), lr=args.lr * sdp.size())
        c = Adam(model.parameters(), lr=lr * sdp.size())
        d = PlainSGD(model.parameters(), lr=cfg["lr"] * sdp.size())
        for x in torch.utils.data.DataLoader(data):
            model(x).sum().backward()
        a.step()
        """,
        only=ONLY,
    )
    changes = [(c.line, c.col, c.message) for c in result.changes if c.transform == ONLY]
    assert changes == [
        (6, 41, "SGD: learning rate 0.1 * sdp.size()"),
        (7, 39, "RMSprop: learning rate args.lr * sdp.size()"),
        (8, 30, "Adam: learning rate lr * sdp.size()"),
        (9, 34, "SGD: learning rate cfg[\"lr\"] * sdp.size()"),
    ]


def test_positional_lr():
    out, _ = convert("opt = torch.optim.Adam(model.parameters(), 3e-4, (0.9, 0.99))\n")
    assert out == "opt = torch.optim.Adam(model.parameters(), 3e-4 * sdp.size(), (0.9, 0.99))\n"


def test_the_users_expression_is_kept_and_parenthesised_when_needed():
    out, _ = convert(
        "a = torch.optim.SGD(model.parameters(), lr=base + 0.1)\n"
        "b = torch.optim.SGD(model.parameters(), lr=MAX_LR / 25)\n"
        "c = torch.optim.SGD(model.parameters(), lr=hi if fast else lo)\n"
        "opt = torch.optim.SGD(model.parameters(), lr=(base))\n"
    )
    assert out == (
        "a = torch.optim.SGD(model.parameters(), lr=(base + 0.1) * sdp.size())\n"
        "b = torch.optim.SGD(model.parameters(), lr=MAX_LR / 25 * sdp.size())\n"
        "c = torch.optim.SGD(model.parameters(), lr=(hi if fast else lo) * sdp.size())\n"
        "opt = torch.optim.SGD(model.parameters(), lr=(base) * sdp.size())\n"
    )


@pytest.mark.parametrize(
    ("cls", "default"),
    [("Adam", "0.001"), ("AdamW", "0.001"), ("SGD", "0.001"), ("RMSprop", "0.01"),
     ("Adagrad", "0.01"), ("Adadelta", "1.0"), ("Adamax", "0.002"), ("NAdam", "0.002"),
     ("RAdam", "0.001"), ("ASGD", "0.01"), ("Rprop", "0.01"), ("SparseAdam", "0.001")],
)
def test_default_lr_is_written_out_and_scaled(cls, default):
    out, result = convert(f"opt = torch.optim.{cls}(model.parameters())\n")
    assert out == f"opt = torch.optim.{cls}(model.parameters(), lr={default} * sdp.size())\n"
    assert messages(result, ONLY) == [f"{cls}: default learning rate {default} written out, * sdp.size()"]


def test_default_lr_goes_right_after_the_parameters_keeping_the_layout():
    out, _ = convert(
        "opt = torch.optim.Adam(\n"
        "    model.parameters(),\n"
        "    betas=(0.9, 0.99),  # tuned\n"
        ")\n"
        "opt = torch.optim.AdamW(\n"
        "    model.parameters(),\n"
        ")\n"
        "opt = torch.optim.AdamW(\n"
        "    model.parameters()\n"
        ")\n"
        "opt = torch.optim.Adam(params=model.parameters(), weight_decay=0.1)\n"
    )
    assert out == (
        "opt = torch.optim.Adam(\n"
        "    model.parameters(),\n"
        "    lr=0.001 * sdp.size(),\n"
        "    betas=(0.9, 0.99),  # tuned\n"
        ")\n"
        "opt = torch.optim.AdamW(\n"
        "    model.parameters(),\n"
        "    lr=0.001 * sdp.size(),\n"
        ")\n"
        "opt = torch.optim.AdamW(\n"
        "    model.parameters(),\n"
        "    lr=0.001 * sdp.size()\n"
        ")\n"
        "opt = torch.optim.Adam(params=model.parameters(), weight_decay=0.1, lr=0.001 * sdp.size())\n"
    )


def test_parameter_groups_each_get_their_lr_scaled():
    result = check_transformed(
        """\
        import torch

        opt = torch.optim.SGD(
            [
                {"params": model.backbone.parameters(), "lr": base * 0.1},
                {"params": model.head.parameters()},
                dict(params=model.extra.parameters(), lr=1e-3),
            ],
            lr=base,
            momentum=0.9,
        )
        for x in torch.utils.data.DataLoader(data):
            model(x).sum().backward()
        opt.step()
        """,
        """\
        import torch
        import sdp_runtime.torch as sdp

        sdp.init()

        opt = torch.optim.SGD(
            [
                {"params": model.backbone.parameters(), "lr": base * 0.1 * sdp.size()},
                {"params": model.head.parameters()},
                dict(params=model.extra.parameters(), lr=1e-3 * sdp.size()),
            ],
            lr=base * sdp.size(),
            momentum=0.9,
        )
        for x in torch.utils.data.DataLoader(data):
            model(x).sum().backward()
        opt.step()
        """,
        only=ONLY,
    )
    assert [(c.line, c.message) for c in result.changes if c.transform == ONLY] == [
        (5, "SGD: parameter group learning rate base * 0.1 * sdp.size()"),
        (7, "SGD: parameter group learning rate 1e-3 * sdp.size()"),
        (9, "SGD: learning rate base * sdp.size()"),
    ]


def test_parameter_groups_built_in_a_variable_and_added_later():
    out, _ = convert(
        'head = {"params": model.head.parameters(), "lr": 0.1}\n'
        'groups = [{"params": model.body.parameters()}, head]\n'
        "opt = torch.optim.Adam(groups)\n"
        'opt.add_param_group({"params": model.extra.parameters(), "lr": 0.01})\n'
    )
    assert out == (
        'head = {"params": model.head.parameters(), "lr": 0.1 * sdp.size()}\n'
        'groups = [{"params": model.body.parameters()}, head]\n'
        "opt = torch.optim.Adam(groups, lr=0.001 * sdp.size())\n"
        'opt.add_param_group({"params": model.extra.parameters(), "lr": 0.01 * sdp.size()})\n'
    )


def test_sqrt_scaling():
    out, result = convert(
        "opt = torch.optim.SGD(model.parameters(), lr=0.1)\n"
        "opt = torch.optim.Adam(model.parameters())\n",
        lr_scaling="sqrt",
    )
    assert out == (
        "opt = torch.optim.SGD(model.parameters(), lr=0.1 * sdp.size() ** 0.5)\n"
        "opt = torch.optim.Adam(model.parameters(), lr=0.001 * sdp.size() ** 0.5)\n"
    )
    assert messages(result, ONLY) == [
        "SGD: learning rate 0.1 * sdp.size() ** 0.5",
        "Adam: default learning rate 0.001 written out, * sdp.size() ** 0.5",
    ]


def test_no_scaling_leaves_every_learning_rate_alone():
    result = check_transformed(
        """\
        import torch
        from torch.optim.lr_scheduler import OneCycleLR
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        sched = OneCycleLR(opt, max_lr=1.0, total_steps=10)
        for x in torch.utils.data.DataLoader(data):
            model(x).sum().backward()
        opt.step()
        """,
        """\
        import torch
        from torch.optim.lr_scheduler import OneCycleLR
        import sdp_runtime.torch as sdp

        sdp.init()
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        sched = OneCycleLR(opt, max_lr=1.0, total_steps=10)
        for x in torch.utils.data.DataLoader(data):
            model(x).sum().backward()
        opt.step()
        """,
        only=ONLY,
        lr_scaling="none",
    )
    assert messages(result, ONLY) == []


def test_already_scaled_learning_rates_are_left_alone():
    check_noop(
        """\
        import torch
        import sdp_runtime.torch as sdp
        from sdp_runtime.torch import size as world

        sdp.init()
        lr = args.lr * sdp.size()
        a = torch.optim.SGD(model.parameters(), lr=lr)
        b = torch.optim.SGD(model.parameters(), lr=args.lr * world())
        c = torch.optim.Adam(model.parameters(), lr=0.001 * sdp.size() ** 0.5)
        d = torch.optim.SGD(
            [{"params": model.parameters(), "lr": 0.1 * sdp.size()}], lr=0.1 * sdp.size()
        )
        e = torch.optim.lr_scheduler.OneCycleLR(d, max_lr=0.1 * sdp.size(), total_steps=100)
        for x in torch.utils.data.DataLoader(data):
            model(x).sum().backward()
        a.step()
        """,
        only=ONLY,
    )


def test_converting_the_output_again_changes_nothing():
    result = check_transformed(
        """\
        import torch
        opt = torch.optim.SGD([{"params": model.parameters(), "lr": 0.1}], momentum=0.9)
        adam = torch.optim.Adam(model.parameters())
        for x in torch.utils.data.DataLoader(data):
            model(x).sum().backward()
        opt.step()
        """,
        """\
        import torch
        import sdp_runtime.torch as sdp

        sdp.init()
        opt = torch.optim.SGD([{"params": model.parameters(), "lr": 0.1 * sdp.size()}], lr=0.001 * sdp.size(), momentum=0.9)
        adam = torch.optim.Adam(model.parameters(), lr=0.001 * sdp.size())
        for x in torch.utils.data.DataLoader(data):
            model(x).sum().backward()
        opt.step()
        """,
        only=ONLY,
    )
    check_noop(result.output.decode(), only=ONLY)


def test_schedulers_that_set_absolute_learning_rates_need_a_person():
    result = check_transformed(
        """\
        import torch
        from torch.optim import lr_scheduler as ls

        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        a = ls.OneCycleLR(opt, max_lr=MAX_LR, total_steps=100)
        b = torch.optim.lr_scheduler.CyclicLR(opt, 0.01, 0.1)
        c = ls.CosineAnnealingLR(opt, T_max=10, eta_min=1e-5)
        d = ls.CosineAnnealingLR(opt, T_max=10, eta_min=0)
        e = ls.LambdaLR(opt, lambda epoch: 0.95 ** epoch)
        f = ls.StepLR(opt, step_size=1, gamma=0.5)
        for x in torch.utils.data.DataLoader(data):
            model(x).sum().backward()
        opt.step()
        """,
        """\
        import torch
        from torch.optim import lr_scheduler as ls
        import sdp_runtime.torch as sdp

        sdp.init()

        opt = torch.optim.SGD(model.parameters(), lr=0.1 * sdp.size())
        a = ls.OneCycleLR(opt, max_lr=MAX_LR, total_steps=100)
        b = torch.optim.lr_scheduler.CyclicLR(opt, 0.01, 0.1)
        c = ls.CosineAnnealingLR(opt, T_max=10, eta_min=1e-5)
        d = ls.CosineAnnealingLR(opt, T_max=10, eta_min=0)
        e = ls.LambdaLR(opt, lambda epoch: 0.95 ** epoch)
        f = ls.StepLR(opt, step_size=1, gamma=0.5)
        for x in torch.utils.data.DataLoader(data):
            model(x).sum().backward()
        opt.step()
        """,
        only=ONLY,
    )
    assert [(c.line, c.message) for c in result.manual] == [
        (5, "OneCycleLR sets the learning rate itself from max_lr=MAX_LR: scale it by sdp.size()"),
        (6, "CyclicLR sets the learning rate itself from base_lr=0.01, max_lr=0.1: scale it by "
            "sdp.size()"),
        (7, "CosineAnnealingLR has an absolute learning rate eta_min=1e-5: scale it by sdp.size()"),
    ]


def test_writes_into_param_groups_need_a_person():
    result = check_transformed(
        """\
        import torch

        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for group in opt.param_groups:
            group["lr"] = 0.1 * warmup(step)
        opt.param_groups[0]["lr"] = 0.01
        opt.param_groups[0]["lr"] *= 0.5
        config["lr"] = 0.3
        for x in torch.utils.data.DataLoader(data):
            model(x).sum().backward()
        opt.step()
        """,
        """\
        import torch
        import sdp_runtime.torch as sdp

        sdp.init()

        opt = torch.optim.SGD(model.parameters(), lr=0.1 * sdp.size())
        for group in opt.param_groups:
            group["lr"] = 0.1 * warmup(step)
        opt.param_groups[0]["lr"] = 0.01
        opt.param_groups[0]["lr"] *= 0.5
        config["lr"] = 0.3
        for x in torch.utils.data.DataLoader(data):
            model(x).sum().backward()
        opt.step()
        """,
        only=ONLY,
    )
    note = "learning rate written into param_groups: scale the new value by sdp.size()"
    assert [(c.line, c.message) for c in result.manual] == [(5, note), (6, note)]


def test_lbfgs_and_hidden_learning_rates_need_a_person():
    result = check_transformed(
        """\
        import torch

        a = torch.optim.LBFGS(model.parameters(), lr=1)
        b = torch.optim.SGD(model.parameters(), **cfg.optim)
        for x in torch.utils.data.DataLoader(data):
            model(x).sum().backward()
        b.step()
        """,
        """\
        import torch
        import sdp_runtime.torch as sdp

        sdp.init()

        a = torch.optim.LBFGS(model.parameters(), lr=1)
        b = torch.optim.SGD(model.parameters(), **cfg.optim)
        for x in torch.utils.data.DataLoader(data):
            model(x).sum().backward()
        b.step()
        """,
        only=ONLY,
    )
    assert [(c.line, c.message) for c in result.manual] == [
        (3, "LBFGS (closure-based) is not converted: scale its learning rate by sdp.size() if "
            "the larger global batch needs it, and check the closure"),
        (4, "SGD: the learning rate may come from **cfg.optim: scale it by sdp.size()"),
    ]


def test_other_libraries_optimizers_are_not_touched():
    check_noop(
        """\
        import torch
        from transformers import AdamW
        import sdp_runtime.torch as sdp

        sdp.init()
        opt = AdamW(model.parameters(), lr=1e-4)
        for x in torch.utils.data.DataLoader(data):
            model(x).sum().backward()
        opt.step()
        """,
        only=ONLY,
    )


def test_only_the_optimizer_whose_loop_reads_sharded_data_is_scaled():
    # A classifier trained on a DataLoader, then a calibration layer fitted on the same held-out
    # tensors at every step: scaling the second rate would step N times too far.
    result = run(
        """\
        import torch

        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for x in torch.utils.data.DataLoader(data):
            model(x).sum().backward()
            opt.step()
        calibration_opt = torch.optim.SGD(calibration.parameters(), lr=0.01)
        for step in range(50):
            calibration(val_logits).sum().backward()
            calibration_opt.step()
        """,
        ONLY,
    )
    out = result.output.decode()
    assert "opt = torch.optim.SGD(model.parameters(), lr=0.1 * sdp.size())" in out
    assert "calibration_opt = torch.optim.SGD(calibration.parameters(), lr=0.01)\n" in out
    assert messages(result, ONLY, manual=True) == [
        "SGD: 0.01 left as it is: full-batch training, every rank sees the same data; scale it "
        "by sdp.size() once each rank trains on its own part of the data"
    ]


def test_a_scheduler_of_an_unscaled_optimizer_asks_nothing():
    result = run(
        """\
        import torch

        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for x in torch.utils.data.DataLoader(data):
            model(x).sum().backward()
            opt.step()
        head_opt = torch.optim.SGD(head.parameters(), lr=0.01)
        sched = torch.optim.lr_scheduler.OneCycleLR(head_opt, max_lr=0.1, total_steps=50)
        for step in range(50):
            head(features).sum().backward()
            head_opt.step()
            sched.step()
        """,
        ONLY,
    )
    assert not any("OneCycleLR" in m for m in messages(result, ONLY))


WRAPPER = '''\
import torch


class Wrapped:
    def __init__(self, optimizer):
        self._optimizer = optimizer

    def step_and_update_lr(self):
{update}        self._optimizer.step()


opt = Wrapped(torch.optim.Adam(model.parameters(), lr=0.1))
for x in torch.utils.data.DataLoader(data):
    model(x).sum().backward()
    opt.step_and_update_lr()
'''


def test_an_optimizer_whose_wrapper_sets_its_rate_every_step_needs_a_person():
    # The wrapper writes param_group["lr"] on every step: a scaled lr=0.1 would be overwritten.
    update = (
        "        for group in self._optimizer.param_groups:\n"
        "            group[\"lr\"] = 0.1 * 2\n"
    )
    result = run(WRAPPER.format(update=update), ONLY)
    assert "lr=0.1)" in result.output.decode() and "sdp.size()" not in result.output.decode()
    assert (14, "Adam: learning rate left as it is: Wrapped sets it anew in the parameter groups "
                "on every step; scale the rate it sets by sdp.size() there") in [
        (c.line, c.message) for c in result.manual
    ]


def test_an_optimizer_in_a_wrapper_that_leaves_its_rate_alone_is_scaled():
    result = run(WRAPPER.format(update=""), ONLY)
    assert "torch.optim.Adam(model.parameters(), lr=0.1 * sdp.size())" in result.output.decode()
    assert result.manual == []


# -- the whole program: a loader the conversion cannot split keeps the rate -------------------

OWN_SAMPLERS = {
    # its own sampler, bound in if/elif branches
    "bound": """\
        if mode == "random":
            sampler = RandomSampler(ds)
        elif mode == "seq":
            sampler = SequentialSampler(ds)
        loader = DataLoader(ds, batch_size=8, sampler=sampler)
        """,
    # loaders made in if/elif branches, one of them with a sampler no DistributedSampler replaces
    "branches": """\
        if mode == "random":
            loader = DataLoader(ds, batch_size=8, sampler=WeightedRandomSampler(torch.ones(64), 64))
        elif mode == "seq":
            loader = DataLoader(ds, batch_size=8, sampler=SequentialSampler(ds))
        """,
}


@pytest.mark.parametrize("case", sorted(OWN_SAMPLERS))
def test_the_rate_is_not_scaled_when_the_loop_reads_a_loader_that_stays_whole(tmp_path, case):
    """The whole-program contract found the data part missing (a sampler that does not split)
    and asked for a ``shard_loader`` repair that cannot be made: the rate was scaled by that
    repair all the same. Scaled only where the data is split; the note says why not."""
    import textwrap

    from sdp_convert.options import Options
    from sdp_convert.runner import Config, Job, run_jobs

    source = textwrap.dedent("""\
        import torch
        from torch.utils.data import (
            DataLoader, RandomSampler, SequentialSampler, TensorDataset, WeightedRandomSampler
        )

        mode = "random"
        ds = TensorDataset(torch.randn(64, 4), torch.randn(64, 1))
        model = torch.nn.Linear(4, 1)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        """) + textwrap.dedent(OWN_SAMPLERS[case]) + textwrap.dedent("""\
        for epoch in range(3):
            for x, y in loader:
                opt.zero_grad()
                torch.nn.functional.mse_loss(model(x), y).backward()
                opt.step()
        """)
    (tmp_path / "train.py").write_text(source)
    [outcome] = run_jobs([Job(tmp_path / "train.py", "train.py", None)],
                         Config(Options(line_length=10_000), mode="check"), workers=1)
    out = outcome.output.decode()
    assert "lr=0.1)" in out and "sdp.size()" not in out.split("opt = ", 1)[1].split("\n")[0]
    notes = [c.message for c in outcome.changes]
    assert any("has its own sampler" in n for n in notes), notes
    assert any(c.transform == "scale_learning_rate" and c.manual and "0.1 left as it is" in c.message
               for c in outcome.changes), notes
    assert not any(c.transform == "scale_learning_rate" and c.message.startswith("SGD: learning")
                   for c in outcome.changes), notes
