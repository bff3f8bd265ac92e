"""Where TensorFlow training happens: gradient tapes, the steps that apply their gradients, and
the loops and functions that drive those steps (``training_facts``, computed once per file)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import libcst as cst

from .index import FileIndex, Scope, file_index, nodes_of
from .scopes import callers
from .syntax import target_names

if TYPE_CHECKING:
    from .model import FileModel

TAPES = ("tensorflow.GradientTape", "tensorflow.autodiff.GradientTape")


APPLY_METHODS = ("apply_gradients", "apply")


BY_HAND_METHODS = ("assign_sub", "assign_add", "assign")


_DIFFERENTIATING = ("gradient", "jacobian", "batch_jacobian")


@dataclass(eq=False)
class Tape:
    call: cst.Call  #: ``tf.GradientTape(...)``
    name: str
    scope: Scope
    with_stmt: cst.With | None
    gradient_calls: list[cst.Call] = field(default_factory=list)
    applies: list[cst.Call] = field(default_factory=list)
    by_hand: list[cst.Call] = field(default_factory=list)
    wrapped: bool = False


@dataclass(eq=False)
class StepSite:
    """Where a training loop runs one optimizer step."""

    apply: cst.Call
    #: The statement, in the loop's function, that runs the step: the ``apply_gradients`` line
    #: itself, or the call of the step function.
    statement: cst.BaseStatement
    loops: list[cst.For | cst.While]  #: innermost first, all in the statement's function
    #: (function, the call of it) from the step function out to the call in the loop; empty when
    #: the loop applies the gradients itself.
    chain: list[tuple[cst.FunctionDef, cst.Call]] = field(default_factory=list)


@dataclass
class TrainingFacts:
    tapes: list[Tape] = field(default_factory=list)
    #: optimizer call -> the tapes whose gradients it applies
    applies: dict[cst.Call, list[Tape]] = field(default_factory=dict)
    sites: list[StepSite] = field(default_factory=list)
    #: applies found in no training loop (Keras ``train_step`` overrides, or unusual code)
    loopless: list[cst.Call] = field(default_factory=list)
    #: classes whose ``train_step`` applies gradients of a tape (Keras fit drives them), with
    #: that ``train_step`` (their own, or one they inherit from a class of the file)
    train_step_classes: dict[str, cst.FunctionDef] = field(default_factory=dict)
    #: every such ``train_step`` (a class redefined under the same name keeps each of its own)
    train_step_methods: list[cst.FunctionDef] = field(default_factory=list)


def training_facts(fm: FileModel) -> TrainingFacts:
    """The tapes, optimizer steps and loops of the file (original nodes), computed once."""
    if fm.facts.training is not None:
        return fm.facts.training
    index = file_index(fm)
    facts = TrainingFacts()
    for call in fm.calls_to(*TAPES):
        tape = _tape(fm, index, call)
        if tape is None:
            continue
        facts.tapes.append(tape)
        for apply in tape.applies:
            facts.applies.setdefault(apply, []).append(tape)
        scope = tape.scope
        if tape.applies and isinstance(scope, cst.FunctionDef) and scope.name.value == "train_step":
            owner = index.parent_scope.get(id(scope))
            if isinstance(owner, cst.ClassDef):
                facts.train_step_classes[owner.name.value] = scope
                facts.train_step_methods.append(scope)
    _inherited(fm, facts.train_step_classes)
    for apply in sorted(facts.applies, key=lambda n: index.order.get(id(n), 0)):
        sites = _step_sites(fm, index, apply, apply, [])
        if sites:
            facts.sites.extend(sites)
        else:
            facts.loopless.append(apply)
    fm.facts.training = facts
    return facts


def _inherited(fm: FileModel, classes: dict[str, cst.FunctionDef]) -> None:
    """Add the classes of the file that inherit such a ``train_step`` (``class Model(Base)``,
    ``Base.train_step`` averaging its tape's gradients), not overriding it: fit drives it for
    their instances too."""
    found = True
    while found:
        found = False
        for cls in nodes_of(fm, cst.ClassDef):
            name = cls.name.value
            own = any(isinstance(s, cst.FunctionDef) and s.name.value == "train_step"
                      for s in getattr(cls.body, "body", ()))
            base = next((classes[b.value.value] for b in cls.bases if isinstance(b.value, cst.Name)
                         and b.value.value in classes), None)
            if name not in classes and not own and base is not None:
                classes[name] = base
                found = True


def _tape(fm: FileModel, index: FileIndex, call: cst.Call) -> Tape | None:
    parent = fm.parent(call)
    with_stmt = None
    if isinstance(parent, cst.WithItem) and parent.item is call:
        if parent.asname is None or not isinstance(parent.asname.name, cst.Name):
            return None
        name = parent.asname.name.value
        with_stmt = fm.parent(parent)
        assert isinstance(with_stmt, cst.With)
    elif isinstance(parent, cst.Assign) and len(parent.targets) == 1 and isinstance(
        parent.targets[0].target, cst.Name
    ):
        name = parent.targets[0].target.value
    else:
        return None
    tape = Tape(call, name, index.scope(call), with_stmt)
    runtime = fm.runtime_module
    # A name may hold several tapes in turn (``with tf.GradientTape() as tape:`` for the
    # discriminator, again for the generator, again for a saliency map): this tape's uses are
    # those between its binding and the next tape bound to the name.
    bindings = index.bindings_of(name, tape.scope)
    tapes = [
        b for b in bindings
        if isinstance(b.value, cst.Call) and fm.refers_to(b.value.func, *TAPES)
    ]
    own = next((b for b in tapes if b.value is call), None)
    later = [b.order for b in tapes if own is not None and b.order > own.order]
    end = min(later) if later else None

    def is_own(order: int) -> bool:
        if own is None:
            return True
        if order < tapes[0].order:  # before any tape is bound: carried over by a loop
            return own is tapes[-1]
        return own.order <= order and (end is None or order < end)

    for binding in bindings:
        value = binding.value
        if (
            isinstance(value, cst.Call)
            and fm.refers_to(value.func, f"{runtime}.DistributedGradientTape")
            and is_own(binding.order)
        ):
            tape.wrapped = True
    for load in index.loads_of(name, tape.scope):
        if not is_own(index.order.get(id(load), 0)):
            continue
        attribute = fm.parent(load)
        if isinstance(attribute, cst.Attribute) and attribute.attr.value == "gradient":
            gradient = fm.parent(attribute)
            if isinstance(gradient, cst.Call) and gradient.func is attribute:
                tape.gradient_calls.append(gradient)
    _follow(fm, index, tape)
    return tape


def _follow(fm: FileModel, index: FileIndex, tape: Tape) -> None:
    """Follow the tape's gradients to the optimizer calls (or hand updates) that consume them."""
    work: list[cst.CSTNode] = list(tape.gradient_calls)
    seen: set[tuple[int, str, int]] = set()
    returned: set[int] = set()

    def taint(target: cst.CSTNode, statement: cst.CSTNode) -> None:
        scope = index.scope(target)
        for name in [n.value for n in target_names(target)]:
            key = (id(scope), name, id(statement))
            if key not in seen:
                seen.add(key)
                work.extend(_uses_of_binding(index, name, scope, statement))

    while work:
        child = work.pop()
        for parent in fm.ancestors(child):
            if isinstance(parent, cst.Call) and child is not parent.func:
                method = parent.func.attr.value if isinstance(parent.func, cst.Attribute) else ""
                if method in APPLY_METHODS:
                    if parent not in tape.applies:
                        tape.applies.append(parent)
                    break
                if method in BY_HAND_METHODS:
                    tape.by_hand.append(parent)
                    break
                if method in _DIFFERENTIATING:
                    break  # what is differentiated is not a gradient (a penalty in a loss)
            elif isinstance(parent, (cst.Assign, cst.AnnAssign, cst.AugAssign)):
                if child is parent.value:
                    targets = (
                        [t.target for t in parent.targets]
                        if isinstance(parent, cst.Assign)
                        else [parent.target]
                    )
                    for target in targets:
                        taint(target, parent)
                break
            elif isinstance(parent, cst.For):
                if child is parent.iter:
                    taint(parent.target, parent)
                break
            elif isinstance(parent, cst.Return):
                function = index.scope(parent)
                if isinstance(function, cst.FunctionDef) and id(function) not in returned:
                    returned.add(id(function))
                    work.extend(_calls_of(fm, index, function))
                break
            elif isinstance(
                parent, (cst.BaseCompoundStatement, cst.SimpleStatementLine, cst.Lambda)
            ):
                break
            child = parent


def _uses_of_binding(
    index: FileIndex, name: str, scope: Scope, statement: cst.CSTNode
) -> list[cst.Name]:
    """The loads of ``name`` that see the value ``statement`` binds: those after it and before
    the next binding of the name (``grads`` of the discriminator, then ``grads`` of a saliency map,
    are two values). All loads of the name when the statement binds none the index knows of."""
    loads = index.loads_of(name, scope)
    bindings = index.bindings_of(name, scope)
    own = next((b for b in bindings if b.stmt is statement), None)
    if own is None:
        return loads
    later = [b.order for b in bindings if b.order > own.order]
    end = min(later) if later else None
    first = min(b.order for b in bindings)

    def sees(order: int) -> bool:
        if order < first:  # before any binding: the value a loop carries around
            return own is bindings[-1]
        return own.order <= order and (end is None or order < end)

    return [load for load in loads if sees(index.order.get(id(load), 0))]


def _calls_of(fm: FileModel, index: FileIndex, function: cst.FunctionDef) -> list[cst.Call]:
    """Calls of ``function`` outside it (``program.scopes.callers``)."""
    return [c for c in callers(fm, function) if function not in fm.ancestors(c)]


def loops_around(fm: FileModel, node: cst.CSTNode) -> list[cst.For | cst.While]:
    """The loops whose body holds ``node``, innermost first, up to its function."""
    loops: list[cst.For | cst.While] = []
    child = node
    for parent in fm.ancestors(node):
        if isinstance(parent, (cst.FunctionDef, cst.ClassDef, cst.Lambda)):
            break
        if isinstance(parent, (cst.For, cst.While)) and child is parent.body:
            loops.append(parent)
        child = parent
    return loops


def _step_sites(
    fm: FileModel,
    index: FileIndex,
    apply: cst.Call,
    node: cst.CSTNode,
    chain: list[tuple[cst.FunctionDef, cst.Call]],
) -> list[StepSite]:
    loops = loops_around(fm, node)
    statement = fm.enclosing_statement(node)
    if loops and statement is not None:
        return [StepSite(apply, statement, loops, chain)]
    scope = index.scope(node)
    if len(chain) >= 3 or not isinstance(scope, cst.FunctionDef):
        return []
    sites = []
    for caller in _calls_of(fm, index, scope):
        sites.extend(_step_sites(fm, index, apply, caller, [*chain, (scope, caller)]))
    return sites


def is_tf_function(fm: FileModel, function: cst.FunctionDef) -> bool:
    return any(
        fm.refers_to(
            d.decorator.func if isinstance(d.decorator, cst.Call) else d.decorator,
            "tensorflow.function",
        )
        for d in function.decorators
    )


#: Where a TF1 session that only holds a configuration goes: Keras's backend takes it.
_SESSION_SETTERS = ("set_session",)


def session_holds_config_only(fm: FileModel, call: cst.Call) -> bool:
    """A ``tf.compat.v1.Session(config=...)`` that nothing runs: its only use is being handed to
    Keras's ``set_session(...)`` (``config.gpu_options.allow_growth = True``), directly or through
    a name read nowhere else. It sets GPU options; it is no graph-mode training."""
    if any(arg.keyword is None or arg.keyword.value != "config" for arg in call.args):
        return False
    parent = fm.parent(call)
    if isinstance(parent, cst.Arg):
        return _hands_to_setter(fm, parent)
    if not (isinstance(parent, cst.Assign) and len(parent.targets) == 1
            and isinstance(parent.targets[0].target, cst.Name)):
        return False
    index = file_index(fm)
    name = parent.targets[0].target.value
    uses = _uses_of_binding(index, name, index.scope(call), parent)  # (None: the module)
    return bool(uses) and all(isinstance(arg := fm.parent(use), cst.Arg)
                              and _hands_to_setter(fm, arg) for use in uses)


def _hands_to_setter(fm: FileModel, arg: cst.Arg) -> bool:
    outer = fm.parent(arg)
    return isinstance(outer, cst.Call) and (
        (isinstance(outer.func, cst.Attribute) and outer.func.attr.value in _SESSION_SETTERS)
        or (isinstance(outer.func, cst.Name) and outer.func.value in _SESSION_SETTERS))
