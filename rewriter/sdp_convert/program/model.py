"""The program model of one file: what every question of the program layer is asked of.

``FileModel`` holds the original tree and what one walk of it found (``analysis.FileInfo``: what
the file is, its calls by qualified name, every node's parent; ``index.FileIndex``: every binding
and read, the qualified names), plus the answers the program layer computes once, on first use
(``Facts``). It knows nothing of transforms, edits or reports: the functions of ``program/`` take
it as their first argument, and a transform reaches it as ``self.model`` (LibCST's
``MetadataWrapper`` and ruff's ``SemanticModel`` play the same part).

Build one from source text with ``FileModel.from_source`` (what the tests do); the engine builds
it from the walk it shares with detection (``FileModel(module, info, index)``).

What a project run says about the file (``project.ModuleFacts``: loaders it builds for another
module, loaders built elsewhere that it iterates) comes in as ``project``; which transforms this
run leaves off (``--skip``) as ``skip``, for the questions whose answer is "what the file will be
after this run" (``sharding.training_data``).
"""

from __future__ import annotations

import textwrap
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal

import libcst as cst
from libcst.metadata import QualifiedName, QualifiedNameProvider

from ..analysis import Detector, FileInfo, canonical_name, detect
from .index import FileIndex, index_module

if TYPE_CHECKING:
    from .facts import ModuleFacts
    from .sharding import DataSharding
    from .training import TrainingFacts


@dataclass
class Facts:
    """Answers about one file that the program layer computes once, on first use (None before).

    Typed fields, not a string-keyed dict: a misspelt name fails at once, and a reader sees what
    is shared between transforms.
    """

    #: Bindings and uses of every name (``program.index``).
    index: FileIndex | None = None
    #: Tapes, their steps and the loops that drive them (``program.training``).
    training: TrainingFacts | None = None
    #: ``backward()``/``step()`` calls and calls of the file's functions that make them.
    training_calls: set[cst.CSTNode] | None = None
    #: Loops around those calls.
    training_loops: set[cst.CSTNode] | None = None
    #: Where training may begin, in walk order (``model_setup.training_starts``).
    training_triggers: tuple[list[int], list[cst.CSTNode]] | None = None
    #: id(loop) -> the DataLoader calls whose loaders it iterates (``sharding``).
    loader_loops: dict[int, list[cst.Call]] | None = None
    #: Whether anything in the file may set ``requires_grad`` back on (``model_setup``).
    unfreezes: bool | None = None
    #: The functions (None: the module) holding a ``backward()`` call (``models``).
    backward_functions: frozenset[cst.FunctionDef | None] | None = None
    #: id(block or module) -> (id(statement) -> its position in the block's body, the position
    #: of the first statement that leaves the block off rank 0) (``ranks.rank0_only``).
    rank_exits: dict[int, tuple[dict[int, int], int]] | None = None
    #: id(function, class or module) -> every identifier used inside it.
    names: dict[int, set[str]] | None = None
    #: The migration that reports the library's usual mistakes (once, if two migrations apply).
    migration_checks: str | None = None
    #: Models wrap_model_ddp wraps; None when it did not run on the file (its DataParallel notes
    #: are then flag_manual_steps's).
    wrapped_models: list[str] | None = None
    #: id -> the torch optimizers whose model wrap_model_ddp cannot tell (``program.sharding``).
    unaveraged: dict[int, cst.Call] | None = None
    #: Whether the training data is (or will be) split between the ranks (``program.sharding``).
    data_sharding: DataSharding | None = None
    #: Where the TensorFlow training data is sharded (``program.tfshards.TfShardPlan``).
    tf_shards: object | None = None
    #: SageMaker host comparisons (``current_host == hosts[0]``) found by that migration.
    sagemaker_host_checks: list[cst.Comparison] = field(default_factory=list)
    #: Loaders this module shards (or finds sharded) for another module of the project:
    #: (the DataLoader call, function returning it, index in the returned tuple, shuffles,
    #: sharded already).
    exports: list[tuple[cst.Call, str, int | None, bool, bool]] = field(default_factory=list)


