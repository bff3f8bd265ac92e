from __future__ import annotations

from .helpers import check_noop, run

ONLY = "flag_manual_steps"

HEAD = """\
import torch
import sdp_runtime.torch as sdp

sdp.init()
model = torch.nn.Linear(2, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
model(torch.ones(1, 2)).sum().backward()
opt.step()
"""


def notes(source: str, only: str = ONLY) -> list[tuple[int, str]]:
    """The manual notes of ``flag_manual_steps``; the code itself must not change."""
    result = check_noop(source, only=only)
    assert all(c.manual for c in result.changes if c.transform == ONLY)
    return [(c.line, c.message) for c in result.changes if c.transform == ONLY]


def test_hand_updates_without_an_optimizer_are_noted_even_without_step():
    # No optimizer .step() at all: not a convertible training script, but it gets its notes.
    found = notes(
        """\
        import torch

        w = torch.randn(3, requires_grad=True)
        for epoch in range(3):
            loss = (w * 2).sum()
            loss.backward()
            with torch.no_grad():
                w -= 0.1 * w.grad
                w.grad.zero_()
        """
    )
    assert [line for line, _ in found] == [8]
    assert found[0][1].startswith("parameters updated by hand (`w -= 0.1 * w.grad`)")
    assert "w.grad = sdp.allreduce(w.grad)" in found[0][1]


def test_every_spelling_of_a_hand_update():
    found = notes(
        HEAD
        + """\
lr = 0.1


def update(params):
    with torch.no_grad():
        for p in params:
            p -= lr * p.grad
            p.data = p.data - lr * p.grad
            p.sub_(lr * p.grad)
            p.data.add_(p.grad, alpha=-lr)
            p.grad.zero_()
            g = p.grad
"""
    )
    assert [line for line, _ in found] == [15, 16, 17, 18]
    assert all(message.startswith("parameters updated by hand") for _, message in found)


def test_clipping_and_weight_decay_are_not_hand_updates():
    assert (
        notes(
            HEAD
            + """\
total = 0.0
for p in model.parameters():
    p.grad.data.clamp_(-1, 1)
    p.data.mul_(0.99)
    total += p.grad.norm()
    ema[p].add_(p.grad)
torch.manual_seed(0)
"""
        )
        == []
    )


def test_no_step_and_no_update_found_still_gets_a_note():
    found = notes(
        """\
        import torch

        x = torch.ones(2, requires_grad=True)
        (x * 2).sum().backward()
        print(x.grad)
        """
    )
    assert [line for line, _ in found] == [4]
    assert found[0][1].startswith("gradients are computed but no optimizer steps")


def test_lbfgs_any_import_style():
    found = notes(
        HEAD
        + """\
from torch.optim import LBFGS
import torch.optim as O

a = LBFGS(model.parameters())
b = O.LBFGS(model.parameters(), lr=1)
"""
    )
    assert [line for line, _ in found] == [12, 13]
    assert all("closure" in message and "sdp.allreduce(loss)" in message for _, message in found)


def test_hogwild_and_own_processes():
    found = notes(
        HEAD
        + """\
import torch.multiprocessing as mp
from torch.multiprocessing import spawn


def worker(rank):
    pass


model.share_memory()
procs = [mp.Process(target=worker, args=(r,)) for r in range(4)]
spawn(worker, nprocs=2)
"""
    )
    assert [line for line, _ in found] == [17, 18, 19]
    assert "Hogwild" in found[0][1]
    assert found[1][1].startswith("mp.Process(...) starts its own training processes")
    assert found[2][1].startswith("spawn(...) starts its own training processes")


def test_data_parallel_is_noted_only_when_wrap_model_ddp_does_not_run():
    source = (
        HEAD
        + """\
from torch import nn

net = nn.DataParallel(model)
"""
    )
    found = notes(source)
    assert [line for line, _ in found] == [11]
    assert "nn.DataParallel" in found[0][1]
    # With wrap_model_ddp in the pipeline, nn.DataParallel is its business: no second note.
    result = run(source)
    assert not [c for c in result.changes if c.transform == ONLY]


def test_torch_distributed_calls_but_not_rank_queries():
    found = notes(
        HEAD
        + """\
import torch.distributed as dist
from torch.distributed import all_reduce, barrier

t = torch.ones(1)
all_reduce(t)
dist.barrier()
if dist.is_initialized() and dist.get_rank() == 0:
    print(dist.get_world_size())
"""
    )
    assert [line for line, _ in found] == [13, 14]
    assert found[0][1].startswith("all_reduce(...) talks to torch.distributed directly")
    assert "sdp.allreduce" in found[0][1]


def test_model_used_inside_another_models_forward():
    found = notes(
        """\
        import torch
        from torch import nn
        import sdp_runtime.torch as sdp

        sdp.init()
        encoder = nn.Linear(4, 4).to("cpu")


        class Head(nn.Module):
            def __init__(self, backbone):
                super().__init__()
                self.backbone = backbone
                self.fc = nn.Linear(4, 1)

            def forward(self, x):
                return self.fc(encoder(x)) + self.backbone(x)


        model = Head(encoder)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        model(torch.ones(1, 4)).sum().backward()
        opt.step()
        """
    )
    assert [line for line, _ in found] == [16]
    assert found[0][1].startswith(
        "encoder is used inside Head.forward without being one of its submodules"
    )


def test_nothing_to_note_in_a_plain_script():
    assert notes(HEAD) == []


def test_not_run_on_already_distributed_or_tensorflow_files():
    result = run(
        """\
        import torch
        import torch.distributed as dist

        dist.init_process_group("gloo")
        model = torch.nn.Linear(2, 1)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        dist.all_reduce(torch.ones(1))
        model(torch.ones(1, 2)).sum().backward()
        opt.step()
        """
    )
    assert not [c for c in result.changes if c.transform == ONLY]
