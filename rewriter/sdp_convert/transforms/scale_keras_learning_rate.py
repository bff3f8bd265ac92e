"""Scale Keras learning rates by the number of workers.

Before::

    opt = tf.keras.optimizers.Adam(0.001)
    sgd = keras.optimizers.SGD(momentum=0.9)
    schedule = tf.keras.optimizers.schedules.ExponentialDecay(
        initial_learning_rate=0.1, decay_steps=100, decay_rate=0.9)
    model.compile(optimizer="adam", loss="mse")

After::

    opt = tf.keras.optimizers.Adam(0.001 * sdp.size())
    sgd = keras.optimizers.SGD(learning_rate=0.01 * sdp.size(), momentum=0.9)
    schedule = tf.keras.optimizers.schedules.ExponentialDecay(
        initial_learning_rate=0.1 * sdp.size(), decay_steps=100, decay_rate=0.9)
    model.compile(optimizer=tf.keras.optimizers.Adam(learning_rate=0.001 * sdp.size()), loss="mse")

Why: N workers each take a batch of B, so one step sees N*B samples; the linear scaling rule
(Goyal et al.) keeps the per-sample update of the single-GPU script by scaling the learning rate by
N (``Options.lr_scaling``: ``"linear"``, ``"sqrt"`` or ``"none"``, as for PyTorch). An omitted
learning rate is written out with Keras 3's default so that it can be scaled; a string optimizer
given to ``compile`` becomes the optimizer object for the same reason. A ``LearningRateSchedule``
has its rates scaled (initial, and end/warmup targets where the schedule has them). Learning rates
set while training runs (``opt.learning_rate = ...``, ``.assign``, ``K.set_value``, a
``LearningRateScheduler``) are reported for a person: the converter cannot follow them.

This module also holds the Keras helpers the other TensorFlow transforms share: one canonical name
for every spelling of a Keras object (``keras_name``), the expression helpers that multiply or
divide by ``sdp.size()``, and ``FileIndex``, a one-walk index of where names are bound.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field

import libcst as cst
import libcst.matchers as m
from libcst.codemod.visitors import AddImportsVisitor
from libcst.metadata import QualifiedNameProvider, QualifiedNameSource, ScopeProvider

from ..base import Transform

# -- Keras names ---------------------------------------------------------------------------------

_KERAS_ROOTS = ("tensorflow.keras", "tensorflow.python.keras", "tf_keras", "keras")
# TF 2 re-exports a few Keras modules at top level: ``tf.optimizers.Adam``.
_TF_SHORTCUTS = ("optimizers", "losses", "metrics", "callbacks", "initializers")


def keras_name(qname: str) -> str | None:
    """One name for every spelling of a Keras object: ``keras.optimizers.Adam`` for
    ``tensorflow.keras.optimizers.Adam``, ``tf_keras.optimizers.Adam``,
    ``tensorflow.optimizers.Adam`` (``.legacy`` and ``.experimental`` dropped). None for anything
    else."""
    rest = None
    for root in _KERAS_ROOTS:
        if qname == root or qname.startswith(root + "."):
            rest = qname[len(root) + 1 :]
            break
    else:
        for short in _TF_SHORTCUTS:
            if qname == f"tensorflow.{short}" or qname.startswith(f"tensorflow.{short}."):
                rest = qname[len("tensorflow.") :]
                break
    if rest is None or rest.startswith("src."):
        return None
    parts = [p for p in rest.split(".") if p and p not in ("legacy", "experimental")]
    return ".".join(["keras", *parts])


def keras_names(transform: Transform, node: cst.CSTNode) -> set[str]:
    """``keras_name`` of every qualified name ``node`` (original) may refer to."""
    return {k for q in transform.qualified_names(node) if (k := keras_name(q))}


#: Keras 3 defaults (keras/src/optimizers/*.py); tf_keras 2 has the same ones.
OPTIMIZER_DEFAULT_LR = {
    "Adam": "0.001",
    "AdamW": "0.001",
    "Adamax": "0.001",
    "Nadam": "0.001",
    "SGD": "0.01",
    "RMSprop": "0.001",
    "Adagrad": "0.001",
    "Adadelta": "0.001",
    "Ftrl": "0.001",
    "Lion": "0.001",
    "Lamb": "0.001",
    "Adafactor": "0.001",
    "Muon": "0.001",
    "ScheduleFreeAdamW": "0.0025",
}
#: ``optimizer="adam"``: ``keras.optimizers.get`` looks the lower-cased class name up.
OPTIMIZER_STRINGS = {name.lower(): name for name in OPTIMIZER_DEFAULT_LR if name != "Lamb"}
#: Keras' ``compile`` default.
DEFAULT_COMPILE_OPTIMIZER = "RMSprop"

#: Schedule -> the arguments that are rates: (name, position, default or None when optional).
_SCHEDULE_RATES: dict[str, tuple[tuple[str, int, str | None], ...]] = {
    "ExponentialDecay": (("initial_learning_rate", 0, None),),
    "InverseTimeDecay": (("initial_learning_rate", 0, None),),
    "CosineDecayRestarts": (("initial_learning_rate", 0, None),),
    "CosineDecay": (("initial_learning_rate", 0, None), ("warmup_target", 4, None)),
    "PolynomialDecay": (("initial_learning_rate", 0, None), ("end_learning_rate", 2, "0.0001")),
    "PiecewiseConstantDecay": (("values", 1, None),),
}


def optimizer_class(transform: Transform, call: cst.Call) -> str | None:
    """``Adam`` when ``call`` (original) constructs a Keras optimizer, else None."""
    for name in keras_names(transform, call.func):
        parts = name.split(".")
        if len(parts) == 3 and parts[1] == "optimizers" and parts[2] in OPTIMIZER_DEFAULT_LR:
            return parts[2]
    return None


def schedule_class(transform: Transform, call: cst.Call) -> str | None:
    for name in keras_names(transform, call.func):
        parts = name.split(".")
        if parts[1:3] == ["optimizers", "schedules"] and parts[-1] in _SCHEDULE_RATES:
            return parts[-1]
    return None


def keras_spelling(transform: Transform, dotted: str) -> str:
    """How this file can spell ``keras.<dotted>`` (``optimizers.Adam``):
    ``tf.keras.optimizers.Adam`` after ``import tensorflow as tf``, ``keras.optimizers.Adam`` after
    ``import keras``, ``Adam`` after ``from keras.optimizers import Adam``. Schedules an import when
    the file has none."""
    scope = transform.get_metadata(ScopeProvider, transform.module, None)
    wanted = "keras." + dotted
    best: tuple[int, str] | None = None
    for assignment in scope.assignments if scope is not None else ():
        if not isinstance(getattr(assignment, "node", None), (cst.Import, cst.ImportFrom)):
            continue
        for q in scope.get_qualified_names_for(assignment.name):
            canonical = "tensorflow" if q.name == "tensorflow" else keras_name(q.name)
            if canonical is None:
                continue
            if canonical == "tensorflow":
                found = (3, f"{assignment.name}.{wanted}")
            elif wanted == canonical or wanted.startswith(canonical + "."):
                rest = wanted[len(canonical) :]
                found = (rest.count("."), assignment.name + rest)
            else:
                continue
            if best is None or found < best:
                best = found
    if best is not None:
        return best[1]
    root = "tensorflow.keras" if any(
        q.startswith("tensorflow.keras.") for q in transform.state.info.calls
    ) else "keras"
    module, _, name = f"{root}.{dotted}".rpartition(".")
    package, _, first = module.rpartition(".")
    # The import must not take a name the file already uses for something else (``from keras.src
    # import optimizers``, a project's own ``optimizers.py``): it would change what that name means
    # everywhere, and a second pass would take the file's own calls for Keras ones.
    taken = {bound for _, bound in file_index(transform).bindings}
    if first not in taken:
        AddImportsVisitor.add_needed_import(transform.context, package, first)
        return f"{first}.{name}"
    top, asname = ("tensorflow", "tf") if root == "tensorflow.keras" else ("keras", None)
    bound = asname or top
    if bound not in taken:
        AddImportsVisitor.add_needed_import(transform.context, top, asname=asname)
        return f"{bound}{root[len(top):]}.{dotted}"  # keras.optimizers.Adam, tf.keras...
    alias = f"keras_{first}"
    while alias in taken:
        alias = "_" + alias
    AddImportsVisitor.add_needed_import(transform.context, package, first, asname=alias)
    return f"{alias}.{name}"


def is_keras_compile(transform: Transform, call: cst.Call) -> bool:
    """``<model>.compile(...)`` (original): a method called ``compile`` on something that is not an
    imported module (``re.compile``, ``torch.compile``) and takes Keras' arguments."""
    func = call.func
    if not (isinstance(func, cst.Attribute) and func.attr.value == "compile"):
        return False
    if _is_imported(transform, func.value):
        return False
    keywords = {a.keyword.value for a in call.args if a.keyword}
    return bool(keywords & {"optimizer", "loss", "metrics"}) or (
        bool(call.args)
        and not call.args[0].keyword
        and _is_optimizer_like(transform, call.args[0].value)
    )


