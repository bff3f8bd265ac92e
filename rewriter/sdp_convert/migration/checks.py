"""A library's usual mistakes, reported by its migration (once per file, even when two apply):
the launch, a missing broadcast of the initial state, saves on every rank, an unscaled learning
rate, SageMaker's variables and host checks."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import ClassVar

import libcst as cst
from libcst.metadata import QualifiedNameProvider, QualifiedNameSource

from ..analysis import Visitor
from ..base import Transform
from ..program.index import file_index, nodes_of
from ..program.ranks import is_rank_exit
from ..program.readback import private_write
from ..program.syntax import walk
from ..program.vocab import UNSCALED_LR_NOTE
from .common import (
    _BROADCASTS,
    _KERAS_CALLBACK_MODULES,
    _OPTIMIZER,
    _RANK_FUNCTIONS,
    _RANK_STRINGS,
    _SAVE_FUNCTIONS,
    _SAVE_METHODS,
    _SCALING_TEXT,
    _SIZE_FUNCTIONS,
    _TORCH_DDP,
    _WRITING_CALLBACKS,
    Target,
    _parent_and_name,
)
from .smddp import _SageMakerFinder


class MigrationChecks(Transform):
    """What every migration reports about the whole file; ``Migration`` (``migration.imports``)
    adds the rewriting of the library's imports and names."""

    #: The library's top package: the transform runs on files importing anything under it.
    ROOT: ClassVar[str] = ""
    #: Its name in messages.
    LIBRARY: ClassVar[str] = ""
    MODULES: ClassVar[Mapping[str, Target]] = {}
    #: Modules whose import is simply removed (SMDDP's backend registration).
    DROPPED_MODULES: ClassVar[frozenset[str]] = frozenset()
    #: The launch note, once per file that initialises the library.
    LAUNCH: ClassVar[str] = ""
    #: The library's modules, as ``Migration.prepare`` completes them.
    modules: dict[str, Target]
    #: Names (and attributes) assigned from a rank test (``_find_rank_flags``).
    _rank_flags: set[str]
    #: The name the library's module is bound to, which is the runtime's after the migration.
    alias: str | None

    def _runtime_name(self) -> str:
        """An expression for the runtime module, importing it when the file has no alias for it."""
        if self.alias is not None:
            return self.alias
        self.add_runtime_import()
        return self.sdp

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
        # The strings, subscripts and comparisons the finder looks at, in walk order, from the
        # file's index (``nodes_of``): no walk of the file.
        order = file_index(self.fm).order
        finder = _SageMakerFinder()
        kinds = (cst.SimpleString, cst.Subscript, cst.Comparison)
        for node in sorted([n for kind in kinds for n in nodes_of(self.fm, kind)],
                           key=lambda node: order[id(node)]):
            finder.on_visit(node)
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
        """Names (and attributes) assigned from a rank test: ``verbose = hvd.rank() == 0``.

        The assignments in file order (each may read a flag found before it), from the file's
        index (``nodes_of``), not a walk of the file."""
        order = file_index(self.fm).order
        finder = _AssignFinder()
        for node in sorted([*nodes_of(self.fm, cst.Assign), *nodes_of(self.fm, cst.AnnAssign)],
                           key=lambda node: order[id(node)]):
            finder.on_visit(node)
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
        walk(expr, finder)
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
            if self._under_rank_check(call) or self._mentions_rank(call) or private_write(
                self.fm, call, self.state.info.framework or ""
            ):  # a buffer, a temporary directory of its own: each rank's own
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
            f"{UNSCALED_LR_NOTE}: each step now averages N processes' "
            "batches, which usually wants lr * size(); left as is, as it may be deliberate",
            manual=True,
        )



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
    walk(tree, finder)
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
