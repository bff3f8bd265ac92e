"""Migrate a SageMaker model-parallel (SMP, smdistributed.modelparallel) script to sdp_runtime.

Before::

    import smdistributed.modelparallel.torch as smp

    smp.init()
    model = smp.DistributedModel(model)
    optimizer = smp.DistributedOptimizer(optimizer)

    @smp.step
    def train_step(model, data, target):
        loss = F.nll_loss(model(data), target)
        model.backward(loss)
        return loss

    torch.save(model.state_dict(), "model.pt")

After::

    import sdp_runtime.torch.smp as smp

    smp.init()
    model = smp.DistributedModel(model)
    optimizer = smp.DistributedOptimizer(optimizer)

    @smp.step
    def train_step(model, data, target):
        loss = F.nll_loss(model(data), target)
        model.backward(loss)
        return loss

    smp.save(model.state_dict(), "model.pt", partial=False)

Why: SMP runs only on SageMaker. ``sdp_runtime.torch.smp`` and ``sdp_runtime.tensorflow.smp``
have SMP's names (``init``, the rank queries, ``DistributedModel``, ``DistributedOptimizer``,
``step`` with its microbatches, ``StepOutput``, ``partition``, ``save``/``load``,
``amp.GradScaler``, ...), so the script runs under ``sdp-run`` once its import points there; the
alias is kept and nothing else moves. The configuration still comes from ``smp.init(config)`` or
SageMaker's ``SM_HP_MP_PARAMETERS``. PyTorch models with more than one partition, tensor
parallelism or sharded data parallelism are sharded with FSDP; TensorFlow ones are trained
data-parallel (there is no FSDP for TensorFlow), which ``smp.partition`` blocks get a note about.

Call by call:

* ``torch.save(...)`` not under a rank check becomes ``smp.save(..., partial=False)``: written
  once, and ``model.state_dict()`` still runs on every rank, which a sharded model needs (a
  ``torch.save`` put under ``if rank() == 0:`` would gather the shards on rank 0 alone and hang);
  ``model.state_dict()`` already under a ``rank() == 0`` test gets a note saying so;
* ``optimizer.get_gradients(loss, variables)`` in a TensorFlow ``@smp.step`` function becomes
  ``smp.get_gradients(loss, variables)`` (Keras 3 optimizers have no ``get_gradients``; the
  runtime's step records the gradient tape);
* anything of SMP's API the runtime does not have (``save_checkpoint``, ``smp.nn`` layers,
  ``smp.optimizers``, ``CheckpointManager``, ``send``, ...) gets a manual note naming it.

An SMP script is never treated as a single-GPU script: its model is not wrapped in DDP a second
time and its learning rate is not scaled (SMP already ran it data-parallel on SageMaker with that
learning rate). A Horovod import next to SMP's (SMP's hybrid TF recipe) is ``migrate_horovod``'s.
"""

from __future__ import annotations

from collections.abc import Mapping

import libcst as cst
from libcst.metadata import QualifiedNameProvider, QualifiedNameSource

from .. import migration as hvd
from ..analysis import FileInfo, Visitor

_ROOT = "smdistributed.modelparallel"

_COMMON = hvd.names(
    """init is_initialized rank size local_rank local_size dp_rank dp_size mp_rank mp_size
    get_mp_group get_dp_group DistributedModel step StepOutput partition barrier broadcast
    recv_from allgather CommGroup RankType WORLD MP_GROUP DP_GROUP"""
)
_TORCH = _COMMON | hvd.names(
    """pp_rank pp_size tp_rank tp_size rdp_rank rdp_size RDP_GROUP get_dp_process_group
    get_mp_process_group get_rdp_process_group get_world_process_group DistributedOptimizer
    tensor_parallelism model_creation delay_param_initialization save load amp is_tracing"""
)
_TF = _COMMON | hvd.names("get_gradients")

