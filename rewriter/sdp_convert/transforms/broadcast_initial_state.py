"""Start every worker from rank 0's weights and optimizer state in custom TensorFlow training loops.

Before::

    for x, y in dataset:
        loss = train_step(x, y)

After::

    first_batch = True
    for x, y in dataset:
        loss = train_step(x, y)
        if first_batch:
            sdp.broadcast_variables(model.variables, root_rank=0)
            sdp.broadcast_variables(optimizer.variables, root_rank=0)
            first_batch = False

Why: workers build their models from their own random seeds (or load a checkpoint at different
times); without a broadcast they train diverging copies. The broadcast comes after the first step
because that is the first moment all variables exist in every style: a subclassed Keras model builds
its weights on its first call and a Keras 3 optimizer its slots on its first ``apply_gradients``
(``optimizer.build`` before the loop would need the model built first, which a converter cannot do
for a subclassed model without knowing its input shape). It runs in eager code, in the training
loop after the call of the step function, so a ``tf.function`` step is neither changed nor
retraced, and ``model.variables`` / ``optimizer.variables`` (Keras 3 properties, Keras variables)
are read where they are plain Python lists. The first step's update is averaged across workers and
then replaced by rank 0's weights everywhere (Horovod's documented pattern); with the same seed on
every worker it changes nothing at all.

The model is the owner of the variables the tape differentiates (``model.trainable_variables`` ->
``model.variables``, so non-trainable state such as BatchNorm statistics goes too); the optimizer is
the one that applies the gradients. Names the step function gets as parameters are translated to the
call's arguments. Keras ``fit`` gets the same broadcast from ``wrap_keras_fit``'s callback, at its
first batch: a read of the model's weights before the first ``fit`` (``get_weights``,
``save_weights``, ``evaluate``, ...; ``program.keras_reads``) gets
``sdp.broadcast_variables(model.variables, root_rank=0)`` right before it, so that every worker
reads rank 0's weights. Nothing
is added inside a ``train_step`` override (a loop there, a GAN's discriminator steps, runs in the
graph ``fit`` traces, where a flag would broadcast on every step).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import libcst as cst

from ..base import Transform
from ..program.datasets import in_keras_train_step
from ..program.index import FileIndex, file_index, reaching_values
from ..program.keras_reads import weights_read_before_fit
from ..program.scopes import is_dead_definition
from ..program.syntax import arg_named, code
from ..program.training import StepSite, is_tf_function, training_facts

_VARIABLE_ATTRS = ("trainable_variables", "trainable_weights", "variables", "weights")


@dataclass(eq=False)
class _Plan:
    outer: cst.For | cst.While
    anchor: cst.BaseStatement
    variables: list[str] = field(default_factory=list)


class _Untranslatable(Exception):
    """An expression names a local of the step function: it means nothing at the loop."""


class BroadcastInitialState(Transform):
    DESCRIPTION = (
        "Broadcast model and optimizer variables from rank 0 after the first training step."
    )
    FRAMEWORKS = frozenset({"tensorflow"})

    def prepare(self, module: cst.Module) -> None:
        self.loops: set[cst.CSTNode] = set()
        runtime = self.state.runtime_module
        if self.calls_to(f"{runtime}.broadcast_variables", f"{runtime}.broadcast"):
            return  # converted already, or the script broadcasts itself
        facts = training_facts(self.fm)
        index = file_index(self.fm)
        plans: dict[cst.CSTNode, _Plan] = {}
        for site in facts.sites:
            outer = site.loops[-1]
            if in_keras_train_step(self.fm, outer):
                continue  # fit drives it: wrap_keras_fit's callback broadcasts once
            function = self.enclosing_function(outer)
            if function is not None and is_tf_function(self.fm, function):
                self.record(
                    outer,
                    "training loop inside a tf.function: after its first step, broadcast the "
                    f"model and optimizer variables from rank 0 ({self.sdp}.broadcast_variables)",
                    manual=True,
                )
                continue
            try:
                variables = self._variables(index, site)
            except _Untranslatable as err:
                self.record(
                    site.statement,
                    f"broadcast {err} from rank 0 after the first step "
                    f"({self.sdp}.broadcast_variables): the converter cannot name it here",
                    manual=True,
                )
                continue
            anchor = self._anchor(site)
            plan = plans.setdefault(outer, _Plan(outer, anchor))
            if index.is_before(plan.anchor, anchor):
                plan.anchor = anchor
            plan.variables.extend(v for v in variables if v not in plan.variables)
        for apply in facts.loopless:
            scope = index.scope(apply)
            if isinstance(scope, cst.FunctionDef) and scope in facts.train_step_methods:
                continue  # Keras fit runs it: wrap_keras_fit's callback broadcasts
            if isinstance(scope, cst.FunctionDef) and is_dead_definition(self.fm, scope):
                continue  # redefined before anything could call it: it never trains
            self.record(
                apply,
                "no training loop found around this step: after the first step, broadcast the "
                f"model and optimizer variables from rank 0 ({self.sdp}.broadcast_variables)",
                manual=True,
            )
        for plan in plans.values():
            self._plan(index, plan)
        for stmt, model in weights_read_before_fit(self.fm):
            self._before_fit(stmt, model)

    def _before_fit(self, stmt: cst.BaseStatement, model: str) -> None:
        """Rank 0's weights before a read that comes before ``fit`` (whose callback broadcasts
        them only at its first batch)."""
        config = self.module.config_for_parsing
        new = cst.parse_statement(
            f"{self.sdp}.broadcast_variables({model}.variables, root_rank=0)\n", config
        )
        self.insert_before(stmt, new)
        self.add_runtime_import()
        self.record(
            stmt,
            f"{self.sdp}.broadcast_variables({model}.variables, root_rank=0) before this line: "
            f"it reads {model}'s weights before fit, whose callback gives every worker rank 0's "
            f"weights only at its first batch",
        )

    def _plan(self, index: FileIndex, plan: _Plan) -> None:
        flag = "first_batch"
        scope = index.scope(plan.outer)
        if index.bindings_of(flag, scope):
            flag = f"{self.sdp}_first_batch"
        config = self.module.config_for_parsing
        # The flag takes over the loop's blank lines and comments, so that it sits with the loop.
        start = cst.parse_statement(f"{flag} = True\n", config)
        self.insert_before(plan.outer, start.with_changes(leading_lines=plan.outer.leading_lines))
        self.loops.add(plan.outer)
        indent = self.module.default_indent
        lines = [f"if {flag}:\n"]
        lines += [
            f"{indent}{self.sdp}.broadcast_variables({v}, root_rank=0)\n" for v in plan.variables
        ]
        lines.append(f"{indent}{flag} = False\n")
        self.insert_after(plan.anchor, cst.parse_statement("".join(lines), config))
        self.add_runtime_import()
        self.record(
            plan.anchor,
            f"after the first step, broadcast {', '.join(plan.variables)} from rank 0",
        )

    def leave_For(self, original_node: cst.For, updated_node: cst.For) -> cst.For:
        if original_node in self.loops:
            return updated_node.with_changes(leading_lines=())
        return updated_node

    def leave_While(self, original_node: cst.While, updated_node: cst.While) -> cst.While:
        if original_node in self.loops:
            return updated_node.with_changes(leading_lines=())
        return updated_node

    def _anchor(self, site: StepSite) -> cst.BaseStatement:
        """The statement of the innermost loop's body that holds the step."""
        body = site.loops[0].body
        statement: cst.CSTNode = site.statement
        for parent in self.ancestors(site.statement):
            if parent is body:
                break
            if isinstance(parent, cst.BaseStatement):
                statement = parent
        assert isinstance(statement, cst.BaseStatement)
        return statement

    def _variables(self, index: FileIndex, site: StepSite) -> list[str]:
        """``model.variables`` and ``optimizer.variables`` as code that is valid at the loop."""
        facts = training_facts(self.fm)
        found: list[cst.BaseExpression] = []
        for tape in facts.applies[site.apply]:
            for gradient in tape.gradient_calls:
                sources = arg_named(gradient, "sources", 1)
                if sources is not None:
                    found.extend(self._owners(index, sources.value))
        func = site.apply.func
        assert isinstance(func, cst.Attribute)
        optimizer = func.value
        found.append(cst.Attribute(value=optimizer, attr=cst.Name("variables")))
        result: list[str] = []
        for expr in found:
            text = code(self._translate(index, expr, site))
            if text not in result:
                result.append(text)
        return result

    def _owners(self, index: FileIndex, sources: cst.BaseExpression) -> list[cst.BaseExpression]:
        """``model.trainable_variables`` -> ``model.variables``; a list of variables as it is."""
        if isinstance(sources, cst.BinaryOperation) and isinstance(sources.operator, cst.Add):
            return self._owners(index, sources.left) + self._owners(index, sources.right)
        for value in reaching_values(index, sources):
            if isinstance(value, cst.Attribute) and value.attr.value in _VARIABLE_ATTRS:
                return [cst.Attribute(value=value.value, attr=cst.Name("variables"))]
        return [sources]

    def _translate(self, index: FileIndex, expr: cst.BaseExpression, site: StepSite) -> cst.CSTNode:
        """``expr``, written in the step function, as the loop's code must write it."""
        for function, call in site.chain:
            expr = _translate_call(index, expr, function, call)
        return expr


