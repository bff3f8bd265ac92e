"""Collectives on torch.distributed: the one module of the runtime that talks to it.

Every framework layer (``sdp_runtime.torch``, ``sdp_runtime.tensorflow``) calls these functions
with torch tensors; nothing else imports ``torch.distributed``.

- Backend: NCCL when this process has a GPU, Gloo otherwise; ``SDP_BACKEND`` or ``init(backend=)``
  overrides. Without a launcher (one process) a real single-process group is created all the
  same, so that every code path is the one used with many processes. A process group that the
  user created before ``init()`` is adopted.
- Time limit: ``SDP_TIMEOUT`` seconds (default 300) for meeting the other processes and for
  every collective, so a peer that never arrives, hangs or dies gives a ``CommunicationError``
  instead of a hang.
- Fusion: ``allreduce_`` and ``broadcast_`` copy many tensors into a few flat buckets (25 MiB by
  default; ``SDP_BUCKET_MB`` or ``bucket_bytes=``), run one collective per bucket, all of them in
  flight at once, and copy back. Bucket buffers are cached and reused from call to call (one per
  dtype, device and position in the call, grown when a larger one is needed), because allocating
  a fresh 100 MB buffer costs 40-60 ms in page faults where reusing one costs 10 ms.
- Ops: ``AVERAGE`` is a SUM followed by a division by the number of processes. For integer
  tensors that division rounds down (``floor(sum / size)``, like Python's ``//``); for bool
  tensors ``SUM`` is a logical OR, ``MIN`` an AND, ``MAX`` an OR, and ``AVERAGE`` is refused.
  Integer sums wrap around like torch's own integer arithmetic.
- Compression ``"fp16"``: float32/float64 tensors travel as float16 (for AVERAGE they are divided
  by the number of processes before the cast, as torch's ``fp16_compress_hook`` does) and are cast
  back afterwards; other dtypes travel as they are.
- Checks: before each fused collective the ranks compare a fingerprint of the tensors they pass
  (number, dtypes, shapes, op) in one tiny allreduce; if they differ every rank raises
  ``MismatchError`` naming what each rank passed, where Gloo would silently return garbage and
  NCCL would hang. ``SDP_SHAPE_CHECK=0`` turns this off.
- One process: reductions return at once and change nothing (the result of reducing one value
  is that value; nothing is sent, so nothing is compressed). This keeps a converted script run
  with ``python train.py`` exactly equal to the original.

Tensors may live anywhere: under NCCL, CPU tensors are copied to ``device()`` for the collective
and back. Calls are serialised by a lock, so that two threads cannot interleave their collectives.
"""

from __future__ import annotations

import atexit
import contextlib
import hashlib
import math
import os
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, replace
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from . import _env, _exit
from ._types import (
    AlreadyInitializedError,
    CommunicationError,
    MismatchError,
    NotInitializedError,
    ReduceOp,
)

__all__ = [
    "AlreadyInitializedError",
    "CommunicationError",
    "MismatchError",
    "NotInitializedError",
    "ReduceOp",
    "allgather",
    "allgather_object",
    "allreduce_",
    "alltoall",
    "alone",
    "backend",
    "barrier",
    "broadcast_",
    "broadcast_object",
    "buffer_stats",
    "device",
    "init",
    "is_initialized",
    "local_rank",
    "local_size",
    "meet",
    "placement",
    "rank",
    "shutdown",
    "size",
]

DEFAULT_BUCKET_MB = 25.0
DEFAULT_TIMEOUT_S = 300.0
_MIB = 1024 * 1024

# Dtypes Gloo and NCCL reduce natively; int16 travels as int32 (Gloo has no int16). Complex
# tensors travel as their real view.
_NATIVE = {
    torch.bool, torch.int8, torch.uint8, torch.int32, torch.int64,
    torch.float16, torch.bfloat16, torch.float32, torch.float64,
}
_WIDENED = {torch.int16: torch.int32}
_COMPRESSIBLE = {torch.float32, torch.float64}
_DIST_OPS = {
    ReduceOp.AVERAGE: dist.ReduceOp.SUM,
    ReduceOp.SUM: dist.ReduceOp.SUM,
    ReduceOp.MIN: dist.ReduceOp.MIN,
    ReduceOp.MAX: dist.ReduceOp.MAX,
}
_COMPRESSIONS = ("none", "fp16")


@dataclass
class _State:
    placement: _env.Placement
    backend: str
    device: torch.device
    owns_group: bool
    timeout_s: float
    bucket_bytes: int
    check_shapes: bool


