"""The program of one run: every module of it, and values followed across them.

``FileModel`` answers questions about one file; a training program is rarely one file. A model is
made in ``main.py``, handed to ``Learner(**kwargs)`` and trained in ``learner.py`` through
``self.model``; a Keras model is compiled in a factory of ``models.py`` and fit in ``train.py``;
a ``Trainer`` runs the loop of a ``BaseTrainer`` defined in another module. ``Run`` holds the
``FileModel`` of every module of one run (the files converted and the modules next to them that
the program imports) and follows values between them:

- ``trace(ref)``: where the value of an expression is **made** (the call that builds it), through
  names, ``self.<attr>`` (of the class and of its bases and subclasses, in any module),
  ``**kwargs`` lookups, parameters (every caller in the run: functions, ``Cls(...)``,
  ``super().__init__(...)``), returns of functions of any module (factories), imports of
  module-level values, and the wrappers on the way (``DistributedDataParallel``,
  ``DistributedOptimizer``, ...); or where and why it cannot be followed (``Trace.stop``);
- ``callers(ref)``: the calls of a function or method from anywhere in the run;
- ``driving_loops(ref)``: the loops that run a statement, through the functions that call it;
- ``torch_steps()``, ``keras_fits()``, ``tape_steps()``: the training of the program, each with
  the objects it trains (optimizer, models, data, compile), each traced to where it is made.

Policy: every caller and every return is followed (a parameter passed from two places has two
origins), to a bounded depth; a value the model cannot follow is never guessed: it stops with
its reason, and whoever asks says "unknown". The converter's repair (``sdp_convert.projects``)
asks it where to edit; the whole-program contract (``sdp_convert.contract``) asks it, of the
converted program, whether each part holds.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import libcst as cst
import libcst.matchers as m

from ..modules import Project
from .index import Binding, FileIndex, file_index
from .loaders import LOADERS
from .model import FileModel
from .models import model_given, no_grad_in_class
from .scopes import callers as file_callers
from .scopes import class_of, method_of, param_for_arg
from .syntax import code, findall, is_empty_list

#: How far a trace goes (steps through names, calls, parameters).
MAX_DEPTH = 24
#: How many origins one trace may fan out to (callers, returns, branches).
MAX_ORIGINS = 16

#: Methods that return their receiver (a module moved or set up in place).
SELF_METHODS = frozenset({
    "to", "cuda", "cpu", "float", "half", "double", "bfloat16", "train", "eval", "type",
    "requires_grad_", "share_memory", "to_empty", "apply",
})
#: ``tf.data`` methods that give a new dataset made from their receiver: a trace goes through
#: them to the source (``from_tensor_slices(...).apply(sdp.shard).batch(32)``), keeping each in
#: ``Trace.through`` (where a ``shard`` shows).
DATASET_METHODS = frozenset({
    "batch", "shuffle", "map", "prefetch", "cache", "repeat", "filter", "take", "skip",
    "apply", "with_options", "unbatch", "padded_batch", "interleave", "flat_map", "shard",
    "rebatch", "ragged_batch", "enumerate", "concatenate", "prefetch_to_device",
    "flow", "flow_from_directory", "flow_from_dataframe",
})
#: Calls that iterate over their first argument as it is (a progress bar, ``enumerate``): a trace
#: goes through them (``tk0 = tqdm(loader, total=n)`` ... ``for batch in enumerate(tk0)``).
ITERATING = frozenset({
    "tqdm.tqdm", "tqdm.auto.tqdm", "tqdm.notebook.tqdm", "tqdm.std.tqdm", "tqdm.rich.tqdm",
    "builtins.enumerate", "builtins.iter",
})
#: Wrappers the converter (or the user) puts around what they wrap: a trace goes through them.
WRAPPERS = (
    "DistributedDataParallel", "DistributedOptimizer", "DistributedGradientTape",
    "DistributedModel", "DataParallel",
)


@dataclass(eq=False)
class Module:
    """One module of the run."""

    path: Path
    display: str
    fm: FileModel
    #: Converted (and written) by this run; False: a neighbour, read as it is.
    written: bool = True
    notebook: bool = False

    def __repr__(self) -> str:
        return f"Module({self.display})"


@dataclass(frozen=True, eq=False)
class Ref:
    """A node of one module of the run."""

    module: Module
    node: cst.CSTNode

    @property
    def fm(self) -> FileModel:
        return self.module.fm

    @property
    def key(self) -> tuple[str, int]:
        return str(self.module.path), id(self.node)

    @property
    def code(self) -> str:
        return self.module.fm.code(self.node).strip()

    def __repr__(self) -> str:
        return f"Ref({self.module.display}: {self.code[:40]!r})"


@dataclass
class Trace:
    """Where one value comes from: ``made`` (the call, or the ``def``, that makes it), or
    ``stop``, why it cannot be followed further (at ``at``). ``wraps``: the wrapper calls it went
    through (outermost last); ``through``: every expression on the way."""

    made: Ref | None = None
    stop: str = ""
    at: Ref | None = None
    wraps: tuple[Ref, ...] = ()
    through: tuple[Ref, ...] = ()

    def wrapped_by(self, *names: str) -> Ref | None:
        """The wrapper call on the way whose name ends with one of ``names``."""
        for ref in self.wraps:
            if any(q.endswith(names) for q in _names_of_call(ref)):
                return ref
        return None


@dataclass
class TorchStep:
    """An optimizer stepped after a backward pass: ``step`` (``opt.step()`` or
    ``scaler.step(opt)``), the optimizer's origins, the models whose parameters it steps, and the
    loops that drive it."""

    step: Ref
    optimizer: Ref  # the expression stepped
    optimizers: list[Trace]
    models: list[Trace]
    #: Why no model was found for an optimizer that was (empty when models were found).
    models_unknown: str = ""
    loops: list[Ref] = field(default_factory=list)


@dataclass
class KerasFit:
    """``model.fit(...)``: the model's origins, the compile calls of that model."""

    fit: Ref
    models: list[Trace]
    compiles: list[Ref]


@dataclass
class TapeStep:
    """``optimizer.apply_gradients(...)`` of gradients a ``tape.gradient(...)`` computed."""

    apply: Ref
    optimizers: list[Trace]
    tapes: list[tuple[Ref, list[Trace]]]


