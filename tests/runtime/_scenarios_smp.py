"""What each rank runs for tests/runtime/test_smp.py (sdp_runtime.torch.smp)."""

from __future__ import annotations

import copy
import os
import tempfile
import time
from typing import Any

import sdp_runtime.torch.smp as smp
import torch
import torch.distributed as dist
import torch.nn.functional as F
from sdp_runtime import CommunicationError
from sdp_runtime.torch.smp import model as smp_model
from sdp_runtime.torch.smp import state
from torch import nn

from ._checks import checks_in, expect_raises, run_checks


def _net() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 3))


def _data(rows: int = 8) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(5)
    return torch.randn(rows, 4, generator=g), torch.randint(0, 3, (rows,), generator=g)


def _fresh(config: dict[str, Any]) -> None:
    state.reset()
    smp.init(config)


# -- data parallel (the default configuration) ----------------------------------------------------

def check_data_parallel_rank_queries() -> None:
    _fresh({"microbatches": 2})
    assert (smp.mp_rank(), smp.mp_size()) == (0, 1)
    assert (smp.dp_rank(), smp.dp_size()) == (smp.rank(), smp.size())
    assert smp.rdp_rank() == smp.rank() and smp.get_mp_group() == [smp.rank()]
    assert smp.get_dp_group() == list(range(smp.size()))
    t = torch.tensor([float(smp.rank() + 1)])
    dist.all_reduce(t, group=smp.get_dp_process_group())
    assert t.item() == 3.0


def check_broadcast_recv_from_allgather_barrier() -> None:
    if smp.rank() == 0:
        smp.broadcast({"lr": 0.1}, smp.CommGroup.WORLD)
        got = {"lr": 0.1}
    else:
        got = smp.recv_from(0, smp.RankType.WORLD_RANK)
    assert got == {"lr": 0.1}
    assert smp.allgather(smp.rank(), smp.DP_GROUP) == [0, 1]
    smp.barrier()


def check_step_splits_into_microbatches_and_gathers_outputs() -> None:
    seen: list[int] = []

    @smp.step(non_split_inputs=["scale"])
    def forward(x, scale, pair):
        seen.append(x.shape[0])
        assert pair[0].shape[0] == x.shape[0] and pair[1] == "label"
        return x * scale, {"sum": x.sum()}, 1.5

    x = torch.arange(8.0).reshape(4, 2)
    out, parts, number = forward(x, torch.tensor(2.0), (x, "label"))
    assert seen == [2, 2]
    assert torch.equal(out.concat(), x * 2)
    assert out.stack().shape == (2, 2, 2) and len(out.outputs) == 2
    assert torch.equal(parts["sum"].reduce_sum(), x.sum())
    assert torch.allclose(parts["sum"].reduce_mean(), x.sum() / 2)
    assert number == [1.5, 1.5]  # Python numbers: a list, one per microbatch, as SMP gives
    assert len(out) == 2 and list(out) == out.outputs and torch.equal(out[1], x[2:] * 2)
    total = 0
    total += sum(forward(x, torch.tensor(2.0), (x, "label"))[2])
    assert total == 3.0
    expect_raises(ValueError, lambda: forward(torch.ones(3, 2), torch.tensor(1.0), (x, "label")),
                  "3 elements along axis 0")


def check_microbatched_step_equals_one_plain_step_on_the_whole_data() -> None:
    model = smp.DistributedModel(_net())
    optimizer = smp.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.5))
    x, y = _data(8)

    @smp.step
    def train_step(model, x, y):
        loss = F.cross_entropy(model(x), y)
        model.backward(loss)
        return loss

    mine = slice(4 * smp.rank(), 4 * smp.rank() + 4)
    loss = train_step(model, x[mine], y[mine]).reduce_mean()
    optimizer.step()
    plain = _net()
    F.cross_entropy(plain(x), y).backward()
    torch.optim.SGD(plain.parameters(), lr=0.5).step()
    for key, value in plain.state_dict().items():
        assert torch.allclose(model.state_dict()[key], value, atol=1e-6), key
    assert loss.shape == ()
    assert list(model.state_dict()) == list(plain.state_dict())


