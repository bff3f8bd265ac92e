"""The audit's PyTorch hooks: optimizers (every ``torch.optim.Optimizer``), DDP, DataLoaders,
``torch.save``.

- ``Optimizer.__init__`` (patched) registers each optimizer, with the line of the user's code
  that made it, and, for the first K steps, a hook on each of its parameters that sums the local
  gradient as backward produces it, before DDP's or anyone's averaging sees it.
- torch's global optimizer step hooks: before step s <= K, the local gradient sums and the
  gradients the step applies; before step 1 and after steps 1, 2, K (and every N), a fingerprint
  of the trained parameters and of the buffers of the modules that own them, named by their path
  in the outermost module (found once per optimizer, at its first step). At that first step the
  script's own names are found too (``_names``): the expression that reaches each module
  (``trainer.model.body``), the optimizer, the DDP wrappers and the DataLoaders.
- ``DistributedDataParallel.__init__`` (patched) notes where the wrapper was made and which
  parameters it holds, and adds a forward pre-hook that counts training forwards. For the first
  K steps, a gradient that reaches a parameter of a wrapped module in a step with no forward of
  its wrapper is a bypass (``model.module.compute_loss(x)``, ``model.encode(x)``: DDP averages
  nothing); torch's global module hooks (for those K steps only: hooks on the model would be
  pickled with it) see the wrapped module or a child called while no wrapper's forward runs,
  and name the line of the user's code that made that call.
- ``DataLoader.__init__`` / ``__iter__`` and ``_BaseDataLoaderIter._next_index`` / ``__next__``
  (patched): where each loader was made, its sampler and data set; the sample indices of its
  first pass (mapped through ``Subset``\ s to the data set below), a hash of each sample of its
  first K batches, and whether an optimizer stepped right after one of its batches (a training
  loader, not a validation one). One record per loader at the end of its first pass.
- ``torch.save`` to a path is a write the ``open`` audit event does not show (torch writes it
  from C++): noted with its start and end time.
"""

from __future__ import annotations

import base64
import contextlib
import functools
import gc
import hashlib
import json
import linecache
import os
import weakref
from array import array
from typing import Any

from . import _files, _fingerprint, _names
from ._singleton import Singleton


class _State:
    def __init__(self, rec: Any):
        self.rec = rec
        self.k = rec.conf.steps
        self.every = rec.conf.every
        self.optimizers: list[weakref.ref[Any]] = []
        self.index: dict[int, int] = {}  # id(optimizer) -> creation order
        self.made: dict[int, str] = {}  # id(optimizer) -> where the user's code made it
        self.steps: list[int] = []
        self.hooks: list[list[Any]] = []
        self.local: list[dict[int, Any]] = []  # per optimizer: id(param) -> [sum, sum|x|] so far
        self.named_opts: set[int] = set()
        self.names: dict[int, str] = {}
        self.roots: dict[int, tuple[Any, str]] = {}  # id(param) -> (outermost module, path)
        # name, tensor, why ranks may differ ("broadcast", "statistics" or "": they must agree)
        self.buffers: list[tuple[str, weakref.ref[Any], str]] = []
        self.buffer_roots: dict[str, Any] = {}  # buffer name -> its outermost module
        self.forwards = 0
        # DDP wrappers, in creation order: where made, their parameters, their training
        # forwards, and (per optimizer) the DDPs whose parameters got a gradient in a step
        # without a forward of theirs
        self.ddp: list[weakref.ref[Any]] = []
        self.ddp_made: list[str] = []
        self.ddp_of: dict[int, int] = {}  # id(param) -> DDP index
        self.ddp_seq: list[int] = []  # training forwards so far
        self.ddp_mark: list[int] = []  # ddp_seq at the last step of an optimizer training it
        self.opt_ddps: list[set[int]] = []  # per optimizer: the DDPs it trains
        self.bypassed: list[set[int]] = []  # per optimizer, this step
        self.bypass_site: dict[int, dict[str, str]] = {}
        self.watching = True  # bypass call sites looked for (until the first K steps are done)
        self.inside = 0  # DDP forwards running
        self.watch_hooks: list[Any] = []
        self.wrappers: dict[int, int] = {}  # id(DDP) -> its index
        self.watched: dict[int, tuple[int, Any]] = {}  # id(wrapped module or child) -> DDP
        self.loaders: dict[int, _Loader] = {}  # id(DataLoader) -> its record
        self.loader_list: list[_Loader] = []
        self.last_loader: _Loader | None = None  # the last to yield a batch