class Run:
    """Every module of one run, and the questions across them (see the module docstring)."""

    def __init__(self, modules: Iterable[Module], graph: Project) -> None:
        self.modules: dict[Path, Module] = {m.path: m for m in modules}
        self.graph = graph
        self._imported_calls: dict[tuple[str, str], list[Ref]] | None = None
        self._classes: dict[tuple[str, str], Ref] | None = None
        self._bases: dict[tuple[str, int], list[Ref]] = {}
        self._subclasses: dict[tuple[str, int], list[Ref]] | None = None
        self._callers: dict[tuple[str, int], list[Ref]] = {}
        #: Questions being answered (a question asked again inside its own answer: a cycle,
        #: answered with what is known so far) and how deep the questions nest.
        self._active: set[tuple[str, tuple[str, int]]] = set()
        self._nesting = 0
        self._branches = False  # trace(branches=True) under way

    # -- names across modules -----------------------------------------------------------------

    def module_at(self, path: Path) -> Module | None:
        return self.modules.get(path)

    def definition(self, module: Module, qualified: str) -> Ref | None:
        """The ``def`` or ``class`` (top level, any module of the run) that ``qualified`` names
        as ``module`` spells it (``learner.Learner``, ``.models.build``)."""
        if not qualified:
            return None
        target = self.graph.resolve(module.path, qualified)
        if target is None:
            return None
        path, name = target
        other = self.modules.get(path)
        if other is None:
            return None
        node = _top_level(other.fm, name)
        return Ref(other, node) if node is not None else None

    def module_value(self, module: Module, qualified: str) -> Ref | None:
        """A module-level variable of another module of the run (``from config import model``):
        the value its last top-level assignment gives."""
        absolute = self.graph._absolute(module.path, qualified)  # noqa: SLF001
        if absolute is None or "." not in absolute:
            return None
        owner, _, name = absolute.rpartition(".")
        path = self.graph._modules.get(owner)  # noqa: SLF001
        other = self.modules.get(path) if path is not None else None
        if other is None:
            return None
        bound = file_index(other.fm).bindings_of(name, None)
        assigned = [b for b in bound if b.kind == "assign" and b.value is not None]
        if not assigned or assigned[-1].unpacked:
            return None
        return Ref(other, assigned[-1].value)  # type: ignore[arg-type]

    def module_named(self, ref: Ref) -> Module | None:
        """The module of the run an expression names (``module_data`` after ``import
        data_loader.data_loaders as module_data``), or None."""
        for name in sorted(self.qualified(ref)):
            path = self.graph.module_file(ref.module.path, name)
            if path is not None and path in self.modules:
                return self.modules[path]
            # A folder without ``__init__.py`` (a namespace package): its file by its path.
            tail = "/" + name.replace(".", "/")
            found = [m for p, m in self.modules.items() if p.with_suffix("").as_posix().endswith(
                tail) and not name.startswith(".")]
            if len(found) == 1:
                return found[0]
        return None

    def loader_classes(self, module: Module) -> list[tuple[Ref, Ref]]:
        """``(class, base)``: the top-level classes of ``module`` that derive (through classes
        of the run) from a torch ``DataLoader``, each with the class of the run that derives
        from it directly (``MnistDataLoader`` and ``BaseDataLoader``)."""
        found = []
        for node in module.fm.module.body:
            if not isinstance(node, cst.ClassDef):
                continue
            todo, seen = [Ref(module, node)], set()
            while todo:
                current = todo.pop(0)
                if current.key in seen:
                    continue
                seen.add(current.key)
                assert isinstance(current.node, cst.ClassDef)
                if any(current.fm.refers_to(b.value, *LOADERS) for b in current.node.bases):
                    found.append((Ref(module, node), current))
                    break
                todo.extend(self.bases(current))
        return found

    def qualified(self, ref: Ref) -> set[str]:
        return ref.fm.qualified_names(ref.node)

    def _project_target(self, ref: Ref) -> Ref | None:
        """The project ``def``/``class`` an expression names (imported from another module)."""
        for name in sorted(self.qualified(ref)):
            found = self.definition(ref.module, name)
            if found is not None:
                return found
        return None

    def callee(self, call: Ref) -> Ref | None:
        """The function (or class) of the run that ``call`` calls, when that is known."""
        assert isinstance(call.node, cst.Call)
        func = call.node.func
        if isinstance(func, cst.Name):
            binding = file_index(call.fm).reaching(func.value, call.node)
            if binding is not None and isinstance(binding.stmt, (cst.FunctionDef, cst.ClassDef)):
                return Ref(call.module, binding.stmt)
            if binding is None or binding.kind == "import":
                found = self._project_target(Ref(call.module, func))
                if found is None and binding is None:
                    star = self._star_target(call.module, func.value)
                    other = self.modules.get(star[0]) if star is not None else None
                    node = _top_level(other.fm, star[1]) if other is not None and star else None
                    found = Ref(other, node) if other is not None and node is not None else None
                return found
            return None
        if isinstance(func, cst.Attribute):
            if _is_self(func.value):
                cls = _method_class(call.fm, call.node)
                if cls is not None:
                    return self.method(Ref(call.module, cls), func.attr.value)
                return None
            target = self._project_target(Ref(call.module, func))
            if target is not None:
                return target
            # ``Cls.method(...)`` on a class of the run (a classmethod: ``Config.from_args()``).
            if isinstance(func.value, cst.Name):
                binding = file_index(call.fm).reaching(func.value.value, call.node)
                owner = (Ref(call.module, binding.stmt) if binding is not None
                         and isinstance(binding.stmt, cst.ClassDef) else
                         self._project_target(Ref(call.module, func.value))
                         if binding is None or binding.kind == "import" else None)
                if owner is not None and isinstance(owner.node, cst.ClassDef):
                    return self.method(owner, func.attr.value)
            # ``obj.method(...)`` on an instance of a class of the run.
            for trace in self.trace(Ref(call.module, func.value), depth=MAX_DEPTH - 8):
                cls = self.instance_class(trace)
                if cls is not None:
                    return self.method(cls, func.attr.value)
        return None

    def instance_class(self, trace: Trace) -> Ref | None:
        """The class of the run that a traced value is an instance of (``Learner(...)``)."""
        made = trace.made
        if made is None or not isinstance(made.node, cst.Call):
            return None
        target = self.callee_of_made(made)
        if target is not None and isinstance(target.node, cst.ClassDef):
            return target
        return None

    def callee_of_made(self, made: Ref) -> Ref | None:
        assert isinstance(made.node, cst.Call)
        func = made.node.func
        if isinstance(func, cst.Name):
            binding = file_index(made.fm).reaching(func.value, made.node)
            if binding is not None and isinstance(binding.stmt, (cst.FunctionDef, cst.ClassDef)):
                return Ref(made.module, binding.stmt)
        return self._project_target(Ref(made.module, func))

    # -- classes -------------------------------------------------------------------------------

    def method(self, cls: Ref, name: str) -> Ref | None:
        """``cls.name``: defined in the class, or inherited from a base of the run."""
        seen: set[tuple[str, int]] = set()
        todo = [cls]
        while todo:
            current = todo.pop(0)
            if current.key in seen:
                continue
            seen.add(current.key)
            assert isinstance(current.node, cst.ClassDef)
            found = method_of(current.node, name)
            if found is not None:
                return Ref(current.module, found)
            todo.extend(self.bases(current))
        return None

    def bases(self, cls: Ref) -> list[Ref]:
        """The classes of the run that ``cls`` derives from directly."""
        cached = self._bases.get(cls.key)
        if cached is not None:
            return cached
        found = []
        assert isinstance(cls.node, cst.ClassDef)
        for base in cls.node.bases:
            if base.keyword is not None:
                continue
            expr = base.value
            if isinstance(expr, cst.Name):
                binding = file_index(cls.fm).reaching(expr.value, cls.node)
                if binding is not None and isinstance(binding.stmt, cst.ClassDef):
                    found.append(Ref(cls.module, binding.stmt))
                    continue
            target = self._project_target(Ref(cls.module, expr))
            if target is not None and isinstance(target.node, cst.ClassDef):
                found.append(target)
        self._bases[cls.key] = found
        return found

    def subclasses(self, cls: Ref) -> list[Ref]:
        """Every class of the run that derives from ``cls`` (at any depth)."""
        if self._subclasses is None:
            self._subclasses = {}
            for module in self.modules.values():
                for node in file_index(module.fm).by_type.get(cst.ClassDef, []):
                    ref = Ref(module, node)
                    for base in self.bases(ref):
                        self._subclasses.setdefault(base.key, []).append(ref)
        found: list[Ref] = []
        todo = list(self._subclasses.get(cls.key, []))
        while todo:
            current = todo.pop(0)
            if any(current.key == f.key for f in found):
                continue
            found.append(current)
            todo.extend(self._subclasses.get(current.key, []))
        return found

    def family(self, cls: Ref) -> list[Ref]:
        """``cls``, its bases (at any depth) and its subclasses: where ``self.<attr>`` of an
        instance may be set."""
        found = [cls]
        todo = list(self.bases(cls))
        while todo:
            current = todo.pop(0)
            if any(current.key == f.key for f in found):
                continue
            found.append(current)
            todo.extend(self.bases(current))
        for sub in self.subclasses(cls):
            if not any(sub.key == f.key for f in found):
                found.append(sub)
        return found

    # -- calls across modules -------------------------------------------------------------------

    def _calls_index(self) -> dict[tuple[str, str], list[Ref]]:
        """Calls of top-level functions and classes of one module made in another, by
        ``(defining file, name)``."""
        if self._imported_calls is None:
            found: dict[tuple[str, str], list[Ref]] = {}
            for module in self.modules.values():
                for qualified, calls in module.fm.info.calls.items():
                    target = self.graph.resolve(module.path, qualified)
                    if target is None or target[0] == module.path:
                        continue
                    key = (str(target[0]), target[1])
                    found.setdefault(key, []).extend(Ref(module, c) for c in calls)
                for call, target in self._star_calls(module):
                    found.setdefault((str(target[0]), target[1]), []).append(Ref(module, call))
            self._imported_calls = found
        return self._imported_calls

    def _star_calls(self, module: Module) -> list[tuple[cst.Call, tuple[Path, str]]]:
        """Calls of names a ``from X import *`` of a project module brings in."""
        stars = module.fm.info.star_imports
        if not stars:
            return []
        index = file_index(module.fm)
        found = []
        for call in index.by_type.get(cst.Call, []):
            func = call.func  # type: ignore[attr-defined]
            if not isinstance(func, cst.Name) or index.reaching(func.value, call) is not None:
                continue
            target = self._star_target(module, func.value)
            if target is not None:
                found.append((call, target))  # type: ignore[arg-type]
        return found

    def _star_target(self, module: Module, name: str) -> tuple[Path, str] | None:
        for star in module.fm.info.star_imports:
            target = self.graph.resolve(module.path, f"{star}.{name}")
            if target is not None:
                return target
        return None

    def callers(self, function: Ref) -> list[Ref]:
        key = ("callers", function.key)
        if function.key in self._callers:
            return self._callers[function.key]
        if key in self._active or self._nesting > 6:
            return []
        self._active.add(key)
        self._nesting += 1
        try:
            found = self._find_callers(function)
        finally:
            self._active.discard(key)
            self._nesting -= 1
        self._callers[function.key] = found
        return found

    def _find_callers(self, function: Ref) -> list[Ref]:
        """The calls of ``function`` (a ``def``; a class's ``__init__`` is called by
        ``Cls(...)``, by its subclasses' ``Cls(...)`` when they have no ``__init__`` of their own,
        and by ``super().__init__(...)``) from any module of the run."""
        node = function.node
        assert isinstance(node, cst.FunctionDef)
        found: dict[tuple[str, int], Ref] = {}

        def add(refs: Iterable[Ref]) -> None:
            for ref in refs:
                found.setdefault(ref.key, ref)

        cls_node = class_of(function.fm, node)
        if cls_node is None:
            add(Ref(function.module, c) for c in file_callers(function.fm, node))
            if isinstance(function.fm.parent(node), cst.Module):
                add(self._calls_index().get((str(function.module.path), node.name.value), []))
            add(self._value_calls(function))
            return list(found.values())
        cls = Ref(function.module, cls_node)
        name = node.name.value
        classes = [cls, *(s for s in self.subclasses(cls) if self.method(s, name) is function
                          or self.method(s, name) is None or
                          self.method(s, name).node is node)]  # type: ignore[union-attr]
        if name == "__init__":
            for owner in classes:
                if owner.key != cls.key and method_of(owner.node, "__init__") is not None:  # type: ignore[arg-type]
                    continue
                add(self._instantiations(owner))
            for sub in self.subclasses(cls):
                add(self._super_calls(sub, name, cls))
            return list(found.values())
        add(Ref(function.module, c) for c in file_callers(function.fm, node))
        for owner in self.family(cls):
            add(self._self_calls(owner, name, node))
        for module in self.modules.values():
            for call in module.fm.method_calls(name):
                ref = Ref(module, call)
                if ref.key in found or _is_self(call.func.value):  # type: ignore[attr-defined]
                    continue
                target = self.callee(ref)
                if target is not None and target.node is node:
                    found[ref.key] = ref
        return list(found.values())

    def _instantiations(self, cls: Ref) -> list[Ref]:
        assert isinstance(cls.node, cst.ClassDef)
        found = []
        index = file_index(cls.fm)
        binding = index.by_target.get(id(cls.node))
        if binding is not None:
            for use in index.uses(binding):
                parent = cls.fm.parent(use)
                if isinstance(parent, cst.Call) and parent.func is use:
                    found.append(Ref(cls.module, parent))
        if isinstance(cls.fm.parent(cls.node), cst.Module):
            found += self._calls_index().get((str(cls.module.path), cls.node.name.value), [])
        return found + _classmethod_instantiations(cls)

    def _super_calls(self, sub: Ref, name: str, base: Ref) -> list[Ref]:
        """``super().<name>(...)`` and ``Base.<name>(self, ...)`` in the methods of ``sub``."""
        found = []
        assert isinstance(sub.node, cst.ClassDef)
        for call in sub.fm.method_calls(name):
            if not _inside(sub.fm, call, sub.node):
                continue
            receiver = call.func.value  # type: ignore[attr-defined]
            if isinstance(receiver, cst.Call) and isinstance(receiver.func, cst.Name) and (
                receiver.func.value == "super"
            ) or any(b.key == base.key for b in self._named_classes(Ref(sub.module, receiver))):
                found.append(Ref(sub.module, call))
        return found

    def _named_classes(self, ref: Ref) -> list[Ref]:
        expr = ref.node
        if isinstance(expr, cst.Name):
            binding = file_index(ref.fm).reaching(expr.value, expr)
            if binding is not None and isinstance(binding.stmt, cst.ClassDef):
                return [Ref(ref.module, binding.stmt)]
        target = self._project_target(ref)
        return [target] if target is not None and isinstance(target.node, cst.ClassDef) else []

    def _self_calls(self, owner: Ref, name: str, function: cst.FunctionDef) -> list[Ref]:
        """``self.<name>(...)`` in the methods of ``owner`` that resolve to ``function``."""
        found = []
        assert isinstance(owner.node, cst.ClassDef)
        for call in owner.fm.method_calls(name):
            if not (_is_self(call.func.value) and _inside(owner.fm, call, owner.node)):  # type: ignore[attr-defined]
                continue
            # ``self`` is an instance of the class whose method runs, or of a subclass: a base
            # class's ``self._train_epoch()`` runs the subclass's override.
            if any((target := self.method(cls, name)) is not None and target.node is function
                   for cls in (owner, *self.subclasses(owner))):
                found.append(Ref(owner.module, call))
        return found

    def _value_calls(self, function: Ref) -> list[Ref]:
        """Calls of a function passed around as a value (``train_d, train_g = make_steps()``;
        ``step = build_step(model)``): calls of a name bound by assignment that traces to it."""
        found = []
        node = function.node
        for module in self.modules.values():
            index = file_index(module.fm)
            for call in index.by_type.get(cst.Call, []):
                func = call.func  # type: ignore[attr-defined]
                if not isinstance(func, cst.Name):
                    continue
                binding = index.reaching(func.value, call)
                if binding is None or binding.kind not in ("assign", "param"):
                    continue
                for trace in self.trace(Ref(module, func), depth=MAX_DEPTH - 10):
                    if trace.made is not None and trace.made.node is node:
                        found.append(Ref(module, call))
                        break
        return found

    # -- tracing values -----------------------------------------------------------------------

    def trace(self, ref: Ref, depth: int = 0, branches: bool = False) -> list[Trace]:
        """Where the value of ``ref`` (an expression) is made: one ``Trace`` per origin. A name
        read where it is bound by assignments in several branches (``if a: ds = f() else:
        ds = g()``) is followed into each with ``branches``, else into the last one."""
        key = ("trace", ref.key)
        if key in self._active or self._nesting > 6:
            return [Trace(None, f"{ref.code} depends on itself", ref)]
        self._active.add(key)
        self._nesting += 1
        found: list[Trace] = []
        outer, self._branches = self._branches, branches
        try:
            self._trace(ref, (), (), depth, set(), found)
        finally:
            self._active.discard(key)
            self._nesting -= 1
            self._branches = outer
        return found[:MAX_ORIGINS]

    def made(self, ref: Ref) -> list[Ref]:
        """The calls (or definitions) that make the value of ``ref``, where they are known."""
        return [t.made for t in self.trace(ref) if t.made is not None]

    def _trace(
        self,
        ref: Ref,
        through: tuple[Ref, ...],
        wraps: tuple[Ref, ...],
        depth: int,
        seen: set[tuple[str, int]],
        found: list[Trace],
    ) -> None:
        if len(found) >= MAX_ORIGINS:
            return
        node = ref.node
        through = (*through, ref)

        def stop(why: str) -> None:
            found.append(Trace(None, why, ref, wraps, through))

        def go(next_ref: Ref, more_wraps: tuple[Ref, ...] = (), via: tuple[Ref, ...] = ()) -> None:
            self._trace(next_ref, (*through, *via), (*wraps, *more_wraps), depth + 1, seen, found)

        if depth > MAX_DEPTH:
            stop(f"{ref.code} is followed through too many steps")
            return
        if ref.key in seen:
            return  # a cycle: the other way round gives the origins
        seen = seen | {ref.key}
        fm = ref.fm
        index = file_index(fm)
        if isinstance(node, cst.Name):
            if node.value in ("True", "False", "None"):
                found.append(Trace(ref, "", None, wraps, through))
                return
            binding = index.reaching(node.value, node)
            if binding is None:
                value = self._imported_value(ref)
                if value is not None:
                    go(value)
                else:
                    stop(f"{node.value} is not assigned in the program")
                return
            for seen_here in (_branch_bindings(index, node, binding) if self._branches
                              else [binding]):
                self._trace_binding(ref, seen_here, go, stop, found, wraps, through)
            return
        if isinstance(node, cst.Attribute):
            self._trace_attribute(ref, go, stop, found, wraps, through, depth)
            return
        if isinstance(node, cst.Subscript):
            self._trace_subscript(ref, go, stop)
            return
        if isinstance(node, cst.Call):
            self._trace_call(ref, go, stop, found, wraps, through)
            return
        if isinstance(node, cst.IfExp):
            go(Ref(ref.module, node.body))
            go(Ref(ref.module, node.orelse))
            return
        if isinstance(node, cst.BooleanOperation):
            go(Ref(ref.module, node.left))
            go(Ref(ref.module, node.right))
            return
        if isinstance(node, (cst.FunctionDef, cst.ClassDef, cst.Lambda)):
            found.append(Trace(ref, "", None, wraps, through))
            return
        # A literal (a list of parameter groups, a dict of settings, a number): made here.
        found.append(Trace(ref, "", None, wraps, through))

    def _imported_value(self, ref: Ref) -> Ref | None:
        for name in sorted(self.qualified(ref)):
            target = self.definition(ref.module, name)
            if target is not None:
                return target
            value = self.module_value(ref.module, name)
            if value is not None:
                return value
        return None

    def _trace_binding(self, ref, binding: Binding, go, stop, found, wraps, through) -> None:  # noqa: ANN001
        name = binding.name
        if binding.kind == "assign" and binding.value is not None:
            if not binding.unpacked:
                go(Ref(ref.module, binding.value))
                return
            element = self._unpacked(ref.module, binding)
            if element:
                # (The call unpacked, ``a, n = make(x)``, is on the way: who asks where ``x``
                # was handed over finds it.)
                via = (Ref(ref.module, binding.value),) if isinstance(
                    binding.value, cst.Call) else ()
                for item in element:
                    go(item, via=via)
                return
            stop(f"{name} is unpacked from {code(binding.value)}")
            return
        if binding.kind == "param" and isinstance(binding.stmt, cst.FunctionDef):
            self._trace_param(ref, binding.stmt, name, go, stop)
            return
        if binding.kind in ("def",):
            found.append(Trace(Ref(ref.module, binding.stmt), "", None, wraps, through))
            return
        if binding.kind == "import":
            value = self._imported_value(ref)
            if value is not None:
                go(value)
            else:
                found.append(Trace(ref, "", None, wraps, through))  # a library's object
            return
        if binding.kind == "for":
            stop(f"{name} is a loop variable")
            return
        if binding.kind == "with" and isinstance(binding.stmt, cst.With):
            # ``with tf.GradientTape() as tape``: what ``__enter__`` gives; the managers the
            # program traces (tapes, files) give themselves.
            for item in binding.stmt.items:
                target = item.asname.name if item.asname is not None else None
                if isinstance(target, cst.Name) and target.value == name:
                    go(Ref(ref.module, item.item))
                    return
            stop(f"{name} comes from a with statement")
            return
        stop(f"{name} is bound by {binding.kind}")

    def _unpacked(self, module: Module, binding: Binding) -> list[Ref]:
        """``a, b = x, y`` -> ``x``; ``a, b = make()`` -> the element of each tuple ``make``
        returns (in any module of the run)."""
        stmt = binding.stmt
        if not (isinstance(stmt, cst.Assign) and len(stmt.targets) == 1):
            return []
        target = stmt.targets[0].target
        if not isinstance(target, (cst.Tuple, cst.List)):
            return []
        elements = target.elements
        if any(isinstance(e, cst.StarredElement) for e in elements):
            return []
        names = [e.value.value if isinstance(e.value, cst.Name) else None for e in elements]
        if names.count(binding.name) != 1:
            return []
        position = names.index(binding.name)
        value = stmt.value
        if isinstance(value, (cst.Tuple, cst.List)) and len(value.elements) == len(names):
            element = value.elements[position]
            return [] if isinstance(element, cst.StarredElement) else [Ref(module, element.value)]
        if not isinstance(value, cst.Call):
            return []
        function = self.callee(Ref(module, value))
        if function is None or not isinstance(function.node, cst.FunctionDef):
            return []
        found = []
        for ret in _returns(function):
            returned = ret.value
            if isinstance(returned, (cst.Tuple, cst.List)) and len(returned.elements) == len(
                names
            ):
                element = returned.elements[position]
                if not isinstance(element, cst.StarredElement):
                    found.append(Ref(function.module, element.value))
        return found

    def _dataset_receiver(self, ref: Ref) -> bool:
        """Whether a ``tf.data``-style method call is made on a dataset (in a TensorFlow file; in
        a PyTorch one, on something that is no tensor: ``x.repeat(3)`` there is a tensor's)."""
        fm = ref.fm
        return fm.info.framework == "tensorflow" or "tensorflow" in fm.info.imports or (
            "keras" in " ".join(fm.info.imports)
        )

    def _trace_param(self, ref: Ref, function: cst.FunctionDef, name: str, go, stop) -> None:  # noqa: ANN001
        fref = Ref(ref.module, function)
        if name in ("self", "cls") and class_of(ref.fm, function) is not None:
            stop(f"{name} is the instance")
            return
        calls = self.callers(fref)
        param = _param_named(function, name)
        passed = 0
        for call in calls:
            assert isinstance(call.node, cst.Call)
            for arg in call.node.args:
                bound = _param_for(function, call.node, arg)
                if bound is not None and bound.name.value == name:
                    go(Ref(call.module, arg.value))
                    passed += 1
        if passed:
            return
        if param is not None and param.default is not None:
            go(Ref(ref.module, param.default))
            return
        if not calls:
            stop(f"{name} is a parameter of {function.name.value}(), which nothing in the "
                 "program calls")
        else:
            stop(f"{name} is a parameter of {function.name.value}() that its callers do not "
                 "pass by name")

    def _trace_attribute(self, ref, go, stop, found, wraps, through, depth) -> None:  # noqa: ANN001
        node = ref.node
        assert isinstance(node, cst.Attribute)
        attr = node.attr.value
        if _is_self(node.value):
            cls = _method_class(ref.fm, node)
            if cls is None:
                stop(f"{ref.code} is read outside a class")
                return
            values = self._attribute_values(Ref(ref.module, cls), attr, node)
            if not values:
                stop(f"{ref.code} is not assigned in the program")
            for value in values:
                go(value)
            return
        target = self._imported_value(ref)
        if target is not None:
            go(target)
            return
        if _library_name(ref):
            found.append(Trace(ref, "", None, wraps, through))  # ``torch.nn.Linear``
            return
        # ``learner.model``: an attribute of an instance of a class of the run.
        for trace in self.trace(Ref(ref.module, node.value), depth + 1):
            cls = self.instance_class(trace)
            if cls is not None:
                values = self._attribute_values(cls, attr, None)
                for value in values:
                    go(value)
                if values:
                    return
        stop(f"{ref.code} is an attribute the converter cannot follow")

    def _attribute_values(self, cls: Ref, attr: str, at: cst.CSTNode | None) -> list[Ref]:
        """The values ``self.<attr> = value`` gives in ``cls``, its bases and its subclasses;
        in the class of ``at`` itself, the last assignment before ``at`` in its method when there
        is one (``self.model = DDP(self.model)`` after ``self.model = Net()``)."""
        found: list[Ref] = []
        for owner in self.family(cls):
            index = file_index(owner.fm)
            for binding in index.attribute_bindings.get(f"self.{attr}", []):
                if binding.value is None or not _inside(owner.fm, binding.stmt, owner.node):
                    continue
                found.append(Ref(owner.module, binding.value))
        if at is not None and len(found) > 1:
            found = _last_before(cls.fm, found, at) or found
        return found

    def _trace_subscript(self, ref: Ref, go, stop) -> None:  # noqa: ANN001
        node = ref.node
        assert isinstance(node, cst.Subscript)
        key = _literal_index(node)
        container = node.value
        if isinstance(container, cst.Name) and isinstance(key, str):
            binding = file_index(ref.fm).reaching(container.value, container)
            if binding is not None and binding.kind == "param" and isinstance(
                binding.stmt, cst.FunctionDef
            ) and _is_kwargs(binding.stmt, container.value):
                self._trace_keyword(ref, binding.stmt, key, go, stop)
                return
        # ``loaders["train"]``, ``pair[0]``: the element of the literal the container is.
        for trace in self.trace(Ref(ref.module, container)):
            made = trace.made
            if made is None:
                continue
            element = _element(made.node, key)
            if element is not None:
                go(Ref(made.module, element))
                return
        stop(f"{ref.code} is picked from a value the converter cannot follow")

    def _trace_keyword(self, ref: Ref, function: cst.FunctionDef, key: str, go, stop) -> None:  # noqa: ANN001
        """``kwargs["model"]`` (or ``kwargs.get("model")``) of ``def f(**kwargs)``: what the
        callers pass as ``model=``."""
        passed = 0
        for call in self.callers(Ref(ref.module, function)):
            assert isinstance(call.node, cst.Call)
            for arg in call.node.args:
                if arg.keyword is not None and arg.keyword.value == key:
                    go(Ref(call.module, arg.value))
                    passed += 1
                elif arg.star == "**":
                    for trace in self.trace(Ref(call.module, arg.value)):
                        element = _element(trace.made.node, key) if trace.made else None
                        if element is not None and trace.made is not None:
                            go(Ref(trace.made.module, element))
                            passed += 1
        if not passed:
            stop(f"no caller of {function.name.value}() passes {key}=")

    def _trace_call(self, ref, go, stop, found, wraps, through) -> None:  # noqa: ANN001
        node = ref.node
        assert isinstance(node, cst.Call)
        func = node.func
        names = _names_of_call(ref)
        if any(q.rsplit(".", 1)[-1] in WRAPPERS for q in names) and node.args:
            go(Ref(ref.module, node.args[0].value), (ref,))
            return
        if names & ITERATING and node.args and node.args[0].keyword is None:
            go(Ref(ref.module, node.args[0].value))
            return
        if isinstance(func, cst.Attribute):
            method = func.attr.value
            # ``model.to(device)``, ``ds.batch(32)``: methods of a value (not ``np.random.shuffle``,
            # a function of a library module).
            of_value = not (isinstance(func.value, (cst.Name, cst.Attribute))
                            and _library_name(Ref(ref.module, func.value)))
            if method in SELF_METHODS and of_value:
                go(Ref(ref.module, func.value))
                return
            if method in DATASET_METHODS and of_value and self._dataset_receiver(ref):
                go(Ref(ref.module, func.value))
                return
            if method == "get" and node.args and isinstance(func.value, cst.Name):
                key = _string(node.args[0].value)
                binding = file_index(ref.fm).reaching(func.value.value, func.value)
                if key is not None and binding is not None and binding.kind == "param" and (
                    isinstance(binding.stmt, cst.FunctionDef)
                    and _is_kwargs(binding.stmt, func.value.value)
                ):
                    self._trace_keyword(ref, binding.stmt, key, go, stop)
                    return
        target = self.callee(ref)
        if target is not None and isinstance(target.node, cst.FunctionDef) and (
            class_of(target.fm, target.node) is None or not target.node.name.value.startswith("__")
        ):
            returns = [r for r in _returns(target) if r.value is not None]
            if returns:
                for ret in returns:
                    go(Ref(target.module, ret.value))  # type: ignore[arg-type]
                return
        # A class, a library call, a factory the converter cannot see into: the value is made
        # here, as far as the program shows.
        found.append(Trace(ref, "", None, wraps, through))

    # -- loops --------------------------------------------------------------------------------

    def driving_loops(self, ref: Ref, depth: int = 3) -> list[Ref]:
        """The loops that run ``ref``: those around it in its function, then those around each
        call of that function (any module), ``depth`` calls up; innermost first."""
        found: list[Ref] = []
        seen: set[tuple[str, int]] = set()
        frontier = [ref]
        for _ in range(depth + 1):
            following: list[Ref] = []
            for current in frontier:
                if current.key in seen:
                    continue
                seen.add(current.key)
                function = None
                for parent in current.fm.ancestors(current.node):
                    if isinstance(parent, (cst.For, cst.While)):
                        found.append(Ref(current.module, parent))
                    elif isinstance(parent, (cst.ListComp, cst.GeneratorExp, cst.SetComp,
                                             cst.DictComp)):
                        # ``[self.one_batch(x, y) for x, y in self.train_dl]``: its loops,
                        # innermost first.
                        loops = []
                        comp: cst.CompFor | None = parent.for_in
                        while comp is not None:
                            loops.append(Ref(current.module, comp))
                            comp = comp.inner_for_in
                        found.extend(reversed(loops))
                    elif isinstance(parent, cst.FunctionDef):
                        function = parent
                        break
                    elif isinstance(parent, (cst.ClassDef, cst.Lambda)):
                        break
                if function is not None:
                    following += self.callers(Ref(current.module, function))
            frontier = following
        unique: dict[tuple[str, int], Ref] = {}
        for loop in found:
            unique.setdefault(loop.key, loop)
        return list(unique.values())

    # -- the training of the program ----------------------------------------------------------

    def torch_steps(self, modules: Iterable[Module] | None = None) -> list[TorchStep]:
        """Every optimizer of ``modules`` (default: the run) stepped where a backward pass is
        computed: ``opt.step()`` (no arguments) or ``scaler.step(opt)``, whose optimizer is made
        from a model's parameters (whatever library made it: a torch optimizer, a project's own
        ``Optimizer`` subclass, ``transformers.AdamW``)."""
        found = []
        for module in modules if modules is not None else self.modules.values():
            fm = module.fm
            own = fm.info.framework in (None, "torch") and fm.method_calls("backward")
            if not own and not self._backward_elsewhere(module):
                continue
            for call in fm.method_calls("step"):
                stepped = _stepped(call)
                if stepped is None:
                    continue
                if _is_self(stepped):
                    continue  # a scheduler's (or a wrapper's) own ``self.step()``
                step = Ref(module, call)
                optimizer = Ref(module, stepped)
                traces = self.trace(optimizer)
                optimizers = [t for t in traces if t.made is None or self._is_optimizer(t.made)]
                if not any(t.made is not None for t in optimizers) and not _backward_near(
                    module.fm, call
                ):
                    continue  # nothing shows an optimizer: no backward pass before it either
                if not optimizers:
                    continue
                models: list[Trace] = []
                unknown = ""
                for trace in optimizers:
                    if trace.made is None:
                        continue
                    params = self.optimizer_params(trace.made)
                    if params is None:
                        first = _params_of(trace.made.node)
                        if first is None:
                            continue
                        params = Ref(trace.made.module, first)
                    got, why = self.models_of(params)
                    models += got
                    unknown = unknown or why
                found.append(TorchStep(step, optimizer, optimizers, models, unknown,
                                       self.driving_loops(step)))
        return found

    def _backward_elsewhere(self, module: Module) -> bool:
        """Whether the steps of ``module`` may follow a backward pass computed in another module
        (a ``step()`` in a helper the loop calls): a module that steps but never calls backward
        is checked when some module of the run computes one."""
        return bool(module.fm.method_calls("step")) and any(
            m.fm.method_calls("backward") for m in self.modules.values() if m is not module
        )

    def _is_optimizer(self, made: Ref, depth: int = 0) -> bool:
        """A call that makes an optimizer: it gets parameters (``SGD(model.parameters())``,
        ``AdamW(groups)``), and is no learning-rate scheduler (whose first argument is an
        optimizer: ``get_linear_schedule_with_warmup(optimizer, ...)``, whatever its name)."""
        node = made.node
        if not isinstance(node, cst.Call):
            return False
        names = _names_of_call(made)
        if any(".lr_scheduler." in q or q.endswith(("GradScaler", "Scheduler")) for q in names):
            return False
        if any(q.startswith("torch.optim.") for q in names):
            return True
        if self._given_an_optimizer(made, depth):
            return False
        return self.optimizer_params(made) is not None

    def _given_an_optimizer(self, made: Ref, depth: int) -> bool:
        """Whether the first argument of the call ``made`` is an optimizer (one wrapped in a
        ``DistributedOptimizer`` included): the call schedules or wraps that optimizer, it
        trains no parameters of its own."""
        first = _params_of(made.node)
        if first is None or depth > 2:
            return False
        return any(
            t.wrapped_by("DistributedOptimizer") is not None
            or (t.made is not None and t.made.node is not made.node
                and self._is_optimizer(t.made, depth + 1))
            for t in self.trace(Ref(made.module, first))
        )

    def optimizer_params(self, made: Ref) -> Ref | None:
        """The argument of an optimizer's constructor that holds a model's parameters: the
        first positional or ``params=`` (``AdamW(groups)``), or, for a config factory given the
        library and the parameters (``config.init_obj("optimizer", torch.optim, params)``), the
        argument that traces to a model's parameters. None for a factory given a scheduler's
        module (``config.init_obj("lr_scheduler", torch.optim.lr_scheduler, optimizer)``)."""
        node = made.node
        if not isinstance(node, cst.Call):
            return None
        first = _params_of(node)
        if first is not None and self.models_of(Ref(made.module, first))[0]:
            return Ref(made.module, first)
        if any(
            any("lr_scheduler" in q or q.endswith("Scheduler")
                for q in self.qualified(Ref(made.module, arg.value)))
            for arg in node.args
        ):
            return None
        for arg in node.args:
            if arg.value is first or arg.star or isinstance(arg.value, cst.SimpleString):
                continue
            if self.models_of(Ref(made.module, arg.value))[0]:
                return Ref(made.module, arg.value)
        return None

    def models_of(self, params: Ref) -> tuple[list[Trace], str]:
        """The models whose parameters ``params`` (an optimizer's first argument) holds:
        ``model.parameters()``, ``model.fc.parameters()``, parameter groups, lists built from
        ``model.named_parameters()``, in any module. Returns the traces of each model, and why
        none was found (or "")."""
        receivers: list[Ref] = []
        values: list[Ref] = []
        for trace in self.trace(params):
            values += [*trace.through, *([trace.made] if trace.made else [])]
        # The names inside a literal of parameter groups (``[{"params": biases}, ...]``): what
        # they hold too.
        for ref in list(values):
            if isinstance(ref.node, (cst.List, cst.Tuple, cst.Dict)):
                for node in _walk(ref.node):
                    if isinstance(node, cst.Name) and not isinstance(
                        ref.fm.parent(node), (cst.Attribute, cst.Call)
                    ):
                        for trace in self.trace(Ref(ref.module, node), depth=MAX_DEPTH - 8):
                            values += [*trace.through, *([trace.made] if trace.made else [])]
        for ref in values:
            receivers += _parameter_receivers(ref)
            receivers += self._appended_parameters(ref)
            receivers += self._instance_parameters(ref)
        arg = params.fm.parent(params.node)
        call = params.fm.parent(arg) if isinstance(arg, cst.Arg) else None
        if not receivers and isinstance(call, cst.Call):
            # A factory given the model itself (``create_optimizer_v2(model, "adamw")``).
            receivers = [Ref(params.module, n) for n in model_given(params.fm, call)]
        unique: dict[tuple[str, int], Ref] = {}
        for receiver in receivers:
            unique.setdefault(receiver.key, receiver)
        if not unique:
            return [], f"could not tell which model {params.code} holds the parameters of"
        traces: list[Trace] = []
        seen: set[tuple[str, int] | None] = set()
        for receiver in unique.values():
            for trace in self.trace(receiver):
                key = trace.made.key if trace.made is not None else None
                if key is not None and key in seen:
                    continue
                seen.add(key)
                traces.append(trace)
        return traces, ""

    def _instance_parameters(self, ref: Ref) -> list[Ref]:
        """``self.parameters()`` / ``self.named_parameters()`` in a method of a model's class
        (``model.configure_optimizers(config)`` building the optimizer from the model's own
        parameter groups): the object each call of the method is made on, in any module of the
        run (``model`` of ``model.configure_optimizers(config)``). A call on ``self`` again
        (another method of the class) gives nothing."""
        if not any(
            isinstance(node, cst.Call) and isinstance(node.func, cst.Attribute)
            and node.func.attr.value in ("parameters", "named_parameters")
            and isinstance(node.func.value, cst.Name) and node.func.value.value == "self"
            for node in _walk(ref.node)
        ):
            return []
        function = ref.fm.enclosing_function(ref.node)
        if function is None or class_of(ref.fm, function) is None:
            return []
        found = []
        for call in self.callers(Ref(ref.module, function)):
            func = call.node.func if isinstance(call.node, cst.Call) else None
            if isinstance(func, cst.Attribute) and not _is_self(func.value):
                found.append(Ref(call.module, func.value))
        return found

    def _appended_parameters(self, ref: Ref) -> list[Ref]:
        """``biases = []`` filled in a loop over ``model.named_parameters()``: that model."""
        node = ref.node
        if not is_empty_list(node):
            return []
        parent = ref.fm.parent(node)
        if not (isinstance(parent, cst.Assign) and len(parent.targets) == 1
                and isinstance(parent.targets[0].target, cst.Name)):
            return []
        index = file_index(ref.fm)
        binding = index.by_target.get(id(parent.targets[0].target))
        found: list[Ref] = []
        for use in index.uses(binding) if binding is not None else ():
            attribute = ref.fm.parent(use)
            call = ref.fm.parent(attribute) if isinstance(attribute, cst.Attribute) else None
            if not (isinstance(call, cst.Call) and isinstance(attribute, cst.Attribute)
                    and attribute.attr.value in ("append", "extend")):
                continue
            for parent_node in ref.fm.ancestors(call):
                if isinstance(parent_node, cst.For):
                    found += _parameter_receivers(Ref(ref.module, parent_node.iter))
                    break
        return found

    def unused_parameters(self, made: Ref) -> Ref | None:
        """The call in the ``forward`` of the class a model made by ``made`` is an instance of
        (in any module, or a base of it) that runs a trainable submodule under
        ``torch.no_grad()``: DDP needs ``find_unused_parameters=True`` for it."""
        cls = self.callee_of_made(made) if isinstance(made.node, cst.Call) else None
        if cls is None or not isinstance(cls.node, cst.ClassDef):
            return None
        for owner in [cls, *self.family(cls)]:
            if owner.key != cls.key and owner in self.subclasses(cls):
                continue
            call = no_grad_in_class(owner.fm, owner.node)  # type: ignore[arg-type]
            if call is not None:
                return Ref(owner.module, call)
        return None

    def keras_fits(self, modules: Iterable[Module] | None = None) -> list[KerasFit]:
        """Every ``fit`` of a Keras model, with the ``compile`` calls of the same model (in any
        module: a factory that compiles, a script that fits)."""
        fits = []
        chosen = list(modules if modules is not None else self.modules.values())
        compiles = [
            (Ref(module, call), self.made(Ref(module, call.func.value)))  # type: ignore[attr-defined]
            for module in self.modules.values() if module.fm.info.framework == "tensorflow"
            for call in module.fm.method_calls("compile")
            if isinstance(call.func, cst.Attribute)
        ]
        for module in chosen:
            # (``fit_generator`` too: a module the converter did not edit still calls it.)
            for call in (*module.fm.method_calls("fit"), *module.fm.method_calls("fit_generator")):
                if not isinstance(call.func, cst.Attribute):
                    continue
                ref = Ref(module, call)
                traces = self.trace(Ref(module, call.func.value))
                keys = {t.made.key for t in traces if t.made is not None}
                same = [c for c, made in compiles if any(m.key in keys for m in made)]
                # A fit in a module that imports no framework (``model.fit(train)`` on what
                # ``models.get_model()`` returns) is Keras's when its model is compiled so.
                if module.fm.info.framework == "tensorflow" or same:
                    fits.append(KerasFit(ref, traces, same))
        return fits

    def tape_steps(self, modules: Iterable[Module] | None = None) -> list[TapeStep]:
        """Every ``apply_gradients(zip(grads, ...))`` whose gradients come from
        ``tape.gradient(...)``, with the tapes' origins."""
        found = []
        for module in modules if modules is not None else self.modules.values():
            fm = module.fm
            for call in fm.method_calls("apply_gradients"):
                if not isinstance(call.func, cst.Attribute):
                    continue
                ref = Ref(module, call)
                optimizers = self.trace(Ref(module, call.func.value))
                tapes = []
                for gradient in _gradient_calls(self, ref):
                    receiver = gradient.node.func.value  # type: ignore[attr-defined]
                    tapes.append((gradient, self.trace(Ref(gradient.module, receiver))))
                found.append(TapeStep(ref, optimizers, tapes))
        return found