def check_optimizer_stays_the_same_object_for_schedulers() -> None:
    model = smp.DistributedModel(_net())
    base = torch.optim.SGD(model.parameters(), lr=0.1)
    optimizer = smp.DistributedOptimizer(base)
    assert optimizer is base and isinstance(optimizer, torch.optim.SGD)
    torch.optim.lr_scheduler.StepLR(optimizer, 1).step()
    assert "_smp_is_partial" in optimizer.local_state_dict()


def check_grad_scaler_skips_the_step_everywhere_when_one_rank_overflows() -> None:
    weight = nn.Parameter(torch.ones(3))
    optimizer = torch.optim.SGD([weight], lr=0.5)
    scaler = smp.amp.GradScaler()
    scaler.scale(torch.tensor(1.0))  # (the scale exists from the first scale() on)
    before = scaler.get_scale()
    # Rank 1's gradient overflowed (its shard, say); rank 0's is finite: nobody steps.
    weight.grad = torch.full((3,), float("inf") if smp.rank() == 1 else 1.0)
    scaler.unscale_(optimizer)
    scaler.step(optimizer)
    scaler.update()
    assert torch.equal(weight.detach(), torch.ones(3)), weight
    assert scaler.get_scale() == before / 2
    # Finite everywhere: every rank steps.
    optimizer.zero_grad()
    weight.grad = torch.full((3,), scaler.get_scale())
    scaler.unscale_(optimizer)
    scaler.step(optimizer)
    scaler.update()
    assert torch.allclose(weight.detach(), torch.full((3,), 0.5)), weight


def check_save_full_once_and_partial_per_shard() -> None:
    model = smp.DistributedModel(_net())
    folder = smp.allgather(tempfile.mkdtemp() if smp.rank() == 0 else None)[0]
    path = os.path.join(folder, "ckpt.pt")
    smp.save({"model": model.state_dict()}, path, partial=False)
    smp.save(model.local_state_dict(), path, partial=True)
    smp.barrier()
    assert sorted(os.listdir(folder)) == ["ckpt.pt", "ckpt.pt_0"]
    loaded = smp.load(path, partial=False)
    plain = _net()
    plain.load_state_dict(loaded["model"])
    model.load_state_dict(smp.load(path, partial=True))


def _train_step():
    @smp.step
    def train_step(model, x, y):
        loss = F.cross_entropy(model(x), y)
        model.backward(loss)
        return loss

    return train_step


def check_get_module_and_activation_checkpointing() -> None:
    net = _net()
    model = smp.DistributedModel(net)
    assert model.get_module() is net
    smp.set_activation_checkpointing(net)  # nn.Sequential: each child
    x, y = _data(8)
    _train_step()(model, x, y)
    plain = _net()
    F.cross_entropy(plain(x), y).backward()
    for mine, theirs in zip(net.parameters(), plain.parameters(), strict=True):
        assert mine.grad is not None and torch.allclose(mine.grad, theirs.grad, atol=1e-6)


def check_fp16_loss_scaling_clip_master_grads_and_overflow() -> None:
    _fresh({"microbatches": 2, "fp16": True})
    model = smp.DistributedModel(_net())
    optimizer = smp.DistributedOptimizer(
        torch.optim.SGD(model.parameters(), lr=0.5), static_loss_scale=None,
        dynamic_loss_scale=True, dynamic_loss_args={"init_scale": 2.0**8, "scale_window": 2})
    x, y = _data(8)
    mine = slice(4 * smp.rank(), 4 * smp.rank() + 4)
    _train_step()(model, x[mine], y[mine])
    assert model.get_module()[0].weight.grad.abs().max() > 1.0  # scaled by 2**8
    plain = _net()
    F.cross_entropy(plain(x), y).backward()
    want = torch.nn.utils.clip_grad_norm_(plain.parameters(), 0.1)
    norm = optimizer.clip_master_grads(0.1)
    assert torch.allclose(norm, want, atol=1e-5), (norm, want)
    optimizer.step()
    torch.optim.SGD(plain.parameters(), lr=0.5).step()
    assert optimizer.overflow is False
    for key, value in plain.state_dict().items():
        assert torch.allclose(model.state_dict()[key], value, atol=1e-6), key
    # An inf gradient on rank 1 only: the step is skipped on both, the scale halves.
    optimizer.zero_grad()
    _train_step()(model, x[mine], y[mine])
    if smp.rank() == 1:
        model.get_module()[0].weight.grad[0, 0] = float("inf")
    before = {k: v.clone() for k, v in model.state_dict().items()}
    optimizer.step()
    assert optimizer.overflow is True
    assert optimizer._sdp_scaler.scale == 2.0**7
    for key, value in before.items():
        assert torch.equal(model.state_dict()[key], value), key
    _fresh({"microbatches": 2})