_state: _State | None = None
_lock = threading.RLock()
# (wire dtype, device, slot) -> flat buffer; slot = index of the bucket among the call's buckets
# of that dtype, so that buckets in flight together never share a buffer.
_buffers: dict[tuple[torch.dtype, torch.device, int], torch.Tensor] = {}
_atexit_registered = False
_groups_left = 0  # groups this process has left (keys of the exit count in the store)
_groups_made = 0  # process groups this process has created (init after shutdown: fresh keys)
# With one process every collective returns at once. Tests of the GPU path turn this off, to run
# real NCCL collectives on a one-process group.
_SHORTCUT_ALONE = True


# --------------------------------------------------------------------------------------------
# Lifecycle and queries


def init(backend: str | None = None) -> None:
    """Join the job: find this process's place, pick a backend and meet the other processes.

    Arguments:
        backend: ``"nccl"`` or ``"gloo"``; default ``SDP_BACKEND``, else NCCL with a GPU and Gloo
            without.

    Raises:
        AlreadyInitializedError: ``init()`` already ran in this process (``shutdown()`` first).
        CommunicationError: the other processes did not all arrive within ``SDP_TIMEOUT`` s.

    Example:
        >>> init()
        >>> rank(), size()
        (0, 1)
    """
    global _state, _atexit_registered
    if os.environ.get("SDP_AUDIT"):  # the audit under a launcher other than sdp-run
        from . import _audit

        _audit.install()
    with _lock:
        if _state is not None:
            raise AlreadyInitializedError(
                "sdp_runtime is already initialized in this process; call sdp.shutdown() before "
                "calling sdp.init() again"
            )
        placement = _env.detect()
        timeout_s = _env_float("SDP_TIMEOUT", DEFAULT_TIMEOUT_S)
        bucket_bytes = int(_env_float("SDP_BUCKET_MB", DEFAULT_BUCKET_MB) * _MIB)
        check = os.environ.get("SDP_SHAPE_CHECK", "1").strip().lower() not in ("0", "false", "no")
        if dist.is_initialized():
            placement, name, dev = _adopt(placement)
            owns = False
        else:
            name = _choose_backend(backend)
            dev = _choose_device(name, placement.local_rank)
            if dev.type == "cuda":
                torch.cuda.set_device(dev)
            _rendezvous(name, placement, timeout_s)
            owns = True
            if placement.size > 1:
                _exit.start(placement.rank, placement.size, _default_store())
        _state = _State(placement, name, dev, owns, timeout_s, max(bucket_bytes, 1), check)
        if not _atexit_registered:
            # Leaving the group explicitly avoids the backend's "terminate called" noise at exit.
            atexit.register(shutdown)
            _atexit_registered = True


def shutdown() -> None:
    """Leave the job and free the bucket buffers; a no-op when not initialized.

    Runs by itself at exit. A rank whose script ended cleanly waits (``SDP_EXIT_WAIT`` s at most)
    for the others and leaves together with them; a rank that failed, or whose peers failed or
    wait for it in a collective, leaves at once (see ``_exit``). A process group adopted from the
    user (created before ``init()``) is left alone.

    Example:
        >>> shutdown()
    """
    global _state
    with _lock:
        if _state is None:
            return
        state, _state = _state, None
        _buffers.clear()
        if state.owns_group and dist.is_initialized():
            if state.placement.size > 1:
                if not _exit.finish():
                    # This rank failed, or a peer failed, waits for it in a collective or is still
                    # busy: leave without tearing the group down, so that the peers see this
                    # process end (the launcher sees its exit status first) rather than a group
                    # closed under them while it is still finishing.
                    return
                _leave_together(state)
            dist.destroy_process_group()


def _default_store() -> Any:
    return dist.distributed_c10d._get_default_store()


def _leave_together(state: _State) -> None:
    """Return only once every rank is done with Gloo, so that none tears it down too early.

    Called only when every rank has posted a clean end of its script (``_exit.finish``), so all
    of them take part in this barrier. A rank that destroys its group while a peer is still
    finishing the last collective can make that peer abort at exit ("terminate called without
    an active exception"). A Gloo barrier alone does not prevent it (a rank may leave the barrier
    before its peer has), so each rank then also counts itself out in the rendezvous store,
    outside Gloo, and waits for the others. Bounded (10 s at most).
    """
    try:
        dist.barrier()
    except Exception:  # a peer is gone: nobody to wait for
        return
    global _groups_left
    _groups_left += 1  # every rank leaves the same groups in the same order: a fresh key each time
    key = f"sdp_runtime/left/{_groups_left}"
    with contextlib.suppress(Exception):
        store = _default_store()
        store.add(key, 1)
        deadline = time.monotonic() + min(state.timeout_s, 10.0)
        while store.add(key, 0) < state.placement.size:
            if time.monotonic() > deadline:
                return
            time.sleep(0.005)


