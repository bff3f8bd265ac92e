"""What each rank runs for tests/runtime/test_comm_torch.py (sdp_runtime._comm on Gloo)."""

from __future__ import annotations

import os
import time
from typing import Any

import torch
from sdp_runtime import (
    AlreadyInitializedError,
    CommunicationError,
    MismatchError,
    NotInitializedError,
    ReduceOp,
)
from sdp_runtime import _comm as c

from ._checks import checks_in, expect_raises, run_checks

OPS = list(ReduceOp)
SIGNED = [torch.int8, torch.int16, torch.int32, torch.int64]
FLOATS = [torch.float16, torch.bfloat16, torch.float32, torch.float64]
ALL_DTYPES = [*FLOATS, *SIGNED, torch.uint8, torch.bool]


def values(dtype: torch.dtype, r: int) -> list[Any]:
    """Rank ``r``'s input: exact in every dtype, with negative odd sums to tell floor from trunc."""
    if dtype == torch.bool:
        return [True, False, r == 0, r == 1]
    if dtype == torch.uint8:
        return [3 * (r + 1), 50 + r, 255 - 100 * r]  # 255 + 155 wraps around
    if dtype in FLOATS:
        return [1.0 * (r + 1) + r, -2.0 * (r + 1) - r, 3.5 * (r + 1) + r, 0.25 * (r + 1) + r]
    return [7 * (r + 1) + r, -9 * (r + 1), r, 20 * (r + 1) + r, -(r + 1), -r]


