"""The audit's PyTorch hooks: optimizers (every ``torch.optim.Optimizer``), DDP, ``torch.save``.

- ``Optimizer.__init__`` (patched) registers each optimizer and, for the first K steps, a hook on
  each of its parameters that sums the local gradient as backward produces it, before DDP's or
  anyone's averaging sees it.
- torch's global optimizer step hooks: before step s <= K, the local gradient sums and the
  gradients the step applies; before step 1 and after steps 1, 2, K (and every N), a fingerprint
  of the trained parameters and of the buffers of the modules that own them, named by their path
  in the outermost module (found once, at the first step).
- ``DistributedDataParallel.__init__`` (patched) adds a forward pre-hook that counts training
  forwards and hashes each sample of the first K forwards' first input; only the samples that a
  DataLoader of this rank yielded (``_BaseDataLoaderIter.__next__``, patched, hashes its first
  batches' samples) are kept: random inputs such as a GAN's noise are not training data.
- ``torch.save`` to a path is a write the ``open`` audit event does not show (torch writes it
  from C++): noted with its start and end time.
"""

from __future__ import annotations

import contextlib
import functools
import gc
import os
import weakref
from typing import Any

from . import _files, _fingerprint
from ._singleton import Singleton


class _State:
    def __init__(self, rec: Any):
        self.rec = rec
        self.k = rec.conf.steps
        self.every = rec.conf.every
        self.optimizers: list[weakref.ref[Any]] = []
        self.index: dict[int, int] = {}  # id(optimizer) -> creation order
        self.steps: list[int] = []
        self.hooks: list[list[Any]] = []
        self.local: list[dict[int, Any]] = []  # per optimizer: id(param) -> [sum, sum|x|] so far
        self.names: dict[int, str] = {}
        # name, tensor, why ranks may differ ("broadcast", "statistics" or "": they must agree)
        self.buffers: list[tuple[str, weakref.ref[Any], str]] = []
        self.named = False
        self.forwards = 0
        self.ddp: list[weakref.ref[Any]] = []
        self.loader_batches = 0
        self.loader_samples: set[str] = set()  # hashes of the samples DataLoaders yielded


_get: Singleton[_State] = Singleton(_State, lambda record: _end(record))


# --------------------------------------------------------------------------------------------
# Optimizers


def patch_optimizer(rec: Any, module: Any) -> None:
    state = _get(rec)
    cls = module.Optimizer
    init = cls.__init__

    @functools.wraps(init)
    def audited_init(self: Any, *args: Any, **kwargs: Any) -> None:
        init(self, *args, **kwargs)
        with contextlib.suppress(Exception):
            _register(state, self)

    cls.__init__ = audited_init
    module.register_optimizer_step_pre_hook(lambda opt, a, k: _guarded(_before_step, state, opt))
    module.register_optimizer_step_post_hook(lambda opt, a, k: _guarded(_after_step, state, opt))


def _guarded(fn: Any, *args: Any) -> None:
    try:
        fn(*args)
    except Exception as error:  # the audit must never break the job
        import sys

        print(f"sdp audit: {fn.__name__} failed: {error!r}", file=sys.stderr)


def _register(state: _State, opt: Any) -> int:
    key = id(opt)
    if key in state.index and state.optimizers[state.index[key]]() is opt:
        return state.index[key]
    i = len(state.optimizers)
    state.index[key] = i
    state.optimizers.append(weakref.ref(opt))
    state.steps.append(0)
    state.local.append({})
    handles = []
    for p in _params(opt):
        handles.append(p.register_hook(functools.partial(_local_grad, state, i, id(p))))
    state.hooks.append(handles)
    return i


def _params(opt: Any) -> list[Any]:
    return [p for g in opt.param_groups for p in g["params"] if getattr(p, "requires_grad", False)]


def _local_grad(state: _State, i: int, key: int, grad: Any) -> None:
    if grad is None or state.steps[i] >= state.k:
        return None
    with contextlib.suppress(Exception):
        pair = _fingerprint.grads(grad)
        old = state.local[i].get(key)
        state.local[i][key] = pair if old is None else [old[0] + pair[0], old[1] + pair[1]]
    return None


def _before_step(state: _State, opt: Any) -> None:
    i = _register(state, opt)
    step = state.steps[i] + 1
    if step > state.k:
        return
    params = _params(opt)
    if not state.named:
        _name_params(state, params)
    name = functools.partial(_name, state)
    if step == 1:
        _weights(state, i, params, 0)
    local = state.local[i]
    state.local[i] = {}
    state.rec.emit({"kind": "grads", "opt": i, "step": step,
                    "local": {name(p): local[id(p)] for p in params if id(p) in local},
                    "applied": {name(p): _fingerprint.grads(p.grad) for p in params
                                if p.grad is not None}})


def _after_step(state: _State, opt: Any) -> None:
    i = _register(state, opt)
    state.steps[i] += 1
    step = state.steps[i]
    if step in (1, 2, state.k) or (state.every and step % state.every == 0):
        _weights(state, i, _params(opt), step)
    if step == state.k:
        for handle in state.hooks[i]:
            handle.remove()
        state.hooks[i] = []


def _weights(state: _State, i: int, params: list[Any], step: int) -> None:
    name = functools.partial(_name, state)
    tensors = {name(p): _fingerprint.weights(p) for p in params}
    state.rec.emit({"kind": "weights", "opt": i, "step": step, "params": tensors,
                    "buffers": _buffers(state)})


def _buffers(state: _State) -> dict[str, Any]:
    out = {}
    for bname, ref, why in state.buffers:
        b = ref()
        if b is not None:
            out[bname] = _fingerprint.weights(b) + [why]
    return out


