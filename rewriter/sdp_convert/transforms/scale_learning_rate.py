"""Scale the learning rate of every ``torch.optim`` optimizer by the number of processes.

Before::

    opt = optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    adam = Adam(net.parameters())
    groups = torch.optim.SGD([{"params": head, "lr": base + 0.1}, {"params": body}], lr=base)

After::

    opt = optim.SGD(model.parameters(), lr=args.lr * sdp.size(), momentum=0.9)
    adam = Adam(net.parameters(), lr=0.001 * sdp.size())
    groups = torch.optim.SGD([{"params": head, "lr": (base + 0.1) * sdp.size()}, {"params": body}],
                             lr=base * sdp.size())

Why: N processes each take a batch of B, so one step averages the gradient of N*B samples; the
linear scaling rule (Goyal et al.) keeps the single-GPU script's progress per sample by scaling
the learning rate by N. ``Options.lr_scaling`` picks ``"linear"`` (``* sdp.size()``), ``"sqrt"``
(``* sdp.size() ** 0.5``) or ``"none"``. The keyword or positional ``lr``, the ``"lr"`` of each
parameter group given as a literal, and an omitted ``lr`` (written out with torch's default) are
scaled, but only where the data of the loops that step that optimizer is split between the
ranks (``program.sharding.optimizer_data``: a DataLoader with, or getting, a DistributedSampler;
the file as a whole where those loops are not known): with unsharded data every rank averages the
same gradient and a scaled rate would step N times too far, so the rate stays and a manual note
says to scale it once the data is split (full-batch and reinforcement-learning scripts are named
as such). A file that trains one model on a sharded loader and fits another on the full batch
gets the first rate scaled only. Learning rates the converter cannot follow get a manual note:
``max_lr``/``base_lr`` of OneCycleLR and CyclicLR (they set the rate themselves), absolute floors
(``eta_min``, ``min_lr``, ``swa_lr``), writes into ``param_groups``, an ``lr`` hidden in
``**kwargs``, and LBFGS. Schedulers that multiply the rate (StepLR, LambdaLR, ...) keep working
on the scaled one. An ``lr`` that already involves the world size is left alone.
"""

from __future__ import annotations

from collections.abc import Iterator

import libcst as cst

from ..base import Transform
from ..program.index import FileIndex, file_index, reaching_values
from ..program.optimizers import (
    _SCHEDULER_MODULES,
    lr_set_by_wrapper,
    lr_set_while_training,
    optimizer_class,
    params_argument,
)
from ..program.project import repairs_of
from ..program.sharding import optimizer_data
from ..program.syntax import arg_named, code, insert_keyword, mentions, size_factor, times_size

#: torch 2.13's defaults (torch/optim/*.py), written out when a script leaves lr out.
DEFAULT_LR = {
    "Adadelta": "1.0",
    "Adafactor": "0.01",
    "Adagrad": "0.01",
    "Adam": "0.001",
    "AdamW": "0.001",
    "Adamax": "0.002",
    "ASGD": "0.01",
    "Muon": "0.001",
    "NAdam": "0.002",
    "RAdam": "0.001",
    "RMSprop": "0.01",
    "Rprop": "0.01",
    "SGD": "0.001",
    "SparseAdam": "0.001",
}
#: Schedulers that set absolute learning rates: class -> (argument, position).
_ABSOLUTE_RATES: dict[str, tuple[tuple[str, int], ...]] = {
    "OneCycleLR": (("max_lr", 1),),
    "CyclicLR": (("base_lr", 1), ("max_lr", 2)),
    "CosineAnnealingLR": (("eta_min", 2),),
    "CosineAnnealingWarmRestarts": (("eta_min", 3),),
    "ReduceLROnPlateau": (("min_lr", 7),),
    "SWALR": (("swa_lr", 1),),
}
#: Why the learning rate stays, by ``DataSharding.kind``.
UNSHARDED = {
    "not sharded": "the training data is not split between the ranks (see the data's note)",
    "partly sharded": "the training data is split on some of the paths that bind it only (see "
    "the data's note)",
    "environment": "the data comes from an environment, not a dataset the ranks can split",
    "input": "it optimises an input tensor, not a model's parameters: not data-parallel as "
    "written",
    "full batch": "full-batch training, every rank sees the same data",
    "full batch drawn": "full-batch training on tensors each rank draws for itself, not "
    "parts of one dataset",
    "not found": "no sharded training data was found",
    "unaveraged": "the converter could not tell which model it trains (see the note on wrapping), "
    "so nothing averages its gradients between the ranks",
}
#: A positional argument written as a string is a name (timm's ``"adamw"``), never a rate.
STRINGS = (cst.SimpleString, cst.ConcatenatedString, cst.FormattedString)
#: Calls whose result is the world size (a learning rate mentioning one is already scaled).
WORLD_SIZE = (
    "sdp_runtime.torch.size",
    "sdp_runtime.torch.distributed.get_world_size",
    "torch.distributed.get_world_size",
)


