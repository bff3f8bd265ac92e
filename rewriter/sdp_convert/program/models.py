"""torch models: which object an optimizer trains, what a module is, and the wrappers
(DistributedDataParallel, DataParallel, torch.compile) as data."""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

import libcst as cst
import libcst.matchers as m
from libcst.metadata import QualifiedNameSource

from .index import Binding, FileIndex, Scope, file_index
from .optimizers import optimizer_class
from .positions import node_positions
from .scopes import arguments_for, class_of, training_loops, uses
from .syntax import arg_named, assigned_target, code, findall, is_empty_list
from .vocab import DATA_PARALLEL_CHECKPOINTS, GROWN_FOR_DATA_PARALLEL

T = TypeVar("T")

if TYPE_CHECKING:
    from .model import FileModel

DDP = (
    "sdp_runtime.torch.DistributedDataParallel",
    "sdp_runtime.torch.ddp.DistributedDataParallel",
    "sdp_runtime.torch.parallel.DistributedDataParallel",
    "sdp_runtime.torch.parallel.distributed.DistributedDataParallel",
    "torch.nn.parallel.DistributedDataParallel",
    "torch.nn.parallel.distributed.DistributedDataParallel",
)


DATA_PARALLEL = (
    "torch.nn.DataParallel",
    "torch.nn.parallel.DataParallel",
    "torch.nn.parallel.data_parallel.DataParallel",
)


COMPILE = ("torch.compile",)


WRAPPERS = DDP + DATA_PARALLEL + COMPILE


#: Methods that place or prepare a model; the wrap comes after the last of them.
SETUP_METHODS = frozenset({
    "to", "cuda", "cpu", "half", "float", "double", "bfloat16", "type", "to_empty", "apply",
    "load_state_dict", "requires_grad_",
})

#: The methods of a module that move it to a device (and return it): a DDP wrap must come
#: after them, since DDP takes the devices of the parameters it finds when it wraps.
DEVICE_MOVES = frozenset({"to", "cuda"})


def moved_attribute(fm: FileModel, node: cst.CSTNode) -> bool:
    """Whether ``node``, a ``self.<attr>`` read in a method, is moved to a device by its class
    (``self.model = self.model.to(self.device)`` or ``self.model.cuda()`` in any method): a
    model kept by a trainer object that places it on the device itself."""
    if not (isinstance(node, cst.Attribute) and isinstance(node.value, cst.Name)
            and node.value.value == "self"):
        return False
    function = fm.enclosing_function(node)
    cls = class_of(fm, function) if function is not None else None
    if cls is None:
        return False
    spelled = code(node)
    return any(
        isinstance(call.func, cst.Attribute) and call.func.attr.value in DEVICE_MOVES
        and code(call.func.value) == spelled
        for call in findall(cls, m.Call())
    )


#: Context managers and decorators under which no gradient is recorded.
NO_GRAD = ("torch.no_grad", "torch.inference_mode")

