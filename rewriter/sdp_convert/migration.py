"""Migrating a script from another data-parallel library to sdp_runtime: the shared machinery.

``Migration`` points a library's imports at sdp_runtime (same names where the runtime has them),
rewrites what maps, and reports what it lacks and the library's usual mistakes (a missing
broadcast, a save on every rank, an unscaled learning rate). ``migrate_horovod`` and
``migrate_smddp`` are this class with their module tables.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import ClassVar

import libcst as cst
from libcst.codemod.visitors import AddImportsVisitor
from libcst.helpers import get_full_name_for_node
from libcst.metadata import QualifiedNameProvider, QualifiedNameSource

from .analysis import FileInfo, Visitor
from .base import Transform
from .program.index import file_index
from .program.ranks import is_rank_exit


@dataclass(frozen=True)
class Target:
    """Where an old module's names live in sdp_runtime.

    ``names``: the members the runtime provides under the same name. ``renamed``: members the
    runtime's main module (``sdp_runtime.torch``) provides under another name. ``fallback``: a real
    module that still provides the other members (``torch.distributed`` for SageMaker's PyTorch
    API), used for the names of ``FALLBACK_NAMES`` only.
    """

    module: str
    names: frozenset[str]
    fallback: str | None = None
    renamed: Mapping[str, str] = field(default_factory=dict)


def names(text: str) -> frozenset[str]:
    return frozenset(text.split())


#: What ``sdp_runtime/tensorflow/keras/__init__.py`` exports.
RUNTIME_KERAS_NAMES = names(
    """init shutdown is_initialized size local_size rank local_rank allreduce allgather broadcast
    broadcast_variables broadcast_object DistributedOptimizer load_model callbacks Compression
    ReduceOp Average Sum Min Max nccl_built gloo_built mpi_built"""
)


RUNTIME_CALLBACK_NAMES = names(
    """BroadcastGlobalVariablesCallback MetricAverageCallback LearningRateWarmupCallback
    LearningRateScheduleCallback"""
)


#: What to do instead of each Horovod/SMDDP API the runtime does not provide.
_ADVICE_GROUPS: Mapping[tuple[str, ...], str] = {
    ("elastic",): "for Horovod elastic, drop @hvd.elastic.run and the State object (keep its "
    "fields as plain variables), checkpoint every epoch and restart a failed job from the last "
    "checkpoint",
    ("join",): "for uneven inputs, give every rank the same number of batches "
    "(DistributedSampler(..., drop_last=True) or dataset.shard) and remove the join() call",
    ("barrier",): "an allreduce of a dummy value waits for every process as a barrier does",
    ("Adasum",): "use op=Average (the default) with the learning rate scaled by size()",
    ("Product",): "use Sum, Min, Max or Average",
    ("ProcessSet", "global_process_set", "add_process_set", "remove_process_set"): "process sets "
    "are not supported: sdp_runtime collectives always run over all processes; remove it",
    (
        "allreduce_async", "allreduce_async_", "allgather_async", "broadcast_async",
        "broadcast_async_", "grouped_allreduce_async", "grouped_allreduce_async_",
        "sparse_allreduce_async", "alltoall_async", "reducescatter_async", "poll", "synchronize",
    ): "there are no asynchronous handles: call the synchronous collective (allreduce, allgather, "
    "broadcast) instead",
    (
        "alltoall", "reducescatter", "grouped_reducescatter", "grouped_allgather",
        "grouped_allreduce_", "all_to_all_single",
    ): "express it with allreduce/allgather, or call torch.distributed's on the runtime's "
    "process group",
    ("start_timeline", "stop_timeline"): "remove the call and profile with torch.profiler or "
    "tf.profiler",
    (
        "mpi_threads_supported", "mpi_enabled", "mpi_built", "gloo_enabled", "gloo_built",
        "nccl_built", "ddl_built", "ccl_built", "cuda_built", "rocm_built",
    ): "sdp_runtime always uses NCCL on GPUs and Gloo on CPUs: replace this build query with "
    "torch.cuda.is_available() (or a constant) where the answer matters",
    ("cross_rank", "cross_size", "is_homogeneous"): "use rank() // local_size() and "
    "size() // local_size() (sdp-run starts as many processes on every node)",
    ("SyncBatchNorm", "SyncBatchNormalization"): "use "
    "torch.nn.SyncBatchNorm.convert_sync_batchnorm(model) under DistributedDataParallel, or plain "
    "batch norm",
    ("broadcast_global_variables", "BroadcastGlobalVariablesHook"): "call "
    "broadcast_variables(model.variables, root_rank=0) (and the optimizer's variables) after the "
    "first step, or use callbacks.BroadcastGlobalVariablesCallback(0) in fit",
    ("PartialDistributedGradientTape", "PartialDistributedOptimizer"): "use "
    "DistributedGradientTape / DistributedOptimizer for all variables",
    ("BestModelCheckpoint",): "use keras.callbacks.ModelCheckpoint(save_best_only=True), added on "
    "rank 0 only",
    ("size_op", "local_size_op", "rank_op", "local_rank_op", "process_set_included_op"): "call "
    "size()/rank() (plain ints) instead",
}


ADVICE: Mapping[str, str] = {name: text for group, text in _ADVICE_GROUPS.items() for name in group}


#: torch.distributed names that SageMaker scripts may use and that sdp_runtime.torch.distributed
#: does not re-export: they keep working through torch.distributed on the runtime's process group.
FALLBACK_NAMES = names(
    """destroy_process_group get_backend new_group all_to_all_single reduce gather scatter
    reduce_scatter monitored_barrier all_gather_into_tensor reduce_scatter_tensor""")


_RANK_FUNCTIONS = names("rank local_rank get_rank get_local_rank")


_SIZE_FUNCTIONS = names("size get_world_size")


_BROADCASTS = names(
    """broadcast_parameters broadcast_variables broadcast_global_variables
    BroadcastGlobalVariablesCallback BroadcastGlobalVariablesHook DistributedDataParallel"""
)


_TORCH_DDP = ("torch.nn.parallel.DistributedDataParallel",
              "torch.nn.parallel.distributed.DistributedDataParallel")


_SAVE_FUNCTIONS = (
    "torch.save", "tensorflow.saved_model.save", "tensorflow.keras.models.save_model",
    "keras.models.save_model", "keras.saving.save_model",
)


_SAVE_METHODS = ("save", "save_weights")


_WRITING_CALLBACKS = ("ModelCheckpoint", "TensorBoard", "CSVLogger", "BackupAndRestore")


_KERAS_CALLBACK_MODULES = ("tensorflow.keras.callbacks", "keras.callbacks", "tf_keras.callbacks")


_OPTIMIZER = re.compile(
    r"^(torch\.optim|(tensorflow\.keras|keras|tf_keras|tensorflow)\.optimizers(\.legacy)?)"
    r"\.[A-Z]\w*$"
)


#: A statement using size() like this scales something on purpose (lr, or the batch instead).
_SCALING_TEXT = re.compile(r"lr|learning|rate|scal|batch", re.IGNORECASE)


_SAGEMAKER_VAR = re.compile(r"^SM_[A-Z0-9_]+$")


_RANK_STRINGS = ("RANK", "LOCAL_RANK", "OMPI_COMM_WORLD_RANK", "SLURM_PROCID")


def _parent_and_name(dotted: str) -> tuple[str, str]:
    parent, _, name = dotted.rpartition(".")
    return parent, name


def _dotted(dotted: str) -> cst.Attribute | cst.Name:
    node = cst.parse_expression(dotted)
    assert isinstance(node, (cst.Attribute, cst.Name))
    return node


class Migration(Transform):
    """Point the imports of one library at sdp_runtime and report what cannot follow.

    Subclasses give the library's module table; everything else (import styles, names spelled in
    full, unsupported names, the usual mistakes, SageMaker variables) is shared.
    """

    #: The library's top package: the transform runs on files importing anything under it.
    ROOT: ClassVar[str] = ""
    #: Its name in messages.
    LIBRARY: ClassVar[str] = ""
    MODULES: ClassVar[Mapping[str, Target]] = {}
    #: Modules whose import is simply removed (SMDDP's backend registration).
    DROPPED_MODULES: ClassVar[frozenset[str]] = frozenset()
    #: The launch note, once per file that initialises the library.
    LAUNCH: ClassVar[str] = ""

    @classmethod
    def applies_to(cls, info: FileInfo) -> bool:
        return info.origin in ("horovod", "smddp", "smp") and any(
            i == cls.ROOT or i.startswith(cls.ROOT + ".") for i in info.imports
        )

    # -- the whole file first ---------------------------------------------------------------------

    def prepare(self, module: cst.Module) -> None:
        self.modules: dict[str, Target] = dict(self.MODULES)
        #: Names of one module moved to another: ``torch.nn.parallel.DistributedDataParallel``.
        self.moved_names: dict[str, str] = {}
        self.configure()
        self.spelled_in_full: set[str] = set()
        #: {runtime module: the name the file binds it to at module level, after the migration}
        self.aliases: dict[str, str] = {}
        for stmt in module.body:
            for small in stmt.body if isinstance(stmt, cst.SimpleStatementLine) else ():
                for full, bound in _bindings(small):
                    if full in self.modules and bound != full:
                        self.aliases.setdefault(self.modules[full].module, bound)
        #: Uses of a bare ``import horovod`` that nothing rewrites (``horovod.spark.run``).
        self._root_left = self._unmapped_root_uses(module)
        self._assignments: list[tuple[list[cst.BaseExpression], cst.BaseExpression]] = []
        self._rank_flags: set[str] = set()
        self.alias = self._module_alias(module)
        if self.alias is not None:
            # After the migration this name *is* the runtime module: rank-0 guards use it.
            self.state.runtime_alias = self.alias
        # The checks of the whole file run once even when both migrations apply to it.
        facts = self.state.facts
        if facts.migration_checks is None:
            facts.migration_checks = self.NAME
        if facts.migration_checks == self.NAME:
            self._note_launch()
            self._note_sagemaker(module)
            if self.state.info.training:
                self._rank_flags = self._find_rank_flags(module)
                self._check_broadcast()
                self._check_saves()
                self._check_lr_scaling()

    def _unmapped_root_uses(self, module: cst.Module) -> list[cst.CSTNode]:
        """Uses of the name a bare ``import horovod`` binds that the migration leaves as they
        are: not ``horovod.torch...`` (a mapped module, rewritten) nor ``horovod.__version__``."""
        index = file_index(self.fm)
        kept = {*self.modules, f"{self.ROOT}.__version__"}
        left: list[cst.CSTNode] = []
        seen: set[int] = set()
        for binding in index.bindings_of(self.ROOT.split(".")[0], None):
            for node in index.uses(binding):
                if id(node) in seen:
                    continue
                seen.add(id(node))
                chain: cst.CSTNode = node
                while True:
                    parent = self.parent(chain)
                    if not (isinstance(parent, cst.Attribute) and parent.value is chain):
                        break
                    chain = parent
                parts = (get_full_name_for_node(chain) or "").split(".")
                prefixes = {".".join(parts[:i]) for i in range(1, len(parts) + 1)}
                if not prefixes & kept:
                    left.append(node)
        return left

    def configure(self) -> None:
        """Adjust ``self.modules``/``self.moved_names`` to this file (subclasses)."""

    def _module_alias(self, module: cst.Module) -> str | None:
        """The module-level name of the library's main module (``hvd``) if it has ``rank()``."""
        framework = self.state.info.framework
        for stmt in module.body:
            if not isinstance(stmt, cst.SimpleStatementLine):
                continue
            for small in stmt.body:
                for full, bound in _bindings(small):
                    target = self._target_module(full)
                    if target is None or "rank" not in self.modules[full].names:
                        continue
                    if (framework == "torch") == target.startswith("sdp_runtime.torch"):
                        return bound if bound != full else target
        return None

    def _target_module(self, full: str) -> str | None:
        target = self.modules.get(full)
        return target.module if target else None

    def _runtime_name(self) -> str:
        """An expression for the runtime module, importing it when the file has no alias for it."""
        if self.alias is not None:
            return self.alias
        self.add_runtime_import()
        return self.sdp

    # -- imports ---------------------------------------------------------------------------------

    def leave_Import(self, original_node: cst.Import, updated_node: cst.Import) -> cst.Import:
        new_names: list[cst.ImportAlias] = []
        changed = False
        for alias in updated_node.names:
            full = get_full_name_for_node(alias.name) or ""
            if full in self.DROPPED_MODULES:
                changed = True
                self.record(original_node, self.dropped_message(full))
                continue
            target = self._target_module(full)
            if target is not None and (alias.asname is not None or full.startswith(self.ROOT)):
                # (``import torch.distributed`` also binds ``torch``: it stays; the names spelled
                # in full are rewritten one by one.)
                new_names.append(alias.with_changes(name=_dotted(target)))
                changed = True
                self.record(original_node, f"{full} -> {target} (same names)")
                continue
            if full == self.ROOT and alias.asname is None:
                # ``import horovod``: its uses point at sdp_runtime now (or are noted one by
                # one); the import itself would only stop the script where horovod is absent.
                changed = True
                left = len(self._root_left)
                self.record(
                    original_node,
                    f"import {full} removed: "
                    + (
                        f"{left} use(s) are not provided by sdp_runtime (see their notes)"
                        if left
                        else "its uses now point at sdp_runtime"
                    ),
                    manual=bool(left),
                )
                continue
            if full == self.ROOT or full.startswith(self.ROOT + "."):
                self.record(
                    original_node,
                    f"import {full}: sdp_runtime has no equivalent of {full}; left as is "
                    f"(remove it once nothing uses it)",
                    manual=True,
                )
            new_names.append(alias)
        if not changed:
            return updated_node
        if not new_names:
            self._remove_statement(original_node)
            return updated_node
        last = new_names[-1]
        new_names[-1] = last.with_changes(comma=cst.MaybeSentinel.DEFAULT)
        return updated_node.with_changes(names=new_names)

    def dropped_message(self, full: str) -> str:
        return f"removed import {full}"

    def _remove_statement(self, node: cst.CSTNode) -> None:
        stmt = self.enclosing_statement(node)
        if isinstance(stmt, cst.SimpleStatementLine) and len(stmt.body) == 1:
            self.replace_statement(stmt, [])
        else:  # pragma: no cover - an import sharing its line with other statements
            self.record(node, "remove this import by hand", manual=True)

    def leave_ImportFrom(
        self, original_node: cst.ImportFrom, updated_node: cst.ImportFrom
    ) -> cst.ImportFrom:
        if updated_node.module is None or updated_node.relative:
            return updated_node
        module = get_full_name_for_node(updated_node.module) or ""
        ours = module == self.ROOT or module.startswith(self.ROOT + ".")
        if isinstance(updated_node.names, cst.ImportStar):
            target = self._target_module(module)
            if target is not None:
                self.record(original_node, f"{module} -> {target} (same names)")
                return updated_node.with_changes(module=_dotted(target))
            if ours:
                self._unsupported_module(original_node, module)
            return updated_node

        # Where each imported name goes: {new module: [aliases]}; unchanged ones stay in ``module``.
        groups: dict[str, list[cst.ImportAlias]] = {}
        dropped: list[str] = []
        for alias in updated_node.names:
            name = get_full_name_for_node(alias.name) or ""
            destination = self._destination(module, name)
            if destination is None:
                if not (ours or module in self.modules):  # from torch.nn.parallel import X
                    groups.setdefault(module, []).append(alias)
                    continue
                old = self.modules.get(module)
                if old and old.fallback and name in FALLBACK_NAMES:
                    groups.setdefault(old.fallback, []).append(alias)
                    self.record(
                        original_node,
                        f"{name}: not in {old.module}; imported from {old.fallback}, which works "
                        f"on the runtime's process group",
                        manual=True,
                    )
                    continue
                dropped.append(name)
                continue
            new_module, new_name = destination
            if new_name != name and alias.asname is None:
                alias = alias.with_changes(asname=cst.AsName(name=cst.Name(name)))
            groups.setdefault(new_module, []).append(alias.with_changes(name=cst.Name(new_name)))
        if ours and module not in self.modules and not groups:
            # from horovod.torch.elastic import run: a module the runtime has no equivalent of
            self._unsupported_module(original_node, module)
            return updated_node
        if not dropped and set(groups) == {module}:
            return updated_node
        if not groups:
            self.record(
                original_node,
                f"from {module} import {', '.join(dropped)}: not provided by sdp_runtime, left "
                f"as is; {self._advice(dropped[0])}",
                manual=True,
            )
            return updated_node
        for name in dropped:
            self.record(
                original_node,
                f"{name}: not provided by sdp_runtime, removed from this import (see its uses)",
                manual=True,
            )
        targets = ", ".join(m for m in groups if m != module)
        self.record(original_node, f"from {module} import ... -> from {targets} import ...")
        statements = [
            updated_node.with_changes(
                module=_dotted(new_module),
                names=[*aliases[:-1], aliases[-1].with_changes(comma=cst.MaybeSentinel.DEFAULT)],
            )
            for new_module, aliases in groups.items()
        ]
        if len(statements) > 1:
            stmt = self.enclosing_statement(original_node)
            if isinstance(stmt, cst.SimpleStatementLine) and len(stmt.body) == 1:
                lines = [stmt.with_changes(body=[statements[0]])]
                lines += [cst.SimpleStatementLine(body=[s]) for s in statements[1:]]
                self.replace_statement(stmt, lines)
        return statements[0]

    def _destination(self, module: str, name: str) -> tuple[str, str] | None:
        """Where ``from module import name`` must import from now, or None if it stays or goes."""
        full = f"{module}.{name}"
        target = self._target_module(full)
        if target is not None:  # a module imported from its parent: from horovod import torch
            return _parent_and_name(target)
        if module in self.modules and self._provides(module, name):
            return self.modules[module].module, name
        if full in self.moved_names:
            return _parent_and_name(self.moved_names[full])
        return None

    def _provides(self, module: str, name: str) -> bool:
        return name in self.modules[module].names or f"{module}.{name}" in self.modules

    def _unsupported_module(self, node: cst.CSTNode, module: str) -> None:
        # horovod.torch.elastic -> the advice for "elastic"
        parts = module.split(".")
        member = parts[-1]
        for i in range(len(parts) - 1, 0, -1):
            if ".".join(parts[:i]) in self.modules:
                member = parts[i]
                break
        self.record(
            node,
            f"{module}: not provided by sdp_runtime, left as is; {self._advice(member)}",
            manual=True,
        )

    def _advice(self, member: str) -> str:
        return ADVICE.get(member, "rewrite this part by hand")

    # -- names used in the code ------------------------------------------------------------------

    def leave_Attribute(
        self, original_node: cst.Attribute, updated_node: cst.Attribute
    ) -> cst.BaseExpression:
        return self._rename(original_node, updated_node)

    def leave_Name(self, original_node: cst.Name, updated_node: cst.Name) -> cst.BaseExpression:
        return self._rename(original_node, updated_node)

    def _rename(
        self, original: cst.Attribute | cst.Name, updated: cst.Attribute | cst.Name
    ) -> cst.BaseExpression:
        found = self.get_metadata(QualifiedNameProvider, original, set())
        if not found:
            return updated
        spelled = get_full_name_for_node(original)
        for qname in sorted(found, key=lambda q: q.name):
            if qname.source is not QualifiedNameSource.IMPORT:
                continue
            full = qname.name
            if full in self.moved_names:
                if isinstance(original, cst.Attribute):  # nn.parallel.DistributedDataParallel
                    new = self.moved_names[full]
                    self._import_for(_parent_and_name(new)[0])
                    self._record_once(original, f"{spelled} -> {new}")
                    return _dotted(new).with_changes(lpar=updated.lpar, rpar=updated.rpar)
                return updated
            target = self.modules.get(full)
            if target is not None:
                if spelled == full and isinstance(original, cst.Attribute):  # horovod.torch.init
                    # The file's own name for the module when it has one (``dist``), else in full.
                    alias = self.aliases.get(target.module)
                    if alias is None:
                        self._import_for(target.module)
                    new = alias or target.module
                    self._record_once(original, f"{full}.* -> {new}.*")
                    return _dotted(new).with_changes(lpar=updated.lpar, rpar=updated.rpar)
                return updated
            parent, member = _parent_and_name(full)
            if parent not in self.modules:
                if parent == self.ROOT and member == "__version__":
                    self._import_for("sdp_runtime")
                    self._record_once(original, f"{spelled} -> sdp_runtime.__version__")
                    return _dotted("sdp_runtime.__version__").with_changes(
                        lpar=updated.lpar, rpar=updated.rpar
                    )
                if parent == self.ROOT and not any(
                    m == full or m.startswith(full + ".") for m in self.modules
                ):  # horovod.__version__, horovod.spark
                    self.record(original, f"{spelled}: not provided by sdp_runtime", manual=True)
                return updated
            if self._provides(parent, member):
                return updated
            target = self.modules[parent]
            text = spelled or self.module.code_for_node(original)
            if member in target.renamed and isinstance(original, cst.Attribute):
                new = f"{self._runtime_name()}.{target.renamed[member]}"
                self.record(original, f"{text} -> {new} (the same, in sdp_runtime)")
                return _dotted(new).with_changes(lpar=updated.lpar, rpar=updated.rpar)
            if target.fallback and member in FALLBACK_NAMES:
                fallback = f"{target.fallback}.{member}"
                self.record(
                    original,
                    f"{text}: not in {target.module}; now {fallback}, which works on the "
                    f"runtime's process group",
                    manual=True,
                )
                if isinstance(original, cst.Attribute):
                    self._import_for(target.fallback)
                    return _dotted(fallback).with_changes(lpar=updated.lpar, rpar=updated.rpar)
                return updated
            self.record(original, f"{text}: not provided by sdp_runtime; {self._advice(member)}",
                        manual=True)
            return updated
        return updated

    def _import_for(self, module: str) -> None:
        """Make sure ``module`` is imported (for a name spelled in full)."""
        AddImportsVisitor.add_needed_import(self.context, module)

    def _record_once(self, node: cst.CSTNode, message: str) -> None:
        if message not in self.spelled_in_full:
            self.spelled_in_full.add(message)
            self.record(node, message)

    # -- calls -----------------------------------------------------------------------------------

    def leave_Call(self, original_node: cst.Call, updated_node: cst.Call) -> cst.BaseExpression:
        names_ = {q for q in self.qualified_names(original_node.func) if self._is_ours(q)}
        if not names_:
            return self._even_shard(original_node, updated_node)
        for arg in original_node.args:
            if arg.keyword is not None and arg.keyword.value == "process_set":
                self.record(arg, f"process_set=: {ADVICE['ProcessSet']}", manual=True)
        return self.rewrite_call(original_node, updated_node, names_)

    def _even_shard(self, original: cst.Call, updated: cst.Call) -> cst.BaseExpression:
        """``ds.shard(hvd.size(), hvd.rank())`` -> ``ds.apply(hvd.shard)``.

        The plain shard gives the first ``n % size`` ranks one element more; after ``batch`` that
        can be one step more, and that rank waits at the end of the epoch for peers that left it
        (Horovod users meet it as a hang). The runtime's ``shard`` pads as DistributedSampler does.
        """
        func = original.func
        if not (
            isinstance(func, cst.Attribute)
            and func.attr.value == "shard"
            and len(original.args) == 2
            and all(a.keyword is None and not a.star for a in original.args)
        ):
            return updated
        size_call, rank_call = (a.value for a in original.args)
        modules = []
        for call, member in ((size_call, "size"), (rank_call, "rank")):
            if not (isinstance(call, cst.Call) and not call.args
                    and isinstance(call.func, cst.Attribute)):
                return updated
            found = {q.rpartition(".")[0] for q in self.qualified_names(call.func)
                     if q.endswith("." + member)}
            modules.append(found & set(self.modules))
        common = modules[0] & modules[1]
        target = self.modules.get(next(iter(common))) if common else None
        if target is None or not target.module.startswith("sdp_runtime.tensorflow"):
            return updated
        new_size = updated.args[0].value
        assert isinstance(new_size, cst.Call) and isinstance(new_size.func, cst.Attribute)
        spelled = new_size.func.value
        self.record(
            original,
            f"{self.module.code_for_node(original)} -> .apply("
            f"{self.module.code_for_node(spelled)}.shard): every rank gets the same number of "
            "elements (a rank with one batch more would wait for the others at the end of each "
            "epoch)",
        )
        assert isinstance(updated.func, cst.Attribute)
        return updated.with_changes(
            func=updated.func.with_changes(attr=cst.Name("apply")),
            args=[cst.Arg(cst.Attribute(value=spelled, attr=cst.Name("shard")))],
        )

    def rewrite_call(
        self, original_node: cst.Call, updated_node: cst.Call, qualified: set[str]
    ) -> cst.BaseExpression:
        """A subclass's own call rewrites (SMDDP's ``init_process_group(backend="smddp")``)."""
        return updated_node

    def _is_ours(self, qname: str) -> bool:
        return qname.startswith(self.ROOT + ".") or any(
            qname.startswith(m + ".") for m in self.modules
        )

    # -- notes for the whole file ----------------------------------------------------------------

    def _calls_ending(self, members: Iterable[str]) -> list[cst.Call]:
        """Calls of this library's functions whose last name is in ``members``."""
        wanted = set(members)
        roots = (self.ROOT, *self.modules)
        found = [
            qname
            for qname in self.state.info.calls
            if qname.rpartition(".")[2] in wanted
            and any(qname.startswith(r + ".") for r in roots)
        ]
        return self.calls_to(*found)

    def _note_launch(self) -> None:
        inits = self._calls_ending(("init", "init_process_group"))
        if inits and self.LAUNCH:
            self.record(inits[0], self.LAUNCH)

    def _note_sagemaker(self, module: cst.Module) -> None:
        finder = _SageMakerFinder()
        module.visit(finder)
        if finder.variables:
            first, names_ = finder.variables[0][0], sorted({v for _, v, _ in finder.variables})
            required = any(req for _, _, req in finder.variables)
            self.record(
                first,
                f"reads SageMaker's {', '.join(names_)}: left as is; outside SageMaker set "
                f"{'them' if len(names_) > 1 else 'it'} (or pass the matching arguments) when "
                f"launching with sdp-run",
                manual=required,
            )
        for comparison in finder.host_checks:
            self.record(
                comparison,
                f"`{self.module.code_for_node(comparison)}` is true on every process of the first "
                f"host, so all of them run what it guards; use rank() == 0 to do it once (left as "
                f"is)",
                manual=True,
            )
        self.state.facts.sagemaker_host_checks = finder.host_checks

    def _find_rank_flags(self, module: cst.Module) -> set[str]:
        """Names (and attributes) assigned from a rank test: ``verbose = hvd.rank() == 0``."""
        finder = _AssignFinder()
        module.visit(finder)
        self._assignments = finder.assignments
        flags: set[str] = set()
        for targets, value in self._assignments:
            if self._mentions(value, self.is_rank_call, flags, _RANK_STRINGS):
                flags.update(self.module.code_for_node(t) for t in targets)
        return flags

    def _mentions_rank(self, expr: cst.CSTNode) -> bool:
        return self._mentions(expr, self.is_rank_call, self._rank_flags, _RANK_STRINGS)

    def _mentions(
        self,
        expr: cst.CSTNode,
        is_call: Callable[[cst.Call], bool],
        flags: set[str],
        strings: tuple[str, ...] = (),
    ) -> bool:
        finder = _MentionFinder(self.module, is_call, flags, strings)
        expr.visit(finder)
        return finder.found

    def is_rank_call(self, node: cst.Call) -> bool:
        for qname in self.qualified_names(node.func):
            root, member = _parent_and_name(qname)
            if member in _RANK_FUNCTIONS and (
                self._is_ours(qname)
                or root.startswith(("sdp_runtime", "torch.distributed", "horovod", "smdistributed"))
            ):
                return True
        return False

    def _under_rank_check(self, node: cst.CSTNode) -> bool:
        """Whether ``node`` runs only on some ranks (``if`` on the rank, an early return, ...)."""
        child: cst.CSTNode = node
        host_checks = self.state.facts.sagemaker_host_checks
        for parent in self.ancestors(node):
            if isinstance(parent, (cst.If, cst.IfExp, cst.While)) and child is not parent.test:
                test = parent.test
                if self._mentions_rank(test) or any(
                    _contains(test, c) for c in host_checks
                ):
                    return True
            if isinstance(parent, (cst.IndentedBlock, cst.Module)) and isinstance(
                child, cst.BaseStatement
            ):
                for stmt in parent.body:
                    if stmt is child:
                        break
                    if is_rank_exit(stmt, self._mentions_rank):
                        return True
            child = parent
        return False

    def _check_broadcast(self) -> None:
        info = self.state.info
        if self._calls_ending(_BROADCASTS) or self.calls_to(*_TORCH_DDP):
            return
        if info.framework == "torch":
            optimizers = self._calls_ending(("DistributedOptimizer",))
            for call in optimizers:
                model = _named_parameters_owner(call)
                stmt = self.enclosing_statement(call)
                if model is None or not isinstance(stmt, cst.SimpleStatementLine):
                    continue
                if not isinstance(stmt.body[0], (cst.Assign, cst.AnnAssign, cst.Expr)):
                    continue
                model_text = self.module.code_for_node(model)
                line = (
                    f"{self._runtime_name()}.broadcast_parameters("
                    f"{model_text}.state_dict(), root_rank=0)"
                )
                self.insert_after(stmt, cst.parse_statement(line + "\n"))
                self.record(
                    call,
                    f"added {line}: every rank starts from rank 0's weights (the script never "
                    f"broadcast them)",
                )
                return
            where = optimizers[0] if optimizers else self._first_init()
            if where is not None:
                self.record(
                    where,
                    "no broadcast of the initial state: add broadcast_parameters(model.state_dict()"
                    ", root_rank=0) and broadcast_optimizer_state(optimizer, root_rank=0) before "
                    "training",
                    manual=True,
                )
            return
        tapes = self._calls_ending(("DistributedGradientTape",))
        if tapes:
            self.record(
                tapes[0],
                "no broadcast of the initial variables: after the first training step call "
                "broadcast_variables(model.variables, root_rank=0) and "
                "broadcast_variables(optimizer.variables, root_rank=0)",
                manual=True,
            )
            return
        fits = self._calls_ending(("DistributedOptimizer",)) or self.method_calls("fit")
        if fits:
            self.record(
                fits[0],
                "no broadcast of the initial variables: add "
                "callbacks.BroadcastGlobalVariablesCallback(0) to the callbacks of fit",
                manual=True,
            )

    def _first_init(self) -> cst.Call | None:
        inits = self._calls_ending(("init", "init_process_group"))
        return inits[0] if inits else None

    def _check_saves(self) -> None:
        candidates = self.calls_to(*_SAVE_FUNCTIONS)
        imported_roots = {i.split(".")[0] for i in self.state.info.imports}
        for method in _SAVE_METHODS:
            for call in self.method_calls(method):
                found = self.get_metadata(QualifiedNameProvider, call.func, set())
                if found and all(
                    q.source is QualifiedNameSource.IMPORT or q.name.split(".")[0] in imported_roots
                    for q in found
                ):
                    continue  # np.save, pickle-like module functions: not a model's checkpoint
                candidates.append(call)
        for call in sorted(set(candidates), key=self._order):
            if self._under_rank_check(call) or self._mentions_rank(call):
                continue
            text = self.module.code_for_node(call.func)
            stmt = self.enclosing_statement(call)
            if (
                isinstance(stmt, cst.SimpleStatementLine)
                and len(stmt.body) == 1
                and isinstance(stmt.body[0], cst.Expr)
                and stmt.body[0].value is call
            ):
                self._runtime_name()
                self.guard_rank0(stmt)
                self.record(
                    call,
                    f"{text}(...) now runs on rank 0 only (every rank wrote the same file)",
                )
            else:
                self.record(
                    call,
                    f"{text}(...) runs on every rank: write it on rank 0 only (if rank() == 0:)",
                    manual=True,
                )
        for qname, calls in self.state.info.calls.items():
            parent, member = _parent_and_name(qname)
            if member in _WRITING_CALLBACKS and parent in _KERAS_CALLBACK_MODULES:
                for call in calls:
                    if not self._under_rank_check(call):
                        self.record(
                            call,
                            f"{member} writes files on every rank: add it to the callbacks on "
                            f"rank 0 only (if rank() == 0: callbacks.append(...))",
                            manual=True,
                        )

    def _check_lr_scaling(self) -> None:
        optimizers = sorted(
            (c for q, calls in self.state.info.calls.items() if _OPTIMIZER.match(q) for c in calls),
            key=self._order,
        )
        if not optimizers:
            return
        sizes = self._calls_ending(_SIZE_FUNCTIONS)
        size_ids = {id(c) for c in sizes}

        def is_size(call: cst.Call) -> bool:
            return id(call) in size_ids

        # Scaled on purpose: size() (or a name holding it: ``args.world_size``) in the optimizer's
        # arguments or in a statement about the lr (or about the batch, scaled instead).
        flags: set[str] = set()
        for targets, value in self._assignments:
            if self._mentions(value, is_size, flags):
                texts = [self.module.code_for_node(t) for t in targets]
                if any(_SCALING_TEXT.search(t) for t in texts):
                    return
                flags.update(texts)
        for call in sizes:
            stmt = self.enclosing_statement(call)
            if stmt is not None and _SCALING_TEXT.search(self.module.code_for_node(stmt)):
                return
        if any(self._mentions(o, is_size, flags) for o in optimizers):
            return
        self.record(
            optimizers[0],
            "the learning rate is not scaled by size(): each step now averages N processes' "
            "batches, which usually wants lr * size(); left as is, as it may be deliberate",
            manual=True,
        )