_get: Singleton[_State] = Singleton(_State, lambda record: _end(record))


def _made_at(obj: Any) -> str:
    """Where the user's code made ``obj``: the innermost frame of the user's code that is not a
    method of ``obj`` itself (a subclass's ``__init__``)."""
    for frame in reversed(_names.user_frames(_files.is_user)):
        if frame.f_locals.get("self") is not obj:
            return _files.at(frame)
    return "?"


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
            state.made.setdefault(id(self), _made_at(self))
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
    state.opt_ddps.append(set())
    state.bypassed.append(set())
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
        j = state.ddp_of.get(key)
        if j is not None and state.ddp_seq[j] == state.ddp_mark[j]:
            state.bypassed[i].add(j)  # no forward of its wrapper since the last step
    return None


def _before_step(state: _State, opt: Any) -> None:
    last = state.last_loader
    if last is not None:  # the loader whose batch this step trains on
        last.trained = True
        state.last_loader = None
    i = _register(state, opt)
    step = state.steps[i] + 1
    if step > state.k:
        return
    params = _params(opt)
    if i not in state.named_opts:
        _name_params(state, params)
        _name_in_script(state, i, opt, params)
    name = functools.partial(_name, state)
    if step == 1:
        _weights(state, i, params, 0)
    local = state.local[i]
    state.local[i] = {}
    record: dict[str, Any] = {
        "kind": "grads", "opt": i, "step": step,
        "local": {name(p): local[id(p)] for p in params if id(p) in local},
        "applied": {name(p): _fingerprint.grads(p.grad) for p in params if p.grad is not None}}
    if state.bypassed[i]:
        record["bypassed"] = {str(j): state.bypass_site.get(j) for j in sorted(state.bypassed[i])}
        state.bypassed[i] = set()
    state.rec.emit(record)


