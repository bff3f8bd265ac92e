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
(``Session``, placeholders, ``tf.compat.v1.train`` optimizers, estimators) are reported for a person
instead; other ``tf.compat.v1`` names (``logging``, ``flags``) are not graph mode.

This module also holds ``training_facts``, the analysis of tapes, optimizer steps and training
loops that ``shard_tf_dataset`` and ``broadcast_initial_state`` share.
"""

from __future__ import annotations

import libcst as cst

from ..analysis import FileInfo
from ..base import Transform
from ..program.index import file_index, reaching_values
from ..program.keras import keras_name, optimizer_class
from ..program.syntax import code
from ..program.training import (
    BY_HAND_METHODS,
    Tape,
    session_holds_config_only,
    training_facts,
)

#: What TF1 graph-mode *training* calls (``tf.compat.v1.logging``, ``flags``, ``app`` are not it).
_TF1_PREFIXES = (
    "tensorflow.estimator.", "tensorflow.compat.v1.estimator.", "tensorflow.compat.v1.train.",
    "tensorflow.compat.v1.layers.",
)
_TF1_NAMES = (
    "tensorflow.Session", "tensorflow.InteractiveSession", "tensorflow.placeholder",
    "tensorflow.train.MonitoredTrainingSession", "tensorflow.global_variables_initializer",
) + tuple(
    f"tensorflow.compat.v1.{n}"
    for n in ("Session", "InteractiveSession", "placeholder", "global_variables_initializer",
              "disable_eager_execution", "disable_v2_behavior", "get_variable",
              "variable_scope", "gradients")
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
        # A session that only holds GPU options for Keras (``set_session(Session(config=...))``)
        # is no graph-mode training.
        markers = [q for q in markers if not (q.endswith(".Session") and all(
            session_holds_config_only(self.fm, c) for c in self.calls_to(q)))]
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
        facts = training_facts(self.fm)
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
            isinstance(value, cst.Call) and optimizer_class(self.fm, value) is not None
            for value in reaching_values(file_index(self.fm), expr)
        ) or (isinstance(expr, cst.Attribute) and expr.attr.value == "optimizer")


def _applied(tape: Tape) -> str:
    return ", ".join(sorted({code(a.func) for a in tape.applies}))