def _translate_call(
    index: FileIndex, expr: cst.BaseExpression, function: cst.FunctionDef, call: cst.Call
) -> cst.BaseExpression:
    """``expr``, valid inside ``function``, as the code around ``call`` writes it."""
    params = function.params
    positional = [p.name.value for p in (*params.posonly_params, *params.params)]
    mapping: dict[str, cst.BaseExpression] = {}
    is_method = isinstance(index.parent_scope.get(id(function)), cst.ClassDef)
    if is_method and positional:
        receiver = call.func.value if isinstance(call.func, cst.Attribute) else None
        if receiver is not None:
            mapping[positional[0]] = receiver
        positional = positional[1:]
    positional_args = [a for a in call.args if a.keyword is None and not a.star]
    for name, arg in zip(positional, positional_args, strict=False):
        mapping[name] = arg.value
    for arg in call.args:
        if arg.keyword is not None:
            mapping[arg.keyword.value] = arg.value
    locals_ = {
        name for (scope_id, name) in index.bindings if scope_id == id(function)
    } - set(mapping)

    class Substitute(cst.CSTTransformer):
        def __init__(self) -> None:
            super().__init__()
            self.not_variables: set[int] = set()  # ``.attr`` and ``keyword=`` names

        def visit_Attribute(self, node: cst.Attribute) -> None:
            self.not_variables.add(id(node.attr))

        def visit_Arg(self, node: cst.Arg) -> None:
            if node.keyword is not None:
                self.not_variables.add(id(node.keyword))

        def leave_Name(self, original_node: cst.Name, updated_node: cst.Name) -> cst.BaseExpression:
            if id(original_node) in self.not_variables:
                return updated_node
            if original_node.value in mapping:
                return mapping[original_node.value].deep_clone()
            if original_node.value in locals_:
                raise _Untranslatable(code(expr))
            return updated_node

    result = expr.visit(Substitute())
    assert isinstance(result, cst.BaseExpression)
    return result
