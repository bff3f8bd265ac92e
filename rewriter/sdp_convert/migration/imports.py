"""Point a library's imports at sdp_runtime: the same names where the runtime has them, the
module table of each library (``transforms/migrate_horovod``, ``migrate_smddp``), names spelled
in full, names moved or renamed, and a note for each name the runtime lacks."""

from __future__ import annotations

import libcst as cst
from libcst.codemod.visitors import AddImportsVisitor
from libcst.helpers import get_full_name_for_node
from libcst.metadata import QualifiedNameProvider, QualifiedNameSource

from ..analysis import FileInfo
from ..program.index import file_index
from ..program.vocab import ONE_BRANCH_NOTE
from .checks import MigrationChecks
from .common import Target, _dotted, _parent_and_name
from .downloads import order_import_downloads
from .horovod import ADVICE
from .smddp import FALLBACK_NAMES


class Migration(MigrationChecks):
    """Point the imports of one library at sdp_runtime and report what cannot follow.

    Subclasses give the library's module table; everything else (import styles, names spelled in
    full, unsupported names, the usual mistakes, SageMaker variables) is shared.
    """

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
                order_import_downloads(self, module, self._first_init())

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
            self.record(original, f"{text}: not provided by sdp_runtime{self._branch(original)}; "
                                  f"{self._advice(member)}", manual=True)
            return updated
        return updated

    def _branch(self, node: cst.CSTNode) -> str:
        """Where ``node`` is one branch of a conditional expression (``op=hvd.Adasum if
        args.use_adasum else hvd.Average``), when it is evaluated, in words: a run may never."""
        child = node
        for parent in self.ancestors(node):
            if isinstance(parent, cst.IfExp) and child in (parent.body, parent.orelse):
                holds = "true" if child is parent.body else "false"
                other = parent.orelse if child is parent.body else parent.body
                return (f", {ONE_BRANCH_NOTE}`{self.module.code_for_node(parent.test)}` is "
                        f"{holds} (`{self.module.code_for_node(other)}` otherwise)")
            if isinstance(parent, cst.BaseStatement):
                break
            child = parent
        return ""

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