def is_initialized() -> bool:
    """Whether ``init()`` has run (and ``shutdown()`` has not)."""
    return _state is not None


def placement() -> _env.Placement:
    """This process's full placement (rank, size, local rank, master address, launcher)."""
    return _require("sdp.placement()").placement


def rank() -> int:
    """This process's rank, 0 to ``size() - 1``."""
    return _require("sdp.rank()").placement.rank


def size() -> int:
    """Number of processes in the job."""
    return _require("sdp.size()").placement.size


def local_rank() -> int:
    """This process's rank among the processes on its machine (its GPU index)."""
    return _require("sdp.local_rank()").placement.local_rank


def local_size() -> int:
    """Number of processes on this process's machine."""
    return _require("sdp.local_size()").placement.local_size


def device() -> torch.device:
    """Where collectives run: ``cuda:<local rank>`` under NCCL, else ``cpu``."""
    return _require("sdp.device()").device


def backend() -> str:
    """The torch.distributed backend in use (``"nccl"`` or ``"gloo"``)."""
    return _require("sdp.backend()").backend


def buffer_stats() -> dict[str, int]:
    """How many bucket buffers are cached and their total size in bytes (for tests and tuning)."""
    with _lock:
        return {
            "count": len(_buffers),
            "bytes": sum(b.numel() * b.element_size() for b in _buffers.values()),
        }


def alone() -> bool:
    """Whether this process is the whole job, so that collectives have nothing to do."""
    return _alone(_require("sdp collectives"))


def _alone(state: _State) -> bool:
    return state.placement.size == 1 and _SHORTCUT_ALONE


def _require(what: str) -> _State:
    state = _state
    if state is None:
        raise NotInitializedError(what)
    return state


def _env_float(name: str, default: float) -> float:
    raw = os.environ.get(name, "").strip()
    if not raw:
        return default
    try:
        value = float(raw)
    except ValueError:
        raise ValueError(f"environment variable {name}={raw!r} is not a number") from None
    if value <= 0:
        raise ValueError(f"environment variable {name}={raw!r} must be positive")
    return value


def _choose_backend(requested: str | None) -> str:
    name = (requested or os.environ.get("SDP_BACKEND") or "").strip().lower()
    if not name:
        return "nccl" if torch.cuda.is_available() else "gloo"
    if name not in ("nccl", "gloo"):
        raise ValueError(f"unknown backend {name!r} (SDP_BACKEND): expected 'nccl' or 'gloo'")
    if name == "nccl" and not torch.cuda.is_available():
        raise ValueError("backend 'nccl' needs a CUDA GPU, and this process has none; use 'gloo'")
    return name


def _torch_backend(name: str) -> str:
    """The backend string given to torch.distributed for ``name``.

    With NCCL, CPU tensors still need a backend: a script that keeps its model on the CPU of a GPU
    host (``device = "cpu"``, ``--no-accel``) would fail at its first collective on NCCL alone.
    torch's per-device backends route CPU tensors to Gloo and CUDA tensors to NCCL.

    Example:
        >>> _torch_backend("nccl"), _torch_backend("gloo")
        ('cpu:gloo,cuda:nccl', 'gloo')
    """
    return "cpu:gloo,cuda:nccl" if name == "nccl" else name


def _choose_device(name: str, local_rank: int) -> torch.device:
    if name == "nccl":
        return torch.device("cuda", local_rank % torch.cuda.device_count())
    return torch.device("cpu")


def _adopt(found: _env.Placement) -> tuple[_env.Placement, str, torch.device]:
    """Take over a process group the user initialised (e.g. with torch's init_process_group)."""
    name = str(dist.get_backend()).lower()
    r, s = dist.get_rank(), dist.get_world_size()
    if (found.rank, found.size) == (r, s):
        here = found
    else:  # the environment says nothing reliable: assume one machine
        here = replace(found, rank=r, size=s, local_rank=r, local_size=s, launcher="adopted")
    nccl = "nccl" in name
    dev = torch.device("cuda", torch.cuda.current_device()) if nccl else torch.device("cpu")
    return here, "nccl" if nccl else name, dev