# -- helpers on nodes ------------------------------------------------------------------------


def _backward_near(fm: FileModel, call: cst.Call) -> bool:
    """A ``.backward()`` call in the function (or module body) that holds ``call``."""
    function = fm.enclosing_function(call)
    for backward in fm.method_calls("backward"):
        if fm.enclosing_function(backward) is function:
            return True
    return False


def _top_level(fm: FileModel, name: str) -> cst.CSTNode | None:
    found = None
    for stmt in fm.module.body:
        if isinstance(stmt, (cst.FunctionDef, cst.ClassDef)) and stmt.name.value == name:
            found = stmt
    return found


def _method_class(fm: FileModel, node: cst.CSTNode) -> cst.ClassDef | None:
    for parent in fm.ancestors(node):
        if isinstance(parent, cst.FunctionDef):
            cls = class_of(fm, parent)
            if cls is not None:
                return cls
    return None


def _inside(fm: FileModel, node: cst.CSTNode, outer: cst.CSTNode) -> bool:
    return any(parent is outer for parent in fm.ancestors(node))


def _is_self(expr: cst.BaseExpression) -> bool:
    return isinstance(expr, cst.Name) and expr.value == "self"


def _names_of_call(ref: Ref) -> set[str]:
    node = ref.node
    if not isinstance(node, cst.Call):
        return set()
    names = ref.fm.qualified_names(node.func)
    if not names:
        func = node.func
        if isinstance(func, cst.Attribute):
            names = {func.attr.value}
        elif isinstance(func, cst.Name):
            names = {func.value}
    return names