def _after_step(state: _State, opt: Any) -> None:
    i = _register(state, opt)
    state.steps[i] += 1
    step = state.steps[i]
    if step <= state.k:
        for j in state.opt_ddps[i]:
            state.ddp_mark[j] = state.ddp_seq[j]
    if step in (1, 2, state.k) or (state.every and step % state.every == 0):
        _weights(state, i, _params(opt), step)
    if step == state.k:
        for handle in state.hooks[i]:
            handle.remove()
        state.hooks[i] = []
        _stop_watching(state)


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
    find those modules' buffers. One look over the live objects, at an optimizer's first step
    (none when an earlier look named all its parameters)."""
    import torch

    wanted = {id(p) for p in params if id(p) not in state.names}
    if not wanted:
        return
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
            if id(p) not in state.names:
                state.names[id(p)] = _strip(pname, is_ddp)
                state.roots[id(p)] = (root, _strip(pname, is_ddp))
        statistics = _statistics(root)
        for bname, b in root.named_buffers():
            if b is not None and all(n != _strip(bname, is_ddp) for n, _, _ in state.buffers):
                why = "broadcast" if broadcast else "statistics" if id(b) in statistics else ""
                state.buffers.append((_strip(bname, is_ddp), weakref.ref(b), why))
                state.buffer_roots[_strip(bname, is_ddp)] = weakref.ref(root)


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


# --------------------------------------------------------------------------------------------
# The script's own names


def _name_in_script(state: _State, i: int, opt: Any, params: list[Any]) -> None:
    """Emit, once per optimizer, what the findings about it will be said with: the script's
    expression for each parameter's module, for the optimizer, its DDP wrappers and the
    DataLoaders, and where the user's code made each."""
    import torch

    state.named_opts.add(i)
    ddps = {j: ref() for j, ref in enumerate(state.ddp)}
    for p in params:
        j = state.ddp_of.get(id(p))
        if j is not None:
            state.opt_ddps[i].add(j)
    roots = {id(root): root for root, _ in (state.roots.get(id(p), (None, "")) for p in params)
             if root is not None}
    buffers = {bname: root for bname, ref in state.buffer_roots.items()
               if (root := ref()) is not None and id(root) in roots}
    modules: dict[int, Any] = {}
    for root in roots.values():
        modules.update((id(m), m) for m in root.modules())
    loaders = {id(ref): info for info in state.loader_list
               if info.name is None and (ref := info.ref()) is not None}
    targets = {id(opt), *modules, *(id(d) for d in ddps.values() if d is not None), *loaders}
    tensor = torch.Tensor

    def children(obj: Any) -> Any:
        if isinstance(obj, torch.nn.Module):
            own = list(obj._modules.items())
            return own + [(k, v) for k, v in vars(obj).items()
                          if not k.startswith("_") and not isinstance(v, tensor)]
        return None

    found = _names.find(targets, _names.user_frames(_files.is_user),
                        skip=lambda o: isinstance(o, tensor), children=children)
    for ident, info in loaders.items():
        if ident in found:
            info.name = found[ident]
    shown: dict[str, str] = {}
    owners: dict[str, str] = {}
    wrapped: dict[str, int] = {}
    for bname, root in buffers.items():
        shown[bname] = _script_name(root, bname, found)[0] or bname
    for p in params:
        key = _name(state, p)
        shown[key], owner = _script_name(*state.roots.get(id(p), (None, "")), found)
        shown[key] = shown[key] or key
        if owner:
            owners[key] = owner
        if id(p) in state.ddp_of:
            wrapped[key] = state.ddp_of[id(p)]
    state.rec.emit({
        "kind": "names", "opt": i,
        "optimizer": {"name": found.get(id(opt)), "where": state.made.get(id(opt), "?"),
                      "class": type(opt).__name__,
                      "distributed": callable(getattr(type(opt), "_sdp_reduce", None))},
        "params": shown, "owners": owners, "wrapped": wrapped,
        "ddps": {str(j): {"name": found.get(id(d)), "where": state.ddp_made[j]}
                 for j, d in ddps.items() if d is not None and j in state.opt_ddps[i]}})


def _script_name(root: Any, path: str, found: dict[int, str]) -> tuple[str | None, str | None]:
    """``trainer.model.body.weight``: for the parameter or buffer at ``path`` in ``root``, the
    script's name of ``root`` (else of the nearest module on the path that has one) and the path
    below it; and the script's name of ``root`` (None when it has none).

    Under a DDP wrapper the wrapped module's own name is used when the script has one of its
    own (``net`` in ``model = DDP(net)``), else the wrapper's (``model.body``, not
    ``model.module.body``).
    """
    import torch

    if root is None:
        return None, None
    module = root
    if isinstance(root, torch.nn.parallel.DistributedDataParallel):
        inner = found.get(id(root.module))
        if inner is not None and (id(root) not in found or inner != found[id(root)] + ".module"):
            module = root.module
    owner = found.get(id(module))
    parts = path.split(".")
    for n in range(len(parts)):
        if id(module) in found:
            shown = found[id(module)]
            for part in parts[n:]:
                shown = _names.key(shown, part)
            return shown, owner
        module = module._modules.get(parts[n]) if n < len(parts) - 1 else None
        if module is None:
            break
    return None, owner


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
            _register_ddp(state, self)

    cls.__init__ = audited_init