_FIT_KEYWORDS = frozenset(
    {"epochs", "callbacks", "validation_data", "validation_split", "steps_per_epoch", "verbose",
     "batch_size", "initial_epoch", "validation_steps"}
)


def keras_fit_calls(transform: Transform) -> list[cst.Call]:
    """``<model>.fit(...)`` calls (original) of a Keras model: on something ``compile`` is called
    on, or with Keras' own arguments (so that ``scaler.fit(x)`` of scikit-learn is left alone)."""
    compiled = {
        code(c.func.value)  # type: ignore[attr-defined]
        for c in transform.method_calls("compile")
        if is_keras_compile(transform, c)
    }
    found = []
    for call in transform.method_calls("fit"):
        func = call.func
        assert isinstance(func, cst.Attribute)
        if _is_imported(transform, func.value):
            continue
        keywords = {a.keyword.value for a in call.args if a.keyword}
        if code(func.value) in compiled or keywords & _FIT_KEYWORDS:
            found.append(call)
    return found


def _is_optimizer_like(transform: Transform, expr: cst.BaseExpression) -> bool:
    if isinstance(expr, cst.SimpleString):
        return expr.evaluated_value.lower() in OPTIMIZER_STRINGS if isinstance(
            expr.evaluated_value, str
        ) else False
    return isinstance(expr, cst.Call) and optimizer_class(transform, expr) is not None