def _library_name(ref: Ref) -> bool:
    """Whether an expression names something of a library (``torch.nn``, ``tf.keras``), as its
    qualified name (from an import) shows."""
    for q in ref.fm.raw_qualified_names(ref.node):
        source = getattr(q, "source", None)
        if source is not None and getattr(source, "name", "") == "IMPORT":
            return True
    return False


def _returns(function: Ref) -> list[cst.Return]:
    return list(file_index(function.fm).returns.get(id(function.node), []))


def _param_named(function: cst.FunctionDef, name: str) -> cst.Param | None:
    params = function.params
    for param in (*params.posonly_params, *params.params, *params.kwonly_params):
        if param.name.value == name:
            return param
    return None


def _param_for(function: cst.FunctionDef, call: cst.Call, arg: cst.Arg) -> cst.Param | None:
    """The parameter ``arg`` binds; ``super().__init__(x)`` and ``Base.__init__(self, x)``
    bind as their spelling says."""
    func = call.func
    if isinstance(func, cst.Attribute) and not (
        isinstance(func.value, cst.Call) and m_is_super(func.value)
    ) and function.params.params and function.params.params[0].name.value == "self" and (
        call.args and isinstance(call.args[0].value, cst.Name)
        and call.args[0].value.value == "self" and function.name.value == func.attr.value
        and not _is_self(func.value)
    ):
        # ``Base.method(self, x)``: positions as written.
        params = [*function.params.posonly_params, *function.params.params]
        if arg.keyword is not None:
            return _param_named(function, arg.keyword.value)
        position = next(i for i, a in enumerate(call.args) if a is arg)
        return params[position] if position < len(params) else None
    return param_for_arg(function, call, arg)