def check_save_checkpoint_and_resume_from_checkpoint() -> None:
    model = smp.DistributedModel(_net())
    optimizer = smp.DistributedOptimizer(torch.optim.Adam(model.parameters(), lr=0.1))
    x, y = _data(8)
    _train_step()(model, x, y)
    optimizer.step()
    folder = smp.allgather(tempfile.mkdtemp() if smp.rank() == 0 else None)[0]
    saved = {k: v.clone() for k, v in model.state_dict().items()}
    saved_opt = copy.deepcopy(optimizer.state_dict())
    smp.save_checkpoint(folder, tag="step1", partial=True, model=model, optimizer=optimizer,
                        user_content={"step": 1})
    smp.save_checkpoint(folder, tag="full.pt", partial=False, model=model, user_content="u")
    optimizer.zero_grad()
    _train_step()(model, x, y)
    optimizer.step()
    assert smp.resume_from_checkpoint(folder, tag="step1") == {"step": 1}
    for key, value in saved.items():
        assert torch.equal(model.state_dict()[key], value), key
    assert torch.equal(optimizer.state_dict()["state"][0]["exp_avg"],
                       saved_opt["state"][0]["exp_avg"])
    assert sorted(os.listdir(os.path.join(folder, "step1_partial"))) == [
        "model_0.pt", "optimizer_0.pt", "user_content.pt"]
    with open(os.path.join(folder, "newest")) as f:
        assert f.read() == "full.pt"
    assert smp.resume_from_checkpoint(folder, partial=False) == "u"  # the newest: full.pt
    plain = _net()
    plain.load_state_dict(torch.load(os.path.join(folder, "full.pt"), weights_only=True))
    expect_raises(FileNotFoundError, lambda: smp.resume_from_checkpoint(folder + "-none"),
                  "no checkpoint in")


# -- two partitions: one replica sharded with FSDP ------------------------------------------------

def check_partitioned_rank_queries() -> None:
    _fresh({"partitions": 2, "microbatches": 2})
    assert (smp.mp_rank(), smp.mp_size()) == (smp.rank(), 2)
    assert (smp.dp_rank(), smp.dp_size()) == (0, 1)
    assert (smp.pp_rank(), smp.pp_size()) == (smp.rank(), 2)
    assert smp.get_mp_group() == [0, 1] and smp.get_dp_group() == [smp.rank()]
    assert smp.get_pp_group() == [0, 1] and smp.get_tp_group() == [smp.rank()]
    assert smp.allgather(smp.rank(), smp.MP_GROUP) == [0, 1]
    assert smp.allgather(smp.rank(), smp.PP_GROUP) == [0, 1]
    assert smp.allgather("me", smp.DP_GROUP) == ["me"]


def check_partition_blocks_become_fsdp_units() -> None:
    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            with smp.partition(0):
                self.a = nn.Linear(4, 8)
            with smp.partition(1):
                self.b = nn.Sequential(nn.ReLU(), nn.Linear(8, 3))

    net = Net()
    assert (net.a._smp_partition, net.b._smp_partition, net.b[1]._smp_partition) == (0, 1, 1)
    groups = smp_model._units(net, 2)
    assert [[id(m) for m in g] for g in groups] == [[id(net.a)], [id(net.b)]]


def check_auto_partition_cuts_children_by_parameter_count() -> None:
    net = nn.Sequential(nn.Linear(10, 10), nn.Linear(10, 10), nn.Linear(10, 10),
                        nn.Linear(10, 10))
    groups = smp_model._units(net, 2)
    assert [len(g) for g in groups] == [2, 2]