def _bindings(small: cst.BaseSmallStatement) -> list[tuple[str, str]]:
    """``(module, bound name)`` for each module an import statement binds to a name."""
    found: list[tuple[str, str]] = []
    if isinstance(small, cst.Import):
        for alias in small.names:
            full = get_full_name_for_node(alias.name) or ""
            bound = get_full_name_for_node(alias.asname.name) if alias.asname else full
            found.append((full, bound or full))
    elif (
        isinstance(small, cst.ImportFrom)
        and small.module is not None
        and not small.relative
        and not isinstance(small.names, cst.ImportStar)
    ):
        module = get_full_name_for_node(small.module) or ""
        for alias in small.names:
            name = get_full_name_for_node(alias.name) or ""
            bound = get_full_name_for_node(alias.asname.name) if alias.asname else name
            found.append((f"{module}.{name}", bound or name))
    return found


def _named_parameters_owner(call: cst.Call) -> cst.BaseExpression | None:
    """``model`` in ``DistributedOptimizer(opt, named_parameters=model.named_parameters())``."""
    for arg in call.args:
        if arg.keyword is not None and arg.keyword.value == "named_parameters":
            value = arg.value
            if (
                isinstance(value, cst.Call)
                and isinstance(value.func, cst.Attribute)
                and value.func.attr.value == "named_parameters"
                and not value.args
            ):
                return value.func.value
    return None


