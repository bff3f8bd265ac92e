"""Average gradients across workers: wrap every GradientTape whose gradients an optimizer applies.

Before::

    with tf.GradientTape() as tape:
        loss = loss_fn(y, model(x, training=True))
    grads = tape.gradient(loss, model.trainable_variables)
    optimizer.apply_gradients(zip(grads, model.trainable_variables))

After::

    with tf.GradientTape() as tape:
        loss = loss_fn(y, model(x, training=True))
    tape = sdp.DistributedGradientTape(tape)
    grads = tape.gradient(loss, model.trainable_variables)
    optimizer.apply_gradients(zip(grads, model.trainable_variables))

Why: each worker computes gradients on its own shard; ``DistributedGradientTape.gradient``
allreduces them (average), so every worker applies the same update and the weights stay equal.
Only tapes whose gradients reach ``apply_gradients``/``apply`` are wrapped (followed through
assignments, clipping, helper functions that return them): a tape used for a gradient penalty or a
saliency map must keep per-worker gradients. Two tapes in one ``with`` (GANs) are both wrapped; a
tape in a Keras ``train_step`` override is wrapped too, and the fact is left for ``wrap_keras_fit``,
which then must not also wrap the compiled optimizer (gradients would be averaged twice).
Gradients applied by hand (``v.assign_sub(lr * g)``), ``optimizer.minimize`` and TF1 graph code
(``Session``, ``tf.compat.v1.train`` optimizers) are reported for a person instead.

This module also holds ``training_facts``, the analysis of tapes, optimizer steps and training
loops that ``shard_tf_dataset`` and ``broadcast_initial_state`` share.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import libcst as cst

from ..analysis import FileInfo
from ..base import Transform
from .scale_keras_learning_rate import (
    FileIndex,
    Scope,
    assigned_values,
    code,
    file_index,
    keras_name,
    optimizer_class,
)

TAPES = ("tensorflow.GradientTape", "tensorflow.autodiff.GradientTape")
APPLY_METHODS = ("apply_gradients", "apply")
BY_HAND_METHODS = ("assign_sub", "assign_add", "assign")
_DIFFERENTIATING = ("gradient", "jacobian", "batch_jacobian")
_TF1_PREFIXES = ("tensorflow.compat.v1.", "tensorflow.estimator.")
_TF1_NAMES = ("tensorflow.Session", "tensorflow.train.MonitoredTrainingSession")


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
    #: classes whose ``train_step`` applies gradients of a tape (Keras fit drives them)
    train_step_classes: dict[str, cst.FunctionDef] = field(default_factory=dict)


def training_facts(transform: Transform) -> TrainingFacts:
    """The tapes, optimizer steps and loops of the file (original nodes), computed once."""
    facts = transform.state.facts.get("tf_training")
    if isinstance(facts, TrainingFacts):
        return facts
    index = file_index(transform)
    facts = TrainingFacts()
    for call in transform.calls_to(*TAPES):
        tape = _tape(transform, index, call)
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
    for apply in sorted(facts.applies, key=lambda n: index.order.get(id(n), 0)):
        sites = _step_sites(transform, index, apply, apply, [])
        if sites:
            facts.sites.extend(sites)
        else:
            facts.loopless.append(apply)
    transform.state.facts["tf_training"] = facts
    return facts


def _tape(transform: Transform, index: FileIndex, call: cst.Call) -> Tape | None:
    parent = transform.parent(call)
    with_stmt = None
    if isinstance(parent, cst.WithItem) and parent.item is call:
        if parent.asname is None or not isinstance(parent.asname.name, cst.Name):
            return None
        name = parent.asname.name.value
        with_stmt = transform.parent(parent)
        assert isinstance(with_stmt, cst.With)
    elif isinstance(parent, cst.Assign) and len(parent.targets) == 1 and isinstance(
        parent.targets[0].target, cst.Name
    ):
        name = parent.targets[0].target.value
    else:
        return None
    tape = Tape(call, name, index.scope(call), with_stmt)
    runtime = transform.state.runtime_module
    # A name may hold several tapes in turn (``with tf.GradientTape() as tape:`` for the
    # discriminator, again for the generator, again for a saliency map): this tape's uses are
    # those between its binding and the next tape bound to the name.
    bindings = index.bindings_of(name, tape.scope)
    tapes = [
        b for b in bindings
        if isinstance(b.value, cst.Call) and transform.refers_to(b.value.func, *TAPES)
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
            and transform.refers_to(value.func, f"{runtime}.DistributedGradientTape")
            and is_own(binding.order)
        ):
            tape.wrapped = True
    for load in index.loads_of(name, tape.scope):
        if not is_own(index.order.get(id(load), 0)):
            continue
        attribute = transform.parent(load)
        if isinstance(attribute, cst.Attribute) and attribute.attr.value == "gradient":
            gradient = transform.parent(attribute)
            if isinstance(gradient, cst.Call) and gradient.func is attribute:
                tape.gradient_calls.append(gradient)
    _follow(transform, index, tape)
    return tape


def _follow(transform: Transform, index: FileIndex, tape: Tape) -> None:
    """Follow the tape's gradients to the optimizer calls (or hand updates) that consume them."""
    work: list[cst.CSTNode] = list(tape.gradient_calls)
    seen: set[tuple[int, str, int]] = set()
    returned: set[int] = set()

    def taint(target: cst.CSTNode, statement: cst.CSTNode) -> None:
        scope = index.scope(target)
        for name in _target_names(target):
            key = (id(scope), name, id(statement))
            if key not in seen:
                seen.add(key)
                work.extend(_uses_of_binding(index, name, scope, statement))

    while work:
        child = work.pop()
        for parent in transform.ancestors(child):
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
                    work.extend(_calls_of(transform, index, function))
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