def expected(dtype: torch.dtype, op: ReduceOp, n: int) -> torch.Tensor:
    columns = list(zip(*(values(dtype, r) for r in range(n)), strict=True))
    out: list[Any] = []
    for col in columns:
        if dtype == torch.bool:
            out.append({ReduceOp.SUM: any, ReduceOp.MAX: any, ReduceOp.MIN: all}[op](col))
            continue
        total = sum(col) % 256 if dtype == torch.uint8 else sum(col)
        if op is ReduceOp.SUM:
            out.append(total)
        elif op is ReduceOp.MIN:
            out.append(min(col))
        elif op is ReduceOp.MAX:
            out.append(max(col))
        else:  # documented: float division for floats, floor division for integers
            out.append(total / n if dtype in FLOATS else total // n)
    return torch.tensor(out, dtype=dtype)


def _pairs(n: int) -> list[tuple[torch.dtype, ReduceOp]]:
    return [(d, op) for d in ALL_DTYPES for op in OPS
            if not (d == torch.bool and op is ReduceOp.AVERAGE)]


def check_before_init() -> None:
    calls = [c.rank, c.size, c.local_rank, c.local_size, c.device, c.barrier,
             lambda: c.allreduce_([torch.ones(1)]), lambda: c.broadcast_([torch.ones(1)]),
             lambda: c.allgather(torch.ones(1)), lambda: c.broadcast_object(1),
             lambda: c.allgather_object(1)]
    assert not c.is_initialized()
    for call in calls:
        expect_raises(NotInitializedError, call, "sdp.init()")


def check_placement() -> None:
    n, r = int(os.environ["WORLD_SIZE"]), int(os.environ["RANK"])
    assert (c.rank(), c.size(), c.local_rank(), c.local_size()) == (r, n, r, n)
    assert c.backend() == "gloo" and c.device() == torch.device("cpu")
    assert torch.distributed.get_world_size() == n


def check_init_twice() -> None:
    expect_raises(AlreadyInitializedError, c.init, "already initialized")
    assert c.is_initialized() and c.size() == int(os.environ["WORLD_SIZE"])


def check_every_dtype_and_op() -> None:
    n, r = c.size(), c.rank()
    for dtype, op in _pairs(n):
        t = torch.tensor(values(dtype, r), dtype=dtype)
        c.allreduce_([t], op)
        want = expected(dtype, op, n)
        assert t.dtype == dtype and torch.equal(t, want), f"{dtype} {op}: {t} != {want}"


def check_mixed_dtypes_fused() -> None:
    n, r = c.size(), c.rank()
    for op in OPS:
        dtypes = [d for d in ALL_DTYPES if not (d == torch.bool and op is ReduceOp.AVERAGE)]
        ts = [torch.tensor(values(d, r), dtype=d) for d in dtypes]
        c.allreduce_(ts, op=op.name.lower())  # names work as well as the enum
        for d, t in zip(dtypes, ts, strict=True):
            assert torch.equal(t, expected(d, op, n)), f"{d} {op}: {t}"


def check_bool_average_refused() -> None:
    expect_raises(TypeError, lambda: c.allreduce_([torch.ones(2, dtype=torch.bool)]), "bool")


def check_complex_sum() -> None:
    n, r = c.size(), c.rank()
    t = torch.tensor([complex(r, -2 * r), complex(1, 1)], dtype=torch.complex64)
    c.allreduce_([t], ReduceOp.SUM)
    s = n * (n - 1) // 2
    assert torch.equal(t, torch.tensor([complex(s, -2 * s), complex(n, n)], dtype=torch.complex64))


def check_many_small_tensors_fused_with_reused_buffers() -> None:
    n, r = c.size(), c.rank()
    base = n * (n - 1) / 2

    def make(step: int) -> list[torch.Tensor]:
        small = [torch.full((k % 7 + 1,), float(r + k + step)) for k in range(300)]
        return [*small, torch.arange(5, dtype=torch.float64) * (r + step),
                torch.full((5000,), float(r + step))]  # 20 kB: more than a bucket

    def verify(ts: list[torch.Tensor], step: int) -> None:
        for k, t in enumerate(ts[:300]):
            assert torch.equal(t, torch.full((k % 7 + 1,), n * (k + step) + base)), k
        assert torch.equal(ts[300], torch.arange(5, dtype=torch.float64) * (base + n * step))
        assert torch.equal(ts[301], torch.full((5000,), base + n * step))

    ts = make(0)
    c.allreduce_(ts, ReduceOp.SUM, bucket_bytes=1024)
    verify(ts, 0)
    before = c.buffer_stats()
    pointers = {key: buf.data_ptr() for key, buf in c._buffers.items()}
    assert before["count"] >= 3, before  # 300 small tensors in 1 kB buckets: several buffers
    for step in range(1, 6):
        ts = make(step)
        c.allreduce_(ts, ReduceOp.SUM, bucket_bytes=1024)
        verify(ts, step)
    assert c.buffer_stats() == before
    assert {key: buf.data_ptr() for key, buf in c._buffers.items()} == pointers


def check_fp16_compression() -> None:
    n, r = c.size(), c.rank()
    f32 = torch.full((4,), (r + 1) * 0.1 + 0.001, dtype=torch.float32)
    f64 = torch.full((3,), (r + 1) / 7, dtype=torch.float64)
    i64 = torch.tensor([2 * r + 1])
    exact32 = sum(torch.full((4,), (k + 1) * 0.1 + 0.001) for k in range(n)) / n
    c.allreduce_([f32, f64, i64], ReduceOp.AVERAGE, compression="fp16")
    assert f32.dtype == torch.float32 and f64.dtype == torch.float64
    assert torch.allclose(f32, exact32, rtol=2e-3) and not torch.equal(f32, exact32), f32
    assert torch.allclose(f64, torch.full((3,), sum((k + 1) / 7 for k in range(n)) / n,
                                          dtype=torch.float64), rtol=2e-3)
    assert i64.item() == sum(2 * k + 1 for k in range(n)) // n  # integers are not compressed
    plain = torch.full((4,), (r + 1) * 0.1 + 0.001, dtype=torch.float32)
    c.allreduce_([plain], ReduceOp.AVERAGE)
    assert torch.allclose(plain, exact32, rtol=1e-6)


def check_broadcast_every_dtype_fused() -> None:
    n, r = c.size(), c.rank()
    root = n - 1

    def make(k: int) -> list[torch.Tensor]:
        return [
            torch.full((3, 2), float(k)),
            torch.arange(4, dtype=torch.int16) * k,
            torch.tensor([k == root, True, k == 0]),
            torch.tensor([complex(k, -k)]),
            torch.arange(6.0).reshape(2, 3).t() * k,  # not contiguous
            torch.zeros(0),
            torch.tensor(k * 1.5, dtype=torch.float64),  # 0-d
            torch.full((5,), k, dtype=torch.bfloat16),
            torch.full((7,), k, dtype=torch.uint8),
        ]

    mine = make(r)
    c.broadcast_(mine, root_rank=root)
    for got, want in zip(mine, make(root), strict=True):
        assert got.dtype == want.dtype and torch.equal(got, want), (got, want)
    expect_raises(ValueError, lambda: c.broadcast_([torch.ones(1)], root_rank=n), "root_rank")


def check_allgather_uneven() -> None:
    n, r = c.size(), c.rank()
    got = c.allgather(torch.full((r + 1, 3), r, dtype=torch.int32))
    want = torch.cat([torch.full((k + 1, 3), k, dtype=torch.int32) for k in range(n)])
    assert torch.equal(got, want)
    assert torch.equal(c.allgather(torch.tensor(float(r))), torch.arange(float(n)))
    piece = torch.zeros((0, 2)) if r == 0 else torch.full((1, 2), float(r))
    others = torch.cat([torch.full((1, 2), float(k)) for k in range(1, n)])
    assert torch.equal(c.allgather(piece), others)
    assert c.allgather(torch.tensor([r % 2 == 0])).tolist() == [k % 2 == 0 for k in range(n)]


def check_objects_and_barrier() -> None:
    n, r = c.size(), c.rank()
    got = c.broadcast_object({"from": r, "list": [r]}, root_rank=n - 1)
    assert got == {"from": n - 1, "list": [n - 1]}
    assert c.allgather_object(("rank", r)) == [("rank", k) for k in range(n)]
    c.barrier()


def check_mismatched_tensors_raise_on_every_rank() -> None:
    r = c.rank()
    calls = {
        "shape": lambda: c.allreduce_([torch.ones(3 + r)]),
        "count": lambda: c.allreduce_([torch.ones(2)] * (r + 1)),
        "broadcast_dtype": lambda: c.broadcast_([torch.ones(2, dtype=FLOATS[2 + r % 2])]),
        "allgather_trailing": lambda: c.allgather(torch.ones(1, 2 + r)),
    }
    messages = {name: expect_raises(MismatchError, call) for name, call in calls.items()}
    for text in messages.values():
        assert all(f"rank {k}:" in text for k in range(c.size())), text
    assert "float32[3]" in messages["shape"] and "float32[4]" in messages["shape"]
    assert "float64" in messages["broadcast_dtype"]
    t = torch.ones(1)
    c.allreduce_([t], ReduceOp.SUM)  # every rank stopped before sending data: the group still works
    assert t.item() == c.size()


def comm_suite() -> dict[str, str]:
    """``check_before_init`` first, then ``init()``, then every other check in order."""
    checks = checks_in(globals())
    outcome = run_checks(checks[:1])
    c.init()
    return {**outcome, **run_checks(checks[1:])}


# ---- failures: each runs in its own launch -------------------------------------------------


def _time_error(call: Any) -> dict[str, Any]:
    start = time.monotonic()
    try:
        call()
    except CommunicationError as error:
        return {"error": str(error), "elapsed": time.monotonic() - start}
    return {"error": None, "elapsed": time.monotonic() - start}


def dead_peer() -> dict[str, Any]:
    c.init()
    if c.rank() == 1:
        os._exit(3)  # dies without a word, as a crashed process does
    return _time_error(lambda: c.allreduce_([torch.ones(1000)]))


def hung_peer() -> dict[str, Any]:
    c.init()
    if c.rank() == 1:
        time.sleep(2 * float(os.environ["SDP_TIMEOUT"]))  # alive, but silent
        os._exit(0)
    return _time_error(lambda: c.allreduce_([torch.ones(1000)]))


def placement_and_sum() -> dict[str, Any]:
    c.init()
    t = torch.tensor([float(c.rank() + 1)])
    c.allreduce_([t], ReduceOp.SUM)
    p = c.placement()
    return {"placement": [p.rank, p.size, p.local_rank, p.local_size, p.launcher], "sum": t.item()}


def peer_never_arrives() -> dict[str, Any]:
    if os.environ["RANK"] == "1":
        return {"skipped": True}
    return _time_error(c.init)
