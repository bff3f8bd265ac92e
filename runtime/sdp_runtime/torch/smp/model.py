"""``smp.DistributedModel``, ``smp.DistributedOptimizer`` and ``smp.partition``.

Plain data parallelism (one partition, nothing sharded): the model is wrapped in sdp_runtime's
``DistributedDataParallel`` (gradients averaged over the data-parallel ranks; on one process the
model is only called). More than one partition, tensor parallelism or sharded data parallelism:
the model's parameters are sharded with PyTorch FSDP2 (``fully_shard``) over the ranks of one
model replica (the MP_GROUP; with several replicas, hybrid sharding: replicated across them).
Each ``smp.partition(i)`` block becomes one FSDP unit (its parameters gathered together, as one
pipeline stage would hold them); without partition hints (SMP's auto-partition) the top-level
children are cut into ``partitions`` consecutive groups of about equal parameter count. Every
rank of a replica gets the same batch (SMP scripts shard their data by ``dp_rank()``), so the
result equals data parallelism over the replicas, within float tolerance.

``state_dict()`` is the whole model's, with the plain module's keys (loads into the model without
SMP); ``local_state_dict()`` is this rank's shard, marked ``_smp_is_partial``.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator, Mapping
from typing import Any

import torch
from torch import nn

from ... import _comm
from ..ddp import DistributedDataParallel
from . import state

PARTIAL_KEY = "_smp_is_partial"

_local = threading.local()
_model: DistributedModel | None = None
_optimizer: Any = None


# -- partition hints ------------------------------------------------------------------------------

def _tag(module: nn.Module, name: str, submodule: nn.Module | None) -> None:
    index = getattr(_local, "partition", None)
    if index is not None and submodule is not None and not hasattr(submodule, "_smp_partition"):
        submodule._smp_partition = index  # type: ignore[assignment]


_hook_installed = False


@contextlib.contextmanager
def partition(index: int) -> Iterator[None]:
    """Place the modules created inside the block in partition ``index`` (SMP's manual
    partitioning). Here a partition is one FSDP unit when the model is sharded; otherwise the
    block only runs its body.

    Arguments:
        index: the partition, from 0 to ``partitions - 1``.

    Example:
        >>> with smp.partition(0):
        ...     self.encoder = Encoder()
    """
    global _hook_installed
    if not _hook_installed:
        nn.modules.module.register_module_module_registration_hook(_tag)
        _hook_installed = True
    outer = getattr(_local, "partition", None)
    _local.partition = int(index)
    try:
        yield
    finally:
        _local.partition = outer


def set_partition(module: nn.Module, index: int) -> None:
    """Place ``module`` in partition ``index``, as ``with smp.partition(index):`` around its
    creation would (SMP's manual partitioning of a module made elsewhere).

    Arguments:
        module: a submodule of the model, before ``smp.DistributedModel`` wraps it.
        index: the partition, from 0 to ``partitions - 1``.

    Example:
        >>> for i, layer in enumerate(model.transformer.h):
        ...     smp.set_partition(layer, i * smp.pp_size() // len(model.transformer.h))
    """
    module._smp_partition = int(index)  # type: ignore[assignment]


def set_activation_checkpointing(module: nn.Module, preserve_rng_state: bool = True,
                                 pack_args_as_tuple: bool = False,
                                 strategy: str = "each") -> None:
    """Recompute ``module``'s activations in the backward pass instead of keeping them
    (``torch.utils.checkpoint``, non-reentrant): less memory, the same gradients. An
    ``nn.Sequential`` or ``nn.ModuleList`` has each of its children checkpointed (SMP's
    ``strategy="each"``; the grouping strategies checkpoint each child too).

    Arguments:
        module: a submodule of the model.
        preserve_rng_state: replay the random state (dropout) in the recomputation.
        pack_args_as_tuple, strategy: SMP's options; see above.

    Example:
        >>> for layer in model.get_module().transformer.h:
        ...     smp.set_activation_checkpointing(layer)
    """
    if isinstance(module, (nn.Sequential, nn.ModuleList)):
        for child in module.children():
            set_activation_checkpointing(child, preserve_rng_state)
        return
    if getattr(module, "_smp_checkpointed", False):
        return
    from torch.utils.checkpoint import checkpoint

    forward = module.forward

    def checkpointed(*args: Any, **kwargs: Any) -> Any:
        if not torch.is_grad_enabled():
            return forward(*args, **kwargs)
        return checkpoint(forward, *args, use_reentrant=False,
                          preserve_rng_state=preserve_rng_state, **kwargs)

    module.forward = checkpointed  # type: ignore[method-assign]
    module._smp_checkpointed = True  # type: ignore[assignment]


@contextlib.contextmanager
def tensor_parallelism(enabled: bool = True, **config: Any) -> Iterator[None]:
    """SMP's tensor-parallel block; here the sharding is FSDP's, so it only runs its body."""
    yield


@contextlib.contextmanager
def model_creation(tensor_parallelism: bool = False, dtype: torch.dtype | None = None,
                   **config: Any) -> Iterator[None]:
    """SMP's model-creation block: creates the model in ``dtype`` when one is given."""
    previous = torch.get_default_dtype()
    if dtype is not None and dtype.is_floating_point:
        torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(previous)


@contextlib.contextmanager
def delay_param_initialization(enabled: bool = True) -> Iterator[None]:
    """SMP's delayed initialisation; parameters are created at once here."""
    yield


# -- the model ------------------------------------------------------------------------------------

class DistributedModel(nn.Module):
    """The model, trained data-parallel, or sharded with FSDP when the configuration asks for
    partitions, tensor parallelism or sharded data parallelism.

    Arguments:
        module: the model.
        average_grads_across_microbatches: divide each microbatch's gradient by the number of
            microbatches (default True; False sums them, for losses summed over the batch).
        broadcast_buffers, bucket_cap_mb, gradient_as_bucket_view: given to DDP.
        **ignored: SMP's tracing options (``trace_device``, ...), which mean nothing here.

    Example:
        >>> model = smp.DistributedModel(Net())
        >>> @smp.step
        ... def train_step(model, x, y):
        ...     loss = F.nll_loss(model(x), y)
        ...     model.backward(loss)
        ...     return loss
    """

    def __init__(self, module: nn.Module, average_grads_across_microbatches: bool = True,
                 broadcast_buffers: bool = True, bucket_cap_mb: float = 25,
                 gradient_as_bucket_view: bool = False, **ignored: Any) -> None:
        global _model
        super().__init__()
        layout = state.layout()
        dev = _comm.device()
        if dev.type == "cuda":
            module = module.to(dev)
        self.module = module
        self.average_grads_across_microbatches = average_grads_across_microbatches
        self.partitioned = True
        self._scale = 1.0
        self._fsdp = layout.config.sharded and layout.size > 1
        #: {name: parameter} before sharding, so that an optimizer made earlier can be moved on.
        self._names = {id(p): n for n, p in module.named_parameters()}
        if layout.size > 1:
            _comm.broadcast_(list(module.state_dict().values()), root_rank=0)
        if self._fsdp:
            _shard(module, layout)
            engine: nn.Module = module
        elif layout.size > 1:
            options: dict[str, Any] = {"bucket_cap_mb": bucket_cap_mb,
                                       "gradient_as_bucket_view": gradient_as_bucket_view}
            if not broadcast_buffers:  # (torch warns that the argument is deprecated)
                options["broadcast_buffers"] = False
            engine = DistributedDataParallel(module, **options)
        else:
            engine = module
        self.__dict__["_sdp_engine"] = engine  # not a submodule: state dicts keep the module's keys
        _model = self

    def get_module(self) -> nn.Module:
        """The model given to ``DistributedModel`` (sharded in place when the configuration
        shards it): its submodules and parameters are the ones that train.

        Example:
            >>> layers = model.get_module().transformer.h
        """
        return self.module

    @property
    def _engine(self) -> Any:
        """What runs the forward pass: DDP, the FSDP-sharded module, or the module."""
        return self.__dict__["_sdp_engine"]

    # -- forward and backward

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        return self._engine(*args, **kwargs)

    def backward(self, tensors: Any, grad_tensors: Any = None) -> None:
        """``torch.autograd.backward`` for a microbatch of a ``@smp.step``: its gradient counts
        ``1 / microbatches`` (see ``average_grads_across_microbatches``).

        Example:
            >>> model.backward(loss)
        """
        scale = self._scale * _loss_scale()
        if scale != 1.0:
            if grad_tensors is None:
                tensors = _scaled(tensors, scale)
            else:
                grad_tensors = _scaled(grad_tensors, scale)
        torch.autograd.backward(tensors, grad_tensors)

    @contextlib.contextmanager
    def microbatch(self, index: int, count: int) -> Iterator[None]:
        """Run microbatch ``index`` of ``count``: gradients are averaged across processes after
        the last one only."""
        last = index == count - 1
        self._scale = 1.0 / count if self.average_grads_across_microbatches else 1.0
        engine = self._engine
        try:
            if self._fsdp:
                engine.set_requires_gradient_sync(last)
                yield
            elif not last and isinstance(engine, DistributedDataParallel) and engine.communicates:
                with engine.no_sync():
                    yield
            else:
                yield
        finally:
            self._scale = 1.0
            if self._fsdp and not last:
                engine.set_requires_gradient_sync(True)

    # -- state

    def state_dict(self, *args: Any, **kwargs: Any) -> Any:  # type: ignore[override]
        """The whole model's state with the plain module's keys. Sharded: gathered from the
        ranks that shard this replica, which must all call it; called on some of them only
        (under ``if smp.rank() == 0:``), it raises ``CommunicationError`` naming the call after
        half of ``SDP_TIMEOUT`` seconds instead of hanging."""
        if self._fsdp:
            _meet_shards("model.state_dict()")
        full = self.module.state_dict(*args, **kwargs)
        if self._fsdp:
            for key, value in full.items():
                if hasattr(value, "full_tensor"):
                    full[key] = value.full_tensor().detach()
        return full

    def local_state_dict(self) -> dict[str, Any]:
        """This rank's part of the state (its shards when sharded), marked partial."""
        local = {k: v.to_local().detach() if hasattr(v, "to_local") else v
                 for k, v in self.module.state_dict().items()}
        local[PARTIAL_KEY] = True
        return local

    def load_state_dict(self, state_dict: Mapping[str, Any], strict: bool = True,
                        assign: bool = False) -> Any:  # type: ignore[override]
        """Load a whole state (``state_dict()``, or the plain model's), or this rank's
        ``local_state_dict()``."""
        values = dict(state_dict)
        partial = bool(values.pop(PARTIAL_KEY, False))
        if not self._fsdp:
            return self.module.load_state_dict(values, strict=strict)
        own = self.module.state_dict()
        missing = [k for k in own if k not in values]
        unexpected = [k for k in values if k not in own]
        if strict and (missing or unexpected):
            raise RuntimeError(f"DistributedModel.load_state_dict: missing keys {missing}, "
                               f"unexpected keys {unexpected}")
        with torch.no_grad():
            for key, target in own.items():
                if key not in values:
                    continue
                source = torch.as_tensor(values[key])
                if hasattr(target, "to_local"):
                    piece = source if partial else _local_piece(source, target)
                    target.to_local().copy_(piece)
                else:
                    target.copy_(source)
        return nn.modules.module._IncompatibleKeys(missing, unexpected)

    def local_parameters(self) -> Iterator[nn.Parameter]:
        """The parameters this rank holds (all of them unless sharded, then its shards)."""
        return self.module.parameters()

    def local_named_parameters(self) -> Iterator[tuple[str, nn.Parameter]]:
        return self.module.named_parameters()

    def local_modules(self) -> Iterator[nn.Module]:
        return self.module.modules()

    def local_named_modules(self) -> Iterator[tuple[str, nn.Module]]:
        return self.module.named_modules()

    def local_buffers(self) -> Iterator[torch.Tensor]:
        return self.module.buffers()

    def local_named_buffers(self) -> Iterator[tuple[str, torch.Tensor]]:
        return self.module.named_buffers()

    def register_post_partition_hook(self, hook: Any) -> Any:
        """Runs ``hook(model, optimizer)`` at once: the model is placed when it is wrapped."""
        hook(self, None)
        return _NoHandle()

    def moved_parameter(self, param: nn.Parameter) -> nn.Parameter:
        """The parameter that replaced ``param`` when the model was sharded (else ``param``)."""
        name = self._names.get(id(param))
        if name is None:
            return param
        return self.module.get_parameter(name)


class _NoHandle:
    def remove(self) -> None:
        pass


def _scaled(tensors: Any, scale: float) -> Any:
    if isinstance(tensors, torch.Tensor):
        return tensors * scale
    return [t * scale for t in tensors]


def _local_piece(full: torch.Tensor, target: Any) -> torch.Tensor:
    """This rank's piece of a whole tensor, laid out like the DTensor ``target``."""
    from torch.distributed.tensor import distribute_tensor

    full = full.to(device=target.device, dtype=target.dtype)
    return distribute_tensor(full, target.device_mesh, target.placements,
                             src_data_rank=None).to_local()


# -- sharding -------------------------------------------------------------------------------------

def _shard(module: nn.Module, layout: Any) -> None:
    """``fully_shard`` each partition's modules as one unit, then the whole model."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    dev = _comm.device().type
    if layout.replicas > 1:
        mesh = init_device_mesh(dev, (layout.replicas, layout.shard_size),
                                mesh_dim_names=("replicate", "shard"))
    else:
        mesh = init_device_mesh(dev, (layout.shard_size,), mesh_dim_names=("shard",))
    for group in _units(module, layout.config.partitions):
        fully_shard(group if len(group) > 1 else group[0], mesh=mesh)
    fully_shard(module, mesh=mesh)


def _units(module: nn.Module, partitions: int) -> list[list[nn.Module]]:
    """The groups of submodules to shard together, innermost first."""
    depth = {id(m): n.count(".") + 1 for n, m in module.named_modules() if n}
    tagged: dict[int, list[nn.Module]] = {}
    for name, sub in module.named_modules():
        index = getattr(sub, "_smp_partition", None)
        if not name or index is None or not _has_parameters(sub):
            continue
        parent = module.get_submodule(name.rpartition(".")[0]) if "." in name else module
        if getattr(parent, "_smp_partition", None) == index:
            continue  # inside a module of the same partition: sharded with it
        tagged.setdefault(index, []).append(sub)
    if tagged:
        groups = list(tagged.values())
        return sorted(groups, key=lambda g: -max(depth[id(m)] for m in g))
    children = [c for c in module.children() if _has_parameters(c)]
    if len(children) <= 1:
        return []
    if partitions <= 1:
        return [[c] for c in children]
    sizes = [sum(p.numel() for p in c.parameters()) for c in children]
    target = sum(sizes) / partitions
    groups_auto: list[list[nn.Module]] = [[]]
    running = 0.0
    for child, n in zip(children, sizes, strict=True):
        if groups_auto[-1] and running + n / 2 > target * len(groups_auto) \
                and len(groups_auto) < partitions:
            groups_auto.append([])
        groups_auto[-1].append(child)
        running += n
    return [g for g in groups_auto if g]


def _has_parameters(module: nn.Module) -> bool:
    return any(True for _ in module.parameters())


def current_model() -> DistributedModel | None:
    return _model


_GATHER_ADVICE = (
    "A sharded model (partitions, tensor or sharded data parallelism) gathers its whole state "
    "from every rank holding a shard: call state_dict() on every rank, outside any rank test, "
    "and let smp.save(state, path, partial=False) write it once (on rank 0)"
)


def _meet_shards(what: str) -> None:
    """Before gathering a sharded state: every rank sharding this replica must be here too."""
    layout = state.layout()
    first = layout.rank - layout.rank % layout.shard_size
    _comm.meet(what, range(first, first + layout.shard_size), _GATHER_ADVICE)


# -- the optimizer --------------------------------------------------------------------------------

def DistributedOptimizer(optimizer: torch.optim.Optimizer, static_loss_scale: float | None = 1.0,
                         dynamic_loss_scale: bool = False, **dynamic_loss_args: Any) -> Any:
    """The optimizer, with ``state_dict()`` for the whole model and ``local_state_dict()``,
    SMP's ``clip_master_grads(max_norm)`` and ``overflow``, and SMP's loss scaling when the
    configuration has ``"fp16": True``.

    The same object is returned (a learning-rate scheduler keeps working). When the model was
    sharded after the optimizer was made, its parameters are replaced by the sharded ones.

    Arguments:
        optimizer: a torch optimizer over the model's parameters.
        static_loss_scale: the loss scale under ``"fp16": True`` (None: dynamic).
        dynamic_loss_scale: scale dynamically under ``"fp16": True``: start at ``init_scale``
            (2**32), divide by ``scale_factor`` (2) after an overflow (no lower than
            ``min_scale``, after ``delayed_shift`` overflows in a row), multiply by it after
            ``scale_window`` (1000) steps without one.
        **dynamic_loss_args: ``dynamic_loss_args={...}`` or those keys directly.

    Example:
        >>> optimizer = smp.DistributedOptimizer(torch.optim.Adam(model.parameters()))
    """
    global _optimizer
    model = _model
    if model is not None and model._fsdp:
        for group in optimizer.param_groups:
            group["params"] = [model.moved_parameter(p) for p in group["params"]]
    base = type(optimizer)
    if not getattr(base, "_sdp_smp", False):
        optimizer.__class__ = type(base.__name__, (base,), {
            "_sdp_smp": True,
            "state_dict": _optimizer_state_dict,
            "load_state_dict": _optimizer_load_state_dict,
            "local_state_dict": _optimizer_local_state_dict,
            "step": _optimizer_step,
            "clip_master_grads": _clip_master_grads,
            "overflow": property(lambda self: self._sdp_scaler.overflow),
        })
    args = dict(dynamic_loss_args.pop("dynamic_loss_args", None) or {}, **dynamic_loss_args)
    fp16 = bool((state.config().raw or {}).get("fp16"))
    optimizer._sdp_scaler = _LossScaler(  # type: ignore[attr-defined]
        fp16, static_loss_scale, dynamic_loss_scale or static_loss_scale is None, **args)
    _optimizer = optimizer
    return optimizer


def current_optimizer() -> Any:
    return _optimizer


def _loss_scale() -> float:
    optimizer = _optimizer
    return optimizer._sdp_scaler.scale if optimizer is not None else 1.0


class _LossScaler:
    """SMP's FP16 loss scaling: ``model.backward`` multiplies the loss by ``scale``; before the
    step the gradients are divided by it and checked on every process; a step with an inf/NaN
    gradient on any process is skipped everywhere (``overflow``) and the scale lowered."""

    def __init__(self, enabled: bool, static: float | None, dynamic: bool,
                 init_scale: float = 2.0**32, scale_factor: float = 2.0,
                 scale_window: int = 1000, min_scale: float = 1.0, delayed_shift: int = 1,
                 consecutive_hysteresis: bool = False, **ignored: Any) -> None:
        self.enabled = enabled
        self.dynamic = enabled and dynamic
        self.scale = (init_scale if self.dynamic else float(static or 1.0)) if enabled else 1.0
        self.factor, self.window, self.min_scale = scale_factor, scale_window, min_scale
        self.delayed_shift = self.hysteresis = max(1, int(delayed_shift))
        self.consecutive_hysteresis = consecutive_hysteresis
        self.good_steps = 0
        self.overflow = False
        self.unscaled = False

    def unscale(self, optimizer: torch.optim.Optimizer) -> bool:
        """Divide the gradients by the scale (once a step); True when one is inf/NaN on any
        process."""
        if self.unscaled:
            return self.overflow
        self.unscaled = True
        grads = [p.grad for g in optimizer.param_groups for p in g["params"]
                 if p.grad is not None]
        if not self.enabled:
            self.overflow = False
            return False
        found = torch.zeros((), device=_comm.device())
        for grad in grads:
            local = grad.to_local() if hasattr(grad, "to_local") else grad
            local.div_(self.scale)
            found = torch.maximum(found, (~torch.isfinite(local)).any().to(found.dtype))
        if _comm.size() > 1:
            torch.distributed.all_reduce(found, op=torch.distributed.ReduceOp.MAX)
        self.overflow = bool(found.item())
        return self.overflow

    def update(self) -> None:
        self.unscaled = False
        if not self.dynamic:
            return
        if self.overflow:
            self.good_steps = 0
            self.hysteresis -= 1
            if self.hysteresis <= 0:
                self.scale = max(self.scale / self.factor, self.min_scale)
                self.hysteresis = self.delayed_shift
            return
        if self.consecutive_hysteresis:
            self.hysteresis = self.delayed_shift
        self.good_steps += 1
        if self.good_steps % self.window == 0:
            self.scale *= self.factor
            self.hysteresis = self.delayed_shift


def _optimizer_step(self: Any, closure: Any = None) -> Any:
    """The step, skipped on every process when a scaled gradient overflowed (``overflow``)."""
    scaler = self._sdp_scaler
    try:
        if scaler.unscale(self):
            return None
        return super(type(self), self).step(closure)
    finally:
        scaler.update()


def _clip_master_grads(self: Any, max_norm: float, norm_type: float = 2.0) -> torch.Tensor:
    """Clip the gradients of the optimizer's parameters (of the whole model, sharded or not) to
    the global norm ``max_norm``, after unscaling them under FP16 (SMP's FP32 master
    gradients); returns the norm before clipping (inf after an overflow, nothing clipped).

    Example:
        >>> optimizer.clip_master_grads(1.0)
        >>> optimizer.step()
    """
    if self._sdp_scaler.unscale(self):
        return torch.tensor(float("inf"))
    params = [p for g in self.param_groups for p in g["params"] if p.grad is not None]
    norm = torch.nn.utils.clip_grad_norm_(params, max_norm, norm_type=norm_type)
    return norm.full_tensor() if hasattr(norm, "full_tensor") else norm


def _optimizer_state_dict(self: Any) -> dict[str, Any]:
    """The whole optimizer state (torch's layout: loads into the plain model's optimizer).
    Sharded: gathered, so every rank sharding the model must call it (see ``state_dict``)."""
    if any(hasattr(p, "device_mesh") for group in self.param_groups for p in group["params"]):
        _meet_shards("optimizer.state_dict()")
    sd = _own_state(super(type(self), self).state_dict())
    for values in sd["state"].values():
        for key, value in values.items():
            if hasattr(value, "full_tensor"):
                values[key] = value.full_tensor().detach()
    return sd


def _own_state(sd: dict[str, Any]) -> dict[str, Any]:
    """torch's ``state_dict()`` with its per-parameter dicts copied: torch hands out the live
    ones, and replacing a DTensor in them by its whole or local tensor would corrupt the state
    the next ``step()`` uses (a checkpoint saved mid-training)."""
    sd["state"] = {key: dict(values) for key, values in sd["state"].items()}
    return sd


def _optimizer_local_state_dict(self: Any) -> dict[str, Any]:
    sd = _own_state(super(type(self), self).state_dict())
    for values in sd["state"].values():
        for key, value in values.items():
            if hasattr(value, "to_local"):
                values[key] = value.to_local().detach()
    sd[PARTIAL_KEY] = True
    return sd


def _optimizer_load_state_dict(self: Any, state_dict: Mapping[str, Any]) -> None:
    sd = dict(state_dict)
    partial = bool(sd.pop(PARTIAL_KEY, False))
    params = [p for group in self.param_groups for p in group["params"]]
    if partial or any(hasattr(p, "device_mesh") for p in params):
        # partial: this shard's local tensors; else whole tensors, sharded like their parameter
        convert, fits = (_from_local, _local_like) if partial else (_as_dtensor, _like_param)

        def one(values: Mapping[str, Any], param: Any) -> dict[str, Any]:
            return {k: convert(v, param) if fits(v, param) else v for k, v in values.items()}

        sd["state"] = {i: one(values, params[int(i)]) for i, values in sd["state"].items()}
    super(type(self), self).load_state_dict(sd)


def _like_param(value: Any, param: Any) -> bool:
    return (isinstance(value, torch.Tensor) and hasattr(param, "device_mesh")
            and tuple(value.shape) == tuple(param.shape))


def _local_like(value: Any, param: Any) -> bool:
    return (isinstance(value, torch.Tensor) and hasattr(param, "device_mesh")
            and tuple(value.shape) == tuple(param.to_local().shape) and value.dim() > 0)


def _as_dtensor(value: torch.Tensor, param: Any) -> Any:
    from torch.distributed.tensor import DTensor

    return DTensor.from_local(_local_piece(value, param), param.device_mesh, param.placements,
                              run_check=False, shape=param.shape, stride=param.stride())


def _from_local(value: torch.Tensor, param: Any) -> Any:
    from torch.distributed.tensor import DTensor

    return DTensor.from_local(value.to(param.device), param.device_mesh, param.placements,
                              run_check=False, shape=param.shape, stride=param.stride())
