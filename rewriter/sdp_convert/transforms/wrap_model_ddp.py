"""Wrap each trained model in ``sdp.DistributedDataParallel`` once it sits on its device.

Before::

    model = Net()
    if use_cuda:
        model.cuda()
    optimizer = optim.SGD(model.parameters(), lr=0.01)

    class Trainer:
        def __init__(self):
            self.model = nn.DataParallel(WaveNet()).cuda()

After::

    model = Net()
    if use_cuda:
        model.cuda()
    model = sdp.DistributedDataParallel(model)
    optimizer = optim.SGD(model.parameters(), lr=0.01)

    class Trainer:
        def __init__(self):
            self.model = WaveNet().cuda()
            self.model = sdp.DistributedDataParallel(self.model)

Why: data parallelism averages the gradients of all processes before each step; DDP does it
during ``backward()``, overlapping communication with compute, and broadcasts rank 0's weights
when it wraps, so every process starts from the same model.

Which object is the model: the one whose ``.parameters()`` (or ``named_parameters()``) an
optimizer gets, followed through variables, function arguments and factories
(``build_optimizer(model.parameters())``, ``model = build_model(cfg)``), local, module-level or
``self.<attr>``; with no optimizer in sight, a module whose output feeds ``loss.backward()``.
Each such model (a GAN has two) is wrapped right after the last statement that creates, moves
(``.to``, ``.cuda()``, ...) or freezes it before it is first trained, and before
``torch.compile``; the optimizer keeps working on the same parameters either way.
``nn.DataParallel`` is removed (one process per GPU) and the model wrapped instead. A model that
is already wrapped (``sdp``'s or torch's DDP) is left alone.

``sdp.DistributedDataParallel`` keeps the unwrapped ``state_dict`` keys and looks up attributes it
lacks on the wrapped module, so ``model.encoder`` and checkpoint code keep working unchanged; the
converter does not rewrite them to ``model.module.<attr>``. A *call* of a user method
(``model.encode(x)``) in a function that calls ``backward()`` gets a manual note: it runs around
DDP's forward, so its gradients would not be averaged. Models no optimizer trains (evaluation
only), models that are part of another wrapped model, and models the converter cannot locate get
manual notes too.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import libcst as cst
import libcst.matchers as m

from ..base import Transform
from ..program.index import Binding, FileIndex, file_index
from ..program.optimizers import optimizer_class, params_argument
from ..program.scopes import arguments_for
from ..program.syntax import arg_named, code

_DDP = (
    "sdp_runtime.torch.DistributedDataParallel",
    "sdp_runtime.torch.ddp.DistributedDataParallel",
    "sdp_runtime.torch.parallel.DistributedDataParallel",
    "sdp_runtime.torch.parallel.distributed.DistributedDataParallel",
    "torch.nn.parallel.DistributedDataParallel",
    "torch.nn.parallel.distributed.DistributedDataParallel",
)
_DATA_PARALLEL = (
    "torch.nn.DataParallel",
    "torch.nn.parallel.DataParallel",
    "torch.nn.parallel.data_parallel.DataParallel",
)
_COMPILE = ("torch.compile",)
_WRAPPERS = _DDP + _DATA_PARALLEL + _COMPILE
#: Methods that place or prepare a model; the wrap comes after the last of them.
_SETUP_METHODS = frozenset({
    "to", "cuda", "cpu", "half", "float", "double", "bfloat16", "type", "to_empty", "apply",
    "load_state_dict", "requires_grad_",
})
#: What DDP (torch.nn.Module) answers itself: calling these on the wrapped model is fine.
_MODULE_API = _SETUP_METHODS | frozenset({
    "parameters", "named_parameters", "buffers", "named_buffers", "children", "named_children",
    "modules", "named_modules", "state_dict", "train", "eval", "zero_grad", "forward",
    "register_buffer", "register_parameter", "register_module", "add_module", "get_submodule",
    "get_parameter", "get_buffer", "register_forward_hook", "register_forward_pre_hook",
    "register_full_backward_hook", "register_full_backward_pre_hook", "register_backward_hook",
    "register_state_dict_pre_hook", "register_load_state_dict_pre_hook",
    "register_load_state_dict_post_hook", "extra_repr", "share_memory", "compile", "xpu", "ipu",
    "mtia", "set_extra_state", "get_extra_state", "no_sync", "join", "register_comm_hook",
})
#: torch.nn classes that hold weights (a model built from them may be trained).
_NN_WEIGHTED = ("Sequential", "Linear", "Bilinear", "Conv", "ConvTranspose", "LSTM", "GRU", "RNN",
                "Embedding", "Transformer", "MultiheadAttention", "Lazy")
_MODEL_FACTORIES = ("torchvision.models.", "timm.create_model", "transformers.")
_PARAMETER_METHODS = m.Name("parameters") | m.Name("named_parameters")

Scope = cst.FunctionDef | cst.ClassDef | None


@dataclass(eq=False)
class _Model:
    """One model to wrap: ``model`` (a name of ``scope``) or ``self.model`` (of class ``owner``)."""

    target: str
    scope: Scope
    owner: cst.ClassDef | None
    creation: Binding
    seen_at: list[cst.CSTNode] = field(default_factory=list)
    #: Parameters the model is passed in as: ``(name, function)`` (``def train(net, ...)``).
    aliases: list[tuple[str, Scope]] = field(default_factory=list)
    #: Wrapped by the script already (``model = sdp.DistributedDataParallel(model)``).
    wrapped: bool = False

    @property
    def key(self) -> tuple[str, int]:
        return self.target, id(self.owner if self.owner is not None else self.scope)


class WrapModelDdp(Transform):
    DESCRIPTION = "Wrap each trained model in sdp.DistributedDataParallel."
    FRAMEWORKS = frozenset({"torch"})

    def prepare(self, module: cst.Module) -> None:
        self.index: FileIndex = file_index(self)
        # original DataParallel call nested in an expression -> replaced by its module argument
        self.unwrap: set[cst.Call] = set()
        self.models: dict[tuple[str, int], _Model] = {}
        self._attribute_uses: dict[str, list[cst.Attribute]] | None = None
        self.state.facts.wrapped_models = []
        if self.calls_to("sdp_runtime.torch.DistributedOptimizer"):
            return  # the optimizer averages the gradients already; DDP would do it twice
        unresolved: list[tuple[cst.CSTNode, str]] = []

        for call in self.calls_to("torch.optim", prefix=True):
            if optimizer_class(self, call) is None:
                continue
            params = params_argument(call)
            receivers = list(self._receivers(params.value, 0)) if params is not None else []
            if not receivers:
                unresolved.append((call, "could not tell which model this optimizer trains"))
            for receiver in receivers:
                if not self._add(receiver, receiver):
                    where = f"could not tell where {code(receiver)} is created"
                    unresolved.append((receiver, where))
        for call in self._stepped_optimizers():
            params = arg_named(call, "params", 0)
            for receiver in self._receivers(params.value, 0) if params is not None else ():
                self._add(receiver, receiver)
        for call in self.calls_to(*_DATA_PARALLEL):
            self._data_parallel(call)
        from_optimizers = bool(self.models)
        if not from_optimizers:
            for model, at in self._models_from_backward():
                self._add(model, at)
        if from_optimizers or not self.models:
            for node, what in unresolved:
                self.record(
                    node,
                    f"{what}: wrap it in {self.sdp}.DistributedDataParallel by hand (or average "
                    f"the gradients with {self.sdp}.allreduce before each step)",
                    manual=True,
                )

        planned = [model for model in self.models.values() if not self._part_of_another(model)]
        for model in planned:
            self._plan(model)
        self._note_untrained()

    # -- which object is the model ------------------------------------------------------------

    def _receivers(self, expr: cst.BaseExpression, depth: int) -> Iterator[cst.BaseExpression]:
        """``X`` of every ``X.parameters()`` / ``X.named_parameters()`` that ``expr`` (original)
        passes on, through variables and function parameters."""
        if depth > 5:
            return
        for call in m.findall(expr, m.Call(func=m.Attribute(attr=_PARAMETER_METHODS))):
            assert isinstance(call, cst.Call) and isinstance(call.func, cst.Attribute)
            yield call.func.value
        for name in m.findall(expr, m.Name()):
            assert isinstance(name, cst.Name)
            parent = self.parent(name)
            if isinstance(parent, cst.Attribute) or (
                isinstance(parent, (cst.Call, cst.Arg))
                and name is not getattr(parent, "value", None)
            ):
                continue  # ``model.x``, ``list(...)``, ``lr=``: not a value passed on
            binding = self.index.reaching(name.value, name)
            if binding is None:
                continue
            if binding.kind == "assign" and binding.value is not None and not binding.unpacked:
                yield from self._receivers(binding.value, depth + 1)
            elif binding.kind == "param":
                for value, _ in self._arguments(binding):
                    yield from self._receivers(value, depth + 1)

    def _arguments(self, binding: Binding) -> Iterator[tuple[cst.BaseExpression, cst.Call]]:
        """What the callers pass for a function parameter: ``(argument, call)``."""
        function = binding.stmt
        if isinstance(function, cst.FunctionDef):
            yield from arguments_for(self, function, binding.name)

    def _add(
        self,
        receiver: cst.BaseExpression,
        at: cst.CSTNode,
        depth: int = 0,
        aliases: tuple[tuple[str, Scope], ...] = (),
    ) -> bool:
        """Make the model ``receiver`` (original) refers to a candidate. False: not locatable."""
        target = _model_expression(receiver)
        if target is None or depth > 5:
            return False
        if isinstance(target, cst.Name):
            binding = self.index.reaching(target.value, target)
            if binding is None:
                return False
            if binding.kind == "param":
                alias = (*aliases, (target.value, binding.scope))
                found = [
                    self._add(value, call, depth + 1, alias)
                    for value, call in self._arguments(binding)
                ]
                return bool(found) and all(found)
            if binding.kind != "assign" or binding.value is None:
                return False
            bindings = self.index.bindings_of(target.value, binding.scope)
            creation = self._creation(bindings, binding, target)
            owner = None
            if receiver is not target and creation is not None and self._is_plain_object(
                creation.value
            ):
                return False  # ``trainer.model.parameters()``: the model is not ``trainer``
        else:
            owner = self._owner_class(target)
            if owner is None:
                return False
            bindings = [
                b for b in self.index.attribute_bindings.get(code(target), [])
                if self._owner_class(b.stmt) is owner
            ]
            creation = self._creation(bindings, None, target)
        wrapped = [b for b in bindings if self._is_wrapper(b.value, _DDP)]
        creation = creation or next(iter(wrapped), None)
        if creation is None:
            return False
        if m.findall(receiver, m.Subscript()) and isinstance(
            creation.value, (cst.List, cst.Tuple, cst.Dict, cst.ListComp, cst.DictComp)
        ):
            return False  # ``models[0]``: one of several models, which one is not known
        model = _Model(code(target), creation.scope, owner, creation, wrapped=bool(wrapped))
        model = self.models.setdefault(model.key, model)
        model.seen_at.append(at)
        model.aliases.extend(a for a in aliases if a not in model.aliases)
        return True

    def _creation(
        self, bindings: list[Binding], reaching: Binding | None, at: cst.CSTNode
    ) -> Binding | None:
        """The assignment that creates the model used at ``at``, skipping wrappers
        (``torch.compile(model)``, ``nn.DataParallel(model)``)."""
        creations = [
            b for b in bindings
            if b.kind == "assign" and b.value is not None and not self._is_wrapper(b.value)
        ]
        if not creations:
            return None
        same_function = [
            b for b in creations
            if self.enclosing_function(b.stmt) is self.enclosing_function(at)
            and self.index.is_before(b.stmt, at)
        ]
        if same_function:
            return same_function[-1]
        if reaching is None:  # ``self.model``: the one ``__init__`` makes
            in_init = [b for b in creations if isinstance(b.scope, cst.FunctionDef)
                       and b.scope.name.value == "__init__"]
            return (in_init or creations)[0]
        return creations[0]

    def _stepped_optimizers(self) -> Iterator[cst.Call]:
        """Constructors of objects whose ``.step()`` is called (optimizers from other libraries,
        factories) that are not torch.optim's (those are handled with notes)."""
        for step in self.method_calls("step"):
            func = step.func
            assert isinstance(func, cst.Attribute)
            if not isinstance(func.value, (cst.Name, cst.Attribute)):
                continue
            binding = (
                self.index.reaching(func.value.value, func.value)
                if isinstance(func.value, cst.Name)
                else next(iter(self.index.attribute_bindings.get(code(func.value), [])[-1:]), None)
            )
            value = binding.value if binding is not None else None
            if isinstance(value, cst.Call) and optimizer_class(self, value) is None and not (
                self.refers_to(value.func, "torch.optim", prefix=True)
            ):
                yield value

    def _models_from_backward(self) -> Iterator[tuple[cst.BaseExpression, cst.CSTNode]]:
        """Modules called in the computation of what ``.backward()`` is called on."""
        for backward in self.method_calls("backward"):
            func = backward.func
            assert isinstance(func, cst.Attribute)
            todo: list[tuple[cst.BaseExpression, int]] = [(func.value, 0)]
            seen: set[int] = set()
            while todo:
                expr, depth = todo.pop()
                if id(expr) in seen or depth > 4:
                    continue
                seen.add(id(expr))
                for call in m.findall(expr, m.Call()):
                    assert isinstance(call, cst.Call)
                    callee = call.func
                    if _model_expression(callee) is callee and self._is_module_value(callee):
                        yield callee, backward
                for name in m.findall(expr, m.Name()):
                    assert isinstance(name, cst.Name)
                    binding = self.index.reaching(name.value, name)
                    if binding is not None and binding.kind == "assign" and binding.value:
                        todo.append((binding.value, depth + 1))

    def _data_parallel(self, call: cst.Call) -> None:
        """``nn.DataParallel`` goes: one process per GPU, and the model gets DDP instead."""
        arg = arg_named(call, "module", 0)
        if arg is None:
            self.record(call, "nn.DataParallel without a module: replace it by hand", manual=True)
            return
        parent = self.parent(call)
        message = (
            f"nn.DataParallel removed: one process per GPU, the model is wrapped in "
            f"{self.sdp}.DistributedDataParallel instead"
        )
        if (
            isinstance(parent, cst.Assign)
            and len(parent.targets) == 1
            and code(parent.targets[0].target) == code(arg.value)
        ):
            # ``model = nn.DataParallel(model)``: the statement goes (and an ``if`` holding only it)
            stmt = self.enclosing_statement(call)
            removed: cst.CSTNode | None = stmt
            body = self.parent(stmt) if stmt is not None else None
            if not isinstance(stmt, cst.SimpleStatementLine) or len(stmt.body) != 1:
                removed = None
            elif isinstance(body, cst.IndentedBlock) and len(body.body) == 1:
                owner = self.parent(body)
                outer = self.parent(owner) if owner is not None else None
                removed = owner if (
                    isinstance(owner, cst.If) and owner.orelse is None
                    and isinstance(outer, (cst.Module, cst.IndentedBlock)) and len(outer.body) > 1
                ) else None
            if removed is None:
                self.record(call, "nn.DataParallel: replace it by hand with the DDP wrap",
                            manual=True)
                return
            self.replace_statement(removed, [])
            self.record(call, message)
            self._add(arg.value, call)
            return
        self.unwrap.add(call)
        self.record(call, message)
        if isinstance(parent, cst.Assign) and len(parent.targets) == 1:
            self._add(parent.targets[0].target, call)
        elif not self.models:
            self._add(arg.value, call)

    def _part_of_another(self, model: _Model) -> bool:
        """``decoder = Decoder(encoder)``: ``encoder`` is not wrapped on its own."""
        for other in self.models.values():
            if other is model or other.creation.value is None:
                continue
            if other.scope is model.scope and any(
                code(n) == model.target
                for n in m.findall(other.creation.value, m.Name() | m.Attribute())
            ):
                self.record(
                    model.creation.stmt,
                    f"{model.target} is part of {other.target}, which is wrapped: "
                    f"not wrapped on its own",
                    manual=True,
                )
                return True
        return False

    # -- where the wrap goes ------------------------------------------------------------------

    def _plan(self, model: _Model) -> None:
        if model.wrapped:
            return
        same = self._bindings(model)
        first = self.enclosing_statement(model.creation.stmt)
        if first is None:
            return
        bodies = {
            id(p) for p in self.ancestors(first) if isinstance(p, (cst.Module, cst.IndentedBlock))
        }

        def level(node: cst.CSTNode) -> cst.BaseStatement | None:
            child = node
            for parent in self.ancestors(node):
                if id(parent) in bodies and isinstance(child, cst.BaseStatement):
                    if isinstance(child, (cst.FunctionDef, cst.ClassDef)):
                        return None  # defining a function runs nothing
                    return child
                child = parent
            return None

        def order(node: cst.CSTNode) -> int:
            return self.index.order.get(id(node), -1)

        start = order(first)
        later = [
            order(stmt) for b in same
            if b.value is not None and not self._is_wrapper(b.value)
            and (stmt := level(b.stmt)) is not None and order(stmt) > start
        ]
        end = min([*later, *self._first_uses(model, level, order, start)], default=1 << 62)

        setup: list[cst.BaseStatement] = [first]
        for b in same:  # ``model = nn.DataParallel(model)`` and the like, where they stand
            if b.value is not None and self._is_wrapper(b.value, _DATA_PARALLEL):
                setup.extend(filter(None, [level(b.stmt)]))
        uses = self._uses(model)
        for use in uses:
            parent = self.parent(use)
            call = self.parent(parent) if parent is not None else None
            if (
                isinstance(parent, cst.Attribute) and parent.value is use
                and parent.attr.value in _SETUP_METHODS
                and isinstance(call, cst.Call) and call.func is parent
            ):
                setup.extend(filter(None, [level(call)]))
            else:
                stmt = level(use)
                if stmt is not None and start < order(stmt) < end and _freezes(stmt):
                    setup.append(stmt)
        candidates = [s for s in setup if start <= order(s) < end]
        anchor = max(candidates, key=order) if candidates else first

        self.add_runtime_import()
        wrap = f"{model.target} = {self.sdp}.DistributedDataParallel({model.target})"
        self.insert_after(anchor, cst.parse_statement(wrap + "\n"))
        compiled = any(
            self._is_wrapper(b.value, _COMPILE) and order(b.stmt) > order(anchor)
            for b in same
        )
        self.record(
            anchor,
            f"wrap {model.target} in {self.sdp}.DistributedDataParallel"
            + (" (before torch.compile)" if compiled else ""),
        )
        if model.creation.value is not None and any(
            isinstance(c, cst.Call) and self.refers_to(c.func, *_COMPILE)
            for c in m.findall(model.creation.value, m.Call())
        ):
            self.record(
                model.creation.stmt,
                f"{model.target} is compiled before it is wrapped: compile the wrapped model "
                f"instead (torch.compile after {self.sdp}.DistributedDataParallel)",
                manual=True,
            )
        wrapped = self.state.facts.wrapped_models
        if wrapped is not None:
            wrapped.append(model.target)
        for name, scope in model.aliases:
            uses.extend(self.index.loads_of(name, scope))
        self._note_method_calls(uses)

    def _bindings(self, model: _Model) -> list[Binding]:
        if model.owner is None:
            return self.index.bindings_of(model.target, model.scope)
        return [
            b for b in self.index.attribute_bindings.get(model.target, [])
            if self._owner_class(b.stmt) is model.owner
        ]

    def _uses(self, model: _Model) -> list[cst.CSTNode]:
        """Loads of the model: ``model`` names of its scope, or ``self.model`` in its class."""
        if model.owner is None:
            return list(self.index.loads_of(model.target, model.scope))
        if self._attribute_uses is None:
            self._attribute_uses = {}
            for node in self.state.info.parents:
                if isinstance(node, cst.Attribute) and isinstance(node.value, cst.Name) and (
                    node.value.value == "self"
                ):
                    self._attribute_uses.setdefault(f"self.{node.attr.value}", []).append(node)
        return [
            a for a in self._attribute_uses.get(model.target, [])
            if self._owner_class(a) is model.owner
            and not isinstance(self.parent(a), cst.AssignTarget)
        ]

    def _first_uses(
        self,
        model: _Model,
        level: Callable[[cst.CSTNode], cst.BaseStatement | None],
        order: Callable[[cst.CSTNode], int],
        start: int,
    ) -> Iterator[int]:
        """Where training may begin: a call of the model, a ``backward()``/``step()``, or a call
        of a function of this file (it may train), each at the model's block level."""
        triggers: list[cst.CSTNode] = [
            *self.method_calls("backward"),
            *self.method_calls("step"),
        ]
        for name in self.index.functions:
            triggers.extend(self.index.calls_by_name.get(name, ()))
        for use in self._uses(model):
            parent = self.parent(use)
            if isinstance(parent, cst.Call) and parent.func is use:
                triggers.append(parent)
        for node in triggers:
            stmt = level(node)
            if stmt is not None and order(stmt) > start:
                yield order(stmt)

    # -- notes --------------------------------------------------------------------------------

    def _note_method_calls(self, uses: list[cst.CSTNode]) -> None:
        trains = {id(self.enclosing_function(c)) for c in self.method_calls("backward")}
        for use in uses:
            parent = self.parent(use)
            call = self.parent(parent) if parent is not None else None
            if (
                isinstance(parent, cst.Attribute) and parent.value is use
                and parent.attr.value not in _MODULE_API
                and isinstance(call, cst.Call) and call.func is parent
                and id(self.enclosing_function(call)) in trains
            ):
                self.record(
                    call,
                    f"{code(parent)}(...) runs the wrapped module around DDP's forward: gradients "
                    f"computed through it are not averaged; in the training step call "
                    f"{code(use)}(...) instead",
                    manual=True,
                )

    def _note_untrained(self) -> None:
        """Models built and called here that no optimizer trains (evaluation, a teacher)."""
        models = {(m_.target, id(m_.scope)) for m_ in self.models.values() if m_.owner is None}
        for (scope_id, name), bindings in self.index.bindings.items():
            if (name, scope_id) in models:
                continue
            for binding in bindings:
                if binding.kind != "assign" or not self._is_module_value_expr(binding.value):
                    continue
                if self._part_of_a_model(name, binding.scope):
                    break
                called = any(
                    isinstance(p := self.parent(load), cst.Call) and p.func is load
                    for load in self.index.loads_of(name, binding.scope)
                )
                if called:
                    self.record(
                        binding.stmt,
                        f"{name} is not trained here (no optimizer gets its parameters): left "
                        f"unwrapped, each process runs its own copy",
                        manual=True,
                    )
                break

    def _part_of_a_model(self, name: str, scope: Scope) -> bool:
        """``name`` is handed to a model's constructor (``Decoder(encoder)``) or returned."""
        for model in self.models.values():
            value = model.creation.value
            if model.scope is scope and value is not None and any(
                n.value == name for n in m.findall(value, m.Name())
            ):
                return True
        if isinstance(scope, cst.FunctionDef):
            for ret in self.index.returns.get(id(scope), ()):
                if ret.value is not None and any(
                    n.value == name for n in m.findall(ret.value, m.Name())
                ):
                    return True
        return False

    # -- rewriting ----------------------------------------------------------------------------

    def leave_Call(self, original_node: cst.Call, updated_node: cst.Call) -> cst.BaseExpression:
        if original_node not in self.unwrap:
            return updated_node
        arg = arg_named(updated_node, "module", 0)
        assert arg is not None
        return arg.value.with_changes(
            lpar=[*updated_node.lpar, *arg.value.lpar], rpar=[*arg.value.rpar, *updated_node.rpar]
        )

    # -- helpers ------------------------------------------------------------------------------

    def _owner_class(self, node: cst.CSTNode) -> cst.ClassDef | None:
        for parent in self.ancestors(node):
            if isinstance(parent, cst.ClassDef):
                return parent
        return None

    def _is_wrapper(
        self, value: cst.BaseExpression | None, names: tuple[str, ...] = _WRAPPERS
    ) -> bool:
        return isinstance(value, cst.Call) and self.refers_to(value.func, *names)

    def _is_plain_object(self, value: cst.BaseExpression | None) -> bool:
        """``Trainer(cfg)`` where ``Trainer`` is a class of this file that is no torch module."""
        if not (isinstance(value, cst.Call) and isinstance(value.func, cst.Name)):
            return False
        cls = self.index.classes.get(value.func.value)
        return cls is not None and not self._is_module_class(cls, 0)

    def _is_module_class(self, cls: cst.ClassDef, depth: int) -> bool:
        for base in cls.bases:
            if self.refers_to(base.value, "torch.nn", prefix=True):
                return True
            if isinstance(base.value, cst.Name) and depth < 4:
                parent = self.index.classes.get(base.value.value)
                if parent is not None and self._is_module_class(parent, depth + 1):
                    return True
        return False

    def _is_module_value(self, callee: cst.BaseExpression) -> bool:
        """Whether the name ``callee`` (original) was assigned a torch module with weights."""
        if isinstance(callee, cst.Name):
            binding = self.index.reaching(callee.value, callee)
            return binding is not None and self._is_module_value_expr(binding.value)
        found = self.index.attribute_bindings.get(code(callee), [])
        return bool(found) and self._is_module_value_expr(found[0].value)

    def _is_module_value_expr(self, value: cst.BaseExpression | None) -> bool:
        while (
            isinstance(value, cst.Call)
            and isinstance(value.func, cst.Attribute)
            and value.func.attr.value in _SETUP_METHODS | {"train", "eval"}
        ):
            value = value.func.value
        if not isinstance(value, cst.Call):
            return False
        for q in self.qualified_names(value.func):
            if q.startswith("torch.nn.") and q.count(".") == 2:
                if q.rsplit(".", 1)[-1].startswith(_NN_WEIGHTED):
                    return True
            elif q.startswith(_MODEL_FACTORIES) or q.endswith(".from_pretrained"):
                return True
        if isinstance(value.func, cst.Name):
            cls = self.index.classes.get(value.func.value)
            return cls is not None and self._is_module_class(cls, 0)
        return False


def _model_expression(receiver: cst.BaseExpression) -> cst.Name | cst.Attribute | None:
    """The model of ``receiver``: ``model`` for ``model.backbone`` and for ``model[0]`` (a layer of
    an ``nn.Sequential``; ``_add`` refuses it when ``model`` is a list of models), ``self.model``
    for ``self.model.head``; None for what is not a plain name (``get()``)."""
    chain: list[cst.Attribute] = []
    node = receiver
    while isinstance(node, (cst.Attribute, cst.Subscript)):
        if isinstance(node, cst.Subscript):
            chain.clear()  # ``self.layers[0]``: the model is ``self.layers``
        else:
            chain.append(node)
        node = node.value
    if not isinstance(node, cst.Name):
        return None
    if node.value == "self":
        return chain[-1] if chain else None
    return node


def _freezes(stmt: cst.CSTNode) -> bool:
    """Whether ``stmt`` sets ``requires_grad`` (DDP must see the final set of trained weights)."""
    names = m.Name("requires_grad") | m.Name("requires_grad_")
    return bool(m.findall(stmt, m.Attribute(attr=names)))