def _contains(tree: cst.CSTNode, node: cst.CSTNode) -> bool:
    finder = _Finder(node)
    tree.visit(finder)
    return finder.found


class _Finder(Visitor):
    def __init__(self, node: cst.CSTNode) -> None:
        self.node = node
        self.found = False

    def on_visit(self, node: cst.CSTNode) -> bool:
        if node is self.node:
            self.found = True
        return not self.found


class _MentionFinder(Visitor):
    """Whether an expression mentions something: a call of a kind, a flag name, a string."""

    def __init__(
        self,
        module: cst.Module,
        is_call: Callable[[cst.Call], bool],
        flags: set[str],
        strings: tuple[str, ...],
    ) -> None:
        self.module = module
        self.is_call = is_call
        self.flags = flags
        self.strings = strings
        self.found = False

    def on_visit(self, node: cst.CSTNode) -> bool:
        if self.found:
            return False
        if isinstance(node, cst.Call) and self.is_call(node):
            self.found = True
        elif isinstance(node, (cst.Name, cst.Attribute)) and self.flags:
            self.found = self.module.code_for_node(node) in self.flags
        elif isinstance(node, cst.SimpleString) and self.strings:
            self.found = node.evaluated_value in self.strings
        return not self.found


class _AssignFinder(Visitor):
    def __init__(self) -> None:
        self.assignments: list[tuple[list[cst.BaseExpression], cst.BaseExpression]] = []

    def visit_Assign(self, node: cst.Assign) -> None:
        self.assignments.append(([t.target for t in node.targets], node.value))

    def visit_AnnAssign(self, node: cst.AnnAssign) -> None:
        if node.value is not None:
            self.assignments.append(([node.target], node.value))