def _target_names(target: cst.CSTNode) -> list[str]:
    if isinstance(target, cst.Name):
        return [target.value]
    if isinstance(target, (cst.Tuple, cst.List)):
        return [n for e in target.elements for n in _target_names(e.value)]
    if isinstance(target, cst.StarredElement):
        return _target_names(target.value)
    return []


def _calls_of(transform: Transform, index: FileIndex, function: cst.FunctionDef) -> list[cst.Call]:
    """Calls of ``function`` (by name: ``f(...)``, or ``obj.f(...)`` for a method) outside it."""
    is_method = isinstance(index.parent_scope.get(id(function)), cst.ClassDef)
    found = []
    for call in index.calls_by_name.get(function.name.value, []):
        if function in transform.ancestors(call):
            continue
        if isinstance(call.func, cst.Name):
            binding = index.reaching(call.func.value, call)
            if binding is not None and binding.stmt is function:
                found.append(call)
        elif is_method and isinstance(call.func, cst.Attribute):
            found.append(call)
    return found


def loops_around(transform: Transform, node: cst.CSTNode) -> list[cst.For | cst.While]:
    """The loops whose body holds ``node``, innermost first, up to its function."""
    loops: list[cst.For | cst.While] = []
    child = node
    for parent in transform.ancestors(node):
        if isinstance(parent, (cst.FunctionDef, cst.ClassDef, cst.Lambda)):
            break
        if isinstance(parent, (cst.For, cst.While)) and child is parent.body:
            loops.append(parent)
        child = parent
    return loops


def _step_sites(
    transform: Transform,
    index: FileIndex,
    apply: cst.Call,
    node: cst.CSTNode,
    chain: list[tuple[cst.FunctionDef, cst.Call]],
) -> list[StepSite]:
    loops = loops_around(transform, node)
    statement = transform.enclosing_statement(node)
    if loops and statement is not None:
        return [StepSite(apply, statement, loops, chain)]
    scope = index.scope(node)
    if len(chain) >= 3 or not isinstance(scope, cst.FunctionDef):
        return []
    sites = []
    for caller in _calls_of(transform, index, scope):
        sites.extend(_step_sites(transform, index, apply, caller, [*chain, (scope, caller)]))
    return sites


def is_tf_function(transform: Transform, function: cst.FunctionDef) -> bool:
    return any(
        transform.refers_to(
            d.decorator.func if isinstance(d.decorator, cst.Call) else d.decorator,
            "tensorflow.function",
        )
        for d in function.decorators
    )


def _tf1_markers(info: FileInfo) -> list[str]:
    return sorted(
        q for q in info.calls if q.startswith(_TF1_PREFIXES) or q in _TF1_NAMES or (
            q.startswith("tensorflow.train.") and q.endswith("Optimizer")
        )
    )


def _keras_optimizers_called(info: FileInfo) -> bool:
    return any((k := keras_name(q)) and k.startswith("keras.optimizers.") for q in info.calls)


