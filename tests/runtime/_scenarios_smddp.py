"""What each rank runs for tests/runtime/test_smddp_api.py: every name of SMDDP's PyTorch API
reference, through the module a migrated script imports, called with the documented signature."""

from __future__ import annotations

import importlib

import torch

from ._checks import run_checks


def _module(smddp_module: str):  # the runtime module the migration puts in its place
    from sdp_convert.transforms.migrate_smddp import SMDDP_MODULES

    return importlib.import_module(SMDDP_MODULES[smddp_module].module)


def smddp_torch_api() -> dict[str, str]:
    dist = _module("smdistributed.dataparallel.torch.distributed")
    parallel = _module("smdistributed.dataparallel.torch.parallel")
    world = dist.group.WORLD
    outcome = run_checks([("is_available", lambda: _true(dist.is_available()))])
    outcome.update(run_checks([("init_process_group", dist.init_process_group)]))
    n, r = dist.get_world_size(), dist.get_rank()

    def is_initialized() -> None:
        assert dist.is_initialized()

    def get_world_size() -> None:
        assert dist.get_world_size(group=world) == n == 2

    def get_rank() -> None:
        assert dist.get_rank(group=world) == r and 0 <= r < n

    def get_local_rank() -> None:
        assert dist.get_local_rank() == r  # one machine

    def all_reduce() -> None:
        t = torch.tensor([float(r + 1)])
        assert dist.all_reduce(t, op=dist.ReduceOp.SUM, group=world, async_op=False) is None
        assert t.item() == n * (n + 1) / 2
        for op, expected in ((dist.ReduceOp.MIN, 1.0), (dist.ReduceOp.MAX, float(n))):
            t = torch.tensor([float(r + 1)])
            dist.all_reduce(t, op, world, True).wait()
            assert t.item() == expected

    def broadcast() -> None:
        t = torch.tensor([r])
        dist.broadcast(t, src=n - 1, group=world, async_op=False)
        assert t.item() == n - 1

    def all_gather() -> None:
        parts = [torch.empty(2) for _ in range(n)]
        assert dist.all_gather(parts, torch.full((2,), float(r)), world, True).wait()
        assert [p.tolist() for p in parts] == [[float(k)] * 2 for k in range(n)]

    def all_to_all_single() -> None:
        out = torch.empty(n, 2)
        dist.all_to_all_single(out, torch.full((n, 2), float(r)), group=world)
        assert out.tolist() == [[float(k)] * 2 for k in range(n)]
        # rank r sends r + 1 rows to each process: each receives k + 1 rows from rank k
        sizes_in, sizes_out = [r + 1] * n, [k + 1 for k in range(n)]
        out = torch.empty(sum(sizes_out))
        work = dist.all_to_all_single(out, torch.full(((r + 1) * n,), float(r)), sizes_out,
                                      sizes_in, world, True)
        assert work.wait() and out.tolist() == [float(k) for k in range(n) for _ in range(k + 1)]

    def barrier() -> None:
        assert dist.barrier(group=world, async_op=False) is None
        assert dist.barrier(world, True).is_completed()

    def reduce_op() -> None:
        assert {dist.ReduceOp.SUM, dist.ReduceOp.MIN, dist.ReduceOp.MAX, dist.ReduceOp.AVERAGE}

    def distributed_data_parallel() -> None:
        torch.manual_seed(0)
        model = parallel.DistributedDataParallel(
            torch.nn.Linear(3, 1), device_ids=None, output_device=None, broadcast_buffers=True,
            process_group=None, bucket_cap_mb=25,
        )
        model(torch.full((1, 3), float(r + 1))).sum().backward()
        grad = model.module.weight.grad
        assert grad.tolist() == [[(n + 1) / 2] * 3], grad  # the average of 1, ..., n

    outcome.update(run_checks([
        (fn.__name__, fn) for fn in (
            is_initialized, get_world_size, get_rank, get_local_rank, all_reduce, broadcast,
            all_gather, all_to_all_single, barrier, reduce_op, distributed_data_parallel,
        )
    ]))
    return outcome


def _true(value: object) -> None:
    assert value is True