def m_is_super(call: cst.Call) -> bool:
    return isinstance(call.func, cst.Name) and call.func.value == "super"


def _is_kwargs(function: cst.FunctionDef, name: str) -> bool:
    star = function.params.star_kwarg
    return star is not None and star.name.value == name


def _string(expr: cst.BaseExpression) -> str | None:
    if isinstance(expr, cst.SimpleString):
        value = expr.evaluated_value
        return value if isinstance(value, str) else None
    return None


def _literal_index(node: cst.Subscript) -> str | int | None:
    if len(node.slice) != 1 or not isinstance(node.slice[0].slice, cst.Index):
        return None
    value = node.slice[0].slice.value
    if isinstance(value, cst.Integer):
        return int(value.value)
    return _string(value)


def _element(container: cst.CSTNode, key: object) -> cst.BaseExpression | None:
    if key is None:
        return None
    if isinstance(container, cst.Dict):
        for element in container.elements:
            if isinstance(element, cst.DictElement) and _string(element.key) == key:
                return element.value
        return None
    if isinstance(container, cst.Call) and isinstance(container.func, cst.Name) and (
        container.func.value == "dict"
    ):
        for arg in container.args:
            if arg.keyword is not None and arg.keyword.value == key:
                return arg.value
        return None
    if isinstance(container, (cst.List, cst.Tuple)) and isinstance(key, int):
        elements = container.elements
        if any(isinstance(e, cst.StarredElement) for e in elements) or not (
            0 <= key < len(elements)
        ):
            return None
        return elements[key].value
    return None


