"""Make Keras ``compile``/``fit`` data-parallel: distributed optimizer, broadcast and metric
callbacks.

Before::

    model.compile(optimizer=tf.keras.optimizers.Adam(0.001), loss="mse")
    model.fit(x_train, y_train, batch_size=64, epochs=3, steps_per_epoch=100,
              callbacks=[tf.keras.callbacks.ModelCheckpoint("ckpt.keras")])

After (with ``scale_keras_learning_rate`` and ``add_runtime_init``)::

    model.compile(optimizer=sdp.keras.DistributedOptimizer(
                      tf.keras.optimizers.Adam(0.001 * sdp.size())),
                  loss="mse")
    model.fit(sdp.shard(x_train), sdp.shard(y_train), batch_size=64,
              epochs=3, steps_per_epoch=100 // sdp.size(),
              callbacks=[sdp.keras.callbacks.BroadcastGlobalVariablesCallback(0),
                         sdp.keras.callbacks.MetricAverageCallback()]
              + ([tf.keras.callbacks.ModelCheckpoint("ckpt.keras")] if sdp.rank() == 0 else []),
              verbose=1 if sdp.rank() == 0 else 0)

Why, step by step:

* ``DistributedOptimizer`` averages the gradients across workers before Keras applies them. Not done
  when the model's class overrides ``train_step`` (or inherits one from a class of the file) with
  a tape that ``wrap_gradient_tape`` wrapped: the gradients would be averaged twice. A string
  optimizer (``"adam"``) or none (Keras' default ``"rmsprop"``) becomes the optimizer object
  first, in the Keras namespace the file uses.
* ``BroadcastGlobalVariablesCallback(0)`` gives every worker rank 0's weights and optimizer state
  after the first batch (when Keras 3 has built them); ``MetricAverageCallback`` averages the epoch
  metrics so that ``EarlyStopping``, ``ReduceLROnPlateau`` and checkpoints decide the same on every
  worker. Both go first, so that later callbacks see averaged metrics.
* Callbacks that write files (``ModelCheckpoint``, ``TensorBoard``, ``CSVLogger``,
  ``BackupAndRestore``, ..., and a project module's callback class that writes,
  ``Options.project``) run on rank 0 only, wherever the list is built (a literal in ``fit``, a
  variable, ``callbacks.append``); ``verbose`` keeps its value on rank 0 and is 0 elsewhere.
* ``steps_per_epoch`` is divided by the number of workers where the data is split (1/N of the
  batches each), kept for a generator left whole; ``validation_steps`` is kept (all evaluated).
* A ``tf.data`` dataset given to ``fit`` is sharded at its source by ``shard_tf_dataset``. Arrays
  (``fit(x, y)``) are sharded here with ``sdp.shard(x)``: every ``sdp.size()``-th sample from
  ``sdp.rank()`` on, the samples padded (like ``DistributedSampler``) to a multiple of the number of
  workers so that every worker runs the same number of steps. ``batch_size`` stays the
  per-worker batch, and without shuffling one step of N workers sees exactly the samples of one
  step of batch N*B. The same goes for ``fit(x)`` without labels (VAEs, GANs with their own
  ``train_step``), inputs in a tuple, list or dict, and ``sample_weight``; a ``Sequence`` of the
  script's is split by batches. What counts as arrays: ``program.tfshards.fit_inputs_to_split``.
"""

from __future__ import annotations

import libcst as cst

from ..base import Transform
from ..program.index import FileIndex, file_index, reaching_values
from ..program.keras import (
    DEFAULT_COMPILE_OPTIMIZER,
    compile_optimizer_arg,
    fit_arg,
    hidden_fit_arguments,
    is_keras_compile,
    keras_fit_calls,
    keras_names,
    keras_own_train_step,
    optimizer_from_string,
    per_worker_save_freq,
)
from ..program.project import repairs_of
from ..program.ranks import is_rank0_test, rank0_only
from ..program.syntax import (
    add_keyword,
    code,
    divided_by_size,
    double_star,
    elements_list,
    mentions,
    mentions_size,
    prepend_elements,
    replace_arg,
    sum_operand,
)
from ..program.tfshards import data_sharded_for, fit_inputs_to_split
from ..program.training import training_facts
from ..program.vocab import WRITING_KERAS_CALLBACKS

