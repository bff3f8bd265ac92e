"""Migrate a SageMaker model-parallel (SMP, smdistributed.modelparallel) script to sdp_runtime.

Before::

    import smdistributed.modelparallel.torch as smp
    ...
    if smp.dp_rank() == 0:
        smp.save(model.state_dict(), "model.pt", partial=False)
    torch.save(model.state_dict(), "weights.pt")

After (everything else, ``@smp.step`` and ``DistributedModel`` included, stays)::

    import sdp_runtime.torch.smp as smp
    ...
    model_state = model.state_dict()
    if smp.dp_rank() == 0:
        smp.save(model_state, "model.pt", partial=False)
    smp.save(model.state_dict(), "weights.pt", partial=False)

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
  ``torch.save`` put under ``if rank() == 0:`` would gather the shards on rank 0 alone);
* ``model.state_dict()`` / ``optimizer.state_dict()`` of SMP's ``DistributedModel`` /
  ``DistributedOptimizer`` under ``if smp.<x>_rank() == 0:`` moves before the ``if``, onto every
  rank: a sharded model gathers its state from every rank holding a shard, and on some ranks only
  that gather waits for the others (``if smp.dp_rank() == 0:`` leaves out every rank but 0 under
  sharded data parallelism). Where it cannot move (another test, an ``else``, a receiver the
  file does not show to be SMP's, code before it that uses the receiver) it gets a note, and the
  runtime raises naming the call rather than hanging;
* an ``if smp.<x>_rank() == 0:`` holding only ``smp.save(..., partial=True)`` calls is removed:
  each rank of the first replica writes its own shard's file, so the test could only leave shards
  out (a note where the ``if`` holds more);
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
import libcst.matchers as m
from libcst.metadata import QualifiedNameProvider, QualifiedNameSource

from .. import migration as hvd
from ..analysis import FileInfo, Visitor
from ..program.index import nodes_of
from ..program.smp_saves import ROOT, SAVE, SmpSaves, partial
from ..program.syntax import findall

_ROOT = ROOT

_COMMON = hvd.names(
    """init is_initialized rank size local_rank local_size dp_rank dp_size mp_rank mp_size
    get_mp_group get_dp_group DistributedModel step StepOutput partition barrier broadcast
    recv_from allgather CommGroup RankType WORLD MP_GROUP DP_GROUP"""
)
_TORCH = _COMMON | hvd.names(
    """pp_rank pp_size tp_rank tp_size rdp_rank rdp_size RDP_GROUP TP_GROUP PP_GROUP
    get_tp_group get_pp_group get_rdp_group get_dp_process_group get_mp_process_group
    get_rdp_process_group get_tp_process_group get_pp_process_group get_world_process_group
    DistributedOptimizer tensor_parallelism model_creation delay_param_initialization
    set_partition set_activation_checkpointing save load save_checkpoint resume_from_checkpoint
    amp nn is_tracing"""
)
_TF = _COMMON | hvd.names("get_gradients CheckpointManager")

SMP_MODULES: Mapping[str, hvd.Target] = {
    f"{_ROOT}.torch": hvd.Target("sdp_runtime.torch.smp", _TORCH),
    f"{_ROOT}.torch.amp": hvd.Target("sdp_runtime.torch.smp.amp", hvd.names("GradScaler")),
    f"{_ROOT}.torch.nn": hvd.Target("sdp_runtime.torch.smp.nn", hvd.names("FusedLayerNorm")),
    f"{_ROOT}.tensorflow": hvd.Target("sdp_runtime.tensorflow.smp", _TF),
}

#: What ``tensor_parallel_degree`` does here, in every note about it.
_TP_EMULATED = (
    "tensor parallelism is emulated with FSDP here: no layer is split across processes; the "
    "parameters, gradients and optimizer state are sharded over the replica's processes, and "
    "each of them computes whole layers on the same batch (less memory per process for the "
    "state, not for activations, and no speed-up)"
)

_ADVICE_GROUPS: Mapping[tuple[str, ...], str] = {
    ("nn", "DistributedTransformerLMHead", "DistributedTransformer", "DistributedTransformerLayer",
     "DistributedAttentionLayer", "DistributedTransformerOutputLayer", "DistributedLinear",
     "DistributedEmbedding", "FlashAttentionLayer"): "use the torch.nn layer it replaces "
    "(FSDP shards it like any other module)",
    ("huggingface",): "the model here stays the Hugging Face model (no SMP distributed "
    "transformer replaces it), so its state dict already has Hugging Face's names: drop the "
    "translation",
    ("optimizers", "FusedNovoGrad", "FusedLamb"): "use the torch.optim optimizer it replaces",
    ("send",): "use broadcast/recv_from, or torch.distributed on get_world_process_group()",
    ("tp_register", "tp_register_with_module", "set_tensor_parallelism"): _TP_EMULATED
    + ": remove the call",
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
        #: {id(state_dict call): the name it is computed into before its rank guard}
        self._hoisted: dict[int, str] = {}
        self._moved: set[cst.CSTNode] = set()  # ``x = model.state_dict()`` moved out whole
        self._lifted: set[cst.If] = set()  # guards whose leading lines moved up with a hoist
        super().prepare(module)
        self._steps = self._step_functions()
        self._seeds: set[int] = set()  # tf.random.set_seed calls to seed Keras too
        if self.state.info.framework == "tensorflow":
            self._note_tensorflow()
            self._seed_keras()
        for call in self.calls_to(f"{_ROOT}.torch.tensor_parallelism"):
            self.record(call, f"{self.module.code_for_node(call.func)}(): {_TP_EMULATED}")

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
        if self.state.info.framework != "torch":
            return
        self._guards = SmpSaves(self.fm, self._mentions_rank, self._under_rank_check)
        self._check_partial_saves()
        taken = {n.value for n in findall(self.module, m.Name()) if isinstance(n, cst.Name)}
        for call in self.method_calls("state_dict"):
            guard = self._guards.rank_guard(call)
            if guard is None or not self._guards.may_be_sharded(call):
                continue
            test = self.module.code_for_node(guard.test)
            code = self.module.code_for_node(call)
            why = self._guards.not_hoistable(call, guard)
            if why is None:
                self._hoist(call, guard, taken)
                self.record(
                    call,
                    f"{code} moved before `if {test}:`, onto every rank: a sharded model "
                    "(partitions, tensor or sharded data parallelism) gathers its state from "
                    "every rank holding a shard; what the test guards still runs where it did",
                )
                continue
            self.record(
                call,
                f"{code} under `if {test}:` ({why}): when the configuration shards the model "
                "(partitions, tensor or sharded data parallelism) every rank holding a shard must "
                "call it (at run time it raises CommunicationError naming the call); call it "
                "before the test, on every rank, and write the result under the test",
                manual=True,
            )

    def _check_partial_saves(self) -> None:
        """``smp.save(..., partial=True)`` under ``if smp.<x>_rank() == 0:``: each rank of the
        first replica writes its own shard's file, so the test can only leave shards out (all
        but rank 0's under sharded data parallelism); an ``if`` holding only such saves goes."""
        done: set[cst.If] = set()
        for call in self.calls_to(SAVE):
            guard = self._guards.rank_guard(call)
            if guard is None or guard in done or not partial(call):
                continue
            test = self.module.code_for_node(guard.test)
            code = self.module.code_for_node(call.func)
            why = self._guards.not_unguardable(guard)
            if why is None:
                done.add(guard)
                stmts = list(cst.ensure_type(guard.body, cst.IndentedBlock).body)
                first = cst.ensure_type(stmts[0], cst.SimpleStatementLine)  # (not_unguardable)
                comments = [x for x in first.leading_lines if x.comment is not None]
                stmts[0] = stmts[0].with_changes(leading_lines=[*guard.leading_lines, *comments])
                self.replace_statement(guard, stmts)
                self.record(
                    guard,
                    f"`if {test}:` removed around {code}(..., partial=True): it writes each "
                    "shard's file on the ranks of the first replica only, which must all call it; "
                    "the test could only leave shards out of the checkpoint (all but rank 0's "
                    "under sharded data parallelism)",
                )
                continue
            self.record(
                call,
                f"{code}(..., partial=True) under `if {test}:` ({why}): it writes each shard's "
                "file on the ranks of the first replica, which must all call it (at run time it "
                "raises CommunicationError naming the call); under sharded data parallelism the "
                "test leaves all but rank 0 out: call it on every rank",
                manual=True,
            )

    def _hoist(self, call: cst.Call, guard: cst.If, taken: set[str]) -> None:
        """Compute ``call`` into a variable before ``guard``; move ``x = m.state_dict()``. The
        blank lines and comments above ``guard`` move above the first statement put there."""
        first = guard not in self._lifted
        self._lifted.add(guard)
        lines = guard.leading_lines if first else ()
        stmt = self.enclosing_statement(call)
        body = cst.ensure_type(guard.body, cst.IndentedBlock).body
        small = stmt.body[0] if isinstance(stmt, cst.SimpleStatementLine) else None
        if (isinstance(stmt, cst.SimpleStatementLine) and isinstance(small, cst.Assign)
                and small.value is call and len(stmt.body) == 1
                and len(small.targets) == 1 and isinstance(small.targets[0].target, cst.Name)
                and any(s is not stmt and s not in self._moved for s in body)):
            self._moved.add(stmt)
            comments = [x for x in stmt.leading_lines if x.comment is not None]
            self.insert_before(guard, stmt.with_changes(leading_lines=[*lines, *comments]))
            self.replace_statement(stmt, [])
            return
        receiver = cst.ensure_type(cst.ensure_type(call.func, cst.Attribute).value, cst.Name)
        name, number = f"{receiver.value}_state", 1
        while name in taken:
            number += 1
            name = f"{receiver.value}_state_{number}"
        taken.add(name)
        self._hoisted[id(call)] = name
        hoisted = cst.parse_statement(f"{name} = {receiver.value}.state_dict()\n")
        self.insert_before(guard, hoisted.with_changes(leading_lines=lines))

    def leave_If(self, original_node: cst.If, updated_node: cst.If) -> cst.If:
        if original_node in self._lifted:
            return updated_node.with_changes(leading_lines=())
        return updated_node

    # -- calls -----------------------------------------------------------------------------------

    def leave_Call(self, original_node: cst.Call, updated_node: cst.Call) -> cst.BaseExpression:
        if id(original_node) in self._hoisted:
            return cst.Name(self._hoisted[id(original_node)])
        if id(original_node) in self._saves:
            return self._save(original_node, updated_node)
        if self._is_get_gradients(original_node):
            return self._get_gradients(original_node, updated_node)
        if id(original_node) in self._seeds:
            func = cst.ensure_type(updated_node.func, cst.Attribute)
            tf = cst.ensure_type(func.value, cst.Attribute).value
            return updated_node.with_changes(
                func=cst.parse_expression(f"{self.module.code_for_node(tf)}"
                                          ".keras.utils.set_random_seed"))
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
        """The functions decorated with SMP's ``step`` (``@smp.step``, ``@smp.step()``): of the
        file's functions (its index, ``nodes_of``: no walk of the file)."""
        finder = _StepFinder(self)
        for function in nodes_of(self.fm, cst.FunctionDef):
            finder.visit_FunctionDef(function)
        return finder.found

    # -- TensorFlow: no FSDP ---------------------------------------------------------------------

    def _seed_keras(self) -> None:
        """``tf.random.set_seed(s)`` -> ``tf.keras.utils.set_random_seed(s)``: Keras 3's
        initializers do not read TensorFlow's seed, so the script's seed no longer fixed its
        initial weights (two runs, of 1 or N processes, started from different ones)."""
        for call in self.calls_to("tensorflow.random.set_seed"):
            func = call.func
            if not (isinstance(func, cst.Attribute) and isinstance(func.value, cst.Attribute)
                    and isinstance(func.value.value, (cst.Name, cst.Attribute))):
                continue
            self._seeds.add(id(call))
            tf = self.module.code_for_node(func.value.value)
            self.record(
                call,
                f"{self.module.code_for_node(func)}(...) -> {tf}.keras.utils.set_random_seed(...):"
                " Keras 3's initializers ignore TensorFlow's seed, so every run drew other "
                "initial weights (DistributedModel gives every process rank 0's); this seeds "
                "them, and Python's random and NumPy, as under Keras 2",
            )

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
