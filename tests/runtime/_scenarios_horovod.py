"""What each rank runs for tests/runtime/test_horovod_parity.py: Horovod's PyTorch API where
Horovod's own test suite found sdp_runtime.torch lacking (benchmarks/horovod_suites.py)."""

from __future__ import annotations

import sdp_runtime.torch as hvd
import torch

from ._checks import checks_in, expect_raises, run_checks


def check_init_after_shutdown_meets_the_same_peers() -> None:
    # Horovod's tests (and elastic-style scripts) shut down and init again in one process.
    for _ in range(2):
        rank, size = hvd.rank(), hvd.size()
        hvd.barrier()
        hvd.shutdown()
        assert not hvd.is_initialized()
        hvd.init()
        hvd.init()  # a second init() does nothing, as in Horovod (a script may call it twice)
        assert (hvd.rank(), hvd.size()) == (rank, size)
        total = hvd.allreduce(torch.tensor([float(rank + 1)]), op=hvd.Sum)
        assert total.item() == size * (size + 1) / 2


def check_build_queries() -> None:
    assert not hvd.ccl_built() and not hvd.ddl_built() and not hvd.mpi_enabled()
    assert not hvd.mpi_threads_supported() and hvd.gloo_enabled()
    assert hvd.cuda_built() == torch.backends.cuda.is_built() and not hvd.rocm_built()


def check_alltoall_with_and_without_splits() -> None:
    n, r = hvd.size(), hvd.rank()
    # rank r sends r + 1 rows to every process: each receives k + 1 rows from rank k.
    rows = torch.full(((r + 1) * n, 2), float(r))
    out, received = hvd.alltoall(rows, splits=[r + 1] * n)
    assert received.dtype == torch.int32 and received.tolist() == [k + 1 for k in range(n)]
    assert out.tolist() == [[float(k)] * 2 for k in range(n) for _ in range(k + 1)]
    even = hvd.alltoall(torch.arange(n, dtype=torch.int64) + 10 * r)  # one row to each process
    assert even.tolist() == [10 * k + r for k in range(n)]
    expect_raises(ValueError, lambda: hvd.alltoall(torch.zeros(n + 1)), "pass splits=")
    handle = hvd.alltoall_async(torch.arange(float(n)), splits=[1] * n)
    out, received = hvd.synchronize(handle)
    assert out.tolist() == [float(r)] * n and received.tolist() == [1] * n


def check_alltoall_gradient_goes_back_where_the_rows_came_from() -> None:
    n, r = hvd.size(), hvd.rank()
    x = torch.full((n, 1), float(r + 1), requires_grad=True)
    out = hvd.alltoall(x)
    (out * torch.arange(1.0, n + 1).view(n, 1)).sum().backward()
    # row k of x went to rank k, where it was weighted by r + 1 (its position there).
    assert x.grad.view(-1).tolist() == [float(r + 1)] * n