def _is_imported(transform: Transform, expr: cst.BaseExpression) -> bool:
    found = transform.get_metadata(QualifiedNameProvider, expr, set())
    return any(q.source in (QualifiedNameSource.IMPORT, QualifiedNameSource.BUILTIN) for q in found)


def compile_optimizer_arg(call: cst.Call) -> cst.Arg | None:
    """The ``optimizer`` argument of a ``compile`` call (keyword or first positional)."""
    for arg in call.args:
        if arg.keyword and arg.keyword.value == "optimizer":
            return arg
    if call.args and call.args[0].keyword is None and not call.args[0].star:
        return call.args[0]
    return None


def optimizer_from_string(
    transform: Transform, name: str, learning_rate: cst.BaseExpression | None
) -> cst.Call | None:
    """``"adam"`` -> ``tf.keras.optimizers.Adam(learning_rate=...)`` in this file's spelling."""
    cls = OPTIMIZER_STRINGS.get(name.lower())
    if cls is None:
        return None
    func = cst.parse_expression(keras_spelling(transform, f"optimizers.{cls}"))
    args = [cst.Arg(learning_rate, keyword=cst.Name("learning_rate"), equal=_EQUAL)] if (
        learning_rate is not None
    ) else []
    return cst.Call(func=func, args=args)


# -- expressions ---------------------------------------------------------------------------------

_EQUAL = cst.AssignEqual(
    whitespace_before=cst.SimpleWhitespace(""), whitespace_after=cst.SimpleWhitespace("")
)
_TIGHT_OPERATORS = (cst.Multiply, cst.Divide, cst.FloorDivide, cst.Modulo, cst.Power)
_ATOMS = (
    cst.Name, cst.Attribute, cst.Call, cst.Subscript, cst.Integer, cst.Float,
    cst.SimpleString, cst.List, cst.Tuple, cst.Dict,
)


def _operand(expr: cst.BaseExpression) -> cst.BaseExpression:
    """``expr`` as the left operand of ``*`` or ``//``: parenthesised unless it binds tighter."""
    if expr.lpar or isinstance(expr, (*_ATOMS, cst.UnaryOperation)) or (
        isinstance(expr, cst.BinaryOperation) and isinstance(expr.operator, _TIGHT_OPERATORS)
    ):
        return expr
    return expr.with_changes(lpar=[cst.LeftParen()], rpar=[cst.RightParen()])


def size_factor(sdp: str, mode: str) -> str:
    return f"{sdp}.size()" if mode == "linear" else f"{sdp}.size() ** 0.5"


def times_size(expr: cst.BaseExpression, sdp: str, mode: str = "linear") -> cst.BaseExpression:
    """``expr * sdp.size()`` (``** 0.5`` for ``mode="sqrt"``)."""
    return cst.BinaryOperation(
        left=_operand(expr),
        operator=cst.Multiply(),
        right=cst.parse_expression(size_factor(sdp, mode)),
    )