def _rendezvous(name: str, p: _env.Placement, timeout_s: float) -> None:
    global _groups_made
    timeout = timedelta(seconds=timeout_s)
    kwargs: dict[str, Any] = {
        "backend": _torch_backend(name), "rank": p.rank, "world_size": p.size, "timeout": timeout
    }
    if p.store_from_env and _groups_made and p.size > 1:
        # torchrun's store outlives a group, and torch names the new group's keys as it named the
        # last one's: a rank that came back first would read its peer's old address. Init after
        # shutdown (Horovod allows it) meets under a prefix of its own.
        store, _, _ = next(dist.rendezvous("env://", rank=p.rank, world_size=p.size,
                                           timeout=timeout))
        kwargs["store"] = dist.PrefixStore(f"sdp_runtime/group{_groups_made}", store)
    elif p.store_from_env:
        kwargs["init_method"] = "env://"  # torchrun: its agent already hosts the store
    elif p.size == 1:
        kwargs["store"] = dist.HashStore()
    else:
        kwargs["init_method"] = f"tcp://{p.master_addr}:{p.master_port}"
    hook = sys.excepthook
    try:
        dist.init_process_group(**kwargs)
        _groups_made += 1
        if os.environ.get("SDP_RUN_PREFIXED") == "1":
            sys.excepthook = hook  # sdp-run prefixes each line already; torch's hook repeats it
    except Exception as error:  # DistStoreError, TimeoutError, RuntimeError: all mean the same here
        raise CommunicationError(
            f"sdp.init(): rank {p.rank} of {p.size} could not meet the other processes at "
            f"{p.master_addr}:{p.master_port} within {timeout_s:g} s (SDP_TIMEOUT; launcher: "
            f"{p.launcher}). Did every process start, with the same address? Cause: "
            f"{_first_line(error)}"
        ) from error


# --------------------------------------------------------------------------------------------
# Collectives


def allreduce_(
    tensors: Sequence[torch.Tensor],
    op: ReduceOp | str = ReduceOp.AVERAGE,
    compression: str = "none",
    bucket_bytes: int | None = None,
) -> None:
    """Reduce ``tensors`` across all processes, in place, fused into a few buckets.

    Arguments:
        tensors: tensors of any supported dtype (mixed dtypes are grouped), any device; every
            process must pass the same number, shapes and dtypes in the same order.
        op: ``ReduceOp.AVERAGE`` (default), ``SUM``, ``MIN`` or ``MAX`` (or their names).
        compression: ``"none"`` or ``"fp16"`` (float32/float64 travel as float16).
        bucket_bytes: bucket size in bytes; default ``SDP_BUCKET_MB`` (25 MiB).

    Example:
        >>> grads = [p.grad for p in model.parameters()]
        >>> allreduce_(grads, ReduceOp.AVERAGE)
    """
    state = _require("sdp allreduce")
    op = ReduceOp.parse(op)
    compression = _parse_compression(compression)
    items = [_as_reducible(t, op) for t in _tensor_list(tensors, "allreduce_")]
    if _alone(state) or not items:
        return
    limit = bucket_bytes or state.bucket_bytes
    with _lock, torch.no_grad():
        _check_same(state, "allreduce", items, f"{op.name} {compression} {limit}")
        buckets = _plan(items, lambda t: _wire_dtype(t.dtype, compression), limit)
        prescale = op is ReduceOp.AVERAGE and compression == "fp16"

        def launch(buf: torch.Tensor, bucket: _Bucket, wait: bool) -> Any:
            if prescale and bucket.wire != bucket.source:
                buf.div_(state.placement.size)
            return dist.all_reduce(buf, op=_reduce_op(op, bucket.wire), async_op=not wait)

        def finish(buf: torch.Tensor, bucket: _Bucket) -> None:
            if op is ReduceOp.AVERAGE and not (prescale and bucket.wire != bucket.source):
                _divide(buf, state.placement.size)

        _run(state, "allreduce", buckets, launch, finish, copy_in=True, copy_out=True)


def broadcast_(tensors: Sequence[torch.Tensor], root_rank: int = 0) -> None:
    """Overwrite ``tensors`` on every process with ``root_rank``'s values, fused into buckets.

    Tensors of every dtype travel together as bytes, so one bucket serves a whole state dict.

    Arguments:
        tensors: tensors of any dtype and device, the same shapes and dtypes on every process.
        root_rank: the process whose values everyone receives.

    Example:
        >>> broadcast_(list(model.state_dict().values()), root_rank=0)
    """
    state = _require("sdp broadcast")
    root = _check_root(root_rank, state)
    items = [t for t in _tensor_list(tensors, "broadcast_")]
    if _alone(state) or not items:
        return
    with _lock, torch.no_grad():
        _check_same(state, "broadcast", items, f"root {root}")
        buckets = _plan(items, lambda t: torch.uint8, state.bucket_bytes, as_bytes=True)
        mine = state.placement.rank == root

        def launch(buf: torch.Tensor, bucket: _Bucket, wait: bool) -> Any:
            return dist.broadcast(buf, src=root, async_op=not wait)

        _run(state, "broadcast", buckets, launch, None, copy_in=mine, copy_out=not mine)