class FileModel:
    """One file's program: its original tree, parents, calls, names and binding index.

    Every node asked about is a node of the *original* tree (``module``).
    """

    def __init__(
        self,
        module: cst.Module,
        info: FileInfo,
        index: FileIndex,
        *,
        runtime_alias: str = "sdp",
        project: ModuleFacts | None = None,
        skip: frozenset[str] = frozenset(),
    ) -> None:
        assert index.names is not None
        self.module = module
        self.info = info
        self.index = index
        #: The name the converted file reaches sdp_runtime by (the engine's choice, ``sdp``
        #: unless the file uses that name; a migration may keep the library's own alias).
        self.runtime_alias = runtime_alias
        #: What the other modules of the project say about this one (None: a file alone).
        self.project = project
        #: Transforms this run leaves off (``--skip``).
        self.skip = skip
        self.facts = Facts(index=index)
        #: ``calls_to``'s answers: (names, prefix) -> the calls.
        self._calls_to: dict[tuple[tuple[str, ...], bool], list[cst.Call]] = {}
        self._names = index.names
        #: The parent of every node (``analysis.FileInfo.parents``).
        self.parents = info.parents

    @classmethod
    def from_source(
        cls,
        source: str | bytes,
        framework: Literal["auto", "torch", "tensorflow"] = "auto",
        *,
        dedent: bool = False,
        recheck: bool = False,
        project: ModuleFacts | None = None,
        skip: frozenset[str] = frozenset(),
    ) -> FileModel:
        """Parse ``source`` and build its model as the engine does (one walk: the binding index
        with detection riding along)."""
        if dedent:
            text = source.decode() if isinstance(source, bytes) else source
            source = textwrap.dedent(text)
        module = cst.parse_module(source)
        detector = Detector()
        index = index_module(module, detector)
        assert index.names is not None
        info = detect(module, {QualifiedNameProvider: index.names}, framework, recheck, detector)
        return cls(module, info, index, project=project, skip=skip)

    # -- what the file is ---------------------------------------------------------------------

    @property
    def sdp(self) -> str:
        """The name the runtime module is imported as in this file."""
        return self.runtime_alias

    @property
    def runtime_module(self) -> str:
        return "sdp_runtime.torch" if self.info.framework == "torch" else "sdp_runtime.tensorflow"

    @property
    def metadata(self) -> Mapping[object, Mapping[cst.CSTNode, object]]:
        """The metadata a libcst visitor of the original tree reads (qualified names)."""
        return {QualifiedNameProvider: self._names}

    # -- names --------------------------------------------------------------------------------

    def raw_qualified_names(self, node: cst.CSTNode) -> set[QualifiedName]:
        """libcst's ``QualifiedName`` objects for ``node`` (with their source: import, local,
        builtin), as ``QualifiedNameProvider`` gives them."""
        return self._names.get(node, set())  # type: ignore[return-value]

    def qualified_names(self, node: cst.CSTNode) -> set[str]:
        """Fully qualified names ``node`` may refer to (``torch.optim.SGD`` for ``optim.SGD``)."""
        found: Iterable[QualifiedName] = self._names.get(node, set())  # type: ignore[assignment]
        return {canonical_name(q.name) for q in found}

    def refers_to(self, node: cst.CSTNode, *names: str, prefix: bool = False) -> bool:
        """Whether ``node`` refers to one of ``names`` (or to something under them if
        ``prefix``)."""
        for q in self.qualified_names(node):
            for name in names:
                if q == name or (prefix and q.startswith(name + ".")):
                    return True
        return False

    def calls_to(self, *names: str, prefix: bool = False) -> list[cst.Call]:
        """``Call`` nodes whose callee refers to one of ``names``, in file order (from the index
        detection builds: no walk of its own). The transforms ask the same questions over and
        over (twice per conversion, and per model, loader, write); each answer is kept for the
        file (``info.calls`` does not change once detection built it), a new list each time."""
        key = (names, prefix)
        cached = self._calls_to.get(key)
        if cached is None:
            found: dict[int, cst.Call] = {}
            for qname, calls in self.info.calls.items():
                if qname in names or (prefix and any(qname.startswith(n + ".") for n in names)):
                    for call in calls:
                        found[id(call)] = call
            cached = self._calls_to[key] = sorted(found.values(), key=self.order)
        return list(cached)

    def method_calls(self, method: str) -> list[cst.Call]:
        """Calls of the form ``<anything>.<method>(...)``, in file order."""
        return list(self.info.method_calls.get(method, ()))

    def order(self, node: cst.CSTNode) -> int:
        """The position of a call in the file (-1 for other nodes)."""
        return self.info.call_order.get(id(node), -1)

    # -- the tree -----------------------------------------------------------------------------

    def parent(self, node: cst.CSTNode) -> cst.CSTNode | None:
        """The parent of an original node (from the map the detection pass builds)."""
        return self.parents.get(node)

    def ancestors(self, node: cst.CSTNode) -> Iterator[cst.CSTNode]:
        parents = self.parents
        current = parents.get(node)
        while current is not None:
            yield current
            current = parents.get(current)

    def enclosing_statement(self, node: cst.CSTNode) -> cst.BaseStatement | None:
        """The statement holding ``node`` that sits directly in a module or block body."""
        child: cst.CSTNode = node
        for parent in self.ancestors(node):
            if isinstance(parent, (cst.Module, cst.IndentedBlock)) and isinstance(
                child, cst.BaseStatement
            ):
                return child
            child = parent
        return None

    def enclosing_function(self, node: cst.CSTNode) -> cst.FunctionDef | None:
        for parent in self.ancestors(node):
            if isinstance(parent, cst.FunctionDef):
                return parent
        return None

    def code(self, node: cst.CSTNode) -> str:
        """The source text of ``node``."""
        return self.module.code_for_node(node)