class WrapGradientTape(Transform):
    DESCRIPTION = (
        "Wrap each GradientTape whose gradients are applied in sdp.DistributedGradientTape."
    )
    FRAMEWORKS = frozenset({"tensorflow"})

    @classmethod
    def applies_to(cls, info: FileInfo) -> bool:
        # Also on TensorFlow files that train in a way the converter cannot handle (TF1 graphs,
        # hand-written updates, minimize): there it only reports, so nothing is half-converted.
        if info.framework not in cls.FRAMEWORKS or not info.vanilla:
            return False
        return info.training or bool(_tf1_markers(info)) or (
            info.uses_tape and any(m in info.method_calls for m in BY_HAND_METHODS)
        ) or ("minimize" in info.method_calls and _keras_optimizers_called(info))

    def prepare(self, module: cst.Module) -> None:
        markers = _tf1_markers(self.state.info)
        if markers:
            calls = self.calls_to(*markers)
            names = list(dict.fromkeys(
                q.replace("tensorflow", "tf")
                for c in calls
                for q in sorted(self.qualified_names(c.func))
                if q in markers
            ))
            names = [n for n in names if not any(n.startswith(o + ".") for o in names)]
            # The telling ones first: sessions, TF1 optimizers, estimators.
            names.sort(key=lambda n: not any(k in n for k in ("Session", "Optimizer", "estimator")))
            self.record(
                calls[0],
                f"TF1 graph-mode code ({', '.join(names[:3])}{', ...' if len(names) > 3 else ''}):"
                f" not converted; port the training step to TF2 (GradientTape or Keras fit) first,"
                f" or average its gradients by hand",
                manual=True,
            )
        for call in self.method_calls("minimize"):
            if not self._is_keras_optimizer(call.func.value):  # type: ignore[attr-defined]
                continue  # a TF1 optimizer: the note above covers it
            self.record(
                call,
                "optimizer.minimize computes gradients inside the optimizer: compute them with a "
                "GradientTape and apply_gradients so that they can be averaged",
                manual=True,
            )
        facts = training_facts(self)
        for tape in facts.tapes:
            if tape.by_hand and not tape.applies:
                self.record(
                    tape.by_hand[0],
                    f"variables updated by hand with the gradients of {tape.name!r}: average "
                    f"them ({self.sdp}.DistributedGradientTape) and broadcast the initial "
                    f"variables from rank 0 by hand, or use a Keras optimizer",
                    manual=True,
                )
            if not tape.applies or tape.wrapped or not self.state.info.convertible:
                continue
            if tape.with_stmt is None:
                self.record(
                    tape.call,
                    f"tape {tape.name!r} is not opened by a with statement: wrap it in "
                    f"{self.sdp}.DistributedGradientTape before calling gradient()",
                    manual=True,
                )
                continue
            self._wrap(tape)

    def _wrap(self, tape: Tape) -> None:
        # Statement edits are planned before the traversal: the blocks they go into are left
        # (and edited) before any module-level hook would run.
        assert tape.with_stmt is not None
        wrap = cst.parse_statement(
            f"{tape.name} = {self.sdp}.DistributedGradientTape({tape.name})\n"
        )
        inside = [g for g in tape.gradient_calls if tape.with_stmt in self.ancestors(g)]
        if inside:  # gradient() called while recording: wrap before the first such call
            statement = self.enclosing_statement(inside[0])
            assert statement is not None
            self.insert_before(statement, wrap)
        else:
            self.insert_after(tape.with_stmt, wrap)
        where = f" in {tape.scope.name.value}()" if isinstance(tape.scope, cst.FunctionDef) else ""
        self.record(
            tape.call,
            f"{tape.name} = {self.sdp}.DistributedGradientTape({tape.name}){where}: gradients "
            f"averaged across workers before {_applied(tape)}",
        )
        self.add_runtime_import()


    def _is_keras_optimizer(self, expr: cst.BaseExpression) -> bool:
        return any(
            isinstance(value, cst.Call) and optimizer_class(self, value) is not None
            for value in assigned_values(file_index(self), expr)
        ) or (isinstance(expr, cst.Attribute) and expr.attr.value == "optimizer")


def _applied(tape: Tape) -> str:
    return ", ".join(sorted({code(a.func) for a in tape.applies}))
