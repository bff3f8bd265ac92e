"""The base class of every transform, and the per-file state the transforms share.

All transforms of the pipeline run in ONE traversal of the original tree (see ``engine``), over
metadata resolved once. So a transform:

* reads metadata (qualified names, parents, scopes) of *original* nodes only: the ``original_node``
  of a ``leave_*`` hook, or any node of ``self.module`` in ``prepare``;
* may rewrite expressions in ``leave_*`` hooks (returning the same kind of node where it can);
* never replaces, removes or adds statements itself: it asks the shared ``EditPlan``
  (``insert_before``, ``insert_after``, ``guard_rank0``, ``replace_statement``), which the engine
  applies to every statement body in one place, so edits of different transforms compose;
* records what it did with ``self.record(original_node, message, manual=...)``, never prints;
* asks the program layer with ``self.fm``, the file's ``program.model.FileModel``
  (``origin(self.fm, ...)``): the program layer answers, the transform decides and edits.

A transform that needs to know something about the whole file before it edits (which loader is
iterated in the training loop, which name holds the model) gathers it in ``prepare``, which runs
on the original tree before the traversal.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, ClassVar

import libcst as cst
from libcst.codemod import Codemod, CodemodContext, VisitorBasedCodemodCommand
from libcst.codemod.visitors import AddImportsVisitor
from libcst.matchers._decorators import (
    CONSTRUCTED_LEAVE_MATCHER_ATTR,
    CONSTRUCTED_VISIT_MATCHER_ATTR,
    VISIT_NEGATIVE_MATCHER_ATTR,
    VISIT_POSITIVE_MATCHER_ATTR,
)
from libcst.metadata import QualifiedNameProvider

from .analysis import FileInfo
from .options import LrScaling, Options  # noqa: F401 - re-exported (the public names)

if TYPE_CHECKING:  # the program layer is below this module: its types only
    from .program.model import Facts, FileModel


@dataclass
class EditPlan:
    """Statement-level edits, keyed by statements of the original tree.

    The engine applies them in every statement body (module, indented block) after the
    transforms' own ``leave_*`` hooks ran. Consecutive statements guarded for rank 0 share one
    ``if``.
    """

    before: dict[cst.CSTNode, list[cst.BaseStatement]] = field(default_factory=dict)
    after: dict[cst.CSTNode, list[cst.BaseStatement]] = field(default_factory=dict)
    guarded: set[cst.CSTNode] = field(default_factory=set)
    replaced: dict[cst.CSTNode, Sequence[cst.BaseStatement]] = field(default_factory=dict)
    #: Statements run inside ``with <runtime>.rank0_first():`` (consecutive ones share it).
    rank0_first: set[cst.CSTNode] = field(default_factory=set)
    #: Expressions of the original tree that a transform moved into a statement of their own
    #: (inserted before theirs): the new statement, which runs them from now on.
    hoisted: dict[cst.CSTNode, cst.BaseStatement] = field(default_factory=dict)

    def __bool__(self) -> bool:
        return bool(
            self.before or self.after or self.guarded or self.replaced or self.rank0_first
        )


@dataclass
class FileState:
    """Everything the transforms of one file share: the program model they read (``model``,
    ``program.model.FileModel``), the options, and what they edit and report."""

    model: FileModel
    options: Options
    edits: EditPlan = field(default_factory=EditPlan)
    # (original node, transform, message, manual); positions are resolved once, at the end.
    records: list[tuple[cst.CSTNode, str, str, bool]] = field(default_factory=list)

    @property
    def info(self) -> FileInfo:
        return self.model.info

    @property
    def module(self) -> cst.Module:
        return self.model.module

    @property
    def facts(self) -> Facts:
        """What the program layer computed once for this file (``program.model.Facts``)."""
        return self.model.facts

    @property
    def runtime_alias(self) -> str:
        return self.model.runtime_alias

    @runtime_alias.setter
    def runtime_alias(self, alias: str) -> None:
        self.model.runtime_alias = alias

    @property
    def runtime_module(self) -> str:
        return self.model.runtime_module


_MATCHER_MARKERS = (
    VISIT_POSITIVE_MATCHER_ATTR,
    VISIT_NEGATIVE_MATCHER_ATTR,
    CONSTRUCTED_VISIT_MATCHER_ATTR,
    CONSTRUCTED_LEAVE_MATCHER_ATTR,
)


class Transform(VisitorBasedCodemodCommand):
    """A libcst codemod that is one step of the distributed recipe."""

    #: One line, shown by ``--list-transforms``.
    DESCRIPTION: ClassVar[str] = ""
    #: Frameworks (``FileInfo.framework`` values) this transform applies to.
    FRAMEWORKS: ClassVar[frozenset[str]] = frozenset()
    #: The public name: the transform module's name (set by ``__init_subclass__``).
    NAME: ClassVar[str] = ""
    #: Project mode (``program.project``): also runs on a module with no training code of its
    #: own that builds another module's training data (``"data"``), or that is the entry point
    #: running another module's training code (``"entry"``); otherwise only on training scripts.
    PROJECT_ROLES: ClassVar[frozenset[str]] = frozenset()

    # Parents come from ``FileInfo.parents`` (see ``parent``), not ParentNodeProvider: same map,
    # a fraction of the cost; qualified names from the file's index (``program.names``), not
    # libcst's scope analysis (declared so that ``get_metadata`` hands them out). A transform
    # that needs more metadata declares it and gets it.
    METADATA_DEPENDENCIES = (QualifiedNameProvider,)

    def __init_subclass__(cls, **kwargs: object) -> None:
        super().__init_subclass__(**kwargs)
        cls.NAME = cls.__module__.rsplit(".", 1)[-1]
        # The engine calls the plain visit_*/leave_* hooks itself (one traversal for all
        # transforms) and never gathers matcher decorators: a decorated hook would silently
        # never run, so it is refused here, when the class is defined.
        for attr, value in vars(cls).items():
            if any(hasattr(value, marker) for marker in _MATCHER_MARKERS):
                raise TypeError(
                    f"{cls.__qualname__}.{attr}: libcst matcher decorators (@m.visit, @m.leave, "
                    "@m.call_if_inside, @m.call_if_not_inside) are not supported on a Transform; "
                    "use a plain leave_<Node> hook and test the node with m.matches()"
                )

    def __init__(self, context: CodemodContext, state: FileState) -> None:
        # Codemod's set-up without MatcherDecoratableTransformer's: the engine calls the hooks
        # itself (no matcher decorators here), and gathering them costs about 14 ms per transform
        # per file, more than parsing a 100-line file.
        Codemod.__init__(self, context)
        cst.CSTTransformer.__init__(self)
        self.state = state
        #: The file's program model (``program.model.FileModel``, ``state.model``): what the
        #: program layer's functions take (``origin(self.fm, call)``). A transform reads it; it
        #: edits and reports through ``state`` (``insert_before``, ``record``, ...).
        self.fm = state.model

    # -- the pipeline's questions -------------------------------------------------------------

    @classmethod
    def applies_to(cls, info: FileInfo) -> bool:
        """Whether this transform runs on a file. By default: on the frameworks it names."""
        return info.framework in cls.FRAMEWORKS and info.convertible

    def prepare(self, module: cst.Module) -> None:
        """Look at the whole original file before the traversal. Metadata is available."""

    # -- helpers for subclasses ---------------------------------------------------------------

    @property
    def module(self) -> cst.Module:
        return self.state.module

    @property
    def sdp(self) -> str:
        """The name the runtime module is imported as in this file."""
        return self.state.runtime_alias

    # The tree and its names: the program model's answers (``program.model.FileModel``).

    def qualified_names(self, node: cst.CSTNode) -> set[str]:
        """Fully qualified names ``node`` may refer to (``torch.optim.SGD`` for ``optim.SGD``)."""
        return self.fm.qualified_names(node)

    def refers_to(self, node: cst.CSTNode, *names: str, prefix: bool = False) -> bool:
        """Whether ``node`` refers to one of ``names`` (or to something under them if
        ``prefix``)."""
        return self.fm.refers_to(node, *names, prefix=prefix)

    def calls_to(self, *names: str, prefix: bool = False) -> list[cst.Call]:
        """Original ``Call`` nodes whose callee refers to one of ``names``, in file order.

        An index built once per file (cheap): prefer it to walking the tree in ``prepare``.
        """
        return self.fm.calls_to(*names, prefix=prefix)

    def method_calls(self, method: str) -> list[cst.Call]:
        """Original calls of the form ``<anything>.<method>(...)``, in file order."""
        return self.fm.method_calls(method)

    def _order(self, node: cst.CSTNode) -> int:
        return self.fm.order(node)

    def parent(self, node: cst.CSTNode) -> cst.CSTNode | None:
        """The parent of an original node (from the map the detection pass builds)."""
        return self.fm.parents.get(node)

    def ancestors(self, node: cst.CSTNode) -> Iterable[cst.CSTNode]:
        return self.fm.ancestors(node)

    def enclosing_statement(self, node: cst.CSTNode) -> cst.BaseStatement | None:
        """The statement holding ``node`` that sits directly in a module or block body."""
        return self.fm.enclosing_statement(node)

    def enclosing_function(self, node: cst.CSTNode) -> cst.FunctionDef | None:
        return self.fm.enclosing_function(node)

    def record(self, node: cst.CSTNode, message: str, *, manual: bool = False) -> None:
        """Report a change (or, with ``manual``, a spot a person must look at) at ``node``."""
        self.state.records.append((node, self.NAME, message, manual))

    def add_import(self, module: str, obj: str | None = None, asname: str | None = None) -> None:
        """Schedule ``import module [as asname]`` / ``from module import obj [as asname]`` (the
        edit the program layer's spelling helpers ask for when a file lacks a name)."""
        AddImportsVisitor.add_needed_import(self.context, module, obj, asname)

    def add_runtime_import(self) -> None:
        AddImportsVisitor.add_needed_import(
            self.context, self.state.runtime_module, asname=self.sdp
        )

    def insert_before(self, stmt: cst.CSTNode, *new: cst.BaseStatement) -> None:
        self.state.edits.before.setdefault(stmt, []).extend(new)

    def insert_after(self, stmt: cst.CSTNode, *new: cst.BaseStatement) -> None:
        self.state.edits.after.setdefault(stmt, []).extend(new)

    def guard_rank0(self, stmt: cst.CSTNode) -> None:
        """Run ``stmt`` on rank 0 only (``if sdp.rank() == 0:``)."""
        self.state.edits.guarded.add(stmt)

    def run_rank0_first(self, stmt: cst.CSTNode) -> None:
        """Run ``stmt`` on each machine's local rank 0 first (``with sdp.rank0_first():``).

        ``stmt`` is a statement of the original tree or one inserted before one.
        """
        self.state.edits.rank0_first.add(stmt)

    def hoist(self, expr: cst.CSTNode, stmt: cst.BaseStatement) -> None:
        """Note that ``stmt``, inserted before the statement of ``expr``, now runs ``expr``
        (which the transform replaces by a name): edits of what runs ``expr`` go to ``stmt``."""
        self.state.edits.hoisted[expr] = stmt

    def hoisted_around(self, node: cst.CSTNode) -> cst.CSTNode | None:
        """The expression holding ``node`` (or ``node`` itself) that a transform moved into a
        statement of its own (``hoist``); None where ``node`` stays in its statement."""
        hoisted = self.state.edits.hoisted
        if not hoisted:
            return None
        if node in hoisted:
            return node
        for parent in self.ancestors(node):
            if parent in hoisted:
                return parent
            if isinstance(parent, cst.BaseStatement):
                return None
        return None

    def replace_statement(self, stmt: cst.CSTNode, new: Sequence[cst.BaseStatement]) -> None:
        self.state.edits.replaced[stmt] = new