def _last_before(fm: FileModel, values: list[Ref], at: cst.CSTNode) -> list[Ref]:
    """Of the assignments in the method that holds ``at``, the last one before it."""
    function = fm.enclosing_function(at)
    index = file_index(fm)
    here = [v for v in values if v.fm is fm and function is not None
            and _inside(fm, v.node, function) and index.is_before(v.node, at)
            and not _inside(fm, at, v.node)]
    return here[-1:] if here else []


def _stepped(call: cst.Call) -> cst.BaseExpression | None:
    """The optimizer ``call`` steps: ``opt`` of ``opt.step()``, ``opt`` of
    ``scaler.step(opt)``."""
    func = call.func
    if not isinstance(func, cst.Attribute) or func.attr.value != "step":
        return None
    if not call.args:
        return func.value
    scaler = "scaler" in code(func.value).lower()
    if len(call.args) == 1 and call.args[0].keyword is None and scaler:
        return call.args[0].value
    return None


def _params_of(node: cst.CSTNode) -> cst.BaseExpression | None:
    """The parameters argument of an optimizer's constructor (first positional, or
    ``params=``)."""
    if not isinstance(node, cst.Call):
        return None
    for arg in node.args:
        if arg.keyword is not None and arg.keyword.value in ("params", "parameters",
                                                             "model_params"):
            return arg.value
    first = node.args[0] if node.args else None
    if first is not None and first.keyword is None and not first.star:
        return first.value
    return None


