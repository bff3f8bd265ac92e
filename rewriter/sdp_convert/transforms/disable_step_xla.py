"""Compile a tf.function training step with XLA on one process only (XLA cannot run the allreduce).

Before::

    @tf.function(jit_compile=True)
    def train_step(x, y):
        with tf.GradientTape() as tape:
            loss = loss_fn(y, model(x, training=True))
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables))
        return loss

After::

    @tf.function(jit_compile=sdp.size() == 1)
    def train_step(x, y):
        with tf.GradientTape() as tape:
            loss = loss_fn(y, model(x, training=True))
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables))
        return loss

(``wrap_gradient_tape`` adds the ``DistributedGradientTape`` line.) Why: the averaging step of the
recipe, ``DistributedGradientTape.gradient``, hands the gradients to the runtime through a Python
callback (``tf.py_function``), which XLA cannot compile, so a step compiled with XLA fails at its
first call on several processes. The step cannot be split in a compiled and an uncompiled half
without rewriting it, so on several processes it runs as a ``tf.function`` without XLA; on one
process (``python train.py``) the allreduce is an identity and the step compiles with XLA exactly
as before. ``jit_compile=<expr>`` becomes ``<expr> and sdp.size() == 1``. Keras ``fit`` needs no
change here: the runtime keeps XLA around its allreduce (``sdp.keras.prepare_train_function``).

A step is a function that opens a ``tf.GradientTape`` and applies gradients (``apply_gradients``,
``apply``), itself or in a function of the file it calls; it may be compiled by decorator
(``@tf.function(jit_compile=True)``), by call (``tf.function(train_step, jit_compile=True)``,
``tf.function(self.train_step, ...)`` for a method) or by ``tf.function(jit_compile=True)(step)``.
A ``tf.function`` that does not train (evaluation, a gradient penalty) keeps XLA.
"""

from __future__ import annotations

import libcst as cst
import libcst.matchers as m

from ..base import Transform
from ..program.scopes import referents
from ..program.syntax import findall

_TF_FUNCTION = "tensorflow.function"
_TAPES = ("tensorflow.GradientTape", "tensorflow.autodiff.GradientTape")
_APPLY = m.Call(func=m.Attribute(attr=m.Name("apply_gradients") | m.Name("apply")))
#: Expressions that need brackets on the left of ``and``.
_LOOSE = (cst.BooleanOperation, cst.IfExp, cst.Lambda, cst.NamedExpr)
_LOCAL_CALL = m.Call(func=m.Name() | m.Attribute(value=m.Name("self")))
#: How deep calls from the compiled function to the file's own functions are followed.
_DEPTH = 3


class DisableStepXla(Transform):
    DESCRIPTION = "Compile tf.function training steps with XLA on one process only."
    FRAMEWORKS = frozenset({"tensorflow"})

    def prepare(self, module: cst.Module) -> None:
        #: original ``jit_compile=`` argument -> the name of the step it compiles
        self.steps: dict[cst.Arg, str] = {}
        for call in self.calls_to(_TF_FUNCTION):
            arg = _keyword(call, "jit_compile")
            if arg is None or self._never_xla(arg.value):
                continue
            step = self._compiled_function(call)
            if step is not None and self._trains(step):
                self.steps[arg] = step.name.value

    def leave_Arg(self, original_node: cst.Arg, updated_node: cst.Arg) -> cst.Arg:
        name = self.steps.get(original_node)
        if name is None:
            return updated_node
        one = cst.parse_expression(f"{self.sdp}.size() == 1")
        value = updated_node.value
        if m.matches(value, m.Name("True")):
            new: cst.BaseExpression = one
        else:
            if isinstance(value, _LOOSE) and not value.lpar:
                value = value.with_changes(lpar=[cst.LeftParen()], rpar=[cst.RightParen()])
            new = cst.BooleanOperation(left=value, operator=cst.And(), right=one)
        self.add_runtime_import()
        self.record(
            original_node,
            f"{name}(): jit_compile={self.module.code_for_node(original_node.value)} -> "
            f"{self.module.code_for_node(new)}: XLA cannot compile the gradient allreduce, so the "
            f"step compiles with XLA on one process only",
        )
        return updated_node.with_changes(value=new)

    def _never_xla(self, value: cst.BaseExpression) -> bool:
        """``False``/``None``, or already limited to one process (converted before)."""
        if m.matches(value, m.Name("False") | m.Name("None")):
            return True
        size = f"{self.state.runtime_module}.size"
        calls = [c for c in findall(value, m.Call()) if isinstance(c, cst.Call)]
        return any(self.refers_to(c.func, size) for c in calls)

    def _compiled_function(self, call: cst.Call) -> cst.FunctionDef | None:
        """The function ``tf.function(...)`` compiles: decorated, passed, or passed afterwards."""
        parent = self.parent(call)
        if isinstance(parent, cst.Decorator):
            owner = self.parent(parent)
            return owner if isinstance(owner, cst.FunctionDef) else None
        target: cst.BaseExpression | None = None
        positional = [a for a in call.args if a.keyword is None]
        if positional:
            target = positional[0].value
        else:
            func = _keyword(call, "func")
            target = func.value if func is not None else None
        if target is None and isinstance(parent, cst.Call) and parent.func is call:
            target = parent.args[0].value if parent.args else None  # tf.function(...)(step)
        return self._function_named(target) if target is not None else None

    def _function_named(self, expr: cst.BaseExpression) -> cst.FunctionDef | None:
        """The ``def`` a name (``step``) or a method (``self.step``) refers to, in this file."""
        if isinstance(expr, cst.Name):
            nodes = [b.node for b in referents(self.fm, expr)]
            defs = [n for n in nodes if isinstance(n, cst.FunctionDef)]
            return defs[-1] if defs else None
        if m.matches(expr, m.Attribute(value=m.Name("self"))):
            assert isinstance(expr, cst.Attribute)
            cls = next((n for n in self.ancestors(expr) if isinstance(n, cst.ClassDef)), None)
            if cls is None:
                return None
            methods = findall(cls.body, m.FunctionDef(name=m.Name(expr.attr.value)))
            return methods[0] if methods else None  # type: ignore[return-value]
        return None

    def _trains(self, function: cst.FunctionDef) -> bool:
        """Whether ``function``, or a function of the file it calls, opens a tape; and applies."""
        reached = self._reached(function, _DEPTH, {})
        tape = any(
            self.refers_to(item.item.func, *_TAPES)  # type: ignore[attr-defined]
            for f in reached
            for item in findall(f, m.WithItem(item=m.Call()))
        )
        return tape and any(findall(f, _APPLY) for f in reached)

    def _reached(
        self, function: cst.FunctionDef, depth: int, seen: dict[int, cst.FunctionDef]
    ) -> list[cst.FunctionDef]:
        seen[id(function)] = function
        if depth:
            for call in findall(function, _LOCAL_CALL):
                callee = self._function_named(call.func)  # type: ignore[attr-defined]
                if callee is not None and id(callee) not in seen:
                    self._reached(callee, depth - 1, seen)
        return list(seen.values())


def _keyword(call: cst.Call, name: str) -> cst.Arg | None:
    return next((a for a in call.args if a.keyword and a.keyword.value == name), None)
