"""Decide what a file is: which framework, whether it trains, and who already distributes it.

Detection looks at imports and at qualified names of calls, on the metadata the engine resolves
once per file. It never runs the code.

A file that trains is still not a training script, and is left alone byte for byte, when it is

* a **test module**: it imports a test framework (unittest, pytest, absl.testing, a framework's
  own testing helpers such as ``keras.src.testing`` or ``torch.testing._internal``, or subclasses
  ``tf.test.TestCase``) *and* defines tests (top-level ``test_*`` functions, ``*TestCase``
  subclasses, or classes with ``test_*`` methods); or
* a **library module**: nothing in the file runs its training code (no ``if __name__ ==
  "__main__":`` block, and no module-level code that calls a function or class the file defines
  (``main()``, ``Trainer(model)``), passes one of its functions on (``app.run(main)``,
  ``mp.spawn(train)``), builds a model or an optimizer (``keras.Sequential(...)``,
  ``torch.optim.SGD(...)``) or trains itself (``model.fit(...)``, ``loss.backward()``,
  ``with tf.GradientTape()``, ...)), *and* it is either part of a framework (it imports a
  framework's internals: ``tensorflow.python``, ``keras.src``, ``torch._inductor``, any private
  ``_module``; a relative import alone does not count, users' projects are packages too), or all
  its training code is inside optimizer classes (subclasses of an ``...Optimizer`` or classes
  that define ``apply_gradients`` / ``minimize`` themselves). That is a framework's own trainer
  or optimizer (``Optimizer.minimize``, ``Trainer.train_step``), which only runs when a user's
  script calls it. A user's file of definitions alone (a ``Trainer`` class, a ``keras.Model``
  subclass with its own ``train_step``) is still converted, and so is any script with an entry
  point.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal, cast

import libcst as cst
from libcst.metadata import QualifiedNameProvider

Framework = Literal["torch", "tensorflow"]
Origin = Literal["vanilla", "horovod", "smddp", "smp", "sdp", "distributed"]

#: Substrings one of which a file must contain to be parsed at all (cheap prefilter).
FRAMEWORK_MARKERS = (b"torch", b"tensorflow", b"keras", b"horovod", b"smdistributed")
#: ... and one of these: a training step, or a library we migrate. A file with neither cannot be
#: anything ``detect`` would convert or note, so it is not parsed by libcst at all.
ACTIVITY_MARKERS = (b"backward", b"GradientTape", b"apply_gradients", b"fit(", b"fit_generator(",
                    b"horovod",
                    b"smdistributed", b"minimize(", b"distributed", b"deepspeed", b"accelerate",
                    b"lightning", b"sdp_runtime", b"share_memory")


#: Spellings of a package that are the package itself: ``import tensorflow.compat.v2 as tf`` is
#: TensorFlow 2 (sagemaker-debugger's scripts use it).
_ALIASED_PACKAGES = (("tensorflow.compat.v2.", "tensorflow."),)


def canonical_name(name: str) -> str:
    """``tensorflow.compat.v2.keras.Model`` -> ``tensorflow.keras.Model``; others unchanged."""
    for alias, package in _ALIASED_PACKAGES:
        if name.startswith(alias):
            return package + name[len(alias):]
    return name


def worth_parsing(data: bytes) -> bool:
    """Whether ``data`` may be a training script or a distributed one (a cheap byte test)."""
    return any(m in data for m in FRAMEWORK_MARKERS) and any(m in data for m in ACTIVITY_MARKERS)

# Libraries that already make a script distributed; such files are left alone with a note.
_DISTRIBUTED_IMPORTS = {
    "deepspeed": "DeepSpeed",
    "accelerate": "Hugging Face Accelerate",
    "lightning": "PyTorch Lightning",
    "pytorch_lightning": "PyTorch Lightning",
    "torch.distributed.fsdp": "torch FSDP",
    "fairscale": "FairScale",
    "colossalai": "ColossalAI",
}
_DISTRIBUTED_CALLS = {
    "torch.distributed.init_process_group": "torch.distributed",
    "torch.nn.parallel.DistributedDataParallel": "torch DistributedDataParallel",
    "torch.nn.parallel.distributed.DistributedDataParallel": "torch DistributedDataParallel",
    "torch.distributed.fsdp.FullyShardedDataParallel": "torch FSDP",
}
#: Calls that only ask whether (and as what) torch.distributed runs: a helper that reads the rank
#: (``dist.get_rank() if dist.is_initialized() else 0``) sets up nothing itself.
_QUERIES = frozenset(f"torch.distributed.{name}" for name in (
    "is_available", "is_initialized", "get_rank", "get_world_size", "get_backend",
    "is_nccl_available", "is_gloo_available", "is_mpi_available", "is_torchelastic_launched",
))
_TF_STRATEGY_PREFIX = "tensorflow.distribute."
#: Variables a launcher (torchrun, torch.distributed.launch) sets for each process: a script that
#: reads them sets up its own distribution.
_LAUNCHER_VARIABLES = frozenset({"LOCAL_RANK", "RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE"})
#: ``args.<name>`` read by scripts with their own distributed set-up (timm, the ImageNet example).
_ARGS_CONVENTIONS = frozenset({"distributed", "local_rank"})
_DISTRIBUTED_SAMPLERS = (
    "torch.utils.data.distributed.DistributedSampler",
    "torch.utils.data.DistributedSampler",
)
#: Launchers whose import shows a script is started as one of several processes.
_LAUNCHER_IMPORTS = (
    "torch.distributed.run", "torch.distributed.launch", "torch.distributed.elastic"
)
_MULTIPROCESSING = "torch.multiprocessing"
_KERAS_PREFIXES = ("tensorflow.keras.", "keras.", "tf_keras.")

# Test frameworks (imports, or qualified names of a test class's bases) that mark a test module.
_TEST_FRAMEWORKS = (
    "unittest",
    "pytest",
    "absl.testing",
    "nose",
    "keras.src.testing",
    "keras.testing",
    "tf_keras.src.testing_infra",
    "tensorflow.test",
    "tensorflow.python.platform.test",
    "tensorflow.python.platform.googletest",
    "tensorflow.python.framework.test_util",
    "torch.testing._internal",
)
# Methods of Keras models and Lightning modules whose names only look like tests.
_MODEL_TEST_METHODS = frozenset(
    {"test_step", "test_on_batch", "test_dataloader", "test_epoch_end", "test_step_end",
     "test_function"}
)
# Module-level calls of these methods train right there: the file is run, not imported.
_TRAINING_METHODS = frozenset(
    {"backward", "step", "apply_gradients", "fit", "fit_generator", "train_on_batch", "minimize"}
)
# ... and of these, where the training code itself is (an optimizer's implementation).
_TRAINING_CODE = _TRAINING_METHODS | {"apply"}
# Imports of a framework's internals: only the framework's own modules (and its tests) use them.
_INTERNAL_PREFIXES = ("tensorflow.python", "keras.src", "tf_keras.src")
_FRAMEWORK_ROOTS = ("torch", "tensorflow", "keras", "tf_keras")
# Module-level construction of these (classes: a capitalized last name) sets training up.
_SETUP_PREFIXES = ("torch.optim.", "torch.nn.") + _KERAS_PREFIXES


@dataclass
class FileInfo:
    """What a file is. ``convertible`` is True for single-process training scripts."""

    framework: Framework | None = None
    origin: Origin = "vanilla"
    training: bool = False
    uses_tape: bool = False
    uses_fit: bool = False
    #: Why the file was judged a training script, or which library already distributes it, or
    #: (with ``excluded``) why a file that trains is not a training script.
    reason: str = ""
    #: ``"test module"`` or ``"library module"`` for a file that trains but is no script to
    #: convert (see the module docstring); such a file is left alone byte for byte.
    excluded: str = ""
    imports: set[str] = field(default_factory=set)
    #: Every call of the file by the qualified names of what it calls, and by method name
    #: (``backward`` for ``loss.backward()``): an index transforms query instead of re-walking.
    calls: dict[str, list[cst.Call]] = field(default_factory=dict, repr=False)
    method_calls: dict[str, list[cst.Call]] = field(default_factory=dict, repr=False)
    call_order: dict[int, int] = field(default_factory=dict, repr=False)
    #: The parent of every node of the original tree but the layout ones (whitespace, comments,
    #: punctuation: ``program.syntax.LAYOUT``, which nobody asks about); libcst's
    #: ParentNodeProvider costs 3.5x a parse, this map comes almost free with the detection pass.
    parents: dict[cst.CSTNode, cst.CSTNode] = field(default_factory=dict, repr=False)

    #: Where the file shows the distribution it does itself (origin ``distributed``), when that is
    #: a construct rather than a library import: an environment read, ``args.local_rank``, ...
    distributed_at: cst.CSTNode | None = field(default=None, repr=False)
    #: Modules the file star-imports (``from utils import *``): names the converter cannot see.
    star_imports: list[str] = field(default_factory=list)
    #: Something in the file runs its training code when it is executed (see the docstring): a
    #: file without is a module other code imports and calls.
    entry_point: bool = True

    #: Set on the engine's own check that a vanilla script's conversion is a fixed point: the
    #: transforms then run on the sdp_runtime code they wrote and must find nothing to do.
    recheck: bool = False

    @property
    def vanilla(self) -> bool:
        """A single-process script (or, on the engine's fixed-point check, its conversion)."""
        if self.excluded:
            return False
        return self.origin == "vanilla" or (self.origin == "sdp" and self.recheck)

    @property
    def convertible(self) -> bool:
        return self.training and self.vanilla

    @property
    def label(self) -> str:
        """A short human name for the report: ``torch``, ``keras``, ``horovod``, ..."""
        if self.origin == "distributed":
            return f"already distributed ({self.reason})"
        if self.origin == "sdp" and not self.recheck:
            return "already uses sdp_runtime"
        if self.origin in ("horovod", "smddp", "smp"):
            return f"{self.origin} ({self.framework})"
        if self.excluded.startswith("Keras on the"):
            return f"not converted ({self.excluded})"
        if self.excluded:
            return f"not a training script ({self.excluded})"
        if not self.training:
            return "not a training script"
        if self.framework == "tensorflow":
            return "keras" if self.uses_fit and not self.uses_tape else "tensorflow"
        return str(self.framework)


#: (visitor class, node class, "visit_" or "leave_") -> the hook's name, None where it has none.
_HOOKS: dict[tuple[type, type, str], str | None] = {}


def _hook(visitor: type, node: type, kind: str) -> str | None:
    key = (visitor, node, kind)
    try:
        return _HOOKS[key]
    except KeyError:
        name = kind + node.__name__
        # libcst's own ``visit_<Node>`` stubs (every node has one) do nothing: not called.
        hook = getattr(visitor, name, None)
        found = _HOOKS[key] = (
            name if callable(hook) and hook is not getattr(cst.CSTVisitor, name, None) else None
        )
        return found


class Visitor(cst.CSTVisitor):
    """A ``CSTVisitor`` without libcst's per-attribute hooks (``visit_<Node>_<field>``).

    libcst calls ``on_visit_attribute`` and ``on_leave_attribute`` for every field of every
    node, and each looks up a method by a name built from strings: about a fifth of a walk's
    cost. The converter's read-only walks define no such method, so they skip the look-ups.
    Its ``visit_<Node>``/``leave_<Node>`` hooks are those libcst calls, looked up once per
    visitor class and node class instead of by a name built for every node.
    """

    def on_visit(self, node: cst.CSTNode) -> bool:
        name = _hook(type(self), type(node), "visit_")
        if name is None:
            return True
        return getattr(self, name)(node) is not False

    def on_leave(self, original_node: cst.CSTNode) -> None:
        name = _hook(type(self), type(original_node), "leave_")
        if name is not None:
            getattr(self, name)(original_node)

    def on_visit_attribute(self, node: cst.CSTNode, attribute: str) -> None:
        pass

    def on_leave_attribute(self, original_node: cst.CSTNode, attribute: str) -> None:
        pass


#: The nodes whose body is a function, class or lambda body (``Detector._depth``): exact
#: classes, a set lookup where ``isinstance`` of libcst's classes goes through ``abc``.
_BODIES = frozenset({cst.FunctionDef, cst.ClassDef, cst.Lambda})


class Detector(Visitor):
    """What ``detect`` reads of a file, in one walk: the syntax as it goes; what needs qualified
    names (callees, class bases, ``os.environ[...]``) is noted in walk order and resolved after
    the walk (``resolve``), so that the walk can be the binding index's own (``index_module``
    takes it along), whose names are known only once the walk is over."""

    METADATA_DEPENDENCIES = (QualifiedNameProvider,)

    def __init__(self) -> None:
        super().__init__()
        self.imports: set[str] = set()
        self.calls: dict[str, list[cst.Call]] = {}
        self.method_calls: dict[str, list[cst.Call]] = {}
        self.order: dict[int, int] = {}
        self.parents: dict[cst.CSTNode, cst.CSTNode] = {}
        self._stack: list[cst.CSTNode] = []
        # The shape of the file, for telling scripts from test and library modules:
        self._depth = 0  # how many function, class and lambda bodies enclose the node
        self.module_calls: list[cst.Call] = []  # calls run when the module runs
        self.top_functions: set[str] = set()
        self.top_classes: set[str] = set()
        self.main_guard = False
        self.test_functions: list[str] = []  # top-level test_* functions
        self.test_classes: list[str] = []  # *TestCase subclasses and classes with test_* methods
        self.class_bases: set[str] = set()  # qualified names of every class's bases
        self.optimizer_classes: set[cst.ClassDef] = set()  # optimizer implementations
        # Distribution the script sets up itself (see ``_own_distribution``):
        self.imported_names: set[str] = set()
        self.star_imports: list[str] = []
        self.launcher_reads: list[tuple[str, cst.CSTNode]] = []  # os.environ["LOCAL_RANK"], ...
        self.args_conventions: list[tuple[str, cst.CSTNode]] = []  # args.local_rank, ...
        #: Nodes whose qualified names are read after the walk, in walk order (``resolve``).
        self._named: list[cst.CSTNode] = []

    def on_visit(self, node: cst.CSTNode) -> bool:
        stack = self._stack
        if stack:
            self.parents[node] = stack[-1]
        stack.append(node)
        if type(node) in _BODIES:
            self._depth += 1
        return super().on_visit(node)

    def on_leave(self, original_node: cst.CSTNode) -> None:
        self._stack.pop()
        if type(original_node) in _BODIES:
            self._depth -= 1
        super().on_leave(original_node)

    def visit_FunctionDef(self, node: cst.FunctionDef) -> None:
        name = node.name.value
        if self._depth == 1:  # on_visit has counted this very function already
            self.top_functions.add(name)
            if _is_test_name(name):
                self.test_functions.append(name)
        elif _is_test_name(name) and len(self._stack) >= 4:
            cls = self._stack[-3]  # FunctionDef <- IndentedBlock <- ClassDef
            if isinstance(cls, cst.ClassDef) and cls.name.value not in self.test_classes:
                self.test_classes.append(cls.name.value)

    def visit_ClassDef(self, node: cst.ClassDef) -> None:
        if self._depth == 1:
            self.top_classes.add(node.name.value)
        for base in node.bases:
            dotted = cst.helpers.get_full_name_for_node(base.value) or ""
            if dotted.endswith("TestCase") and node.name.value not in self.test_classes:
                self.test_classes.append(node.name.value)
        self._named.append(node)
        body = node.body.body if isinstance(node.body, cst.IndentedBlock) else ()
        if any(isinstance(f, cst.FunctionDef) and f.name.value in ("apply_gradients", "minimize")
               for f in body):
            self.optimizer_classes.add(node)

    def _class_bases(self, node: cst.ClassDef) -> None:
        for base in node.bases:
            resolved = self.get_metadata(QualifiedNameProvider, base.value, set())
            qualified = {canonical_name(q.name) for q in resolved}
            self.class_bases.update(qualified)
            dotted = cst.helpers.get_full_name_for_node(base.value) or ""
            if any(n.rsplit(".", 1)[-1].startswith("Optimizer") for n in qualified | {dotted}):
                self.optimizer_classes.add(node)

    def visit_If(self, node: cst.If) -> None:
        if self._depth == 0 and is_main_guard(node.test):
            self.main_guard = True

    def visit_Import(self, node: cst.Import) -> None:
        for alias in node.names:
            name = cst.helpers.get_full_name_for_node_or_raise(alias.name)
            self.imports.add(name)
            bound = alias.asname.name if alias.asname is not None else None
            self.imported_names.add(
                bound.value if isinstance(bound, cst.Name) else name.split(".")[0]
            )

    def visit_ImportFrom(self, node: cst.ImportFrom) -> None:
        if isinstance(node.names, cst.ImportStar):
            dots = "." * len(node.relative)
            module = cst.helpers.get_full_name_for_node(node.module) if node.module else ""
            self.star_imports.append(dots + (module or ""))
        if node.module is not None and not node.relative:
            base = cst.helpers.get_full_name_for_node_or_raise(node.module)
            self.imports.add(base)
            if not isinstance(node.names, cst.ImportStar):
                for alias in node.names:
                    self.imports.add(f"{base}.{alias.name.value}")
        if not isinstance(node.names, cst.ImportStar):
            for alias in node.names:
                bound = alias.asname.name if alias.asname is not None else alias.name
                if isinstance(bound, cst.Name):
                    self.imported_names.add(bound.value)

    def visit_Subscript(self, node: cst.Subscript) -> None:
        # os.environ["LOCAL_RANK"]
        if len(node.slice) == 1 and isinstance(node.slice[0].slice, cst.Index):
            key = node.slice[0].slice.value
            if isinstance(key, cst.SimpleString) and key.evaluated_value in _LAUNCHER_VARIABLES:
                self._named.append(node)

    def _environ_read(self, node: cst.Subscript) -> None:
        key = cast(cst.Index, node.slice[0].slice).value
        names = self.get_metadata(QualifiedNameProvider, node.value, set())
        if any(q.name == "os.environ" for q in names):
            self.launcher_reads.append((str(cast(cst.SimpleString, key).evaluated_value), node))

    def visit_Attribute(self, node: cst.Attribute) -> None:
        # args.local_rank, args.distributed: a script's own distributed set-up
        if (
            node.attr.value in _ARGS_CONVENTIONS
            and isinstance(node.value, cst.Name)
            and not any(isinstance(n, (cst.Import, cst.ImportFrom)) for n in self._stack)
        ):
            self.args_conventions.append((f"{node.value.value}.{node.attr.value}", node))

    def visit_Call(self, node: cst.Call) -> None:
        self.order[id(node)] = len(self.order)
        if self._depth == 0:
            self.module_calls.append(node)
        self._named.append(node)
        if isinstance(node.func, cst.Attribute):
            self.method_calls.setdefault(node.func.attr.value, []).append(node)

    def resolve(self) -> None:
        """What needs qualified names (``metadata`` set), in the order the walk met it."""
        for node in self._named:
            if isinstance(node, cst.Call):
                self._callee(node)
            elif isinstance(node, cst.ClassDef):
                self._class_bases(node)
            else:
                self._environ_read(cast(cst.Subscript, node))
        self._named = []

    def _callee(self, node: cst.Call) -> None:
        for q in self.get_metadata(QualifiedNameProvider, node.func, set()):
            name = canonical_name(q.name)
            self.calls.setdefault(name, []).append(node)
            if name in ("os.environ.get", "os.getenv") and node.args:
                key = node.args[0].value
                if isinstance(key, cst.SimpleString) and key.evaluated_value in (
                    _LAUNCHER_VARIABLES
                ):
                    self.launcher_reads.append((str(key.evaluated_value), node))


def _imports_under(imports: set[str], package: str) -> bool:
    return any(i == package or i.startswith(package + ".") for i in imports)


def _is_test_name(name: str) -> bool:
    """A test function's or method's name; not a model's ``test_step`` and its relatives."""
    return name.startswith("test_") and name not in _MODEL_TEST_METHODS


def is_main_guard(test: cst.BaseExpression) -> bool:
    """``__name__ == "__main__"`` (either way round)."""
    if not isinstance(test, cst.Comparison) or len(test.comparisons) != 1:
        return False
    if not isinstance(test.comparisons[0].operator, cst.Equal):
        return False
    sides = (test.left, test.comparisons[0].comparator)
    names = [s for s in sides if isinstance(s, cst.Name) and s.value == "__name__"]
    strings = [
        s for s in sides
        if isinstance(s, cst.SimpleString) and s.evaluated_value == "__main__"
    ]
    return bool(names and strings)


def _test_module(detector: Detector) -> str:
    """Why the file is a test module, or ``""``."""
    frameworks = sorted(
        f for f in _TEST_FRAMEWORKS
        if _imports_under(detector.imports, f) or _imports_under(detector.class_bases, f)
    )
    if not frameworks:
        return ""
    if detector.test_classes:
        tests = f"test class {detector.test_classes[0]}"
    elif detector.test_functions:
        tests = f"test function {detector.test_functions[0]}()"
    else:
        return ""
    return f"test module: uses {frameworks[0]} and defines {tests}"


def _entry_point(detector: Detector, called: Mapping[str, list[cst.Call]]) -> bool:
    """Whether anything in the file runs when it is executed as a script (see the docstring)."""
    if detector.main_guard:
        return True
    local = detector.top_functions | detector.top_classes
    names: dict[int, list[str]] = {}
    for name, calls in called.items():
        for c in calls:
            names.setdefault(id(c), []).append(name)
    for call in detector.module_calls:
        func = call.func
        if isinstance(func, cst.Name) and func.value in local:
            return True
        if isinstance(func, cst.Attribute) and func.attr.value in _TRAINING_METHODS:
            return True
        if any(isinstance(a.value, cst.Name) and a.value.value in detector.top_functions
               for a in call.args):
            return True
        for q in names.get(id(call), ()):
            if q.endswith(".GradientTape"):
                return True
            if q.startswith(_SETUP_PREFIXES) and q.rsplit(".", 1)[-1][:1].isupper():
                return True
    return False


def _package_module(detector: Detector) -> bool:
    """Whether the file is part of a framework: it imports a framework's internals.

    A relative import alone does not count: a user's ``myproject/train.py`` with ``from .model
    import Net`` and a ``train()`` that ``__main__.py`` calls is a training script to convert.
    """
    for name in detector.imports:
        if any(name == p or name.startswith(p + ".") for p in _INTERNAL_PREFIXES):
            return True
        parts = name.split(".")
        if parts[0] in _FRAMEWORK_ROOTS and any(p.startswith("_") for p in parts[1:]):
            return True
    return False


def _only_in_optimizers(detector: Detector, called: Mapping[str, list[cst.Call]]) -> bool:
    """Whether every training call of the file is inside an optimizer class's implementation."""
    if not detector.optimizer_classes:
        return False
    calls = [c for m in _TRAINING_CODE for c in detector.method_calls.get(m, ())]
    calls += [c for name, cs in called.items() if name.endswith(".GradientTape") for c in cs]
    for call in calls:
        node: cst.CSTNode | None = call
        while node is not None and not isinstance(node, cst.ClassDef):
            node = detector.parents.get(node)
        if node not in detector.optimizer_classes:
            return False
    return True


def _own_distribution(detector: Detector) -> tuple[str, cst.CSTNode | None] | None:
    """(what, where) when the script is made parallel by its own code (not sdp_runtime's): a
    call into torch.distributed, a DistributedSampler, a launcher's variables or conventions,
    or torch.multiprocessing workers sharing one model (Hogwild)."""
    called = detector.calls
    first = sorted(
        (q for q in called if q.startswith("torch.distributed.") and q not in _QUERIES),
        key=lambda q: detector.order.get(id(called[q][0]), 0),
    )
    if first:
        return f"{first[0]}()", called[first[0]][0]
    for name in _DISTRIBUTED_SAMPLERS:
        if name in called:
            return "its own DistributedSampler", called[name][0]
    for name in _LAUNCHER_IMPORTS:
        if _imports_under(detector.imports, name):
            return f"{name} (its launcher)", None
    if detector.launcher_reads:
        variable, node = detector.launcher_reads[0]
        return f"its own launcher set-up (reads {variable} from the environment)", node
    conventions = [
        (what, node) for what, node in detector.args_conventions
        if what.split(".")[0] not in detector.imported_names
    ]
    if conventions:
        what, node = conventions[0]
        return f"its own distributed set-up ({what})", node
    shared = detector.method_calls.get("share_memory")
    workers = [q for q in called if q == _MULTIPROCESSING or q.startswith(_MULTIPROCESSING + ".")]
    if shared and (workers or _imports_under(detector.imports, _MULTIPROCESSING)):
        return "torch.multiprocessing (Hogwild: processes sharing one model)", shared[0]
    return None


def detect(
    module: cst.Module,
    metadata: Mapping[object, Mapping[cst.CSTNode, object]],
    force: Literal["auto", "torch", "tensorflow"] = "auto",
    recheck: bool = False,
    detector: Detector | None = None,
) -> FileInfo:
    """Classify ``module``. ``metadata`` must hold qualified names under
    ``QualifiedNameProvider`` (the engine's come from ``program.names``). ``detector``: one that
    has walked ``module`` already (the engine's rides along the binding index's walk)."""
    if detector is None:
        detector = Detector()
        module.visit(detector)
    detector.metadata = metadata  # type: ignore[assignment]  # shared, resolved once
    detector.resolve()
    imports, called, methods = detector.imports, detector.calls, detector.method_calls
    info = FileInfo(
        imports=imports,
        calls=called,
        method_calls=methods,
        call_order=detector.order,
        parents=detector.parents,
        star_imports=detector.star_imports,
    )

    has_torch = _imports_under(imports, "torch")
    has_tf = any(_imports_under(imports, p) for p in ("tensorflow", "keras", "tf_keras"))
    if force != "auto":
        info.framework = force
    elif has_torch and not has_tf:
        info.framework = "torch"
    elif has_tf and not has_torch:
        info.framework = "tensorflow"
    elif has_torch and has_tf:
        # A script mixing both trains with the one whose optimizer steps.
        tf_training = "apply_gradients" in methods or "fit" in methods
        info.framework = "tensorflow" if tf_training and "backward" not in methods else "torch"

    # Who distributes it already?
    # (SMP last: a script combining SMP with Horovod is an SMP script, its Horovod migrated too.)
    for package, origin in (("horovod", "horovod"), ("smdistributed.dataparallel", "smddp"),
                            ("smdistributed.modelparallel", "smp")):
        if _imports_under(imports, package):
            info.origin = cast(Origin, origin)
            info.reason = package
            if info.framework is None:
                info.framework = "tensorflow" if has_tf else "torch"
    if info.origin == "vanilla":
        for package, label in _DISTRIBUTED_IMPORTS.items():
            if _imports_under(imports, package):
                info.origin, info.reason = "distributed", label
                break
    if info.origin == "vanilla":
        for name, label in _DISTRIBUTED_CALLS.items():
            if name in called:
                info.origin, info.reason = "distributed", label
                break
    if info.origin == "vanilla":
        strategies = sorted(
            c for c in called if c.startswith(_TF_STRATEGY_PREFIX) and c.endswith("Strategy")
        )
        if strategies:
            info.origin, info.reason = "distributed", strategies[0].replace("tensorflow", "tf")
    if info.origin == "vanilla":
        # Keras 3's own data parallelism (keras.distribution.DataParallel, set_distribution).
        keras_distribution = sorted(c for c in called if ".distribution." in c and any(
            c.startswith(p + "distribution.") for p in _KERAS_PREFIXES
        ))
        if keras_distribution:
            info.origin, info.reason = "distributed", "keras.distribution"
    if info.origin == "vanilla" and _imports_under(imports, "sdp_runtime"):
        info.origin, info.reason = "sdp", "sdp_runtime"
    if info.origin == "vanilla":
        own = _own_distribution(detector)
        if own is not None:
            info.origin, info.reason = "distributed", own[0]
            info.distributed_at = own[1]
    info.recheck = recheck

    # Does it train?
    if info.framework == "torch":
        optimizers = sorted(
            c for c in called if c.startswith("torch.optim.") and c[12:13].isupper()
        )
        if "backward" in methods and "step" in methods:
            info.training = True
            info.reason = info.reason or "calls .backward() and .step()" + (
                f" ({optimizers[0]})" if optimizers else ""
            )
    elif info.framework == "tensorflow":
        info.uses_tape = any(c.endswith(".GradientTape") for c in called)
        fit = ("fit" in methods or "fit_generator" in methods) and "compile" in methods and any(
            c.startswith(_KERAS_PREFIXES) for c in called
        )
        info.uses_fit = fit
        if info.uses_tape and ("apply_gradients" in methods or "apply" in methods):
            info.training = True
            info.reason = info.reason or "records a GradientTape and applies its gradients"
        elif fit:
            info.training = True
            info.reason = info.reason or "compiles and fits a Keras model"

    info.entry_point = _entry_point(detector, called)
    # A test or library module that trains is still not a script to convert.
    if info.training and info.origin == "vanilla":
        backend = keras_backend(module, called) if info.framework == "tensorflow" else None
        if backend is not None and backend != "tensorflow":
            info.excluded = f"Keras on the {backend} backend"
            info.training, info.reason = False, (
                f"Keras runs on the {backend} backend here (KERAS_BACKEND / set_backend): "
                "sdp_runtime.tensorflow serves the TensorFlow backend only; use "
                "keras.distribution.DataParallel on that backend, or set KERAS_BACKEND to "
                "tensorflow and convert again"
            )
            return info
        why = _test_module(detector)
        if why:
            info.excluded = "test module"
        elif not info.entry_point:
            if _package_module(detector):
                where = "a module of a framework (it imports framework internals)"
            elif _only_in_optimizers(detector, called):
                where = "an optimizer implementation (its training code is in optimizer classes)"
            else:
                where = ""
            if where:
                info.excluded = "library module"
                why = (
                    f"library module: {where} that nothing in the file runs (no __main__ block, "
                    "no module-level training or call of its own functions)"
                )
        if why:
            info.training, info.reason = False, why
    return info


_BACKEND_SETTERS = ("keras.config.set_backend", "keras.backend.set_backend")


def keras_backend(module: cst.Module, called: Mapping[str, list[cst.Call]]) -> str | None:
    """The Keras backend a script chooses for itself: ``os.environ["KERAS_BACKEND"] = "jax"``
    (or ``setdefault``) at the top level, or ``keras.config.set_backend("jax")``; None when it
    chooses none (TensorFlow, Keras' default) or chooses it by a value the converter cannot
    read."""
    for name in _BACKEND_SETTERS:
        for call in called.get(name, ()):
            if call.args and isinstance(call.args[0].value, cst.SimpleString):
                chosen = call.args[0].value.evaluated_value
                if isinstance(chosen, str):
                    return chosen
    for stmt in module.body:
        if not isinstance(stmt, cst.SimpleStatementLine):
            continue
        for small in stmt.body:
            value: cst.BaseExpression | None = None
            if isinstance(small, cst.Assign) and len(small.targets) == 1:
                target = small.targets[0].target
                if (
                    isinstance(target, cst.Subscript)
                    and module.code_for_node(target.value) in ("os.environ", "environ")
                    and len(target.slice) == 1
                    and isinstance(target.slice[0].slice, cst.Index)
                    and isinstance(target.slice[0].slice.value, cst.SimpleString)
                    and target.slice[0].slice.value.evaluated_value == "KERAS_BACKEND"
                ):
                    value = small.value
            elif (
                isinstance(small, cst.Expr)
                and isinstance(small.value, cst.Call)
                and module.code_for_node(small.value.func).endswith("environ.setdefault")
                and len(small.value.args) == 2
                and isinstance(small.value.args[0].value, cst.SimpleString)
                and small.value.args[0].value.evaluated_value == "KERAS_BACKEND"
            ):
                value = small.value.args[1].value
            if isinstance(value, cst.SimpleString) and isinstance(value.evaluated_value, str):
                return value.evaluated_value
    return None


def steps_in_wrapper(
    info: FileInfo, wrappers: Sequence[tuple[str, str, tuple[str, ...], bool]]
) -> None:
    """A PyTorch script that calls ``.backward()`` and a method of a class another module defines
    that steps the optimizer it holds (``ScheduledOptim(...).step_and_update_lr()``, from
    ``program.project.ModuleFacts.optimizer_wrappers``) trains, though it calls no ``.step()``."""
    if (
        info.framework != "torch" or info.training or info.origin != "vanilla"
        or "backward" not in info.method_calls or not info.entry_point
    ):
        return
    for qname, where, methods, _ in wrappers:
        stepping = [m for m in methods if m in info.method_calls]
        if qname in info.calls and stepping:
            info.training = True
            info.reason = (
                f"calls .backward() and {qname.rsplit('.', 1)[-1]}.{stepping[0]}() ({where}), "
                "which steps the torch optimizer it holds"
            )
            return