SMP_MODULES: Mapping[str, hvd.Target] = {
    f"{_ROOT}.torch": hvd.Target("sdp_runtime.torch.smp", _TORCH),
    f"{_ROOT}.torch.amp": hvd.Target("sdp_runtime.torch.smp.amp", hvd.names("GradScaler")),
    f"{_ROOT}.tensorflow": hvd.Target("sdp_runtime.tensorflow.smp", _TF),
}

_ADVICE_GROUPS: Mapping[tuple[str, ...], str] = {
    ("save_checkpoint", "resume_from_checkpoint"): "save with smp.save({'model': "
    "model.state_dict(), 'optimizer': optimizer.state_dict()}, path, partial=False) and resume "
    "with smp.load(path, partial=False) and load_state_dict",
    ("nn",): "use the torch.nn layer it replaces (FSDP shards it like any other module)",
    ("optimizers",): "use the torch.optim optimizer it replaces",
    ("send",): "use broadcast/recv_from, or torch.distributed on get_world_process_group()",
    ("tp_register", "tp_register_with_module", "set_tensor_parallelism"): "tensor parallelism "
    "is FSDP sharding here: remove the call",
    ("CheckpointManager",): "write a tf.train.Checkpoint (or model.save_weights) on rank 0 and "
    "restore it on every rank",
    ("state",): "SMP's internal state: use the rank and size functions",
}
_ADVICE = {name: text for group, text in _ADVICE_GROUPS.items() for name in group}

_TORCH_SAVE = "torch.save"