def _name(state: _State, p: Any) -> str:
    return state.names.get(id(p)) or f"<parameter {tuple(p.shape)} #{id(p) % 100000}>"


def _name_params(state: _State, params: list[Any]) -> None:
    """Name the trained parameters by their path in the outermost module that holds them, and
    find those modules' buffers. One look over the live objects, at the first step."""
    import torch

    state.named = True
    wanted = {id(p) for p in params}
    module_type = torch.nn.Module
    modules = [m for m in gc.get_objects() if issubclass(type(m), module_type)]
    children = {id(c) for m in modules for c in m.children()}
    roots = [m for m in modules if id(m) not in children]
    roots.sort(key=lambda m: not isinstance(m, torch.nn.parallel.DistributedDataParallel))
    for root in roots:
        named = list(root.named_parameters())
        if not any(id(p) in wanted for _, p in named):
            continue
        is_ddp = isinstance(root, torch.nn.parallel.DistributedDataParallel)
        broadcast = is_ddp and bool(getattr(root, "broadcast_buffers", False))
        for pname, p in named:
            state.names.setdefault(id(p), _strip(pname, is_ddp))
        statistics = _statistics(root)
        for bname, b in root.named_buffers():
            if b is not None and all(n != _strip(bname, is_ddp) for n, _, _ in state.buffers):
                why = "broadcast" if broadcast else "statistics" if id(b) in statistics else ""
                state.buffers.append((_strip(bname, is_ddp), weakref.ref(b), why))


def _statistics(root: Any) -> set[int]:
    """The running statistics of the norm layers in ``root``: each rank's forwards update them
    with its own batches (kept per rank, as in Horovod), unless SyncBatchNorm computes them
    over all ranks."""
    import torch

    norm = torch.nn.modules.batchnorm._NormBase
    sync = torch.nn.SyncBatchNorm
    out = set()
    for m in root.modules():
        if isinstance(m, norm) and not isinstance(m, sync):
            out |= {id(b) for b in (m.running_mean, m.running_var) if b is not None}
    return out


def _strip(name: str, is_ddp: bool) -> str:
    return name[len("module."):] if is_ddp and name.startswith("module.") else name


def _end(record: dict[str, Any]) -> None:
    state = _get.current()
    if state is None:
        return
    record["torch_steps"] = list(state.steps)
    record["forwards"] = state.forwards
    record["torch_buffers"] = _buffers(state)
    for i, ref in enumerate(state.optimizers):
        opt = ref()
        if opt is not None and state.steps[i]:
            params = _params(opt)
            name = functools.partial(_name, state)
            record.setdefault("torch_weights", {})[str(i)] = {
                name(p): _fingerprint.weights(p) for p in params}


# --------------------------------------------------------------------------------------------
# DDP


def patch_ddp(rec: Any, module: Any) -> None:
    state = _get(rec)
    cls = module.DistributedDataParallel
    init = cls.__init__

    @functools.wraps(init)
    def audited_init(self: Any, *args: Any, **kwargs: Any) -> None:
        init(self, *args, **kwargs)
        with contextlib.suppress(Exception):
            state.ddp.append(weakref.ref(self))
            self.register_forward_pre_hook(functools.partial(_forward, state), with_kwargs=True)

    cls.__init__ = audited_init


def _forward(state: _State, module: Any, args: Any, kwargs: Any) -> None:
    import torch

    if not module.training or not torch.is_grad_enabled():
        return None
    state.forwards += 1
    if state.forwards > state.k:
        return None
    with contextlib.suppress(Exception):
        first = next((a for a in (*args, *kwargs.values()) if isinstance(a, torch.Tensor)), None)
        if first is not None:
            # Only samples a DataLoader of this rank yielded: inputs drawn at random (a GAN's
            # noise, alike on every rank when seeded alike) are not the training data.
            hashes = [h for h in _fingerprint.samples(first) if h in state.loader_samples]
            if hashes:
                state.rec.emit({"kind": "inputs", "step": state.forwards, "samples": hashes})
    return None


def patch_loader(rec: Any, module: Any) -> None:
    """Hash the samples of the first batches DataLoaders yield (compared with DDP's inputs)."""
    state = _get(rec)
    cls = module._BaseDataLoaderIter
    next_ = cls.__next__

    @functools.wraps(next_)
    def audited_next(self: Any) -> Any:
        batch = next_(self)
        if state.forwards < state.k and state.loader_batches < 8 * state.k:
            state.loader_batches += 1
            with contextlib.suppress(Exception):
                first = _first_tensor(batch)
                if first is not None:
                    state.loader_samples.update(_fingerprint.samples(first))
        return batch

    cls.__next__ = audited_next


def _first_tensor(batch: Any) -> Any:
    import torch

    if isinstance(batch, torch.Tensor):
        return batch
    if isinstance(batch, dict):
        batch = list(batch.values())
    if isinstance(batch, (list, tuple)):
        return next((b for b in batch if isinstance(b, torch.Tensor)), None)
    return None


# --------------------------------------------------------------------------------------------
# torch.save


def patch_save(rec: Any, module: Any) -> None:
    save = module.save

    @functools.wraps(save)
    def audited_save(obj: Any, f: Any, *args: Any, **kwargs: Any) -> Any:
        if not isinstance(f, (str, os.PathLike)):
            return save(obj, f, *args, **kwargs)
        started = _files.now()
        try:
            return save(obj, f, *args, **kwargs)
        finally:
            _files.note_write(rec, f, "torch.save", started, _files.now())

    module.save = audited_save
    with contextlib.suppress(Exception):
        import torch

        if getattr(torch, "save", None) is save:
            torch.save = audited_save