def check_sharded_training_with_optimizer_made_before_the_wrap() -> None:
    net = _net()
    optimizer = torch.optim.Adam(net.parameters(), lr=0.05)  # before DistributedModel
    model = smp.DistributedModel(net)
    optimizer = smp.DistributedOptimizer(optimizer)
    assert all(hasattr(p, "device_mesh") for g in optimizer.param_groups for p in g["params"])
    x, y = _data(8)

    @smp.step
    def train_step(model, x, y):
        loss = F.cross_entropy(model(x), y)
        model.backward(loss)
        return loss

    for _ in range(3):
        optimizer.zero_grad()
        train_step(model, x, y)  # every rank of the replica gets the whole batch
        optimizer.step()
    plain = _net()
    plain_opt = torch.optim.Adam(plain.parameters(), lr=0.05)
    for _ in range(3):
        plain_opt.zero_grad()
        F.cross_entropy(plain(x), y).backward()
        plain_opt.step()
    full = model.state_dict()
    for key, value in plain.state_dict().items():
        assert torch.allclose(full[key], value, atol=1e-5), key
    # The optimizer's whole state loads into the plain model's optimizer.
    again = torch.optim.Adam(_net().parameters(), lr=0.05)
    again.load_state_dict(optimizer.state_dict())
    for a, b in zip(again.state.values(), plain_opt.state.values(), strict=True):
        assert torch.allclose(a["exp_avg"], b["exp_avg"], atol=1e-5)
    # A whole state dict loads back into the sharded model (each rank keeps its shard).
    model.load_state_dict(plain.state_dict())
    assert torch.allclose(model.state_dict()["0.weight"], plain.state_dict()["0.weight"])
    # clip_master_grads: the norm of the whole model's gradient, from the shards.
    optimizer.zero_grad()
    train_step(model, x, y)
    plain_opt.zero_grad()
    F.cross_entropy(plain(x), y).backward()
    want = torch.nn.utils.clip_grad_norm_(plain.parameters(), 0.01)
    assert torch.allclose(optimizer.clip_master_grads(0.01), want, atol=1e-5)
    # A partial save_checkpoint: one file per shard; resumed, every shard is back.
    folder = smp.allgather(tempfile.mkdtemp() if smp.rank() == 0 else None)[0]
    saved = model.state_dict()
    smp.save_checkpoint(folder, "t1", partial=True, model=model, optimizer=optimizer,
                        user_content=7)
    optimizer.step()
    assert smp.resume_from_checkpoint(folder) == 7
    for key, value in saved.items():
        assert torch.equal(model.state_dict()[key], value), key
    assert sorted(os.listdir(os.path.join(folder, "t1_partial"))) == [
        "model_0.pt", "model_1.pt", "optimizer_0.pt", "optimizer_1.pt", "user_content.pt"]


def smp_suite() -> dict[str, str]:
    return run_checks(checks_in(globals()))


def single_process_partitioned() -> dict[str, Any]:
    """``python train.py`` with two partitions configured: one process runs the whole model."""
    smp.init()
    model = smp.DistributedModel(_net())
    raw = state.config().raw or {}
    return {"configured": raw.get("partitions"), "mp_size": smp.mp_size(),
            "dp_size": smp.dp_size(), "sharded": model._fsdp,
            "keys": list(model.state_dict()) == list(_net().state_dict())}


def one_rank_gathers_a_sharded_model(folder: str) -> dict[str, Any]:
    """Sharded data parallelism on 2 processes: rank 0 alone calls ``model.state_dict()``,
    ``optimizer.state_dict()`` and ``smp.save(..., partial=True)`` (as under ``if smp.rank() ==
    0:``): each raises naming the call instead of hanging; then both ranks call them and they
    work."""
    smp.init()
    model = smp.DistributedModel(_net())
    optimizer = smp.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1))
    errors: list[str] = []
    seconds: list[float] = []
    path = os.path.join(folder, "partial.pt")
    calls = (model.state_dict, optimizer.state_dict,
             lambda: smp.save(model.local_state_dict(), path, partial=True))
    for call in calls:
        if smp.rank() == 0:
            started = time.monotonic()
            try:
                call()
            except CommunicationError as error:
                errors.append(str(error))
            seconds.append(time.monotonic() - started)
        smp.barrier()
    full = model.state_dict()  # both ranks: gathered
    optimizer.state_dict()
    smp.save(model.local_state_dict(), path, partial=True)
    smp.barrier()
    plain = _net()
    return {"errors": errors, "seconds": seconds, "files": sorted(os.listdir(folder)),
            "equal": all(torch.equal(full[k], v) for k, v in plain.state_dict().items()),
            "sharded": model._fsdp}