def divided_by_size(expr: cst.BaseExpression, sdp: str) -> cst.BaseExpression:
    """``expr // sdp.size()``."""
    return cst.BinaryOperation(
        left=_operand(expr), operator=cst.FloorDivide(), right=cst.parse_expression(f"{sdp}.size()")
    )


def mentions(transform: Transform, node: cst.CSTNode, *names: str) -> bool:
    """Whether ``node`` (original) contains a call to one of ``names`` (qualified)."""
    return any(
        transform.refers_to(call.func, *names)
        for call in m.findall(node, m.Call())
        if isinstance(call, cst.Call)
    )


def mentions_size(transform: Transform, node: cst.CSTNode) -> bool:
    return mentions(transform, node, f"{transform.state.runtime_module}.size")


def code(node: cst.CSTNode) -> str:
    return cst.Module(body=[]).code_for_node(node)


def arg_named(call: cst.Call, keyword: str, position: int | None = None) -> cst.Arg | None:
    """The argument bound to parameter ``keyword`` (at ``position`` when passed positionally).

    Keywords are found wherever they are, after ``*args`` or ``**kwargs`` too; positions are not
    known past ``*args``. None may still mean that ``**kwargs`` holds it (see ``double_star``)."""
    positional = 0
    for arg in call.args:
        if arg.keyword is not None:
            if arg.keyword.value == keyword:
                return arg
        elif arg.star == "*":
            position = None
        elif not arg.star:
            if position is not None and positional == position:
                return arg
            positional += 1
    return None


def double_star(call: cst.Call) -> cst.Arg | None:
    """The call's first ``**kwargs`` argument, if any."""
    return next((arg for arg in call.args if arg.star == "**"), None)


def replace_arg(call: cst.Call, old: cst.Arg, value: cst.BaseExpression) -> cst.Call:
    """``call`` (updated) with the argument at ``old``'s index given ``value``."""
    index = _index_of(call, old)
    args = list(call.args)
    args[index] = args[index].with_changes(value=value)
    return call.with_changes(args=args)


def _index_of(call: cst.Call, arg: cst.Arg) -> int:
    for i, a in enumerate(call.args):
        if a is arg:
            return i
    raise ValueError("argument not in call")


def add_keyword(
    call: cst.Call, keyword: str, value: cst.BaseExpression, *, first: bool
) -> cst.Call:
    """``call`` with ``keyword=value`` added first (or last), keeping the call's layout."""
    new = cst.Arg(value, keyword=cst.Name(keyword), equal=_EQUAL)
    args = list(call.args)
    if not args:
        return call.with_changes(args=[new])
    if first:
        comma = cst.Comma(whitespace_after=cst.SimpleWhitespace(" "))
        return call.with_changes(args=[new.with_changes(comma=comma), *args])
    last = args[-1]
    if isinstance(last.comma, cst.Comma):  # one argument a line: the new one goes on its own line
        between = (
            args[-2].comma
            if len(args) > 1 and isinstance(args[-2].comma, cst.Comma)
            else cst.Comma(whitespace_after=call.whitespace_before_args)
        )
        args[-1] = last.with_changes(comma=between)
        return call.with_changes(args=[*args, new.with_changes(comma=last.comma)])
    args[-1] = last.with_changes(comma=cst.Comma(whitespace_after=cst.SimpleWhitespace(" ")))
    return call.with_changes(args=[*args, new])


# -- where names are bound -----------------------------------------------------------------------

Scope = cst.FunctionDef | cst.ClassDef | None


@dataclass(eq=False)
class Binding:
    """One place a name gets a value. ``value`` is the whole assigned expression (None for loop
    targets, parameters, imports, definitions); ``unpacked`` when the target was a tuple."""

    name: str
    scope: Scope
    kind: str  # assign | for | with | param | def | import
    stmt: cst.CSTNode
    value: cst.BaseExpression | None = None
    unpacked: bool = False
    order: int = 0
    target: cst.BaseExpression | None = None