#: What DDP (torch.nn.Module) answers itself: calling these on the wrapped model is fine.
MODULE_API = SETUP_METHODS | frozenset({
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
NN_WEIGHTED = ("Sequential", "Linear", "Bilinear", "Conv", "ConvTranspose", "LSTM", "GRU", "RNN",
                "Embedding", "Transformer", "MultiheadAttention", "Lazy")


MODEL_FACTORIES = ("torchvision.models.", "timm.create_model", "transformers.")


PARAMETER_METHODS = m.Name("parameters") | m.Name("named_parameters")


def model_expression(receiver: cst.BaseExpression) -> cst.Name | cst.Attribute | None:
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


def freezes(stmt: cst.CSTNode) -> bool:
    """Whether ``stmt`` sets ``requires_grad`` (DDP must see the final set of trained weights)."""
    names = m.Name("requires_grad") | m.Name("requires_grad_")
    return bool(findall(stmt, m.Attribute(attr=names)))


def trained_models(
    fm: FileModel, expr: cst.BaseExpression, depth: int
) -> Iterator[cst.BaseExpression]:
    """``X`` of every ``X.parameters()`` / ``X.named_parameters()`` that ``expr`` (original)
    passes on, through variables and function parameters."""
    if depth > 5:
        return
    for call in findall(expr, m.Call(func=m.Attribute(attr=PARAMETER_METHODS))):
        assert isinstance(call, cst.Call) and isinstance(call.func, cst.Attribute)
        yield call.func.value
    for name in findall(expr, m.Name()):
        assert isinstance(name, cst.Name)
        parent = fm.parent(name)
        if isinstance(parent, cst.Attribute) or (
            isinstance(parent, (cst.Call, cst.Arg))
            and name is not getattr(parent, "value", None)
        ):
            continue  # ``model.x``, ``list(...)``, ``lr=``: not a value passed on
        binding = file_index(fm).reaching(name.value, name)
        if binding is None:
            continue
        if binding.kind == "assign" and binding.value is not None and not binding.unpacked:
            yield from trained_models(fm, binding.value, depth + 1)
            if isinstance(binding.value, cst.List) or is_empty_list(binding.value):
                # ``params = []`` / ``list()`` filled later: ``params.append(p)``, ``extend``
                for added in _list_additions(fm, binding):
                    yield from trained_models(fm, added, depth + 1)
        elif binding.kind == "param":
            for value, _ in arguments(fm, binding):
                yield from trained_models(fm, value, depth + 1)
        elif binding.kind == "for" and isinstance(binding.stmt, cst.For):
            # ``for p in filter(lambda p: p.requires_grad, model.parameters()):``
            yield from trained_models(fm, binding.stmt.iter, depth + 1)


def _list_additions(fm: FileModel, binding: Binding) -> Iterator[cst.BaseExpression]:
    """What ``name.append(x)`` / ``name.extend(xs)`` / ``name.insert(i, x)`` / ``name += xs``
    add to the list a binding makes."""
    for use in uses(fm, binding):
        parent = fm.parent(use)
        if isinstance(parent, cst.Attribute) and parent.value is use and parent.attr.value in (
            "append", "extend", "insert"
        ):
            call = fm.parent(parent)
            if isinstance(call, cst.Call) and call.func is parent and call.args:
                yield call.args[-1].value
        elif isinstance(parent, cst.AugAssign) and parent.target is use:
            yield parent.value


def arguments(fm: FileModel, binding: Binding) -> Iterator[tuple[cst.BaseExpression, cst.Call]]:
    """What the callers pass for a function parameter: ``(argument, call)``."""
    function = binding.stmt
    if isinstance(function, cst.FunctionDef):
        yield from arguments_for(fm, function, binding.name)


def stepped_optimizers(fm: FileModel) -> Iterator[cst.Call]:
    """Constructors of objects whose ``.step()`` is called (optimizers from other libraries,
    factories) that are not torch.optim's (those are handled with notes)."""
    for step in fm.method_calls("step"):
        func = step.func
        assert isinstance(func, cst.Attribute)
        if not isinstance(func.value, (cst.Name, cst.Attribute)):
            continue
        binding = (
            file_index(fm).reaching(func.value.value, func.value)
            if isinstance(func.value, cst.Name)
            else next(iter(file_index(fm).attribute_bindings.get(code(func.value), [])[-1:]), None)
        )
        value = binding.value if binding is not None else None
        if isinstance(value, cst.Call) and optimizer_class(fm, value) is None and not (
            fm.refers_to(value.func, "torch.optim", prefix=True)
        ):
            yield value


def stepped_models(fm: FileModel, call: cst.Call) -> list[cst.BaseExpression]:
    """The models an optimizer of another library (``stepped_optimizers``) trains: ``X`` of
    every ``X.parameters()`` its first argument holds (``trained_models``), or, for a factory
    given the model itself (timm's ``create_optimizer_v2(model, "adamw")``), that model: a name
    the file calls in a function that calls ``backward()``."""
    params = arg_named(call, "params", 0)
    found = list(trained_models(fm, params.value, 0)) if params is not None else []
    return found or model_given(fm, call)


def model_given(fm: FileModel, call: cst.Call) -> list[cst.Name]:
    """``[model]`` for a call given the model itself as its first argument
    (``create_optimizer_v2(model, "adamw")``): a name the file calls in a function that calls
    ``backward()``; [] otherwise (an optimizer handed to a scheduler is not called)."""
    params = arg_named(call, "params", 0) or arg_named(call, "model_or_params")
    name = params.value if params is not None else None
    if not isinstance(name, cst.Name):
        return []
    binding = file_index(fm).reaching(name.value, name)
    if binding is None or binding.kind != "assign":
        return []
    trains = _backward_functions(fm)
    for load in file_index(fm).loads_of(name.value, binding.scope):
        parent = fm.parent(load)
        if isinstance(parent, cst.Call) and parent.func is load and (
            fm.enclosing_function(parent) in trains
        ):
            return [name]
    return []


def models_from_backward(fm: FileModel) -> Iterator[tuple[cst.BaseExpression, cst.CSTNode]]:
    """Modules called in the computation of what ``.backward()`` is called on."""
    for backward in fm.method_calls("backward"):
        func = backward.func
        assert isinstance(func, cst.Attribute)
        todo: list[tuple[cst.BaseExpression, int]] = [(func.value, 0)]
        seen: set[int] = set()
        while todo:
            expr, depth = todo.pop()
            if id(expr) in seen or depth > 4:
                continue
            seen.add(id(expr))
            for call in findall(expr, m.Call()):
                assert isinstance(call, cst.Call)
                callee = call.func
                if model_expression(callee) is callee and is_module_value(fm, callee):
                    yield callee, backward
            for name in findall(expr, m.Name()):
                assert isinstance(name, cst.Name)
                binding = file_index(fm).reaching(name.value, name)
                if binding is not None and binding.kind == "assign" and binding.value:
                    todo.append((binding.value, depth + 1))


def owner_class(fm: FileModel, node: cst.CSTNode) -> cst.ClassDef | None:
    for parent in fm.ancestors(node):
        if isinstance(parent, cst.ClassDef):
            return parent
    return None


def is_wrapper(fm: FileModel, value: cst.BaseExpression | None, names: tuple[str, ...] = WRAPPERS
) -> bool:
    return isinstance(value, cst.Call) and fm.refers_to(value.func, *names)


def is_plain_object(fm: FileModel, value: cst.BaseExpression | None) -> bool:
    """``Trainer(cfg)`` where ``Trainer`` is a class of this file that is no torch module."""
    if not (isinstance(value, cst.Call) and isinstance(value.func, cst.Name)):
        return False
    cls = file_index(fm).class_named(value.func)
    return cls is not None and not is_module_class(fm, cls, 0)


def is_module_class(fm: FileModel, cls: cst.ClassDef, depth: int) -> bool:
    for base in cls.bases:
        if fm.refers_to(base.value, "torch.nn", prefix=True):
            return True
        if isinstance(base.value, cst.Name) and depth < 4:
            parent = file_index(fm).class_named(base.value)
            if parent is not None and is_module_class(fm, parent, depth + 1):
                return True
    return False


def is_module_value(fm: FileModel, callee: cst.BaseExpression) -> bool:
    """Whether the name ``callee`` (original) was assigned a torch module with weights."""
    if isinstance(callee, cst.Name):
        binding = file_index(fm).reaching(callee.value, callee)
        return binding is not None and is_module_value_expr(fm, binding.value)
    found = file_index(fm).attribute_bindings.get(code(callee), [])
    return bool(found) and is_module_value_expr(fm, found[0].value)


def is_module_value_expr(fm: FileModel, value: cst.BaseExpression | None) -> bool:
    while (
        isinstance(value, cst.Call)
        and isinstance(value.func, cst.Attribute)
        and value.func.attr.value in SETUP_METHODS | {"train", "eval"}
    ):
        value = value.func.value
    if not isinstance(value, cst.Call):
        return False
    for q in fm.qualified_names(value.func):
        if q.startswith("torch.nn.") and q.count(".") == 2:
            if q.rsplit(".", 1)[-1].startswith(NN_WEIGHTED):
                return True
        elif q.startswith(MODEL_FACTORIES) or q.endswith(".from_pretrained"):
            return True
    if isinstance(value.func, cst.Name):
        cls = file_index(fm).class_named(value.func)
        return cls is not None and is_module_class(fm, cls, 0)
    return False


def model_creation(fm: FileModel, bindings: list[Binding], reaching: Binding | None, at: cst.CSTNode
) -> Binding | None:
    """The assignment that creates the model used at ``at``, skipping wrappers
    (``torch.compile(model)``, ``nn.DataParallel(model)``)."""
    creations = [
        b for b in bindings
        if b.kind == "assign" and b.value is not None and not is_wrapper(fm, b.value)
    ]
    if not creations:
        return None
    same_function = [
        b for b in creations
        if fm.enclosing_function(b.stmt) is fm.enclosing_function(at)
        and file_index(fm).is_before(b.stmt, at)
    ]
    if same_function:
        return same_function[-1]
    if reaching is None:  # ``t.model``: the one ``__init__`` makes
        in_init = [b for b in creations if isinstance(b.scope, cst.FunctionDef)
                   and b.scope.name.value == "__init__"]
        return (in_init or creations)[0]
    return creations[0]


def part_of_a_model(fm: FileModel, name: str, scope: Scope, models: Mapping[Any, Any]) -> bool:
    """``name`` is handed to the constructor of one of ``models`` (``Decoder(encoder)``; each
    value with its ``creation`` binding and ``scope``) or returned."""
    for model in models.values():
        value = model.creation.value
        if model.scope is scope and value is not None and any(
            n.value == name for n in findall(value, m.Name())
        ):
            return True
    if isinstance(scope, cst.FunctionDef):
        for ret in file_index(fm).returns.get(id(scope), ()):
            if ret.value is not None and any(
                n.value == name for n in findall(ret.value, m.Name())
            ):
                return True
    return False


def _branch(fm: FileModel, compound: cst.CSTNode, node: cst.CSTNode) -> int | None:
    """Which branch (suite) of an ``if``/``try`` holds ``node``: an index, None if none."""
    if isinstance(compound, cst.If):
        suites: list[cst.CSTNode | None] = [compound.body, compound.orelse]
    elif isinstance(compound, cst.Try):
        suites = [compound.body, *compound.handlers, compound.orelse, compound.finalbody]
    else:
        return None
    ids = {id(s): i for i, s in enumerate(suites) if s is not None}
    for parent in (node, *fm.ancestors(node)):
        if id(parent) in ids:
            return ids[id(parent)]
        if parent is compound:
            break
    return None


def branch_join(fm: FileModel, creation: cst.CSTNode, others: list[cst.CSTNode]
) -> cst.If | cst.Try | None:
    """Where the branches that create one model join: the outermost ``if``/``try`` around
    ``creation`` (in its function) with another creation of the same model (``others``) in another
    of its branches, or before it (``if resume: model = load(...)``). None when ``creation`` is
    the only one that can reach what follows.

    Example: ``if a: model = A()`` / ``else: model = B()``: the ``if`` statement.
    """
    function = fm.enclosing_function(creation)
    index = file_index(fm)
    rivals = [o for o in others if o is not creation and fm.enclosing_function(o) is function]
    join: cst.If | cst.Try | None = None
    for parent in fm.ancestors(creation):
        if isinstance(parent, (cst.FunctionDef, cst.ClassDef, cst.Lambda, cst.Module)):
            break
        if not isinstance(parent, (cst.If, cst.Try)):
            continue
        mine = _branch(fm, parent, creation)
        for other in rivals:
            theirs = _branch(fm, parent, other)
            if (theirs is not None and theirs != mine) or (
                theirs is None and index.is_before(other, parent)
            ):
                join = parent
                break
    return join


def used_inside(fm: FileModel, uses: list[cst.CSTNode], node: cst.CSTNode) -> bool:
    """A load of the model in ``node`` other than a setup call (``model.to(device)``) or a read of
    its parameters (an optimizer's: the wrapped model trains the same ones)."""
    for use in uses:
        if not any(p is node for p in fm.ancestors(use)):
            continue
        parent = fm.parent(use)
        if not (isinstance(parent, cst.Attribute) and parent.value is use
                and parent.attr.value in SETUP_METHODS | {"parameters", "named_parameters"}):
            return True
    return False


def without_grad(fm: FileModel, call: cst.Call) -> bool:
    """``call`` runs under ``with torch.no_grad():`` or in a function decorated with it."""
    for parent in fm.ancestors(call):
        if isinstance(parent, cst.With) and any(
            isinstance(item.item, cst.Call) and fm.refers_to(item.item.func, *NO_GRAD)
            for item in parent.items
        ):
            return True
        if isinstance(parent, cst.FunctionDef):
            return any(
                fm.refers_to(d.decorator.func if isinstance(d.decorator, cst.Call)
                            else d.decorator, *NO_GRAD)
                for d in parent.decorators
            )
        if isinstance(parent, cst.Lambda):
            return False
    return False


def discarded_outputs(fm: FileModel, target: str, scope: Scope) -> cst.Call | None:
    """A call of the model ``target`` that throws part of its outputs away (``validity, _, _ =
    D(x)``, ``D(x)[0]``): parameters that only produce those get no gradient, and DDP, which
    expects a gradient for every parameter, fails at the next step unless told to look for unused
    ones (``find_unused_parameters=True``)."""
    backward_functions = _backward_functions(fm)
    for name in file_index(fm).loads_of(target, scope):
        call = fm.parent(name)
        if not (isinstance(call, cst.Call) and call.func is name):
            continue
        # Only a call that trains counts: evaluation (under no_grad, or in a function that
        # computes no gradient) needs no gradient for any parameter.
        if without_grad(fm, call) or fm.enclosing_function(call) not in backward_functions:
            continue
        parent = fm.parent(call)
        if isinstance(parent, cst.Subscript) and parent.value is call:
            return call
        if isinstance(parent, cst.Assign) and any(
            isinstance(target_.target, (cst.Tuple, cst.List))
            and any(
                isinstance(e.value, cst.Name) and e.value.value.startswith("_")
                for e in target_.target.elements
            )
            for target_ in parent.targets
        ):
            return call
    return None


def _backward_functions(fm: FileModel) -> frozenset[cst.FunctionDef | None]:
    """The functions (None: module level) that call ``backward()`` (once per file)."""
    if fm.facts.backward_functions is None:
        fm.facts.backward_functions = frozenset(
            fm.enclosing_function(c) for c in fm.method_calls("backward")
        )
    return fm.facts.backward_functions


def user_methods_in_training(
    fm: FileModel, uses: list[cst.CSTNode]
) -> Iterator[tuple[cst.Call, cst.Attribute, cst.CSTNode]]:
    """``(call, model.method, model)`` for each call of a user method of the model (not the
    ``nn.Module`` API) in a function that calls ``backward()``: it runs around DDP's forward.
    Not one under ``torch.no_grad()``: it computes no gradient, so none goes unaveraged."""
    trains = {id(f) for f in _backward_functions(fm)}
    for use in uses:
        parent = fm.parent(use)
        call = fm.parent(parent) if parent is not None else None
        if (
            isinstance(parent, cst.Attribute) and parent.value is use
            and parent.attr.value not in MODULE_API
            and isinstance(call, cst.Call) and call.func is parent
            and id(fm.enclosing_function(call)) in trains
            and not without_grad(fm, call)
            and not makes_stepped_optimizer(fm, call)
        ):
            yield call, parent, use


def untrained_models(
    fm: FileModel, index: FileIndex, trained: set[tuple[str, int]], models: Mapping[Any, Any]
) -> Iterator[tuple[str, Binding]]:
    """``(name, binding)`` of modules built and called in this file that are not in ``trained``
    (``(name, id(scope))``) nor part of another model (of ``models``, the models a transform
    found: ``part_of_a_model``): evaluation models, teachers."""
    for (scope_id, name), bindings in index.bindings.items():
        if (name, scope_id) in trained:
            continue
        for binding in bindings:
            if binding.kind != "assign" or not is_module_value_expr(fm, binding.value):
                continue
            if part_of_a_model(fm, name, binding.scope, models):
                break
            if any(
                isinstance(p := fm.parent(load), cst.Call) and p.func is load
                for load in index.loads_of(name, binding.scope)
            ):
                yield name, binding
            break


def model_bindings(
    fm: FileModel, target: str, scope: Scope, owner: cst.ClassDef | None
) -> list[Binding]:
    """Where the model ``target`` is assigned: the name in ``scope``, or ``self.<attr>`` in the
    methods of ``owner``."""
    index = file_index(fm)
    if owner is None:
        return index.bindings_of(target, scope)
    return [
        b for b in index.attribute_bindings.get(target, []) if owner_class(fm, b.stmt) is owner
    ]


def no_grad_submodule(fm: FileModel, value: cst.BaseExpression | None) -> cst.Call | None:
    """A submodule call (``self.encoder(x)``) under ``torch.no_grad()`` in the ``forward`` of the
    class of this file that ``value`` builds (``Net()``, ``Net().to(device)``), whose parameters
    are not frozen: they never get a gradient, and DDP, which waits for one from every parameter
    that requires it, fails at the next step unless told to look for unused ones."""
    names = [c.func.value for c in findall(value, m.Call(func=m.Name()))] if value else []
    if not names:
        return None  # no call of a plain name: no class of the file is built (no module scan)
    classes = {s.name.value: s for s in fm.module.body if isinstance(s, cst.ClassDef)}
    cls = next((classes[n] for n in names if n in classes), None)
    return no_grad_in_class(fm, cls) if cls is not None else None


def no_grad_in_class(fm: FileModel, cls: cst.ClassDef) -> cst.Call | None:
    """The submodule call under ``torch.no_grad()`` in ``cls.forward`` whose parameters are not
    frozen (see ``no_grad_submodule``), or None; ``cls`` is a class of ``fm``'s file (the project
    model asks it of a class in any module)."""
    text = fm.module.code_for_node(cls)
    for function in findall(cls, m.FunctionDef(name=m.Name("forward"))):
        for block in findall(function, m.With()):
            assert isinstance(block, cst.With)
            if not any(isinstance(i.item, cst.Call) and fm.refers_to(i.item.func, *NO_GRAD)
                       for i in block.items):
                continue
            for call in findall(block.body, m.Call(func=m.Attribute(value=m.Name("self")))):
                assert isinstance(call, cst.Call) and isinstance(call.func, cst.Attribute)
                sub = f"self.{call.func.attr.value}"
                if f"{sub}.requires_grad_(False)" not in text and not re.search(
                    rf"for \w+ in {re.escape(sub)}\.parameters\(\)", text
                ):
                    return call
    return None


def unused_parameters_reason(discarding: cst.Call | None, no_grad: cst.Call | None) -> str:
    """Why the wrap asks for ``find_unused_parameters=True`` (the report's words), or ""."""
    if discarding is not None:
        return (f" with find_unused_parameters=True: {code(discarding)} discards some of its "
                "outputs")
    if no_grad is not None:
        return (f" with find_unused_parameters=True: its forward runs {code(no_grad.func)} under "
                "torch.no_grad(), so those parameters get no gradient")
    return ""


def moves_off_device(fm: FileModel, uses: list[cst.CSTNode], after: int) -> list[cst.Call]:
    """The calls that move a wrapped model (``uses``: its loads) to the CPU after the wrap
    (``after``: the wrap's walk order) inside a loop that trains: ``model.eval().cpu()``,
    ``model.to("cpu")``, through a chain of module methods. One after the training has ended
    harms nothing and is not counted."""
    loops = training_loops(fm)
    order = file_index(fm).order
    found: list[cst.Call] = []
    for use in uses:
        if order.get(id(use), -1) <= after or not any(a in loops for a in fm.ancestors(use)):
            continue
        node: cst.CSTNode = use
        while True:
            attribute = fm.parent(node)
            call = fm.parent(attribute) if attribute is not None else None
            if not (isinstance(attribute, cst.Attribute) and attribute.value is node
                    and isinstance(call, cst.Call) and call.func is attribute
                    and attribute.attr.value in MODULE_API):
                break
            if attribute.attr.value == "cpu" or (
                attribute.attr.value == "to" and call.args and "cpu" in code(call.args[0].value)
            ):
                found.append(call)
                break
            node = call
    return found


def data_parallel_statement(fm: FileModel, call: cst.Call) -> cst.CSTNode | None:
    """The statement that goes with ``model = nn.DataParallel(model)`` (and an ``if`` that holds
    only it, where something else stays in its block); None where it cannot simply go."""
    stmt = fm.enclosing_statement(call)
    if not isinstance(stmt, cst.SimpleStatementLine) or len(stmt.body) != 1:
        return None
    body = fm.parent(stmt)
    if not (isinstance(body, cst.IndentedBlock) and len(body.body) == 1):
        return stmt
    owner = fm.parent(body)
    outer = fm.parent(owner) if owner is not None else None
    return owner if (
        isinstance(owner, cst.If) and owner.orelse is None
        and isinstance(outer, (cst.Module, cst.IndentedBlock)) and len(outer.body) > 1
    ) else None


#: What the note of ``move_off_device_note`` says after the call's code (save_model_in_place reads
#: those notes).
MOVES_OFF_DEVICE = " moves the parameters of "


def move_off_device_note(call: cst.Call, target: str, sdp: str) -> str:
    """The note at a move of a wrapped model off its device (``moves_off_device``)."""
    return (
        f"{code(call)}{MOVES_OFF_DEVICE}{target}, a {sdp}.DistributedDataParallel from "
        "here on, off its device: DistributedDataParallel must keep them where it was built "
        "(moved away and back, its gradients can silently stop being averaged). Save without "
        f"moving it: `torch.save({{k: v.cpu() for k, v in {target}.state_dict().items()}}, "
        "path)`, and drop this move and the move back to the device"
    )


def names_held_by(
    creations: list[tuple[T, object, cst.BaseExpression | None]], wanted: set[str],
) -> dict[tuple[int, str], list[T]]:
    """``(id(scope), name or attribute)`` -> the objects whose creation (``(object, scope,
    value)``) reads that name, in the order given: each creation read once. Only the names and
    attributes spelled as one of ``wanted`` are keys.

    The names and the attributes are found by two searches of one node class each (``findall``'s
    class test, not libcst's matcher on every node as a ``Name() | Attribute()`` would), and a
    node's text is made only where it can be one of ``wanted``: in a name's or an attribute's
    text its identifier (``value``, ``attr``) stands between dots, parentheses, white space,
    comments' ``#`` or the ends, so one that is no such word of ``wanted`` is passed over; a bare
    name's text is its value."""
    words = {word for name in wanted for word in re.split(r"[\s.()\\#]+", name)}
    held: dict[tuple[int, str], list[T]] = {}
    for obj, scope, value in creations:
        if value is None:
            continue
        texts = {
            n.value if not n.lpar and not n.rpar else code(n)
            for n in findall(value, m.Name()) if isinstance(n, cst.Name) and n.value in words
        } | {
            code(a) for a in findall(value, m.Attribute())
            if isinstance(a, cst.Attribute) and a.attr.value in words
        }
        for name in texts & wanted:
            held.setdefault((id(scope), name), []).append(obj)
    return held


def data_parallel_notes(fm: FileModel, call: cst.Call, sdp: str) -> list[tuple[cst.CSTNode, str]]:
    """The manual notes removing ``nn.DataParallel`` (``call``) calls for, each at its place:
    the checkpoints that change format (``data_parallel_checkpoints``), and, once a file (at its
    first DataParallel), each product with the GPU count (``torch.cuda.device_count()``, or what
    it was assigned to: ``opt.batch_size * opt.num_gpu``), a batch size or worker count the
    script grew for DataParallel's one process over every GPU: under ``sdp-run`` each process
    still sees them all, and trains on one."""
    notes: list[tuple[cst.CSTNode, str]] = []
    if (note := data_parallel_checkpoints(fm, call, sdp)) is not None:
        notes.append((call, note))
    wrappers = fm.calls_to("torch.nn.DataParallel")
    if not wrappers or min(wrappers, key=fm.order) is not call:
        return notes
    counts = fm.calls_to("torch.cuda.device_count")
    spelled = {code(c) for c in counts} | {
        code(t.target) for c in counts if isinstance(a := fm.parent(c), cst.Assign)
        for t in a.targets}
    for op in findall(fm.module, m.BinaryOperation(operator=m.Multiply())
                      | m.AugAssign(operator=m.MultiplyAssign())):
        factors = (op.left, op.right) if isinstance(op, cst.BinaryOperation) else (op.value,)
        if spelled and any(code(f) in spelled for f in factors):
            notes.append((op, f"{code(op)}{GROWN_FOR_DATA_PARALLEL} (one "
                              "process over every GPU); each sdp-run process trains on one GPU "
                              "and still sees them all: drop the factor (batch sizes and loader "
                              "workers are per process now)"))
    return notes


def data_parallel_checkpoints(fm: FileModel, call: cst.Call, sdp: str) -> str | None:
    """The note for removing ``nn.DataParallel`` (``call``) in a file that saves or loads the
    ``state_dict`` of the model it wraps (its argument, or the name it is assigned to:
    ``model = nn.DataParallel(Net()).cuda()``): DataParallel's keys carry ``module.``, the
    runtime wrapper's do not, so both the checkpoints this script saves and those it loads
    change format (None: no such save or load here). The lines are named; the edit that keeps
    the old format is said."""
    model = call.args[0].value if call.args else None
    stmt = fm.enclosing_statement(call)
    if not isinstance(model, (cst.Name, cst.Attribute)) and isinstance(
        stmt, cst.SimpleStatementLine
    ) and isinstance(assign := stmt.body[0], cst.Assign) and len(assign.targets) == 1:
        model = assign.targets[0].target
    if model is None:
        return None
    target = code(model)
    # Only what comes after the DataParallel call: before it, the plain model's keys were saved
    # and loaded, as they are now (``model.load_state_dict(ckpt); model = nn.DataParallel(model)``).
    after = fm.order(call)
    loads = [c for c in fm.method_calls("load_state_dict") if fm.order(c) > after
             and isinstance(c.func, cst.Attribute) and code(c.func.value) == target]
    # Saved: inside ``torch.save(...)``, or in a value assigned to a name that one saves
    # (``state = {"net": net.state_dict(), ...}; torch.save(state, path)``).
    saved = {code(a.value) for c in fm.calls_to("torch.save") for a in c.args[:1]}
    saves = [c for c in fm.method_calls("state_dict") if fm.order(c) > after
             and isinstance(c.func, cst.Attribute) and code(c.func.value) == target
             and any((isinstance(p, cst.Call) and fm.refers_to(p.func, "torch.save")) or (
                 isinstance(p, cst.Assign) and any(code(t.target) in saved for t in p.targets))
                 for p in fm.ancestors(c))]
    if not loads and not saves:
        return None
    where = node_positions(fm.module, {id(c) for c in (*loads, *saves)})

    def lines(calls: list[cst.Call]) -> str:
        found = sorted({where[id(c)][0] for c in calls if id(c) in where})
        return ("line " if len(found) == 1 else "lines ") + ", ".join(map(str, found)) + (
            " of the original")

    parts = [f"{DATA_PARALLEL_CHECKPOINTS}{target}.state_dict() keys start with `module.`, "
             f"{sdp}.DistributedDataParallel's do not, so checkpoints change format"]
    if loads:
        parts.append(
            f"the load_state_dict at {lines(loads)}, where it runs before the wrap (into the "
            f"plain {target}; the wrapper's own load takes both forms), fails on a checkpoint "
            "the original script saved, or with strict=False silently loads nothing: strip the "
            "prefix first "
            "(`torch.nn.modules.utils.consume_prefix_in_state_dict_if_present(state, "
            "'module.')`)")
    if saves:
        parts.append(
            f"the checkpoints saved at {lines(saves)} lose the prefix, so code that loads them "
            "strictly into an nn.DataParallel model, as the original did, fails: save "
            f"`{{'module.' + k: v for k, v in {target}.state_dict().items()}}` to keep the old "
            "format, or load them into the plain model")
    return "; ".join(parts)


@dataclass(frozen=True)
class RoundTrip:
    """A wrapped model moved off its device and back in one block (``round_trip``)."""

    #: ``model.eval().cpu()`` and ``model.to(device).train()``: statements of the same block.
    away: cst.SimpleStatementLine
    back: cst.SimpleStatementLine
    #: The last of ``eval``/``train`` the two make (the mode the model is left in), or None.
    mode: str | None
    #: ``model``: the receiver, as written.
    model: str
    #: The ``model.state_dict()`` calls between them, each inside a ``torch.save(...)``.
    saves: tuple[cst.Call, ...]


def _moves(fm: FileModel, stmt: cst.CSTNode, away: bool) -> tuple[str, list[str]] | None:
    """``model.eval().cpu()`` (``away``) or ``model.to(device).train()`` as a statement of its
    own: (the receiver, the methods in call order); None for anything else (a dtype cast, an
    argument that may not name the device, a value kept)."""
    if not (isinstance(stmt, cst.SimpleStatementLine) and len(stmt.body) == 1
            and isinstance(stmt.body[0], cst.Expr)):
        return None
    node, methods = stmt.body[0].value, []
    while isinstance(node, cst.Call) and isinstance(node.func, cst.Attribute):
        name, args = node.func.attr.value, node.args
        target = code(args[0].value) if len(args) == 1 and args[0].keyword is None else None
        if name in ("eval", "train") and not args:
            methods.append(name)
        elif (name == "cpu" and away and not args) or (name == "cuda" and not away) or (
                name == "to" and target is not None and ("cpu" in target) is away
                and (away or re.search(r"device|cuda", target))):
            methods.append("move")
        else:
            return None
        node = node.func.value
    if not isinstance(node, (cst.Name, cst.Attribute)) or "move" not in methods:
        return None
    return code(node), methods[::-1]


def round_trip(fm: FileModel, call: cst.Call) -> RoundTrip | None:
    """The round trip ``call`` (a move of a wrapped model off its device, ``moves_off_device``)
    starts, where dropping both moves provably changes nothing but where the parameters stay:
    the move back is a later statement of the same block, and between them the model is read
    only by ``model.state_dict()`` inside ``torch.save(...)``, nothing leaves the block (no
    ``return``, ``break``, ``continue``, ``raise``, ``yield``), and every call is to an import or
    a builtin (none that could run the model: a function of the file, a method of a local value).
    None otherwise."""
    away = fm.enclosing_statement(call)
    block = fm.parent(away) if away is not None else None
    there = _moves(fm, away, True) if away is not None else None
    if there is None or not isinstance(block, (cst.IndentedBlock, cst.Module)):
        return None
    model, first = there
    body = list(block.body)
    start = next(i for i, s in enumerate(body) if s is away)
    for end in range(start + 1, len(body)):
        back = _moves(fm, body[end], False)
        if back is not None and back[0] == model:
            break
    else:
        return None
    between = body[start + 1:end]
    leaves = m.Return() | m.Break() | m.Continue() | m.Raise() | m.Yield() | m.Await()
    nested = m.FunctionDef() | m.ClassDef() | m.Lambda() | m.Global() | m.Nonlocal()
    if any(findall(s, leaves | nested) for s in between):
        return None
    saves: list[cst.Call] = []
    for stmt in between:
        for node in findall(stmt, m.Name() | m.Attribute()):
            if code(node) != model:
                continue
            attribute = fm.parent(node)
            read = fm.parent(attribute) if attribute is not None else None
            if not (isinstance(attribute, cst.Attribute) and attribute.value is node
                    and attribute.attr.value == "state_dict" and isinstance(read, cst.Call)
                    and read.func is attribute and not read.args
                    and any(isinstance(a, cst.Call) and fm.refers_to(a.func, "torch.save")
                            for a in fm.ancestors(read))):
                return None
            saves.append(read)
        for each in findall(stmt, m.Call()):
            if each in saves:
                continue
            root = each.func
            while isinstance(root, (cst.Attribute, cst.Call, cst.Subscript)):
                root = root.func if isinstance(root, cst.Call) else root.value
            sources = {q.source for q in fm.raw_qualified_names(root)}
            if not sources or not sources <= {QualifiedNameSource.IMPORT,
                                               QualifiedNameSource.BUILTIN}:
                return None
    if any(isinstance(n, cst.Name) and n.value == model.split(".")[0] and not any(
            code(a) == model for a in (n, fm.parent(n)) if a is not None)
            for stmt in between for n in findall(stmt, m.Name())):
        return None  # ``self`` read otherwise than as ``self.model``
    if not saves:
        return None  # nothing saved: the block would lose both statements, the note stays
    mode = next((x for x in reversed(first + _moves(fm, body[end], False)[1])
                 if x in ("eval", "train")), None)
    return RoundTrip(away, body[end], mode, model, tuple(saves))


def makes_stepped_optimizer(fm: FileModel, call: cst.Call) -> bool:
    """``self.optimizer = model.configure_optimizers(config)``: a method of the model whose
    result this file steps (``self.optimizer.step()``), so the optimizer of that model, built
    by the model's own class. The wrap goes after it: the method is the plain model's, and
    the optimizer it makes holds the same parameters the wrapper averages."""
    target = assigned_target(fm, call)
    if target is None:
        return False
    spelled = code(target)
    return any(
        isinstance(step.func, cst.Attribute) and code(step.func.value) == spelled
        for step in fm.method_calls("step")
    )