def is_scaled(transform: Transform, index: FileIndex, expr: cst.BaseExpression) -> bool:
    """Whether ``expr`` (original) already involves the world size, through plain names too."""
    return any(mentions(transform.fm, value, *WORLD_SIZE) for value in reaching_values(index, expr))


class ScaleLearningRate(Transform):
    DESCRIPTION = "Scale torch.optim learning rates by the number of processes."
    FRAMEWORKS = frozenset({"torch"})
    #: Project mode: an optimizer made here whose model is trained, averaged, on split data in
    #: another module (the whole-program contract says so: ``Repair`` ``scale_lr``).
    PROJECT_ROLES = frozenset({"repair:scale_lr"})

    def prepare(self, module: cst.Module) -> None:
        self.mode = self.state.options.lr_scaling
        self.factor = size_factor(self.sdp, self.mode)
        # original Arg / DictElement whose value gets scaled -> the report message
        self.scaled: dict[cst.CSTNode, str] = {}
        # original optimizer Call that gets lr written out -> (class, default)
        self.defaults: dict[cst.Call, tuple[str, str]] = {}
        if self.mode == "none":
            return
        self.index = file_index(self.fm)
        # Each optimizer by the data of the loops that step it: a file may train one model on
        # sharded batches and fine-tune another on the full batch. The whole-program model
        # decides for an optimizer whose loops are in another module (``scale_lr``).
        found = repairs_of(self.fm, "scale_lr")
        asked = {id(node) for _, node in found}
        known = set(asked)
        scaled = False
        for call in self.calls_to("torch.optim", prefix=True):
            cls = optimizer_class(self.fm, call)
            if cls is None:
                continue
            known.discard(id(call))  # decided here (below: an optimizer of another library)
            data = optimizer_data(self.fm, call)
            if data.sharded or id(call) in asked:
                scaled = True
                self._optimizer(call, cls)
            else:
                self._unscaled(call, cls, data.kind)
        for _, call in found:
            # An optimizer of another library or of the project (``MomentumW(params, lr=...)``)
            # that the whole-program model found stepping an averaged model on split data.
            if id(call) in known and isinstance(call, cst.Call):
                scaled = True
                if self._config_factory(call):
                    self.record(
                        call,
                        f"{code(call.func)}: the learning rate comes from the configuration this "
                        f"factory reads: scale it by {self.factor} there",
                        manual=True,
                    )
                else:
                    self._optimizer(call, code(call.func))
        if not scaled:
            self.mode = "none"  # nothing below scales, nor asks a person to
            return
        for call in self.calls_to("torch.optim", prefix=True):
            if optimizer_class(self.fm, call) is None and self._scheduled_scaled(call):
                self._scheduler(call)
        for call in self.method_calls("add_param_group"):
            if call.args:
                self._groups(call.args[0].value, "add_param_group")

    # -- optimizers ---------------------------------------------------------------------------

    def _config_factory(self, call: cst.Call) -> bool:
        """``config.init_obj("optimizer", torch.optim, params)``: a factory given an entry's name
        or the library to build from; its arguments hold no learning rate."""
        first = call.args[0].value if call.args else None
        return isinstance(first, cst.SimpleString) or any(
            "torch.optim" in self.fm.qualified_names(a.value) for a in call.args
        )

    def _unscaled(self, call: cst.Call, cls: str, kind: str) -> None:
        lr = arg_named(call, "lr", 1)
        rate = code(lr.value) if lr is not None else "its learning rate"
        # Set anew while training (a wrapper's schedule, ``group["lr"] = lr``): scaling the
        # constructor's rate would change nothing; the note names what to scale.
        at = lr_set_while_training(self.fm, call)
        then = f"; it is set anew while training ({at}): scale the rate set there" if at else (
            "; scale it")
        self.record(
            call,
            f"{cls}: {rate} left as it is: {UNSHARDED[kind]}{then} by {self.factor} once "
            + ("its model is wrapped in DistributedDataParallel and " if kind == "unaveraged"
               else "") + "each rank trains on its own part of the data",
            manual=True,
        )

    def _optimizer(self, call: cst.Call, cls: str) -> None:
        if cls == "LBFGS":
            self.record(
                call,
                f"LBFGS (closure-based) is not converted: scale its learning rate by "
                f"{self.factor} if the larger global batch needs it, and check the closure",
                manual=True,
            )
            return
        wrapper = lr_set_by_wrapper(self.fm, call)
        if wrapper is not None:
            self.record(
                call,
                f"{cls}: learning rate left as it is: {wrapper} sets it anew in the parameter "
                f"groups on every step; scale the rate it sets by {self.factor} there",
                manual=True,
            )
            return
        params = params_argument(call)
        if params is not None:
            self._groups(params.value, cls)
        lr = arg_named(call, "lr", 1)
        if lr is not None and lr.keyword is None and isinstance(lr.value, STRINGS):
            lr = arg_named(call, "lr")  # ``create_optimizer_v2(model, "adamw", lr=...)``
        if lr is not None:
            if not is_scaled(self, self.index, lr.value):
                self.scaled[lr] = f"{cls}: learning rate {code(lr.value)} * {self.factor}"
            return
        hidden = next((a for a in call.args if a.star), None)
        if hidden is not None:
            self.record(
                call,
                f"{cls}: the learning rate may come from {hidden.star}{code(hidden.value)}: scale "
                f"it by {self.factor}",
                manual=True,
            )
        elif cls in DEFAULT_LR:
            self.defaults[call] = (cls, DEFAULT_LR[cls])
        else:
            self.record(
                call,
                f"{cls}: default learning rate unknown to the converter: pass "
                f"lr=<its default> * {self.factor}",
                manual=True,
            )

    def _groups(self, expr: cst.BaseExpression, cls: str) -> None:
        """Scale the ``"lr"`` of each parameter group literal ``expr`` (original) holds."""
        for value in reaching_values(self.index, expr):
            if isinstance(value, (cst.List, cst.Tuple)):
                for element in value.elements:
                    if isinstance(element, cst.Element):
                        self._group(element.value, cls)
            else:
                self._group(value, cls)

    def _group(self, expr: cst.BaseExpression, cls: str) -> None:
        for value in reaching_values(self.index, expr):
            for entry, rate in _group_rates(self, value):
                if not is_scaled(self, self.index, rate):
                    self.scaled[entry] = (
                        f"{cls}: parameter group learning rate {code(rate)} * {self.factor}"
                    )

    # -- schedulers ---------------------------------------------------------------------------

    def _scheduler(self, call: cst.Call) -> None:
        name = next(
            (
                q.rsplit(".", 1)[-1]
                for q in self.qualified_names(call.func)
                if q.rsplit(".", 1)[0] in _SCHEDULER_MODULES
            ),
            None,
        )
        if name not in _ABSOLUTE_RATES:
            return
        rates = [(n, arg_named(call, n, p)) for n, p in _ABSOLUTE_RATES[name]]
        given = [(n, a) for n, a in rates if a is not None and not _is_zero(a.value)]
        if not given or any(is_scaled(self, self.index, a.value) for _, a in given):
            return
        what = ", ".join(f"{n}={code(a.value)}" for n, a in given)
        sets = "sets the learning rate itself from" if name in ("OneCycleLR", "CyclicLR") else (
            "has an absolute learning rate"
        )
        self.record(call, f"{name} {sets} {what}: scale it by {self.factor}", manual=True)

    def _scheduled_scaled(self, scheduler: cst.Call) -> bool:
        """The optimizer a scheduler drives had its rate scaled (or is not known)."""
        arg = arg_named(scheduler, "optimizer", 0)
        made = [
            v for v in (reaching_values(self.index, arg.value) if arg is not None else ())
            if isinstance(v, cst.Call) and optimizer_class(self.fm, v) is not None
        ]
        return not made or any(optimizer_data(self.fm, v).sharded for v in made)

    # -- writes while training ----------------------------------------------------------------

    def _is_param_group(self, expr: cst.BaseExpression) -> bool:
        """``opt.param_groups[0]``, or ``g`` of ``for g in opt.param_groups``."""
        if isinstance(expr, cst.Subscript):
            return _is_param_groups(expr.value)
        if isinstance(expr, cst.Name):
            binding = self.index.reaching(expr.value, expr)
            return (
                binding is not None
                and binding.kind == "for"
                and isinstance(binding.stmt, cst.For)
                and _is_param_groups(binding.stmt.iter)
            )
        return False

    def _lr_write(self, node: cst.CSTNode, target: cst.BaseExpression) -> None:
        if (
            isinstance(target, cst.Subscript)
            and len(target.slice) == 1
            and isinstance(target.slice[0].slice, cst.Index)
            and _is_string(target.slice[0].slice.value, "lr")
            and self._is_param_group(target.value)
        ):
            self.record(
                node,
                f"learning rate written into param_groups: scale the new value by {self.factor}",
                manual=True,
            )

    def leave_Assign(self, original_node: cst.Assign, updated_node: cst.Assign) -> cst.Assign:
        if self.mode != "none":
            for target in original_node.targets:
                self._lr_write(original_node, target.target)
        return updated_node

    def leave_AugAssign(
        self, original_node: cst.AugAssign, updated_node: cst.AugAssign
    ) -> cst.AugAssign:
        # ``*=`` and ``/=`` keep the scaling; ``+=``/``-=`` add an unscaled amount.
        if self.mode != "none" and isinstance(
            original_node.operator, (cst.AddAssign, cst.SubtractAssign)
        ):
            self._lr_write(original_node, original_node.target)
        return updated_node

    # -- rewriting ----------------------------------------------------------------------------

    def leave_Arg(self, original_node: cst.Arg, updated_node: cst.Arg) -> cst.Arg:
        message = self.scaled.get(original_node)
        if message is None:
            return updated_node
        self.add_runtime_import()
        self.record(original_node, message)
        return updated_node.with_changes(value=times_size(updated_node.value, self.sdp, self.mode))

    def leave_DictElement(
        self, original_node: cst.DictElement, updated_node: cst.DictElement
    ) -> cst.DictElement:
        message = self.scaled.get(original_node)
        if message is None:
            return updated_node
        self.add_runtime_import()
        self.record(original_node, message)
        return updated_node.with_changes(value=times_size(updated_node.value, self.sdp, self.mode))

    def leave_Call(self, original_node: cst.Call, updated_node: cst.Call) -> cst.BaseExpression:
        found = self.defaults.get(original_node)
        if found is None:
            return updated_node
        cls, default = found
        self.add_runtime_import()
        self.record(
            original_node, f"{cls}: default learning rate {default} written out, * {self.factor}"
        )
        value = times_size(cst.Float(default), self.sdp, self.mode)
        params = params_argument(original_node)
        after = -1
        if params is not None and params.keyword is None:
            after = list(original_node.args).index(params)
        elif params is not None:
            after = len(original_node.args) - 1
        return insert_keyword(updated_node, after, "lr", value)


def _group_rates(
    transform: Transform, expr: cst.BaseExpression
) -> Iterator[tuple[cst.CSTNode, cst.BaseExpression]]:
    """``("lr" entry, its value)`` of a group literal: ``{"lr": x}`` or ``dict(lr=x)``."""
    if isinstance(expr, cst.Dict):
        for element in expr.elements:
            if isinstance(element, cst.DictElement) and _is_string(element.key, "lr"):
                yield element, element.value
    elif isinstance(expr, cst.Call) and transform.refers_to(expr.func, "builtins.dict"):
        for arg in expr.args:
            if arg.keyword is not None and arg.keyword.value == "lr":
                yield arg, arg.value


def _is_param_groups(expr: cst.BaseExpression) -> bool:
    return isinstance(expr, cst.Attribute) and expr.attr.value == "param_groups"


def _is_string(expr: cst.BaseExpression, value: str) -> bool:
    return isinstance(expr, cst.SimpleString) and expr.evaluated_value == value


def _is_zero(expr: cst.BaseExpression) -> bool:
    return isinstance(expr, (cst.Integer, cst.Float)) and float(expr.evaluated_value) == 0.0
