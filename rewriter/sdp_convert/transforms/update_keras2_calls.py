"""Make Keras 2 calls Keras 3 rejects work, or say what replaces them.

Before::

    opt = tf.optimizers.Adam(0.001 * hvd.size())
    hvd.broadcast_variables(opt.variables(), root_rank=0)
    model.save("saved_model_dir")
    train_loss.reset_states()

After::

    opt = tf.optimizers.Adam(0.001 * hvd.size())
    hvd.broadcast_variables(opt.variables, root_rank=0)
    model.save("saved_model_dir")   # manual note: model.export("saved_model_dir")
    train_loss.reset_state()

Why: TensorFlow 2.16+ is Keras 3, where scripts written for Keras 2 fail before and after the
conversion. The optimizer's ``variables`` is a property in Keras 3 (calling the list raises
``TypeError``), and the broadcast of the initial state uses it: ``<optimizer>.variables()`` of a
Keras optimizer made in the script (not a ``legacy`` one) becomes ``<optimizer>.variables``, and
``<metric>.reset_states()`` of a Keras metric made in the script ``<metric>.reset_state()``
(Keras 3 has only that), reported. The rest gets a manual note naming the Keras 3 replacement:
``model.save("dir")`` without a ``.keras``/``.h5`` extension or with ``save_format=``
(``model.export("dir")`` for a SavedModel, or a ``.keras`` path), and
``compile(experimental_run_tf_function=...)`` (remove it), ``Adam(lr=...)`` (``learning_rate=``)
and ``fit(workers=, use_multiprocessing=, max_queue_size=)`` (remove them).

``multi_gpu_model(model, gpus=n)`` (Keras 2's ``keras.utils.multi_gpu_model``, removed in
TF 2.4, or a project's copy of it) becomes ``model``, reported: it split each batch over the
process's GPUs, and under ``sdp-run`` each process has one GPU (the DistributedOptimizer averages
the gradients); left, it builds a model for GPUs the process cannot see. Where the file divides
by that GPU count (``batch_size // gpus``: the model was built for one GPU's share of the
batch), it gets a manual note instead.
"""

from __future__ import annotations

import libcst as cst

from ..analysis import FileInfo
from ..base import Transform
from ..program.keras2 import (
    directory_saves,
    divided_by,
    gpu_count,
    keras2_arguments,
    metric_reset_states_calls,
    multi_gpu_model_calls,
    optimizer_variables_calls,
    run_tf_function_args,
    unused_multi_gpu_imports,
)
from ..program.syntax import code


class UpdateKeras2Calls(Transform):
    DESCRIPTION = (
        "Keras 2 calls Keras 3 rejects: opt.variables() -> opt.variables, "
        "metric.reset_states() -> reset_state(); notes."
    )
    FRAMEWORKS = frozenset({"tensorflow"})

    @classmethod
    def applies_to(cls, info: FileInfo) -> bool:
        # Horovod's, SMDDP's and SMP's TF2 recipes are Keras 2 code too.
        return info.framework in cls.FRAMEWORKS and (
            info.convertible or info.origin in ("horovod", "smddp", "smp")
        )

    def prepare(self, module: cst.Module) -> None:
        self._properties: set[cst.Call] = set()
        for call in optimizer_variables_calls(self.fm):
            self._properties.add(call)
            receiver = code(call.func.value)  # type: ignore[attr-defined]
            self.record(
                call, f"{receiver}.variables() -> {receiver}.variables (a property in Keras 3)"
            )
        for call in directory_saves(self.fm):
            self.record(
                call,
                f"{code(call)}: Keras 3 saves only .keras and .h5 files; for a SavedModel "
                f"directory write {code(call.func.value)}.export(...) "  # type: ignore[attr-defined]
                f"(or tf.saved_model.save), else give the path a .keras extension",
                manual=True,
            )
        self._resets: set[cst.Call] = set()
        for call in metric_reset_states_calls(self.fm):
            self._resets.add(call)
            receiver = code(call.func.value)  # type: ignore[attr-defined]
            self.record(
                call, f"{receiver}.reset_states() -> {receiver}.reset_state() (Keras 3's name)"
            )
        self._single_gpu: set[cst.Call] = set()
        if self.state.info.convertible:
            for call in multi_gpu_model_calls(self.fm):
                split = divided_by(self.fm, gpu_count(call))
                if split is not None:  # built for a GPU's share of the batch: a person decides
                    self.record(
                        call,
                        f"{code(call)}: under sdp-run each process sees one GPU, where this "
                        f"builds a model for {code(gpu_count(call))} (it fails); use "  # type: ignore
                        f"{code(call.args[0].value)} itself, built for the batch each process "
                        f"trains on: {code(split)} sized it for one GPU's share",
                        manual=True,
                    )
                    continue
                self._single_gpu.add(call)
                self.record(
                    call,
                    f"{code(call)} -> {code(call.args[0].value)}: under sdp-run each process has "
                    "one GPU (multi_gpu_model split each batch over the GPUs of one process)",
                )
        self._gone = unused_multi_gpu_imports(self.fm, list(self._single_gpu))
        for alias in self._gone:
            self.record(alias, "multi_gpu_model import removed: nothing uses it now, and "
                        "TensorFlow 2.4+ has no keras.utils.multi_gpu_model")
            stmt = self.fm.parent(self.fm.parent(alias))  # the import's own line
            if all(a in self._gone for a in self.fm.parent(alias).names):  # type: ignore
                self.replace_statement(stmt, [])  # what is inserted after it stays
        for arg, message in keras2_arguments(self.fm):
            self.record(arg, message, manual=True)
        for arg in run_tf_function_args(self.fm):
            self.record(
                arg,
                "experimental_run_tf_function= is not an argument of Keras 3's compile(): "
                "remove it (run_eagerly=True runs eagerly)",
                manual=True,
            )

    def leave_ImportFrom(
        self, original_node: cst.ImportFrom, updated_node: cst.ImportFrom
    ) -> cst.ImportFrom:
        if isinstance(original_node.names, cst.ImportStar) or not any(
            a in self._gone for a in original_node.names
        ):
            return updated_node
        kept = [a for a, o in zip(updated_node.names, original_node.names, strict=True)
                if o not in self._gone]  # type: ignore[arg-type]
        if not kept:  # the whole line goes (prepare said so)
            return updated_node
        kept[-1] = kept[-1].with_changes(comma=cst.MaybeSentinel.DEFAULT)
        return updated_node.with_changes(names=kept)

    def leave_Call(self, original_node: cst.Call, updated_node: cst.Call) -> cst.BaseExpression:
        if original_node in self._single_gpu:
            return updated_node.args[0].value
        if original_node in self._properties:
            return updated_node.func.with_changes(
                lpar=updated_node.lpar, rpar=updated_node.rpar
            )
        if original_node in self._resets:
            func = cst.ensure_type(updated_node.func, cst.Attribute)
            return updated_node.with_changes(
                func=func.with_changes(attr=cst.Name("reset_state"))
            )
        return updated_node