class MigrateSmp(hvd.Migration):
    DESCRIPTION = "Point SageMaker smdistributed.modelparallel imports at sdp_runtime's SMP API."
    FRAMEWORKS = frozenset({"torch", "tensorflow"})
    ROOT = _ROOT
    LIBRARY = "SageMaker smdistributed.modelparallel"
    MODULES = SMP_MODULES
    LAUNCH = (
        "launch with `sdp-run -n N train.py` instead of SageMaker's estimator; SMP's parameters "
        "come from smp.init(config) or SM_HP_MP_PARAMETERS (JSON) as before"
    )

    @classmethod
    def applies_to(cls, info: FileInfo) -> bool:
        return info.origin == "smp" and super().applies_to(info)

    def prepare(self, module: cst.Module) -> None:
        self._saves: set[int] = set()  # torch.save calls to write with smp.save (_check_saves)
        super().prepare(module)
        self._steps = self._step_functions()
        if self.state.info.framework == "tensorflow":
            self._note_tensorflow()

    def _advice(self, member: str) -> str:
        return _ADVICE.get(member, "rewrite this part by hand")

    # -- what SMP does itself: no notes about it ---------------------------------------------

    def _check_broadcast(self) -> None:
        """DistributedModel starts every rank from rank 0's weights."""

    def _check_lr_scaling(self) -> None:
        """SMP already trained data-parallel with this learning rate."""

    def _check_saves(self) -> None:
        for call in self.calls_to(_TORCH_SAVE):
            if self._under_rank_check(call) or self._mentions_rank(call):
                continue
            self._saves.add(id(call))
        for call in self.method_calls("state_dict"):
            if self._under_rank_check(call) and self._rank_test_only(call):
                self.record(
                    call,
                    f"{self.module.code_for_node(call)} under a rank() test: when the "
                    "configuration shards the model (partitions, tensor or sharded data "
                    "parallelism) every rank of a replica must call it; test smp.dp_rank() == 0 "
                    "instead, or save with smp.save(..., partial=False) on every rank",
                    manual=True,
                )

    def _rank_test_only(self, node: cst.CSTNode) -> bool:
        """Whether a guard above ``node`` tests ``rank()``/``local_rank()``, not ``dp_rank()``."""
        for parent in self.ancestors(node):
            if isinstance(parent, cst.If) and self._mentions_rank(parent.test):
                return True
        return False

    # -- calls -----------------------------------------------------------------------------------

    def leave_Call(self, original_node: cst.Call, updated_node: cst.Call) -> cst.BaseExpression:
        if id(original_node) in self._saves:
            return self._save(original_node, updated_node)
        if self._is_get_gradients(original_node):
            return self._get_gradients(original_node, updated_node)
        return super().leave_Call(original_node, updated_node)

    def _smp_module(self) -> str:
        """The file's name for the runtime's SMP module, imported in full when it has none."""
        if self.alias is not None:
            return self.alias
        framework = "torch" if self.state.info.framework == "torch" else "tensorflow"
        module = f"sdp_runtime.{framework}.smp"
        self._import_for(module)
        return module

    def _save(self, original: cst.Call, updated: cst.Call) -> cst.BaseExpression:
        alias = self._smp_module()
        has_partial = any(a.keyword is not None and a.keyword.value == "partial"
                          for a in updated.args)
        args = list(updated.args)
        if not has_partial:
            if args:
                args[-1] = args[-1].with_changes(comma=cst.Comma(
                    whitespace_after=cst.SimpleWhitespace(" ")))
            args.append(cst.Arg(
                keyword=cst.Name("partial"), value=cst.Name("False"),
                equal=cst.AssignEqual(whitespace_before=cst.SimpleWhitespace(""),
                                      whitespace_after=cst.SimpleWhitespace("")),
            ))
        self.record(
            original,
            f"torch.save(...) -> {alias}.save(..., partial=False): written once, on rank 0 "
            "(every rank wrote it), with the state still gathered on every rank",
        )
        return updated.with_changes(func=hvd._dotted(f"{alias}.save"), args=args)

    def _is_get_gradients(self, call: cst.Call) -> bool:
        func = call.func
        if not (isinstance(func, cst.Attribute) and func.attr.value == "get_gradients"):
            return False
        found = self.get_metadata(QualifiedNameProvider, func, set())
        if any(q.source is QualifiedNameSource.IMPORT for q in found):
            return False  # a module's function, not a Keras optimizer's method
        function = self.enclosing_function(call)
        return function is not None and id(function) in self._steps

    def _get_gradients(self, original: cst.Call, updated: cst.Call) -> cst.BaseExpression:
        alias = self._smp_module()
        self.record(
            original,
            f"{self.module.code_for_node(original.func)}(...) -> {alias}.get_gradients(...): "
            "Keras 3 optimizers have no get_gradients; the step's gradient tape computes them",
        )
        return updated.with_changes(func=hvd._dotted(f"{alias}.get_gradients"))

    def _step_functions(self) -> set[int]:
        """The functions decorated with SMP's ``step`` (``@smp.step``, ``@smp.step()``)."""
        finder = _StepFinder(self)
        self.module.visit(finder)
        return finder.found

    # -- TensorFlow: no FSDP ---------------------------------------------------------------------

    def _note_tensorflow(self) -> None:
        partitions = self._calls_ending(("partition",))
        for call in partitions:
            self.record(
                call,
                f"{self.module.code_for_node(call)}: TensorFlow has no FSDP, so "
                "sdp_runtime.tensorflow.smp trains the whole model on every process "
                "(data parallel) and this block only runs its body; the model must fit on one "
                "device",
                manual=True,
            )
        if not partitions:
            inits = self._calls_ending(("init",))
            if inits:
                self.record(
                    inits[0],
                    "TensorFlow: sdp_runtime.tensorflow.smp trains data-parallel only (no FSDP "
                    "for TensorFlow); with more than one partition configured it says so when "
                    "it starts, and the whole model must fit on one device",
                )


class _StepFinder(Visitor):
    def __init__(self, transform: MigrateSmp) -> None:
        self.transform = transform
        self.found: set[int] = set()

    def visit_FunctionDef(self, node: cst.FunctionDef) -> None:
        for decorator in node.decorators:
            target = decorator.decorator
            if isinstance(target, cst.Call):
                target = target.func
            names = self.transform.qualified_names(target)
            if any(n.startswith(_ROOT + ".") and n.endswith(".step") for n in names):
                self.found.add(id(node))