def _register_ddp(state: _State, ddp: Any) -> None:
    j = len(state.ddp)
    state.ddp.append(weakref.ref(ddp))
    state.ddp_made.append(_made_at(ddp))
    state.ddp_seq.append(0)
    state.ddp_mark.append(0)
    for p in ddp.module.parameters():
        state.ddp_of.setdefault(id(p), j)
    ddp.register_forward_pre_hook(functools.partial(_forward, state, j), with_kwargs=True)
    if not state.watching:
        return
    # While the first K steps run: is the wrapped module (or a child) called outside a forward
    # of its wrapper? The first such call names the line of the user's code that made it.
    # torch's global module hooks, not hooks on the model: those would be pickled with it
    # (torch.save(model)), and they go when the first K steps are done.
    state.wrappers[id(ddp)] = j
    inner = ddp.module
    for m in (inner, *inner.children()):
        state.watched.setdefault(id(m), (j, weakref.ref(inner)))
    if not state.watch_hooks:
        from torch.nn.modules import module as nn_module

        state.watch_hooks = [
            nn_module.register_module_forward_pre_hook(functools.partial(_module_call, state)),
            nn_module.register_module_forward_hook(functools.partial(_module_done, state),
                                                   always_call=True)]


def _forward(state: _State, j: int, module: Any, args: Any, kwargs: Any) -> None:
    import torch

    if not torch.is_grad_enabled():
        return None
    state.ddp_seq[j] += 1  # a forward that can carry gradients (in eval mode too: frozen BN)
    if module.training:
        state.forwards += 1
    return None


def _module_call(state: _State, module: Any, args: Any) -> None:
    """Any module's call, in the first K steps: a wrapper's forward begins, or a wrapped module
    is called outside one (the first such call per wrapper is kept)."""
    key = id(module)
    if key in state.wrappers:
        state.inside += 1
        return None
    watched = state.watched.get(key)
    if watched is None or state.inside:
        return None
    import torch

    j, inner = watched
    if j not in state.bypass_site and torch.is_grad_enabled():
        with contextlib.suppress(Exception):
            state.bypass_site[j] = _call_site(inner())
    return None


def _module_done(state: _State, module: Any, args: Any, output: Any) -> None:
    if id(module) in state.wrappers:
        state.inside = max(0, state.inside - 1)
    return None


def _call_site(inner: Any) -> dict[str, str]:
    """The line of the user's code that called into ``inner`` (the model under a wrapper),
    past the model's own methods (``compute_loss`` calling ``self.encode``)."""
    own = {id(m) for m in inner.modules()} if inner is not None else set()
    for frame in reversed(_names.user_frames(_files.is_user)):
        if id(frame.f_locals.get("self")) not in own:
            code = linecache.getline(frame.f_code.co_filename, frame.f_lineno).strip()
            return {"where": _files.at(frame), "code": code}
    return {"where": "?", "code": ""}


def _stop_watching(state: _State) -> None:
    if not state.watching:
        return
    state.watching = False
    for handle in state.watch_hooks:
        handle.remove()
    state.watch_hooks = []
    state.watched = {}
    state.inside = 0


# --------------------------------------------------------------------------------------------
# DataLoaders