class _SageMakerFinder(Visitor):
    """``os.environ["SM_MODEL_DIR"]``-style reads and ``current_host == hosts[0]`` tests."""

    def __init__(self) -> None:
        self.variables: list[tuple[cst.CSTNode, str, bool]] = []
        self.host_checks: list[cst.Comparison] = []

    def visit_SimpleString(self, node: cst.SimpleString) -> None:
        value = node.evaluated_value
        if isinstance(value, str) and _SAGEMAKER_VAR.match(value):
            self.variables.append((node, value, False))

    def visit_Subscript(self, node: cst.Subscript) -> None:
        # os.environ["SM_MODEL_DIR"]: fails outside SageMaker unless it is set.
        if (get_full_name_for_node(node.value) or "").endswith("environ") and len(node.slice) == 1:
            index = node.slice[0].slice
            if isinstance(index, cst.Index) and isinstance(index.value, cst.SimpleString):
                value = index.value.evaluated_value
                if isinstance(value, str) and _SAGEMAKER_VAR.match(value):
                    self.variables.append((index.value, value, True))

    def visit_Comparison(self, node: cst.Comparison) -> None:
        if len(node.comparisons) != 1 or not isinstance(node.comparisons[0].operator, cst.Equal):
            return
        left, right = node.left, node.comparisons[0].comparator
        for one, other in ((left, right), (right, left)):
            if (
                isinstance(other, cst.Subscript)
                and "host" in (get_full_name_for_node(one) or "").lower()
                and "hosts" in (get_full_name_for_node(other.value) or "").lower()
            ):
                self.host_checks.append(node)
                return