def allgather(tensor: torch.Tensor) -> torch.Tensor:
    """Concatenate every process's ``tensor`` along dim 0, in rank order.

    The first dimension may differ between processes; the others and the dtype may not. A 0-d
    tensor counts as shape ``(1,)``.

    Arguments:
        tensor: the local piece (any dtype, any device); the result lives on the same device.

    Example:
        >>> allgather(torch.tensor([rank()]))  # tensor([0, 1]) on two processes
    """
    state = _require("sdp allgather")
    (x,) = _tensor_list([tensor], "allgather")
    x = x.detach().reshape(1) if x.dim() == 0 else x.detach()
    if _alone(state):
        return x.clone()
    n = state.placement.size
    trailing = tuple(x.shape[1:])
    with _lock, _guard(state, "allgather"):
        sig = _fingerprint(f"{x.dtype}{trailing}")
        rows = torch.tensor([x.shape[0], sig, -sig], dtype=torch.int64, device=state.device)
        table = torch.empty(n * 3, dtype=torch.int64, device=state.device)
        dist.all_gather(list(table.chunk(n)), rows)
        table = table.view(n, 3).cpu()
        if not (table[:, 1] == sig).all():
            _explain_mismatch("allgather", f"{x.dtype} [*, {', '.join(map(str, trailing))}]")
        counts = table[:, 0].tolist()
        row_bytes = math.prod(trailing) * x.element_size()
        width = max(counts) * row_bytes
        if width == 0:
            return x.new_empty((sum(counts), *trailing))
        send = torch.zeros(width, dtype=torch.uint8, device=state.device)
        if x.numel():
            send[: x.numel() * x.element_size()].copy_(_bytes_of(x.contiguous()))
        received = torch.empty(n * width, dtype=torch.uint8, device=state.device)
        dist.all_gather(list(received.chunk(n)), send)
    pieces = [received[i * width : i * width + c * row_bytes] for i, c in enumerate(counts)]
    flat = torch.cat(pieces).to(x.device)
    return flat.view(x.dtype).view(sum(counts), *trailing)


def alltoall(tensor: torch.Tensor, splits: Sequence[int]) -> tuple[torch.Tensor, list[int]]:
    """Send ``splits[i]`` rows (dim 0) of ``tensor`` to process ``i``; return what came back.

    The other dimensions and the dtype must be the same on every process.

    Arguments:
        tensor: the rows to send, in rank order of their destination.
        splits: how many rows go to each process (one number per process, summing to
            ``tensor.shape[0]``).

    Returns:
        The rows received, in rank order of their sender, and how many came from each.

    Example:
        >>> out, received = alltoall(torch.arange(4), [2, 2])
    """
    state = _require("sdp alltoall")
    (x,) = _tensor_list([tensor], "alltoall")
    x = x.detach().reshape(1) if x.dim() == 0 else x.detach()
    n = state.placement.size
    sends = [int(s) for s in splits]
    if len(sends) != n or any(s < 0 for s in sends) or sum(sends) != x.shape[0]:
        raise ValueError(f"alltoall: splits {sends} must be {n} non-negative numbers (one per "
                         f"process) adding up to the first dimension of the tensor, {x.shape[0]}")
    if _alone(state):
        return x.clone(), sends
    trailing = tuple(x.shape[1:])
    with _lock, _guard(state, "alltoall"):
        sig = _fingerprint(f"{x.dtype}{trailing}")
        mine = torch.tensor([*sends, sig, -sig], dtype=torch.int64, device=state.device)
        table = torch.empty(n * (n + 2), dtype=torch.int64, device=state.device)
        dist.all_gather(list(table.chunk(n)), mine)
        table = table.view(n, n + 2).cpu()
        if not (table[:, n] == sig).all():
            _explain_mismatch("alltoall", f"{x.dtype} [*, {', '.join(map(str, trailing))}]")
        received = table[:, state.placement.rank].tolist()
        row = math.prod(trailing) * x.element_size()  # rows travel as bytes: every dtype goes
        send = _bytes_of(x.contiguous().to(state.device))
        out = torch.empty(sum(received) * row, dtype=torch.uint8, device=state.device)
        dist.all_to_all_single(out, send, [r * row for r in received], [s * row for s in sends])
    return out.to(x.device).view(x.dtype).view(sum(received), *trailing), received