def _parameter_receivers(ref: Ref) -> list[Ref]:
    """``model`` of every ``model.parameters()`` / ``model.fc.named_parameters()`` in ``ref``
    (the model: the name, or ``self.<attr>``, at the root of the chain)."""
    found = []
    for node in _walk(ref.node):
        if not (isinstance(node, cst.Call) and isinstance(node.func, cst.Attribute)
                and node.func.attr.value in ("parameters", "named_parameters")):
            continue
        root = _model_root(node.func.value)
        if root is not None:
            found.append(Ref(ref.module, root))
    return found


def _model_root(expr: cst.BaseExpression) -> cst.BaseExpression | None:
    chain: list[cst.Attribute] = []
    node: cst.BaseExpression = expr
    while isinstance(node, (cst.Attribute, cst.Subscript)):
        if isinstance(node, cst.Subscript):
            chain.clear()
        else:
            chain.append(node)
        node = node.value
    if isinstance(node, cst.Name):
        if node.value == "self":
            return chain[-1] if chain else None
        return node
    return expr if isinstance(expr, cst.Call) else None


def _walk(node: cst.CSTNode) -> Iterator[cst.CSTNode]:
    todo = [node]
    while todo:
        current = todo.pop()
        yield current
        if isinstance(current, (cst.FunctionDef, cst.ClassDef)):
            continue
        todo.extend(reversed(current.children))