class _Loader:
    """One DataLoader: where it was made, its sampler and data set, its first pass."""

    def __init__(self, state: _State, loader: Any):
        self.index = len(state.loader_list)
        self.ref = weakref.ref(loader)
        self.where = _made_at(loader)
        self.name: str | None = None
        self.started = False  # its first pass began
        self.emitted = False
        self.trained = False  # an optimizer stepped right after one of its batches
        self.k = state.k
        self.batches = 0  # of the first pass
        self.first: list[Any] = []  # the indices of its first K batches
        self.read: array | None = array("q")  # its indices (None: not whole numbers)
        self.hashes: list[list[Any]] = []  # per batch: [[base index or None, hash], ...]
        self.yielded = 0
        self.desc: dict[str, Any] = {}
        self.chain: list[Any] = []  # Subset indices, outermost first
        self.plan: Any = None  # the indices one pass reads, when the sampler says so

    def describe(self, loader: Any) -> None:
        """The loader's sampler and the data set under its Subsets (at its first pass)."""
        from torch.utils.data import BatchSampler, Subset

        ds = loader.dataset
        while isinstance(ds, Subset):
            self.chain.append(ds.indices)
            ds = ds.dataset
        try:
            length: int | None = len(ds)
        except Exception:
            length = None
        batch_sampler = loader.batch_sampler
        custom = batch_sampler is not None and type(batch_sampler) is not BatchSampler
        sampler = batch_sampler if custom else loader.sampler
        replicas = getattr(sampler, "num_replicas", None)
        replica = getattr(sampler, "rank", None)
        self.desc = {"sampler": type(sampler).__name__,
                     "split": isinstance(replicas, int) and replicas > 1,
                     "replicas": replicas if isinstance(replicas, int) else None,
                     "replica": replica if isinstance(replica, int) else None,
                     "dataset": type(ds).__name__, "len": length, "content": _content(ds),
                     # drawing with replacement (RandomSampler(replacement=True), a
                     # WeightedRandomSampler): independent draws meet by chance
                     "replacement": getattr(sampler, "replacement", False) is True}
        self.plan = _plan(loader, sampler, custom)

    def take(self, index: Any) -> None:
        """The indices of one batch of the first pass (per batch: keep it short)."""
        self.batches += 1
        if len(self.first) < self.k:
            self.first.append(index)
        read = self.read
        if read is not None:
            try:
                if type(index) is int:
                    read.append(index)
                else:
                    read.extend(index)
            except Exception:
                self.read = None  # a sampler of keys, not positions

    def base(self, index: Any) -> Any:
        for indices in self.chain:
            index = int(indices[index])
        return index

    def record(self, complete: bool) -> dict[str, Any]:
        indices: Any = self.read
        how = "read"
        if not complete and self.plan is not None:
            indices, how = self.plan, "planned"
        epoch = None
        if indices is not None and len(indices):
            with contextlib.suppress(Exception):
                epoch = _index_set(self._bases(indices), self.desc.get("len"))
                epoch["how"] = how
        return {"kind": "loader", "loader": self.index, "where": self.where, "name": self.name,
                "trained": self.trained, "complete": complete, "batches": self.batches,
                **self.desc, "epoch": epoch, "first": self.hashes}

    def _bases(self, indices: Any) -> Any:
        """``indices`` mapped through the Subsets to the data set below them (numpy)."""
        import numpy as np

        if isinstance(indices, range):
            flat = np.arange(indices.start, indices.stop, indices.step, dtype=np.int64)
        else:
            flat = np.asarray(indices, dtype=np.int64)
        for chain in self.chain:
            flat = np.asarray(chain, dtype=np.int64)[flat]
        return flat