def broadcast_object(obj: Any, root_rank: int = 0) -> Any:
    """Return ``root_rank``'s ``obj`` (any picklable object) on every process.

    Example:
        >>> config = broadcast_object(config if rank() == 0 else None)
    """
    state = _require("sdp broadcast_object")
    root = _check_root(root_rank, state)
    if _alone(state):
        return obj
    box = [obj if state.placement.rank == root else None]
    with _lock, _guard(state, "broadcast_object"):
        dist.broadcast_object_list(box, src=root, device=_object_device(state))
    return box[0]


def allgather_object(obj: Any) -> list[Any]:
    """Return the list of every process's ``obj``, in rank order.

    Example:
        >>> allgather_object({"rank": rank()})  # [{'rank': 0}, {'rank': 1}]
    """
    state = _require("sdp allgather_object")
    if _alone(state):
        return [obj]
    out: list[Any] = [None] * state.placement.size
    with _lock, _guard(state, "allgather_object"):
        dist.all_gather_object(out, obj)
    return out


def barrier() -> None:
    """Wait until every process has reached this point.

    Example:
        >>> barrier()
    """
    state = _require("sdp barrier")
    if _alone(state):
        return
    with _lock, _guard(state, "barrier"):
        if state.device.type == "cuda":
            dist.barrier(device_ids=[state.device.index])
        else:
            dist.barrier()


_meetings: dict[str, int] = {}  # {name: calls of meet(name) so far on this rank}


def meet(what: str, ranks: Sequence[int], advice: str = "") -> None:
    """Wait until every rank of ``ranks`` has reached its own same-numbered call of
    ``meet(what, ...)``, through the rendezvous store (outside the backend), before entering a
    collective that only they take part in: a rank that never comes gives an error naming the
    call, not a hang nor a collective matched with another one.

    Arguments:
        what: the call about to start (``model.state_dict()``): names the meeting and the error.
        ranks: the ranks that take part (this one among them).
        advice: what to do instead, appended to the error.

    Raises:
        CommunicationError: a rank of ``ranks`` did not come within half of ``SDP_TIMEOUT``
            seconds (before a peer waiting in another collective times out there), or left the
            job first.

    Example:
        >>> meet("model.state_dict()", [0, 1])
    """
    state = _require(what)
    me = state.placement.rank
    others = [r for r in ranks if r != me]
    if not others:
        return
    number = _meetings.get(what, 0) + 1
    _meetings[what] = number
    store = _default_store()
    prefix = f"sdp_runtime/meet/{what}/{min(ranks)}/{number}"
    store.set(f"{prefix}/{me}", b"1")
    keys = [f"{prefix}/{r}" for r in others]
    # Half the backend's limit: a peer that went on into another collective times out there
    # later, so the error that reaches the user is this one, naming the call.
    limit = state.timeout_s / 2
    deadline = time.monotonic() + limit
    pause = 0.001
    while not store.check(keys):
        left = _exit.explain(what)
        if left is not None or time.monotonic() > deadline:
            missing = [r for r, k in zip(others, keys, strict=True) if not store.check([k])]
            # Forget this call, so that a later one is counted the same on every rank.
            store.delete_key(f"{prefix}/{me}")
            _meetings[what] = number - 1
            if left is not None:  # ended its script, or failed: the launcher tells which
                reason = f"rank(s) {missing} left the job without calling it"
            else:
                reason = (f"rank(s) {missing} did not call it within {limit:g} s (half of "
                          f"SDP_TIMEOUT)")
            raise CommunicationError(
                f"{what} on rank {me} needs ranks {list(ranks)} to call it together: {reason}."
                + (f" {advice}" if advice else "")
            )
        time.sleep(pause)
        pause = min(pause * 2, 0.05)


# --------------------------------------------------------------------------------------------
# Fusion machinery


@dataclass
class _Bucket:
    source: torch.dtype  # dtype of the tensors (after complex -> real views)
    wire: torch.dtype  # dtype on the wire and in the buffer
    tensors: list[torch.Tensor]
    offsets: list[int]  # element offsets (bytes, for byte buckets) of each tensor in the buffer
    numel: int  # buffer elements
    as_bytes: bool