def check_reducescatter_sum_average_and_uneven_rows() -> None:
    n, r = hvd.size(), hvd.rank()
    rows = 2 * n + 1  # the first process gets one row more
    t = torch.arange(rows * 2, dtype=torch.float32).view(rows, 2) * (r + 1)
    summed = hvd.reducescatter(t, op=hvd.Sum)
    counts = [rows // n + (1 if k < rows % n else 0) for k in range(n)]
    start = sum(counts[:r])
    base = torch.arange(rows * 2, dtype=torch.float32).view(rows, 2)[start : start + counts[r]]
    factor = n * (n + 1) / 2
    assert summed.tolist() == (base * factor).tolist()
    averaged = hvd.reducescatter(t)  # Average, Horovod's default for reducescatter
    assert torch.allclose(averaged, base * factor / n)
    scaled = hvd.reducescatter(t, op=hvd.Sum, prescale_factor=2.0, postscale_factor=0.5)
    assert scaled.tolist() == summed.tolist()
    ints = hvd.reducescatter(torch.ones(n, 3, dtype=torch.int64), op=hvd.Sum)
    assert ints.dtype == torch.int64 and ints.tolist() == [[n] * 3]
    a, b = hvd.grouped_reducescatter([torch.ones(n), torch.ones(n, 2) * r], op=hvd.Sum)
    assert a.tolist() == [float(n)] and b.tolist() == [[n * (n - 1) / 2] * 2]
    (c,) = hvd.synchronize(hvd.grouped_reducescatter_async([torch.ones(n)], op=hvd.Sum))
    assert c.tolist() == [float(n)]
    assert hvd.synchronize(hvd.reducescatter_async(torch.ones(n), op=hvd.Max)).tolist() == [1.0]


def check_reducescatter_gradient_is_horovods() -> None:
    n = hvd.size()
    x = torch.ones(n, 2, requires_grad=True)
    hvd.reducescatter(x, op=hvd.Sum).sum().backward()
    assert x.grad.tolist() == [[float(n)] * 2] * n  # allgather of the gradients, times size


def check_allgather_gradient_is_the_average_of_its_rows() -> None:
    n, r = hvd.size(), hvd.rank()
    x = torch.ones(r + 1, 2, requires_grad=True)
    gathered = hvd.allgather(x)
    assert gathered.shape == (n * (n + 1) // 2, 2)
    # every rank weights the rows of rank k by k + 1 and by its own rank + 1
    weights = torch.cat([torch.full((k + 1, 2), float(k + 1)) for k in range(n)]) * (r + 1)
    (gathered * weights).sum().backward()
    expected = (r + 1) * sum(q + 1 for q in range(n)) / n
    assert torch.allclose(x.grad, torch.full((r + 1, 2), expected))


def check_scaling_integers_and_halves_as_horovod() -> None:
    n = hvd.size()
    # integers are scaled in float64 and truncated toward zero, before the sum (prescale)
    t = hvd.allreduce(torch.tensor([3, -3], dtype=torch.int32), op=hvd.Sum, prescale_factor=0.5)
    assert t.dtype == torch.int32 and t.tolist() == [n, -n]
    t = hvd.allreduce(torch.tensor([3], dtype=torch.int64), op=hvd.Sum, postscale_factor=0.5)
    assert t.tolist() == [int(3 * n * 0.5)]
    half = hvd.allreduce(torch.tensor([3.0], dtype=torch.float16), op=hvd.Sum, prescale_factor=0.5)
    assert half.dtype == torch.float16 and half.tolist() == [1.5 * n]
    (block,) = hvd.grouped_reducescatter([torch.full((n,), 5, dtype=torch.int32)], op=hvd.Sum,
                                         prescale_factor=0.5)
    assert block.tolist() == [2 * n]


def check_broadcast_and_grouped_allreduce_are_differentiable() -> None:
    n, r = hvd.size(), hvd.rank()
    x = torch.ones(3, requires_grad=True)
    hvd.broadcast(x * (r + 1), root_rank=n - 1).sum().backward()
    # the root gets the average of every rank's gradient, the others zeros (Horovod's)
    assert x.grad.tolist() == ([float(r + 1)] * 3 if r == n - 1 else [0.0] * 3)
    a, b = torch.ones(2, requires_grad=True), torch.ones(1, requires_grad=True)
    out = hvd.grouped_allreduce([a * (r + 1), b], op=hvd.Sum)
    (out[0].sum() + out[1].sum()).backward()
    assert a.grad.tolist() == [float(n * (r + 1))] * 2 and b.grad.tolist() == [float(n)]


def check_alltoall_every_dtype() -> None:
    n, r = hvd.size(), hvd.rank()
    for dtype in (torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64,
                  torch.float16, torch.bfloat16, torch.float32, torch.float64, torch.bool):
        rows = torch.full((n, 2), r % 2 if dtype == torch.bool else r, dtype=dtype)
        out, _ = hvd.alltoall(rows, splits=[1] * n)
        expected = torch.tensor([[k % 2 if dtype == torch.bool else k] * 2 for k in range(n)])
        assert out.dtype == dtype and torch.equal(out, expected.to(dtype)), (dtype, out)


def check_grouped_allgather_and_async_grouped_allreduce() -> None:
    n, r = hvd.size(), hvd.rank()
    a, b = hvd.grouped_allgather([torch.tensor([r]), torch.full((1, 2), float(r))])
    assert a.tolist() == list(range(n)) and b.tolist() == [[float(k)] * 2 for k in range(n)]
    (a,) = hvd.synchronize(hvd.grouped_allgather_async([torch.tensor([r])]))
    assert a.tolist() == list(range(n))
    x, y = hvd.synchronize(hvd.grouped_allreduce_async([torch.ones(1), torch.ones(2)], op=hvd.Sum))
    assert x.tolist() == [float(n)] and y.tolist() == [float(n)] * 2
    z = [torch.ones(1)]
    hvd.synchronize(hvd.grouped_allreduce_async_(z, op=hvd.Sum))
    assert z[0].item() == n


def check_sparse_allreduce_async_sums_or_averages() -> None:
    n, r = hvd.size(), hvd.rank()
    sparse = torch.sparse_coo_tensor([[r]], [1.0], (n,))
    total = hvd.synchronize(hvd.sparse_allreduce_async(sparse, op=hvd.Sum)).to_dense()
    assert total.tolist() == [1.0] * n
    mean = hvd.synchronize(hvd.sparse_allreduce_async(sparse, name="g", op=hvd.Average))
    assert mean.to_dense().tolist() == [1.0 / n] * n
    handle = hvd.sparse_allreduce_async(sparse, "h", hvd.Sum)
    assert handle().to_dense().tolist() == [1.0] * n  # Horovod's handle is called, not synced


def check_sparse_gradients_reach_sparse_adam_averaged() -> None:
    n, r = hvd.size(), hvd.rank()
    for sparse_as_dense in (False, True):
        torch.manual_seed(0)
        emb = torch.nn.Embedding(4, 2, sparse=True)
        start = emb.weight.detach().clone()
        opt = hvd.DistributedOptimizer(torch.optim.SparseAdam(list(emb.parameters()), lr=0.1),
                                       sparse_as_dense=sparse_as_dense)
        emb(torch.tensor([r])).sum().backward()  # each rank touches its own row
        opt.synchronize()
        grad = emb.weight.grad
        assert grad.is_sparse
        assert grad.to_dense().tolist() == [[1.0 / n] * 2 if k < n else [0.0] * 2
                                            for k in range(4)]
        with opt.skip_synchronize():
            opt.step()
        moved = (emb.weight.detach() != start).any(dim=1).tolist()
        assert moved == [k < n for k in range(4)]  # every rank's row, on every rank


def check_named_parameters_must_name_every_parameter() -> None:
    model = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Linear(2, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    expect_raises(ValueError, lambda: hvd.DistributedOptimizer(
        opt, named_parameters=list(model.named_parameters())[:1]), "does not name")


def check_the_global_process_set_is_accepted_and_others_refused() -> None:
    n = hvd.size()
    assert hvd.global_process_set.size() == n and hvd.global_process_set.included()
    t = hvd.allreduce(torch.ones(1), op=hvd.Sum, process_set=hvd.global_process_set)
    assert t.item() == n

    class Subset:
        ranks = [0]

    for call in (
        lambda: hvd.allreduce(torch.ones(1), process_set=Subset()),
        lambda: hvd.allgather(torch.ones(1), process_set=Subset()),
        lambda: hvd.broadcast(torch.ones(1), 0, process_set=Subset()),
        lambda: hvd.barrier(process_set=Subset()),
        lambda: hvd.DistributedOptimizer(torch.optim.SGD([torch.zeros(1, requires_grad=True)],
                                                         lr=0.1), process_set=Subset()),
        lambda: hvd.init(process_sets=[Subset()]),
    ):
        message = expect_raises(hvd.NotProvidedError, call, "process sets are not supported")
        assert "global_process_set" in message


def check_names_not_provided_say_what_to_do_instead() -> None:
    for name, advice in (("join", "same number of batches"), ("Adasum", "op=Average"),
                         ("elastic", "checkpoint every epoch"), ("ProcessSet", "process sets"),
                         ("start_timeline", "torch.profiler"), ("SyncBatchNorm", "SyncBatchNorm")):
        assert not hasattr(hvd, name)
        message = expect_raises(NotImplementedError, lambda n=name: getattr(hvd, n), advice)
        assert message.startswith(f"horovod.torch.{name} is not provided by sdp_runtime.torch")
    expect_raises(AttributeError, lambda: hvd.no_such_name, "has no attribute 'no_such_name'")
    assert hvd.HorovodInternalError is hvd.CommunicationError


def horovod_suite() -> dict[str, str]:
    hvd.init()
    return run_checks(checks_in(globals()))