def _content(ds: Any) -> str | None:
    """A short hash of what a data set holds, from values read without calling it (its
    tensors, or its ``data``/``targets``/``samples`` attributes), or None."""
    import torch

    parts = []
    held = list(getattr(ds, "tensors", ()) or ())
    held += [getattr(ds, a, None) for a in ("data", "targets", "samples", "imgs", "labels")]
    for value in held:
        if isinstance(value, torch.Tensor):
            parts.append([list(value.shape), str(value.dtype), _fingerprint.strided(value)])
        elif hasattr(value, "shape") and hasattr(value, "dtype"):
            with contextlib.suppress(Exception):
                parts.append([list(value.shape), str(value.dtype),
                              _fingerprint.strided(torch.as_tensor(value))])
        elif isinstance(value, (list, tuple)) and value:
            step = max(1, len(value) // 64)
            parts.append([len(value), [repr(v) for v in value[::step][:64]]])
    if not parts:
        return None
    return hashlib.blake2b(json.dumps(parts, default=str).encode(), digest_size=8).hexdigest()


def _plan(loader: Any, sampler: Any, custom: bool) -> Any:
    """The indices every pass of ``loader`` reads, when its sampler says so without being run
    (running a RandomSampler would draw from the script's random numbers): all of them for a
    SequentialSampler or a RandomSampler without replacement, a SubsetRandomSampler's own."""
    from torch.utils.data import RandomSampler, SequentialSampler, SubsetRandomSampler

    if custom or getattr(loader, "drop_last", False):
        return None
    if isinstance(sampler, SubsetRandomSampler):
        return sampler.indices
    whole = isinstance(sampler, SequentialSampler) or (
        isinstance(sampler, RandomSampler) and not sampler.replacement
        and sampler.num_samples == len(sampler.data_source))
    return range(len(loader.dataset)) if whole else None


def _index_set(flat: Any, length: int | None) -> dict[str, Any]:
    """The distinct sample indices of a pass (numpy): a bitmap over ``length`` (base64, bit i
    of byte i // 8 for index i), or a list."""
    import numpy as np

    distinct = np.unique(flat)
    out: dict[str, Any] = {"reads": int(flat.size), "distinct": int(distinct.size)}
    if length is not None and distinct.size and distinct[0] >= 0 and distinct[-1] < length:
        bits = np.zeros(length, dtype=bool)
        bits[distinct] = True
        out["bits"] = base64.b64encode(np.packbits(bits, bitorder="little").tobytes()).decode()
        out["len"] = length
    else:
        out["list"] = distinct.tolist()
    return out


def patch_loader(rec: Any, module: Any) -> None:
    """Where each DataLoader is made, the indices of its first pass, hashes of the samples of
    its first batches, and whether an optimizer steps on its batches."""
    state = _get(rec)
    loader_cls = module.DataLoader
    init, iter_ = loader_cls.__init__, loader_cls.__iter__

    @functools.wraps(init)
    def audited_init(self: Any, *args: Any, **kwargs: Any) -> None:
        init(self, *args, **kwargs)
        with contextlib.suppress(Exception):
            info = _Loader(state, self)
            state.loaders[id(self)] = info
            state.loader_list.append(info)

    @functools.wraps(iter_)
    def audited_iter(self: Any) -> Any:
        it = iter_(self)
        info = state.loaders.get(id(self))
        if info is not None and info.ref() is self and isinstance(it, iter_cls):
            with contextlib.suppress(Exception):
                it._sdp_loader = info
                if not info.started:
                    info.started = True
                    info.describe(self)
                    it._sdp_collect = info
        return it

    loader_cls.__init__ = audited_init
    loader_cls.__iter__ = audited_iter

    iter_cls = module._BaseDataLoaderIter
    next_index, next_ = iter_cls._next_index, iter_cls.__next__
    iter_cls._sdp_loader = None  # the loader's record (instances made by a DataLoader's iter)
    iter_cls._sdp_collect = None  # the same, while its first pass runs

    @functools.wraps(next_index)
    def audited_next_index(self: Any) -> Any:
        index = next_index(self)
        info = self._sdp_collect
        if info is not None:
            info.take(index)
        return index

    @functools.wraps(next_)
    def audited_next(self: Any) -> Any:
        try:
            batch = next_(self)
        except StopIteration:
            info = self._sdp_collect
            if info is not None:
                self._sdp_collect = None
                _emit_loader(state, info, complete=True)
            raise
        info = self._sdp_loader
        if info is not None:
            state.last_loader = info
            if info.yielded < state.k and self._sdp_collect is not None:
                with contextlib.suppress(Exception):
                    _hash_batch(info, batch)
            info.yielded += 1
        return batch

    iter_cls._next_index = audited_next_index
    iter_cls.__next__ = audited_next


def _hash_batch(info: _Loader, batch: Any) -> None:
    first = _first_tensor(batch)
    if first is None:
        return
    hashes = _fingerprint.samples(first)
    b = info.yielded
    indices = info.first[b] if b < len(info.first) else None
    if not isinstance(indices, (list, tuple)) or len(indices) != len(hashes):
        indices = [None] * len(hashes)
    info.hashes.append([[info.base(i) if isinstance(i, int) else None, h]
                        for i, h in zip(indices, hashes, strict=True)])


def _emit_loader(state: _State, info: _Loader, complete: bool) -> None:
    if info.emitted or not info.yielded:
        return
    info.emitted = True
    try:
        state.rec.emit(info.record(complete))
    except Exception as error:
        import sys

        print(f"sdp audit: loader record failed: {error!r}", file=sys.stderr)
    info.read = None


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
# The end, and torch.save


def _end(record: dict[str, Any]) -> None:
    state = _get.current()
    if state is None:
        return
    for info in state.loader_list:
        if info.started and not info.emitted:
            _emit_loader(state, info, complete=False)
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