@dataclass
class FileIndex:
    """Where every name of the file is bound and used, in one walk of the original tree.

    Flow-insensitive but ordered: the binding that reaches a use is the last one before it in its
    scope (then in the enclosing scopes), which is what straight-line training scripts need.
    """

    order: dict[int, int] = field(default_factory=dict)
    scope_of: dict[int, Scope] = field(default_factory=dict)
    parent_scope: dict[int, Scope] = field(default_factory=dict)
    bindings: dict[tuple[int, str], list[Binding]] = field(default_factory=dict)
    #: ``self.model = ...`` and other attribute targets, by their code, file-wide.
    attribute_bindings: dict[str, list[Binding]] = field(default_factory=dict)
    #: Loads of each name, by (scope, name).
    loads: dict[tuple[int, str], list[cst.Name]] = field(default_factory=dict)
    #: Calls by the callee's last name: ``train_step`` for ``train_step(x)`` and
    #: ``self.train_step(x)``.
    calls_by_name: dict[str, list[cst.Call]] = field(default_factory=dict)
    functions: dict[str, list[cst.FunctionDef]] = field(default_factory=dict)
    classes: dict[str, cst.ClassDef] = field(default_factory=dict)
    loops: list[cst.For | cst.While] = field(default_factory=list)
    withs: list[cst.With] = field(default_factory=list)
    returns: dict[int, list[cst.Return]] = field(default_factory=dict)

    def scope(self, node: cst.CSTNode) -> Scope:
        return self.scope_of.get(id(node))

    def reaching(self, name: str, at: cst.CSTNode) -> Binding | None:
        """The binding of ``name`` that a use at ``at`` (original) sees."""
        scope = self.scope_of.get(id(at))
        position = self.order.get(id(at), 0)
        while True:
            found = self.bindings.get((id(scope), name), [])
            if found:
                before = [b for b in found if b.order <= position]
                # None before: bound later in a loop, or after the function that uses it.
                return before[-1] if before else found[-1]
            if scope is None:
                return None
            scope = self.parent_scope.get(id(scope))
            while isinstance(scope, cst.ClassDef):  # methods don't see class-level names
                scope = self.parent_scope.get(id(scope))

    def bindings_of(self, name: str, scope: Scope) -> list[Binding]:
        return self.bindings.get((id(scope), name), [])

    def loads_of(self, name: str, scope: Scope) -> list[cst.Name]:
        return self.loads.get((id(scope), name), [])

    def is_before(self, a: cst.CSTNode, b: cst.CSTNode) -> bool:
        return self.order.get(id(a), 0) < self.order.get(id(b), 0)