def _plan(
    items: list[torch.Tensor],
    wire_of: Callable[[torch.Tensor], torch.dtype],
    limit: int,
    as_bytes: bool = False,
) -> list[_Bucket]:
    """Group tensors by dtype (in order of first appearance) and cut each group into buckets."""
    groups: dict[tuple[torch.dtype, torch.dtype], list[torch.Tensor]] = {}
    for t in items:
        if t.numel():
            key = (torch.uint8, torch.uint8) if as_bytes else (t.dtype, wire_of(t))
            groups.setdefault(key, []).append(t)
    buckets: list[_Bucket] = []
    for (source, wire), group in groups.items():
        current: list[torch.Tensor] = []
        offsets: list[int] = []
        used = 0
        for t in group:
            # Byte buckets hold every dtype: 16-byte alignment lets each slice be viewed as it.
            need = _aligned(t.numel() * t.element_size()) if as_bytes else t.numel()
            if current and (used + need) * wire.itemsize > limit:
                buckets.append(_Bucket(source, wire, current, offsets, used, as_bytes))
                current, offsets, used = [], [], 0
            current.append(t)
            offsets.append(used)
            used += need
        buckets.append(_Bucket(source, wire, current, offsets, used, as_bytes))
    return buckets


def _run(
    state: _State,
    what: str,
    buckets: list[_Bucket],
    launch: Callable[[torch.Tensor, _Bucket, bool], Any],
    finish: Callable[[torch.Tensor, _Bucket], None] | None,
    copy_in: bool,
    copy_out: bool,
) -> None:
    """Pack each bucket and start its collective, then wait for them in order and unpack.

    ``launch(buf, bucket, wait)`` starts the collective; with ``wait`` (a single bucket: nothing to
    overlap) it runs to the end in the call, which spares Gloo's hand-over to its worker thread
    (about 10% of a 25 MiB allreduce between 2 processes on 2 cores).
    """
    slots: dict[torch.dtype, int] = {}
    in_flight = []
    wait = len(buckets) == 1
    with _guard(state, what):
        for bucket in buckets:
            direct = _direct_view(bucket, state.device)
            if direct is not None:
                buf = direct
            else:
                slot = slots.get(bucket.wire, 0)
                slots[bucket.wire] = slot + 1
                buf = _buffer(bucket.wire, state.device, slot, bucket.numel)
                if copy_in:
                    for t, view in _views(bucket, buf):
                        view.copy_(t)
            in_flight.append((bucket, buf, direct is not None, launch(buf, bucket, wait)))
        for bucket, buf, direct, work in in_flight:
            if work is not None:
                work.wait()
            if finish is not None:
                finish(buf, bucket)
            if copy_out and not direct:
                for t, view in _views(bucket, buf):
                    t.copy_(view)


def _direct_view(bucket: _Bucket, dev: torch.device) -> torch.Tensor | None:
    """A lone tensor already in wire form on the right device is reduced where it lies."""
    if len(bucket.tensors) != 1 or bucket.as_bytes:
        return None
    t = bucket.tensors[0]
    if t.dtype == bucket.wire and t.device == dev and t.is_contiguous():
        return t
    return None


def _views(bucket: _Bucket, buf: torch.Tensor) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    for t, start in zip(bucket.tensors, bucket.offsets, strict=True):
        if bucket.as_bytes:
            nbytes = t.numel() * t.element_size()
            yield t, buf[start : start + nbytes].view(t.dtype).view(t.shape)
        else:
            yield t, buf[start : start + t.numel()].view(t.shape)


def _buffer(dtype: torch.dtype, dev: torch.device, slot: int, numel: int) -> torch.Tensor:
    key = (dtype, dev, slot)
    buf = _buffers.get(key)
    if buf is None or buf.numel() < numel:
        buf = torch.empty(numel, dtype=dtype, device=dev)
        _buffers[key] = buf
    return buf[:numel]


def _aligned(nbytes: int) -> int:
    return (nbytes + 15) // 16 * 16


def _bytes_of(t: torch.Tensor) -> torch.Tensor:
    return t.reshape(-1).view(torch.uint8)


# --------------------------------------------------------------------------------------------
# Dtypes, ops, checks


def _tensor_list(tensors: Sequence[torch.Tensor], what: str) -> list[torch.Tensor]:
    if isinstance(tensors, torch.Tensor):
        raise TypeError(f"{what} takes a list of tensors; wrap a single tensor as [tensor]")
    out = list(tensors)
    for t in out:
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{what} takes torch tensors, got {type(t).__name__}")
        if t.layout != torch.strided:
            raise TypeError(f"{what}: {t.layout} tensors are not supported; use .to_dense()")
    return out


