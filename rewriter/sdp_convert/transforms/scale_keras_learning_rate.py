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

Rates are scaled only where the training data is split between the workers (``program.sharding``:
every training dataset sharded, or shardable by ``shard_tf_dataset``, and ``fit`` arrays that
``wrap_keras_fit`` strides). Otherwise every worker averages the same gradient and a scaled rate
would step N times too far: the rates stay and a manual note per optimizer says to scale them once
the data is split. Where only some of a file's data is split (a notebook of several experiments),
each ``compile`` is decided by the data of its own fits (the ``fit`` calls on the same model after
it, before it is compiled again).

This module also holds the Keras helpers the other TensorFlow transforms share: one canonical name
for every spelling of a Keras object (``keras_name``), the expression helpers that multiply or
divide by ``sdp.size()``, and ``FileIndex``, a one-walk index of where names are bound.
"""

from __future__ import annotations

from collections.abc import Sequence

import libcst as cst

from ..base import Transform
from ..program.index import FileIndex, file_index, reaching_values
from ..program.keras import (
    _SCHEDULE_RATES,
    DEFAULT_COMPILE_OPTIMIZER,
    OPTIMIZER_DEFAULT_LR,
    OPTIMIZER_STRINGS,
    compile_optimizer_arg,
    is_keras_compile,
    keras_name,
    keras_names,
    optimizer_class,
    optimizer_from_string,
    schedule_class,
)
from ..program.optimizers import lr_set_while_training
from ..program.project import repairs_of
from ..program.sharding import training_data
from ..program.syntax import (
    add_keyword,
    arg_named,
    code,
    double_star,
    mentions_size,
    replace_arg,
    size_factor,
    times_size,
)
from ..program.tfshards import data_sharded_for, lengths_of_split_data, schedule_advice

# -- the transform -------------------------------------------------------------------------------

_RUNTIME_LR_ATTRS = ("learning_rate", "lr")
#: Why the learning rate stays, by ``DataSharding.kind``.
UNSHARDED = {
    "not sharded": "the training data is not split between the workers (see the data's note)",
    "partly sharded": "the training data is split on some of the paths that bind it only (see "
    "the data's note)",
    "environment": "the data comes from an environment, not a dataset the workers can split",
    "input": "it optimises an input tensor, not a model: not data-parallel as written",
    "full batch": "full-batch training, every worker sees the same data",
    "full batch drawn": "full-batch training on tensors each worker draws for itself, not "
    "parts of one dataset",
    "not found": "no sharded training data was found",
}


class ScaleKerasLearningRate(Transform):
    DESCRIPTION = "Scale Keras optimizer learning rates (and schedules) by the number of workers."
    FRAMEWORKS = frozenset({"tensorflow"})

    #: Project mode: see ``prepare`` (``repair:scale_keras_lr``).
    PROJECT_ROLES = frozenset({"repair:scale_keras_lr"})

    def prepare(self, module: cst.Module) -> None:
        self.mode = self.state.options.lr_scaling
        # original Call -> what to do with it in leave_Call
        self.optimizers: dict[cst.Call, str] = {}
        self.schedules: dict[cst.Call, str] = {}
        self.compiles: list[cst.Call] = []
        if self.mode == "none":
            return
        # Project mode: a compile in a module that trains nothing itself, whose model another
        # module fits on split data (the whole-program contract's ``scale_keras_lr``): that
        # compile's optimizer alone.
        asked = [node for _, node in repairs_of(self.fm, "scale_keras_lr")]
        if not self.state.info.training and asked:
            data_sharded = True
            asked = self._with_optimizers(asked)
        else:
            data = training_data(self.fm)
            data_sharded = data.sharded
            asked = []
            if not data_sharded and data.kind == "not sharded":
                # A notebook of several experiments: each compile by the data of its own fits.
                asked = self._with_optimizers(self._compiles_on_split_data())
                if asked:
                    self._unscaled(data.kind, asked)
                    data_sharded = True
        if not data_sharded:
            self._unscaled(data.kind)
            return
        index = file_index(self.fm)
        optimizer_vars: set[str] = set()
        for qname, calls in self.state.info.calls.items():
            name = keras_name(qname)
            if name is None:
                continue
            for call in calls:
                if asked and not any(a is call or any(p is a for p in self.ancestors(call))
                                     for a in asked):
                    continue
                cls = optimizer_class(self.fm, call)
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
            if asked and not any(a is call for a in asked):
                continue
            if is_keras_compile(self.fm, call):
                arg = compile_optimizer_arg(call)
                if arg is None or isinstance(arg.value, cst.SimpleString):
                    self.compiles.append(call)
        self._find_runtime_assignments(index, optimizer_vars)

    def _compiles_on_split_data(self) -> list[cst.Call]:
        """The compiles whose model's fits (the ``fit`` calls on the same name after it, before
        that name is compiled again) all train on data split between the workers."""
        compiles = [c for c in self.method_calls("compile") if is_keras_compile(self.fm, c)]
        fits = list(self.method_calls("fit"))
        order = file_index(self.fm).order
        split = []
        for n, compile_call in enumerate(compiles):
            model = code(compile_call.func.value)  # type: ignore[attr-defined]
            start = order.get(id(compile_call), -1)
            end = min([order.get(id(c), -1) for c in compiles[n + 1:]
                       if code(c.func.value) == model  # type: ignore[attr-defined]
                       and order.get(id(c), -1) > start], default=1 << 62)
            own = [f for f in fits if code(f.func.value) == model  # type: ignore[attr-defined]
                   and start < order.get(id(f), -1) < end]
            if own and all(data_sharded_for(self.fm, f) for f in own):
                split.append(compile_call)
        return split

    def _with_optimizers(self, compiles: list[cst.CSTNode]) -> list[cst.CSTNode]:
        """``compiles`` and the optimizer each gets, built in it or bound to a name before it."""
        index = file_index(self.fm)
        found = list(compiles)
        for compile_call in compiles:
            arg = compile_optimizer_arg(compile_call) if isinstance(
                compile_call, cst.Call) else None
            if arg is not None:
                found += [v for v in reaching_values(index, arg.value, compile_call)
                          if isinstance(v, cst.Call)]
        return found

    def _unscaled(self, kind: str, besides: Sequence[cst.CSTNode] = ()) -> None:
        """Unsharded data: every learning rate stays (but those of ``besides``, compiles and
        their optimizers, which are scaled); one note per optimizer says why."""
        factor = size_factor(self.sdp, self.mode)
        why = UNSHARDED[kind]
        skip = set(map(id, besides))
        found: list[tuple[cst.CSTNode, str, str | None]] = []
        for qname, calls in self.state.info.calls.items():
            if keras_name(qname) is not None:
                for call in calls:
                    cls = optimizer_class(self.fm, call)
                    if cls is not None:
                        arg = arg_named(call, "learning_rate", 0) or arg_named(call, "lr")
                        rate = code(arg.value) if arg else "its learning rate"
                        advice = arg and schedule_advice(self.fm, arg.value, factor, self.sdp)
                        found.append((call, f"{cls}: {rate}", advice))
        for call in self.method_calls("compile"):
            arg = compile_optimizer_arg(call) if is_keras_compile(self.fm, call) else None
            if arg is not None and isinstance(arg.value, cst.SimpleString):
                found.append((call, f"optimizer {arg.value.value}: its learning rate", None))
        for node, what, advice in found:
            if id(node) in skip or any(id(p) in skip for p in self.ancestors(node)):
                continue
            at = lr_set_while_training(self.fm, node) if isinstance(node, cst.Call) else None
            then = f"; it is set anew while training ({at}): scale the rate set there" if at else (
                "; scale it")
            tail = advice if advice and not at else (
                f"{then} by {factor} once each worker trains on its own part of the data")
            self.record(node, f"{what} left as it is: {why}{tail}", manual=True)

    def _plan_learning_rate(self, index: FileIndex, call: cst.Call, cls: str) -> None:
        arg = arg_named(call, "learning_rate", 0) or arg_named(call, "lr")
        if arg is None:
            return
        if _is_scaled(self, index, arg.value):
            self.optimizers.pop(call)
            return
        for value in reaching_values(index, arg.value):
            if not isinstance(value, cst.Call):
                continue
            schedule = schedule_class(self.fm, value)
            if schedule is not None:
                self.optimizers.pop(call)
                if not any(_is_scaled(self, index, a.value, value) for a in value.args):
                    self.schedules[value] = schedule
                self._whole_data_steps(value)
                return
            if _is_custom_schedule(self, index, value):
                self.optimizers.pop(call)
                self.record(
                    arg.value,
                    f"custom LearningRateSchedule: scale the rates it returns by "
                    f"{size_factor(self.sdp, self.mode)}",
                    manual=True,
                )
                self._whole_data_steps(value)
                return
            if _foreign_class(self, value):
                # ``module.LinearDecay(...)``: an instance of a class of another module is no
                # number (``schedule * size`` would fail): a schedule, read by a person.
                self.optimizers.pop(call)
                self.record(
                    arg.value,
                    f"{code(value.func)}(...) is the learning rate, an object of a class the "
                    f"converter cannot read here (a LearningRateSchedule): scale the rates it "
                    f"returns by {size_factor(self.sdp, self.mode)}",
                    manual=True,
                )
                self._whole_data_steps(value)
                return

    def _whole_data_steps(self, schedule: cst.Call) -> None:
        """A schedule whose step counts come from the length of the whole training data, now
        split: each worker runs 1/N of an epoch's steps, and ``optimizer.iterations`` counts
        them, so the schedule would run N times slower."""
        for name, made in lengths_of_split_data(self.fm, schedule):
            self.record(
                schedule,
                f"{code(schedule.func)}(...) counts optimizer steps with {name}, which "
                f"{code(made.func)}(...) returns with the training data: the length of all of "
                f"it, while each worker now runs 1/{self.sdp}.size() of an epoch's steps (its "
                f"data is split): divide it here ({name} // {self.sdp}.size()), or the schedule "
                f"runs {self.sdp}.size() times slower",
                manual=True,
            )

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
        optimizer = optimizer_from_string(self.fm, cls, lr, self.add_import)
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
    return any(mentions_size(transform.fm, value) for value in reaching_values(index, expr, at))


def _is_lr_attribute(expr: cst.BaseExpression) -> bool:
    return isinstance(expr, cst.Attribute) and expr.attr.value in _RUNTIME_LR_ATTRS


def _foreign_class(transform: Transform, call: cst.Call) -> bool:
    """``module.LinearDecay(...)`` / ``LinearDecay(...)``: a class (capitalised) that is no Keras
    name and no function or class of this file."""
    name = code(call.func).rsplit(".", 1)[-1]
    if not name[:1].isupper() or keras_names(transform.fm, call.func):
        return False
    qualified = transform.fm.qualified_names(call.func)
    return bool(qualified) and not any(q.startswith(("builtins.", "numpy.", "math.", "torch."))
                                       for q in qualified)


def _is_custom_schedule(transform: Transform, index: FileIndex, call: cst.Call) -> bool:
    """``MySchedule(...)`` where ``MySchedule`` is a class of this file deriving from a schedule."""
    if not isinstance(call.func, cst.Name):
        return False
    cls = index.class_named(call.func)
    if cls is None:
        return False
    return any(
        n.endswith("LearningRateSchedule") or ".schedules." in n
        for base in cls.bases
        for n in keras_names(transform.fm, base.value) | {code(base.value)}
    )