class _Indexer(cst.CSTVisitor):
    def __init__(self) -> None:
        super().__init__()
        self.index = FileIndex()
        self.stack: list[Scope] = [None]
        self.not_loads: set[int] = set()
        self.pending: list[tuple[Binding, cst.CSTNode, str]] = []  # (binding, anchor, start|end)
        self.end: dict[int, int] = {}

    def on_visit(self, node: cst.CSTNode) -> bool:
        self.index.order[id(node)] = len(self.index.order)
        self.index.scope_of[id(node)] = self.stack[-1]
        return super().on_visit(node)

    def on_leave(self, original_node: cst.CSTNode) -> None:
        super().on_leave(original_node)
        self.end[id(original_node)] = len(self.index.order)

    def bind(self, name: str, kind: str, stmt: cst.CSTNode, anchor: cst.CSTNode, when: str,
             value: cst.BaseExpression | None = None, unpacked: bool = False) -> None:
        binding = Binding(name, self.stack[-1], kind, stmt, value, unpacked)
        self.pending.append((binding, anchor, when))
        self.index.bindings.setdefault((id(self.stack[-1]), name), []).append(binding)

    def bind_target(self, target: cst.BaseExpression, kind: str, stmt: cst.CSTNode,
                    anchor: cst.CSTNode, when: str, value: cst.BaseExpression | None,
                    unpacked: bool = False) -> None:
        if isinstance(target, cst.Name):
            self.not_loads.add(id(target))
            self.bind(target.value, kind, stmt, anchor, when, value, unpacked)
        elif isinstance(target, (cst.Tuple, cst.List)):
            for element in target.elements:
                self.bind_target(element.value, kind, stmt, anchor, when, value, True)
        elif isinstance(target, cst.StarredElement):
            self.bind_target(target.value, kind, stmt, anchor, when, value, True)
        elif isinstance(target, cst.Attribute) and not unpacked:
            binding = Binding(code(target), self.stack[-1], kind, stmt, value, target=target)
            self.pending.append((binding, anchor, when))
            self.index.attribute_bindings.setdefault(code(target), []).append(binding)

    # scopes
    def visit_FunctionDef(self, node: cst.FunctionDef) -> None:
        self.not_loads.add(id(node.name))
        self.index.functions.setdefault(node.name.value, []).append(node)
        self.bind(node.name.value, "def", node, node, "end")
        self.index.parent_scope[id(node)] = self.stack[-1]
        self.stack.append(node)
        params = node.params
        for param in (*params.posonly_params, *params.params, *params.kwonly_params,
                      params.star_arg, params.star_kwarg):
            if isinstance(param, cst.Param):
                self.not_loads.add(id(param.name))
                self.bind(param.name.value, "param", node, node.body, "start")

    def leave_FunctionDef(self, original_node: cst.FunctionDef) -> None:
        self.stack.pop()

    def visit_ClassDef(self, node: cst.ClassDef) -> None:
        self.not_loads.add(id(node.name))
        self.index.classes.setdefault(node.name.value, node)
        self.bind(node.name.value, "def", node, node, "end")
        self.index.parent_scope[id(node)] = self.stack[-1]
        self.stack.append(node)

    def leave_ClassDef(self, original_node: cst.ClassDef) -> None:
        self.stack.pop()

    # bindings
    def visit_Import(self, node: cst.Import) -> bool:
        for alias in node.names:
            name = alias.evaluated_alias or alias.evaluated_name.split(".")[0]
            self.bind(name, "import", node, node, "end")
        return False

    def visit_ImportFrom(self, node: cst.ImportFrom) -> bool:
        if not isinstance(node.names, cst.ImportStar):
            for alias in node.names:
                name = alias.evaluated_alias or alias.evaluated_name
                self.bind(name, "import", node, node, "end")
        return False

    def visit_Assign(self, node: cst.Assign) -> None:
        for target in node.targets:
            self.bind_target(target.target, "assign", node, node, "end", node.value)

    def visit_AnnAssign(self, node: cst.AnnAssign) -> None:
        if node.value is not None:
            self.bind_target(node.target, "assign", node, node, "end", node.value)

    def visit_For(self, node: cst.For) -> None:
        self.index.loops.append(node)
        self.bind_target(node.target, "for", node, node.body, "start", None)

    def visit_While(self, node: cst.While) -> None:
        self.index.loops.append(node)

    def visit_With(self, node: cst.With) -> None:
        self.index.withs.append(node)
        for item in node.items:
            if item.asname is not None:
                self.bind_target(item.asname.name, "with", node, node.body, "start", item.item)

    def visit_Return(self, node: cst.Return) -> None:
        scope = self.stack[-1]
        if isinstance(scope, cst.FunctionDef):
            self.index.returns.setdefault(id(scope), []).append(node)

    # uses
    def visit_Attribute(self, node: cst.Attribute) -> None:
        self.not_loads.add(id(node.attr))

    def visit_Arg(self, node: cst.Arg) -> None:
        if node.keyword is not None:
            self.not_loads.add(id(node.keyword))

    def visit_Call(self, node: cst.Call) -> None:
        func = node.func
        name = func.value if isinstance(func, cst.Name) else (
            func.attr.value if isinstance(func, cst.Attribute) else None
        )
        if name:
            self.index.calls_by_name.setdefault(name, []).append(node)

    def visit_Name(self, node: cst.Name) -> None:
        if id(node) not in self.not_loads:
            self.index.loads.setdefault((id(self.stack[-1]), node.value), []).append(node)

    def finish(self) -> FileIndex:
        for binding, anchor, when in self.pending:
            binding.order = (
                self.index.order[id(anchor)] if when == "start" else self.end[id(anchor)]
            )
        for found in (*self.index.bindings.values(), *self.index.attribute_bindings.values()):
            found.sort(key=lambda b: b.order)
        return self.index


def file_index(transform: Transform) -> FileIndex:
    """The file's ``FileIndex``, built once and shared by the transforms."""
    index = transform.state.facts.get("tf_index")
    if not isinstance(index, FileIndex):
        indexer = _Indexer()
        transform.module.visit(indexer)
        index = indexer.finish()
        transform.state.facts["tf_index"] = index
    return index


def assigned_values(
    index: FileIndex, expr: cst.BaseExpression, at: cst.CSTNode | None = None, depth: int = 0
) -> Iterator[cst.BaseExpression]:
    """``expr`` followed through plain name bindings: ``opt`` -> ``Adam(0.1)``."""
    yield expr
    if depth > 8:
        return
    if isinstance(expr, cst.Name):
        binding = index.reaching(expr.value, at if at is not None else expr)
        if binding is not None and binding.value is not None and not binding.unpacked:
            yield from assigned_values(index, binding.value, binding.stmt, depth + 1)
    elif isinstance(expr, cst.Attribute):
        found = index.attribute_bindings.get(code(expr), [])
        for binding in found[-1:]:
            if binding.value is not None:
                yield from assigned_values(index, binding.value, binding.stmt, depth + 1)