#: Callbacks that write files or talk to the outside: rank 0 only.
_RANK0_CALLBACKS = WRITING_KERAS_CALLBACKS
_RANK0_QNAMES = tuple(f"{module}.callbacks.{name}" for name in sorted(_RANK0_CALLBACKS)
                      for module in ("tensorflow.keras", "keras", "tf_keras"))


class WrapKerasFit(Transform):
    DESCRIPTION = (
        "Keras fit: DistributedOptimizer, broadcast/metric callbacks, rank-0 callbacks and output."
    )
    FRAMEWORKS = frozenset({"tensorflow"})
    #: Project mode: a compile of a module that trains nothing, its model fit by another.
    PROJECT_ROLES = frozenset({"repair:distributed_compile"})

    def prepare(self, module: cst.Module) -> None:
        keras = f"{self.state.runtime_module}.keras"
        self.broadcast_callback = f"{keras}.callbacks.BroadcastGlobalVariablesCallback"
        self.compiles: set[cst.Call] = set()
        self.fits: set[cst.Call] = set()
        self.split_lists: set[cst.List] = set()
        self.arrays: dict[cst.Call, list[str]] = {}  # fit -> keywords of the arrays to stride
        self.sequences: set[cst.Call] = set()  # fits given a keras Sequence of the script's
        if not self.state.info.uses_fit and not any(
            is_keras_compile(self.fm, c) for c in self.method_calls("compile")
        ):
            # ``uses_fit`` needs a call of a Keras name; a subclassed model compiled with a string
            # optimizer calls none (``class M(keras.Model)`` is no call) until this conversion
            # writes ``keras.optimizers.Adam(...)``: a second pass must find nothing left to do.
            return
        index = file_index(self.fm)
        facts = training_facts(self.fm)
        asked = {id(n) for _, n in repairs_of(self.fm, "distributed_compile")}
        only_asked = not self.state.info.training
        for call in self.method_calls("compile"):
            if not is_keras_compile(self.fm, call):
                continue
            if only_asked and id(call) not in asked:
                continue
            arg = compile_optimizer_arg(call)
            if arg is not None and mentions(self.fm, arg.value, f"{keras}.DistributedOptimizer"):
                continue
            owner = self._train_step_owner(index, call, facts.train_step_classes)
            if owner is not None:
                if self.state.info.origin == "sdp":
                    continue  # said when the file was converted; nothing new to report
                self.record(
                    call,
                    f"optimizer not wrapped: {owner}.train_step averages its gradients "
                    f"(DistributedGradientTape) already",
                )
                continue
            self.compiles.add(call)
        for call in keras_fit_calls(self.fm) if not only_asked else ():
            self.fits.add(call)
            self._plan_arrays(index, call)
        self._plan_rank0_callbacks(index)
        if self.compiles or self.fits:
            self.add_runtime_import()

    # -- compile ----------------------------------------------------------------------------------

    def _train_step_owner(
        self, index: FileIndex, call: cst.Call, classes: dict[str, cst.FunctionDef]
    ) -> str | None:
        """The class with a wrapped ``train_step`` that the compiled model is an instance of."""
        if not classes:
            return None
        receiver = call.func.value  # type: ignore[attr-defined]
        for value in reaching_values(index, receiver, call):
            if (
                isinstance(value, cst.Call)
                and isinstance(value.func, cst.Name)
                and value.func.value in classes
            ):
                return value.func.value
            if isinstance(value, cst.Name) and value.value == "self":
                owner = index.parent_scope.get(id(index.scope(call)))
                if isinstance(owner, cst.ClassDef) and owner.name.value in classes:
                    return owner.name.value
        if keras_own_train_step(self.fm, index, receiver, call, classes):
            return None  # keras.Sequential, a functional keras.Model: Keras' own train_step
        steps = {id(f): f for f in classes.values()}
        if len(steps) == 1:  # a model built elsewhere (a factory): the file's only such step
            if self.state.info.origin == "sdp":
                return None
            owner = index.parent_scope.get(id(next(iter(steps.values()))))
            assert isinstance(owner, cst.ClassDef)  # a train_step of training_facts' classes
            self.record(call, f"{owner.name.value}.train_step averages its gradients already: if "
                        "this model is one, do not also wrap its optimizer in "
                        f"{self.sdp}.keras.DistributedOptimizer", manual=True)
        return None

    def _compile(self, original: cst.Call, updated: cst.Call) -> cst.Call:
        arg = compile_optimizer_arg(updated)
        if arg is None:
            optimizer = optimizer_from_string(
                self.fm, DEFAULT_COMPILE_OPTIMIZER, None, self.add_import
            )
            assert optimizer is not None
            self.record(original, f"Keras' default optimizer made explicit: {code(optimizer)}")
            updated = add_keyword(updated, "optimizer", optimizer, first=True)
            arg = compile_optimizer_arg(updated)
            assert arg is not None
        value = arg.value
        if isinstance(value, cst.SimpleString):
            name = value.evaluated_value
            converted = optimizer_from_string(
                self.fm, name, None, self.add_import
            ) if isinstance(name, str) else None
            if converted is None:
                self.record(
                    original,
                    f"optimizer {value.value}: wrap it in {self.sdp}.keras.DistributedOptimizer "
                    f"by hand (the converter does not know this name)",
                    manual=True,
                )
                return updated
            self.record(original, f"optimizer {value.value} -> {code(converted)}")
            value = converted
        wrapped = cst.Call(
            func=cst.parse_expression(f"{self.sdp}.keras.DistributedOptimizer"),
            args=[cst.Arg(value)],
        )
        self.record(
            original,
            f"optimizer wrapped in {self.sdp}.keras.DistributedOptimizer: gradients averaged "
            f"across workers",
        )
        return replace_arg(updated, arg, wrapped)

    # -- fit --------------------------------------------------------------------------------------

    def _fit(self, original: cst.Call, updated: cst.Call) -> cst.Call:
        kwargs = double_star(original)
        if kwargs is not None and (todo := hidden_fit_arguments(original, self.sdp)):
            self.record(kwargs, f"fit(**{code(kwargs.value)}): the converter cannot see what it "
                        "holds: " + "; ".join(todo), manual=True)
        updated = self._callbacks(original, updated)
        updated = self._verbose(original, updated)
        steps = fit_arg(updated, "steps_per_epoch")
        original_steps = fit_arg(original, "steps_per_epoch")
        # Fewer steps only for data split between the workers (here, by shard_tf_dataset, or
        # inside the generator's call by port_fit_generator), never for a generator left whole.
        split = self.arrays.get(original) or data_sharded_for(self.fm, original) or any(
            f"{self.sdp}.shard(" in code(a.value) for a in updated.args)
        if split and steps is not None and original_steps is not None and not mentions_size(
            self.fm, original_steps.value
        ) and code(steps.value) != "None":
            self.record(
                original_steps,
                f"steps_per_epoch={code(steps.value)} -> // {self.sdp}.size(): each worker's "
                f"shard has its part of the batches",
            )
            updated = replace_arg(updated, steps, divided_by_size(steps.value, self.sdp))
        for keyword in self.arrays.get(original, []):
            arg = fit_arg(updated, keyword)
            assert arg is not None
            shard = cst.Call(
                func=cst.parse_expression(f"{self.sdp}.shard"), args=[cst.Arg(arg.value)]
            )
            updated = replace_arg(updated, arg, shard)
        if original in self.sequences:
            self.record(
                original,
                f"{code(fit_arg(original, 'x').value)}: each worker reads every "  # type: ignore[union-attr]
                f"{self.sdp}.size()-th batch of the Sequence from {self.sdp}.rank() on, padded so "
                f"that every worker runs the same number of steps",
            )
        elif self.arrays.get(original):
            names = ", ".join(code(fit_arg(original, k).value)  # type: ignore[union-attr]
                              for k in self.arrays[original])
            split = ""
            if fit_arg(original, "validation_split") is not None:
                split = (
                    "; validation_split takes its part of each worker's shard (the validation "
                    "metrics are averaged across workers)"
                )
            self.record(
                original,
                f"{names}: each worker trains on every {self.sdp}.size()-th sample from "
                f"{self.sdp}.rank() on, padded like DistributedSampler so that every worker runs "
                f"the same number of steps (batch_size is per worker){split}",
            )
        return updated

    def _callbacks(self, original: cst.Call, updated: cst.Call) -> cst.Call:
        arg = fit_arg(original, "callbacks")
        if arg is None and double_star(original) is not None:
            return updated
        if arg is not None and any(
            mentions(self.fm, v, self.broadcast_callback)
            for v in reaching_values(file_index(self.fm), arg.value, original)
        ):
            return updated
        new = cst.parse_expression(
            f"[{self.sdp}.keras.callbacks.BroadcastGlobalVariablesCallback(0), "
            f"{self.sdp}.keras.callbacks.MetricAverageCallback()]"
        )
        assert isinstance(new, cst.List)
        self.record(
            arg.value if arg is not None else original,
            "callbacks BroadcastGlobalVariablesCallback(0) (rank 0's initial weights on every "
            "worker) and MetricAverageCallback() (metrics averaged across workers) added first",
        )
        current = fit_arg(updated, "callbacks")
        if current is None:
            return add_keyword(updated, "callbacks", new, first=False)
        value = current.value
        if isinstance(value, cst.List) and not value.lpar:
            return replace_arg(updated, current, prepend_elements(value, new))
        if (
            isinstance(value, cst.BinaryOperation)
            and isinstance(value.operator, cst.Add)
            and isinstance(value.left, cst.List)
        ):  # a list split for rank 0 (below): [shared...] + ([...] if rank 0 else [])
            merged = value.with_changes(left=prepend_elements(value.left, new))
            return replace_arg(updated, current, merged)
        combined = cst.BinaryOperation(left=new, operator=cst.Add(), right=sum_operand(value))
        return replace_arg(updated, current, combined)

    def _verbose(self, original: cst.Call, updated: cst.Call) -> cst.Call:
        arg = fit_arg(original, "verbose")
        if arg is None and double_star(original) is not None:
            return updated
        if arg is not None and (
            (isinstance(arg.value, cst.IfExp) and is_rank0_test(self.fm, arg.value.test))
            or code(arg.value) in ("0", "False")
        ):
            return updated
        current = fit_arg(updated, "verbose")
        value = current.value if current is not None else cst.Integer("1")
        quiet = cst.parse_expression(f"_ if {self.sdp}.rank() == 0 else 0")
        assert isinstance(quiet, cst.IfExp)
        quiet = quiet.with_changes(body=sum_operand(value, ifexp=True))
        self.record(
            arg.value if arg is not None else original,
            "progress output on rank 0 only (verbose=0 on the other workers)",
        )
        if current is None:
            return add_keyword(updated, "verbose", quiet, first=False)
        return replace_arg(updated, current, quiet)

    def _plan_arrays(self, index: FileIndex, fit: cst.Call) -> None:
        split = fit_inputs_to_split(self.fm, fit)
        if split is not None:
            self.arrays[fit], sequence = split
            if sequence:
                self.sequences.add(fit)

    # -- callbacks that write ---------------------------------------------------------------------

    def _rank0_callback(
        self, index: FileIndex, expr: cst.BaseExpression, at: cst.CSTNode
    ) -> str | None:
        project = self.state.options.project  # its modules' writing callbacks count too
        for value in reaching_values(index, expr, at):
            if isinstance(value, cst.Call):
                if project and self.refers_to(value.func, *project.rank0_callbacks):
                    return code(value.func)
                for name in keras_names(self.fm, value.func):
                    if (
                        name.startswith("keras.callbacks.")
                        and name.rsplit(".", 1)[1] in _RANK0_CALLBACKS
                    ):
                        return name.rsplit(".", 1)[1]
        return None

    def _plan_rank0_callbacks(self, index: FileIndex) -> None:
        project = self.state.options.project  # writing callbacks of the project's modules
        for qname in (*_RANK0_QNAMES, *(project.rank0_callbacks if project else ())):
            for call in self.calls_to(qname):
                if qname.endswith(".BackupAndRestore"):
                    self.record(call, "BackupAndRestore runs on rank 0 only: to resume, every "
                                "worker must restore the same backup (e.g. restore on all, write "
                                "on rank 0)", manual=True)
                self._place(index, call)

    def _place(self, index: FileIndex, call: cst.Call) -> None:
        """Find where the callback joins a list, and plan to keep it there on rank 0 only."""
        parent = self.parent(call)
        if isinstance(parent, cst.Assign) and len(parent.targets) == 1:
            target = parent.targets[0].target
            if isinstance(target, cst.Name):
                uses = index.loads_of(target.value, index.scope(parent))
                for use in uses:
                    self._place_use(use)
                return
        self._place_use(call)

    def _place_use(self, node: cst.BaseExpression) -> None:
        parent = self.parent(node)
        if isinstance(parent, cst.Element):
            container = self.parent(parent)
            if isinstance(container, cst.List) and not self._in_rank0_branch(container):
                self.split_lists.add(container)
            return
        if isinstance(parent, cst.Arg):
            call = self.parent(parent)
            if (
                isinstance(call, cst.Call)
                and isinstance(call.func, cst.Attribute)
                and call.func.attr.value in ("append", "insert")
            ):
                statement = self.enclosing_statement(call)
                if statement is not None and not rank0_only(self.fm, call):
                    self.guard_rank0(statement)
                    self.record(call, f"{code(node)} added on rank 0 only (it writes files)")

    def _in_rank0_branch(self, node: cst.CSTNode) -> bool:
        parent = self.parent(node)
        return isinstance(parent, cst.IfExp) and parent.body is node and is_rank0_test(
            self.fm, parent.test)

    def _split(self, original: cst.List, updated: cst.List) -> cst.BaseExpression:
        index = file_index(self.fm)
        shared, rank0 = [], []
        for original_element, element in zip(original.elements, updated.elements, strict=False):
            if isinstance(original_element, cst.Element) and self._rank0_callback(
                index, original_element.value, original
            ):
                rank0.append(element)
            else:
                shared.append(element)
        if not rank0:
            return updated
        names = ", ".join(code(e.value) for e in rank0)
        self.record(original, f"{names} on rank 0 only (writes files)")
        only = cst.parse_expression(f"_ if {self.sdp}.rank() == 0 else []")
        assert isinstance(only, cst.IfExp)
        only = only.with_changes(
            body=elements_list(rank0), lpar=[cst.LeftParen()], rpar=[cst.RightParen()]
        )
        if not shared:
            return only.with_changes(lpar=(), rpar=())
        # The last element left takes the list's last comma (or none): the layout stays.
        shared[-1] = shared[-1].with_changes(comma=updated.elements[-1].comma)
        return cst.BinaryOperation(
            left=updated.with_changes(elements=shared),
            operator=cst.Add(),
            right=only,
        )

    # -- hooks ------------------------------------------------------------------------------------

    def leave_List(self, original_node: cst.List, updated_node: cst.List) -> cst.BaseExpression:
        if original_node in self.split_lists:
            return self._split(original_node, updated_node)
        return updated_node

    def leave_Call(self, original_node: cst.Call, updated_node: cst.Call) -> cst.BaseExpression:
        if original_node in self.compiles:
            return self._compile(original_node, updated_node)
        if original_node in self.fits:
            return self._fit(original_node, updated_node)
        if self.fits:
            call, note = per_worker_save_freq(self.fm, original_node, updated_node)
            if note is not None:
                self.record(*note)
            return call
        return updated_node