def _as_reducible(t: torch.Tensor, op: ReduceOp) -> torch.Tensor:
    if t.is_complex():
        if op in (ReduceOp.MIN, ReduceOp.MAX):
            raise TypeError(f"complex tensors cannot be reduced with {op.name}")
        return torch.view_as_real(t)
    if t.dtype == torch.bool and op is ReduceOp.AVERAGE:
        raise TypeError("bool tensors cannot be averaged; use SUM (logical or), MIN or MAX")
    if t.dtype not in _NATIVE and t.dtype not in _WIDENED:
        raise TypeError(f"allreduce does not support dtype {t.dtype}")
    return t


def _wire_dtype(dtype: torch.dtype, compression: str) -> torch.dtype:
    if compression == "fp16" and dtype in _COMPRESSIBLE:
        return torch.float16
    return _WIDENED.get(dtype, dtype)


def _reduce_op(op: ReduceOp, wire: torch.dtype) -> Any:
    if wire == torch.bool and op is ReduceOp.SUM:
        return dist.ReduceOp.MAX  # logical or, as NCCL does for bool sums
    return _DIST_OPS[op]


def _divide(buf: torch.Tensor, n: int) -> None:
    if buf.is_floating_point() or buf.is_complex():
        buf.div_(n)
    else:
        buf.div_(n, rounding_mode="floor")


def _parse_compression(compression: Any) -> str:
    name = getattr(compression, "name", compression)
    name = "none" if name is None else str(name).lower()
    if name not in _COMPRESSIONS:
        raise ValueError(f"unknown compression {compression!r}; expected 'none' or 'fp16'")
    return name


def _check_root(root_rank: int, state: _State) -> int:
    root = int(root_rank)
    if not 0 <= root < state.placement.size:
        size = state.placement.size
        raise ValueError(f"root_rank {root_rank} is not a rank of this job (size {size})")
    return root


def _describe(items: list[torch.Tensor], extra: str) -> str:
    shapes = ", ".join(f"{str(t.dtype).removeprefix('torch.')}{list(t.shape)}" for t in items)
    return f"{len(items)} tensors ({extra}): {shapes}"


def _fingerprint(text: str) -> int:
    # 7 bytes: a positive int64 whose negation also fits, for the one-allreduce check below.
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=7).digest(), "little")


def _check_same(state: _State, what: str, items: list[torch.Tensor], extra: str) -> None:
    """Raise MismatchError on every rank if the ranks' tensor lists differ (one tiny allreduce)."""
    if not state.check_shapes:
        return
    description = _describe(items, extra)
    sig = _fingerprint(description)
    probe = torch.tensor([sig, -sig], dtype=torch.int64, device=state.device)
    with _guard(state, what):
        dist.all_reduce(probe, op=dist.ReduceOp.MAX)  # max(s) == s and max(-s) == -s iff all equal
    if probe.tolist() != [sig, -sig]:
        _explain_mismatch(what, description)


def _explain_mismatch(what: str, description: str) -> None:
    # Every rank found the difference, so all of them take part in this last collective.
    state = _require(what)
    shown = description if len(description) < 300 else description[:297] + "..."
    everyone: list[Any] = [None] * state.placement.size
    with _guard(state, what):
        dist.all_gather_object(everyone, shown)
    lines = "\n".join(f"  rank {r}: {d}" for r, d in enumerate(everyone))
    raise MismatchError(
        f"{what}: the processes passed different tensors (every rank must pass the same number, "
        f"shapes and dtypes, in the same order):\n{lines}"
    )


def _object_device(state: _State) -> torch.device | None:
    return state.device if state.device.type == "cuda" else None


@contextmanager
def _guard(state: _State, what: str) -> Iterator[None]:
    """Track the collective for the watchdog; turn the backend's errors into one clear message."""
    _exit.enter(what)
    try:
        yield
    except (CommunicationError, NotInitializedError):
        raise
    except (RuntimeError, TimeoutError, ConnectionError) as error:
        reason = _exit.explain(what) if state.placement.size > 1 else None
        if reason is None:
            reason = (
                f"another process probably died, or did not reach the same {what} within "
                f"{state.timeout_s:g} s (SDP_TIMEOUT)"
            )
        raise CommunicationError(
            f"{what} failed on rank {state.placement.rank} of {state.placement.size}: {reason}. "
            f"Cause: {_first_line(error)}"
        ) from error
    finally:
        _exit.leave()


def _first_line(error: BaseException) -> str:
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__