# -- the transform -------------------------------------------------------------------------------

_RUNTIME_LR_ATTRS = ("learning_rate", "lr")


class ScaleKerasLearningRate(Transform):
    DESCRIPTION = "Scale Keras optimizer learning rates (and schedules) by the number of workers."
    FRAMEWORKS = frozenset({"tensorflow"})

    def prepare(self, module: cst.Module) -> None:
        self.mode = self.state.options.lr_scaling
        # original Call -> what to do with it in leave_Call
        self.optimizers: dict[cst.Call, str] = {}
        self.schedules: dict[cst.Call, str] = {}
        self.compiles: list[cst.Call] = []
        if self.mode == "none":
            return
        index = file_index(self)
        optimizer_vars: set[str] = set()
        for qname, calls in self.state.info.calls.items():
            name = keras_name(qname)
            if name is None:
                continue
            for call in calls:
                cls = optimizer_class(self, call)
                if cls is not None:
                    self.optimizers[call] = cls
                    self._plan_learning_rate(index, call, cls)
                    parent = self.parent(call)
                    if isinstance(parent, cst.Assign):
                        optimizer_vars.update(code(t.target) for t in parent.targets)
                elif name == "keras.callbacks.LearningRateScheduler":
                    self.record(
                        call,
                        f"LearningRateScheduler sets the learning rate while training: multiply "
                        f"the rates it returns by {size_factor(self.sdp, self.mode)}",
                        manual=True,
                    )
                elif name == "keras.backend.set_value" and call.args and _is_lr_attribute(
                    call.args[0].value
                ):
                    self._runtime_lr(call)
        for call in self.method_calls("compile"):
            if is_keras_compile(self, call):
                arg = compile_optimizer_arg(call)
                if arg is None or isinstance(arg.value, cst.SimpleString):
                    self.compiles.append(call)
        self._find_runtime_assignments(index, optimizer_vars)

    def _plan_learning_rate(self, index: FileIndex, call: cst.Call, cls: str) -> None:
        arg = arg_named(call, "learning_rate", 0) or arg_named(call, "lr")
        if arg is None:
            return
        if _is_scaled(self, index, arg.value):
            self.optimizers.pop(call)
            return
        for value in assigned_values(index, arg.value):
            if not isinstance(value, cst.Call):
                continue
            schedule = schedule_class(self, value)
            if schedule is not None:
                self.optimizers.pop(call)
                if not any(_is_scaled(self, index, a.value, value) for a in value.args):
                    self.schedules[value] = schedule
                return
            if _is_custom_schedule(self, index, value):
                self.optimizers.pop(call)
                self.record(
                    arg.value,
                    f"custom LearningRateSchedule: scale the rates it returns by "
                    f"{size_factor(self.sdp, self.mode)}",
                    manual=True,
                )
                return

    def _find_runtime_assignments(self, index: FileIndex, optimizer_vars: set[str]) -> None:
        def is_optimizer(expr: cst.BaseExpression) -> bool:
            return code(expr) in optimizer_vars or (
                isinstance(expr, cst.Attribute) and expr.attr.value == "optimizer"
            )

        for found in index.attribute_bindings.values():
            for binding in found:
                target = binding.target
                if (
                    isinstance(target, cst.Attribute)
                    and target.attr.value in _RUNTIME_LR_ATTRS
                    and is_optimizer(target.value)
                ):
                    self._runtime_lr(binding.stmt)
        for call in self.method_calls("assign"):
            func = call.func
            assert isinstance(func, cst.Attribute)
            if _is_lr_attribute(func.value) and is_optimizer(func.value.value):  # type: ignore[attr-defined]
                self._runtime_lr(call)

    def _runtime_lr(self, node: cst.CSTNode) -> None:
        self.record(
            node,
            f"learning rate set while training: scale the new value by "
            f"{size_factor(self.sdp, self.mode)}",
            manual=True,
        )

    def leave_Call(self, original_node: cst.Call, updated_node: cst.Call) -> cst.BaseExpression:
        if original_node in self.optimizers:
            return self._scale_optimizer(
                original_node, updated_node, self.optimizers[original_node]
            )
        if original_node in self.schedules:
            return self._scale_schedule(original_node, updated_node, self.schedules[original_node])
        if original_node in self.compiles:
            return self._compile(original_node, updated_node)
        return updated_node

    def _scale_optimizer(self, original: cst.Call, updated: cst.Call, cls: str) -> cst.Call:
        factor = size_factor(self.sdp, self.mode)
        arg = arg_named(updated, "learning_rate", 0) or arg_named(updated, "lr")
        kwargs = double_star(updated)
        if arg is None and kwargs is not None:
            # Written out as well, a learning rate the dict holds would fail the call.
            self.record(
                original,
                f"{cls}(**{code(kwargs.value)}): scale the learning rate it holds (or Keras' "
                f"default, {OPTIMIZER_DEFAULT_LR[cls]}) by {factor}",
                manual=True,
            )
            return updated
        self.add_runtime_import()
        if arg is None:
            default = OPTIMIZER_DEFAULT_LR[cls]
            self.record(original, f"{cls}: default learning rate {default} written out, * {factor}")
            value = times_size(cst.Float(default), self.sdp, self.mode)
            return add_keyword(updated, "learning_rate", value, first=True)
        self.record(original, f"{cls}: learning rate {code(arg.value)} * {factor}")
        return replace_arg(updated, arg, times_size(arg.value, self.sdp, self.mode))

    def _scale_schedule(self, original: cst.Call, updated: cst.Call, cls: str) -> cst.Call:
        self.add_runtime_import()
        factor = size_factor(self.sdp, self.mode)
        scaled = []
        for name, position, default in _SCHEDULE_RATES[cls]:
            arg = arg_named(updated, name, position)
            if arg is None:
                if default is not None and double_star(updated) is None:
                    value = times_size(cst.Float(default), self.sdp, self.mode)
                    updated = add_keyword(updated, name, value, first=False)
                    scaled.append(name)
                continue
            if isinstance(arg.value, (cst.List, cst.Tuple)):
                elements = [
                    e.with_changes(value=times_size(e.value, self.sdp, self.mode))
                    for e in arg.value.elements
                ]
                updated = replace_arg(updated, arg, arg.value.with_changes(elements=elements))
            elif name == "values":
                self.record(
                    original,
                    f"{cls}: scale each of its values by {factor} (not a literal list)",
                    manual=True,
                )
                continue
            else:
                updated = replace_arg(updated, arg, times_size(arg.value, self.sdp, self.mode))
            scaled.append(name)
        if scaled:
            self.record(original, f"{cls}: {', '.join(scaled)} * {factor}")
        return updated

    def _compile(self, original: cst.Call, updated: cst.Call) -> cst.Call:
        arg = compile_optimizer_arg(updated)
        if arg is None:
            cls = DEFAULT_COMPILE_OPTIMIZER
        else:
            value = arg.value
            assert isinstance(value, cst.SimpleString)
            name = value.evaluated_value
            cls = OPTIMIZER_STRINGS.get(name.lower()) if isinstance(name, str) else None
            if cls is None:
                self.record(
                    original,
                    f"optimizer {value.value}: unknown to the converter, scale its learning rate "
                    f"by {size_factor(self.sdp, self.mode)}",
                    manual=True,
                )
                return updated
        self.add_runtime_import()
        lr = times_size(cst.Float(OPTIMIZER_DEFAULT_LR[cls]), self.sdp, self.mode)
        optimizer = optimizer_from_string(self, cls, lr)
        assert optimizer is not None
        what = f"optimizer {code(arg.value)}" if arg is not None else "default optimizer"
        self.record(
            original,
            f"{what} -> {code(optimizer)} so that its learning rate can be scaled",
        )
        if arg is None:
            return add_keyword(updated, "optimizer", optimizer, first=True)
        return replace_arg(updated, arg, optimizer)


def _is_scaled(
    transform: Transform, index: FileIndex, expr: cst.BaseExpression, at: cst.CSTNode | None = None
) -> bool:
    """Whether ``expr`` (original) involves ``sdp.size()`` already, through plain names too
    (``lr = args.lr * sdp.size()`` then ``Adam(lr)``: scaling it again would square the factor)."""
    return any(mentions_size(transform, value) for value in assigned_values(index, expr, at))


def _is_lr_attribute(expr: cst.BaseExpression) -> bool:
    return isinstance(expr, cst.Attribute) and expr.attr.value in _RUNTIME_LR_ATTRS


def _is_custom_schedule(transform: Transform, index: FileIndex, call: cst.Call) -> bool:
    """``MySchedule(...)`` where ``MySchedule`` is a class of this file deriving from a schedule."""
    if not isinstance(call.func, cst.Name):
        return False
    cls = index.classes.get(call.func.value)
    if cls is None:
        return False
    return any(
        n.endswith("LearningRateSchedule") or ".schedules." in n
        for base in cls.bases
        for n in keras_names(transform, base.value) | {code(base.value)}
    )