def _gradient_calls(run: Run, apply: Ref) -> list[Ref]:
    """The ``tape.gradient(...)`` calls whose result ``apply`` applies (through ``grads``,
    ``zip(grads, vars)``, clipping)."""
    found: list[Ref] = []
    node = apply.node
    assert isinstance(node, cst.Call)
    for arg in node.args[:1]:
        for trace in run.trace(Ref(apply.module, arg.value)):
            for ref in (*trace.through, *([trace.made] if trace.made else [])):
                for inner in _walk(ref.node):
                    if isinstance(inner, cst.Call) and isinstance(inner.func, cst.Attribute) and (
                        inner.func.attr.value == "gradient"
                    ):
                        candidate = Ref(ref.module, inner)
                        if all(c.key != candidate.key for c in found):
                            found.append(candidate)
                # ``grads = tape.gradient(...)`` then ``zip(grads, ...)``: the names inside.
                for inner in _walk(ref.node):
                    if isinstance(inner, cst.Name) and inner is not ref.node:
                        for deeper in run.trace(Ref(ref.module, inner), depth=MAX_DEPTH - 4):
                            made = deeper.made
                            if made is not None and isinstance(made.node, cst.Call) and (
                                isinstance(made.node.func, cst.Attribute)
                                and made.node.func.attr.value == "gradient"
                                and all(c.key != made.key for c in found)
                            ):
                                found.append(made)
    return found


def index_of(fm: FileModel) -> FileIndex:
    return file_index(fm)


def modules_by_display(run: Run) -> Mapping[str, Module]:
    return {m.display: m for m in run.modules.values()}


def build_run(sources: Mapping[Path, tuple[str, bytes | str, bool]]) -> Run:
    """A ``Run`` of ``{path: (display name, source, written)}`` (files that do not parse are left
    out; the import graph still knows them)."""
    modules = []
    for path, (display, source, written) in sources.items():
        try:
            fm = FileModel.from_source(source)
        except Exception:  # noqa: BLE001 - a module that does not parse is not followed
            continue
        modules.append(Module(path, display, fm, written))
    data = {p: (s.encode() if isinstance(s, str) else s) for p, (_, s, _) in sources.items()}
    return Run(modules, Project(data))


def _classmethod_instantiations(cls: Ref) -> list[Ref]:
    """``cls(...)`` in the class's own classmethods (``def from_args(cls, args): ...
    return cls(config)``): each makes an instance of the class, as ``Cls(...)`` does."""
    assert isinstance(cls.node, cst.ClassDef)
    found = []
    for method in cls.node.body.body:
        if not isinstance(method, cst.FunctionDef) or not method.params.params or not any(
            isinstance(d.decorator, cst.Name) and d.decorator.value == "classmethod"
            for d in method.decorators
        ):
            continue
        first = method.params.params[0].name.value
        for node in _walk_calls(method.body):
            if isinstance(node.func, cst.Name) and node.func.value == first:
                found.append(Ref(cls.module, node))
    return found


def _walk_calls(node: cst.CSTNode) -> list[cst.Call]:
    return [n for n in findall(node, m.Call()) if isinstance(n, cst.Call)]


def _branch_bindings(index: FileIndex, name: cst.Name, binding: Binding) -> list[Binding]:
    """The assignments a read of ``name`` may see, in the order they come, where there are
    several (``if a: ds = f() elif b: ds = g()``, each branch its own); ``[binding]`` (the
    one that reaches it last) otherwise."""
    seen = index.referents(name)
    if len(seen) < 2 or not any(b is binding for b in seen) or any(
        b.kind != "assign" for b in seen
    ):
        return [binding]
    return seen
