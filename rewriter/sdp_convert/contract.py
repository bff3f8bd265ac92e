"""The whole-program contract: what a converted program must show, checked on its output.

The transforms recognise patterns; the long tail of real programs holds patterns they do not (a
Keras ``compile`` in another module, a model handed to a ``Learner(**kwargs)``, a module-level
script that calls ``engine.train``). Whatever the transforms did, this module reads the program
as it stands after the conversion (the converted text of every file of the run, the neighbours
as they are) and checks, for every entry point that trains, five parts:

1. ``init``: ``sdp.init()`` runs on the way from the entry (in it, or at import of a module it
   imports), if anything of the runtime is called at all;
2. ``averaging``: every optimizer that steps a model has its gradients averaged (the model wrapped
   in ``DistributedDataParallel``, the optimizer in ``DistributedOptimizer``, the tape in a
   ``DistributedGradientTape``, the Keras optimizer ``compile`` gets in ``DistributedOptimizer``);
3. ``data``: the training data is split (a ``DistributedSampler``, ``shard``);
4. ``state``: every rank starts from rank 0's weights (``DistributedDataParallel``,
   ``broadcast_parameters`` / ``broadcast_variables``, ``BroadcastGlobalVariablesCallback``);
5. ``writes``: files are written by rank 0 only and downloads run on local rank 0 first.

A part *holds* when the program shows it, is *noted* when a manual note of the conversion says
what a person must do about it, and is *missing* otherwise: then this module writes a manual
note at the spot (the optimizer, the loader, the write), so the file, and the run, read "needs
attention", never "converted". The check reads names as the files import them (``ast``, no
libcst): it is a second opinion on the transforms' work, not a copy of their analysis.
"""

from __future__ import annotations

import ast
import json
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path

from .changes import Change
from .modules import import_names, reachable_modules
from .program.vocab import CACHED_DOWNLOADS, EXTRACT_METHODS, EXTRACTIONS, FILE_DOWNLOADS

PARTS = ("init", "averaging", "data", "state", "writes")
_SKIP = "# sdp-convert: skip"
_TAG = {"downloads": "writes"}

#: Which transforms' manual notes speak for which part.
_NOTED_BY = {
    "init": {"add_runtime_init"},
    "averaging": {"wrap_model_ddp", "wrap_keras_fit", "wrap_gradient_tape", "flag_manual_steps",
                  "migrate_horovod", "migrate_smddp"},
    "data": {"shard_dataloader", "shard_tf_dataset", "wrap_keras_fit"},
    "state": {"broadcast_initial_state", "wrap_keras_fit", "wrap_gradient_tape"},
    "writes": {"guard_rank0_writes", "order_downloads", "barrier_before_reads"},
}

#: Programs distributed by other means: the converter leaves them alone, and so does the check.
_OTHER_DISTRIBUTION = (
    "torch.distributed.init_process_group", "torch.nn.parallel.DistributedDataParallel",
    "torch.multiprocessing.spawn", "torch.multiprocessing.Process", "deepspeed.",
    "accelerate.", "lightning.", "pytorch_lightning.", "horovod.", "smdistributed.",
    "tensorflow.distribute.", "torch.distributed.fsdp.",
)

_TORCH_OPTIMIZER = "torch.optim."
#: Calls that download or unpack into shared files (a network read into memory is none: the
#: write of what it returned is a write).
_DOWNLOADS = (*CACHED_DOWNLOADS, *FILE_DOWNLOADS, *EXTRACTIONS)
_WRITE_FUNCTIONS = ("torch.save", "numpy.save", "numpy.savez", "numpy.savetxt", "pickle.dump",
                    "json.dump", "shutil.copy", "shutil.copyfile", "shutil.move", "os.rename",
                    "matplotlib.pyplot.savefig")
_WRITE_METHODS = frozenset({"save_weights", "save_pretrained", "to_csv", "to_pickle",
                            "write_text", "write_bytes", "savefig"})


@dataclass(frozen=True)
class Spot:
    line: int
    col: int
    text: str


@dataclass
class ModuleView:
    """What the contract needs of one module, read from its (converted) text."""

    path: Path
    display: str
    #: In this run (converted and written); False: a neighbour read as it is.
    in_run: bool = True
    entry: bool = False
    #: The runtime's qualified names called here, with where.
    runtime: dict[str, list[Spot]] = field(default_factory=dict)
    init_at_import: bool = False
    #: Runtime calls made when the module runs (at import), before its own ``init()``.
    early_runtime: list[Spot] = field(default_factory=list)
    other_distribution: str = ""
    torch: bool = False
    tensorflow: bool = False
    optimizers: list[tuple[Spot, str, bool]] = field(default_factory=list)  # (at, root, wrapped)
    steps: list[Spot] = field(default_factory=list)
    backward: list[Spot] = field(default_factory=list)
    tapes: list[tuple[Spot, bool]] = field(default_factory=list)  # (at, distributed)
    apply_gradients: list[Spot] = field(default_factory=list)
    compiles: list[tuple[Spot, bool]] = field(default_factory=list)  # (at, distributed optimizer)
    fits: list[Spot] = field(default_factory=list)
    wrapped: set[str] = field(default_factory=set)
    loaders: list[tuple[Spot, bool]] = field(default_factory=list)  # (at, has sampler)
    writes: list[tuple[Spot, str]] = field(default_factory=list)  # unguarded (at, function)
    downloads: list[tuple[Spot, str]] = field(default_factory=list)  # unordered (at, function)
    #: The downloads above that rewrite their files each time (``extractall``, ``urlretrieve``).
    rewriting: set[Spot] = field(default_factory=set)
    #: Functions and methods called here under a rank-0 guard / anywhere (names).
    guarded_calls: set[str] = field(default_factory=set)
    calls: dict[str, int] = field(default_factory=dict)
    notes: list[Change] = field(default_factory=list)
    #: What the converter took the file for (``already distributed (...)``, ...).
    kind: str = ""
    shards: bool = False
    broadcasts: bool = False
    #: Lines the user opted out of (``# sdp-convert: skip`` on a statement's first line: the
    #: statement, its body included): nothing is said about them.
    opted_out: list[tuple[int, int]] = field(default_factory=list)
    distributed_tapes: int = 0
    distributed_optimizers: int = 0
    #: The names its imports bring in, as written (``.data.get_loaders``, ``utils.__module__``):
    #: ``modules.resolve_imports`` finds the project's modules among them.
    imports: list[str] = field(default_factory=list)

    @property
    def trains(self) -> bool:
        return bool(self.steps or self.apply_gradients or self.fits or self.compiles)


def read_module(path: Path, display: str, source: bytes | str, notes: Iterable[Change] = (),
                in_run: bool = True, notebook: bool = False, kind: str = "",
                lines: Callable[[int], int] | None = None) -> ModuleView | None:
    """The view of one module (None when it does not parse). ``lines`` maps a line of
    ``source`` to the line a report gives (that of the file as the user wrote it)."""
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return None
    view = ModuleView(path, display, in_run, notes=[c for c in notes if c.manual], kind=kind)
    mapped = lines or (lambda line: line)
    text = source.decode("utf-8", "replace") if isinstance(source, bytes) else source
    if _SKIP in text:
        rows = text.splitlines()
        view.opted_out = [
            (mapped(n.lineno), mapped(n.end_lineno or n.lineno)) for n in ast.walk(tree)
            if isinstance(n, ast.stmt) and n.lineno <= len(rows) and _SKIP in rows[n.lineno - 1]
        ]
    _Reader(view, mapped).read(tree, notebook)
    view.imports = import_names(tree)
    return view


# -- the cache's form of a view -----------------------------------------------------------------
# A warm run answers every file from the cache; the views of the files it checks are kept there
# too (``runner.check_contract``), in JSON with a tag for each container, so that reading one
# back gives the same view: a tuple stays a tuple, a set a set, a Spot a Spot.

def _encode(value: object) -> object:
    if isinstance(value, Spot):
        return ["S", value.line, value.col, value.text]
    if isinstance(value, Change):
        return ["C", value.line, value.col, value.transform, value.message, value.manual]
    if isinstance(value, (set, frozenset)):
        return ["s", sorted(_encode(v) for v in value)]  # type: ignore[type-var]
    if isinstance(value, tuple):
        return ["T", [_encode(v) for v in value]]
    if isinstance(value, list):
        return ["L", [_encode(v) for v in value]]
    if isinstance(value, dict):
        return ["D", [[k, _encode(v)] for k, v in value.items()]]
    if value is None or isinstance(value, (bool, int, str)):
        return value
    raise TypeError(f"a view holds a {type(value).__name__}")


def _decode(value: object) -> object:
    if not isinstance(value, list):
        return value
    tag, *rest = value
    if tag == "S":
        return Spot(*rest)
    if tag == "C":
        return Change(*rest)
    items = rest[0]
    if tag == "s":
        return {_decode(v) for v in items}
    if tag == "T":
        return tuple(_decode(v) for v in items)
    if tag == "L":
        return [_decode(v) for v in items]
    if tag == "D":
        return {k: _decode(v) for k, v in items}
    raise ValueError(f"unknown tag {tag!r}")


def view_to_bytes(view: ModuleView) -> bytes:
    """The view as the cache keeps it (its path and name are the caller's key, not kept)."""
    data = {f.name: _encode(getattr(view, f.name)) for f in fields(view)
            if f.name not in ("path", "display")}
    return json.dumps(data, separators=(",", ":")).encode()


def view_from_bytes(data: bytes, path: Path, display: str) -> ModuleView:
    """``view_to_bytes``'s view back, for ``path`` shown as ``display`` (ValueError, KeyError or
    TypeError when the data is not such a view)."""
    raw = json.loads(data)
    known = {f.name for f in fields(ModuleView)} - {"path", "display"}
    if set(raw) != known:
        raise ValueError("not a view of this version")
    return ModuleView(path, display, **{k: _decode(v) for k, v in raw.items()})


class _Reader(ast.NodeVisitor):
    def __init__(self, view: ModuleView, lines: Callable[[int], int]) -> None:
        self.view = view
        self.lines = lines
        self.names: dict[str, str] = {}
        self.guards = 0  # depth of rank-0 ``if``s / rank0_first blocks around the node
        self.function: list[str] = []
        self.rank0_first = 0
        self.parents: list[ast.AST] = []
        #: Names (and attributes) assigned a value computed from the rank: ``rank``,
        #: ``args.rank``, ``verbose = 1 if hvd.rank() == 0 else 0``.
        self.per_rank: set[str] = set()
        self.guarded_names: set[str] = set()
        self.named_callbacks: list[tuple[Spot, str, str]] = []

    # -- names ----------------------------------------------------------------------------------
    def qualified(self, node: ast.AST) -> str:
        if isinstance(node, ast.Name):
            return self.names.get(node.id, node.id)
        if isinstance(node, ast.Attribute):
            base = self.qualified(node.value)
            return f"{base}.{node.attr}" if base else ""
        if isinstance(node, ast.Call):
            return self.qualified(node.func) + "()"
        return ""

    def read(self, tree: ast.Module, notebook: bool) -> None:
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.asname:
                        self.names[alias.asname] = alias.name
                    else:
                        self.names.setdefault(alias.name.split(".")[0], alias.name.split(".")[0])
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                for alias in node.names:
                    self.names[alias.asname or alias.name] = f"{node.module}.{alias.name}"
        view = self.view
        roots = {v.split(".")[0] for v in self.names.values()}
        view.torch = "torch" in roots
        view.tensorflow = bool({"tensorflow", "keras"} & roots)
        view.entry = notebook or any(_is_main_guard(s) for s in tree.body) or _runs_calls(tree)
        view.init_at_import = any(
            isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Call)
            and _is_init(self.qualified(stmt.value.func)) for stmt in tree.body
        )
        for stmt in tree.body:
            if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) or (
                _is_main_guard(stmt)
            ):
                continue
            calls = [n for n in _walk_here(stmt) if isinstance(n, ast.Call)]
            if any(_is_init(self.qualified(c.func)) for c in calls):
                break
            view.early_runtime += [
                Spot(self.lines(c.lineno), c.col_offset + 1, ast.unparse(c.func)) for c in calls
                if self.qualified(c.func).startswith("sdp_runtime.")
                and not self.qualified(c.func).endswith(("is_initialized", "shutdown"))
            ]
        self.visit(tree)
        # A callback made on every rank writes only where it is handed to fit: on rank 0
        # only when its name is read under a rank-0 test (``[ckpt] if sdp.rank() == 0``).
        view.writes += [(spot, function) for spot, function, name in self.named_callbacks
                        if name not in self.guarded_names]

    # -- walk -----------------------------------------------------------------------------------
    def generic_visit(self, node: ast.AST) -> None:
        self.parents.append(node)
        super().generic_visit(node)
        self.parents.pop()

    def visit_FunctionDef(self, node: ast.FunctionDef | ast.AsyncFunctionDef) -> None:
        self.function.append(node.name)
        self.generic_visit(node)
        self.function.pop()

    visit_AsyncFunctionDef = visit_FunctionDef  # noqa: N815

    def visit_If(self, node: ast.If) -> None:
        rank0 = _rank0_test(self, node.test)
        self.parents.append(node)
        self.visit(node.test)
        self.guards += rank0
        for stmt in node.body:
            self.visit(stmt)
        self.guards -= rank0
        # ``if rank() != 0: return`` and the like: what follows is not guarded; kept simple.
        for stmt in node.orelse:
            self.visit(stmt)
        self.parents.pop()

    def visit_With(self, node: ast.With) -> None:
        first = any(self.qualified(item.context_expr).endswith(".rank0_first()")
                    for item in node.items)
        self.rank0_first += first
        self.generic_visit(node)
        self.rank0_first -= first

    def visit_Assign(self, node: ast.Assign) -> None:
        if isinstance(node.value, ast.Call) and _is_wrap(self.qualified(node.value.func)):
            for target in node.targets:
                self.view.wrapped.add(ast.unparse(target))
        if self.mentions_rank(node.value):
            for target in node.targets:
                for name in ast.walk(target):
                    if isinstance(name, (ast.Name, ast.Attribute)):
                        self.per_rank.add(ast.unparse(name))
        self.generic_visit(node)

    def visit_IfExp(self, node: ast.IfExp) -> None:
        rank0 = _rank0_test(self, node.test)
        self.parents.append(node)
        self.visit(node.test)
        self.guards += rank0
        self.visit(node.body)
        self.guards -= rank0
        self.visit(node.orelse)
        self.parents.pop()

    def visit_Name(self, node: ast.Name) -> None:
        if self.guards and isinstance(node.ctx, ast.Load):
            self.guarded_names.add(node.id)

    def visit_Attribute(self, node: ast.Attribute) -> None:
        # ``dataset.apply(sdp.shard)``: the runtime's shard, passed rather than called.
        if node.attr.startswith("shard") and self.qualified(node).startswith("sdp_runtime."):
            self.view.shards = True
        self.generic_visit(node)

    def visit_Subscript(self, node: ast.Subscript) -> None:
        # ``x[sdp.rank()::sdp.size()]``: a split by hand.
        if isinstance(node.slice, ast.Slice) and self.mentions_rank(node.slice):
            self.view.shards = True
        self.generic_visit(node)

    def mentions_rank(self, expr: ast.AST) -> bool:
        for n in ast.walk(expr):
            if isinstance(n, ast.Call) and _RANK_CALL.match(self.qualified(n.func).split(".")[-1]):
                return True
            if isinstance(n, (ast.Name, ast.Attribute)) and ast.unparse(n) in self.per_rank:
                return True
        return False

    def visit_Call(self, node: ast.Call) -> None:
        view = self.view
        name = self.qualified(node.func)
        spot = Spot(self.lines(node.lineno), node.col_offset + 1, ast.unparse(node.func))
        method = node.func.attr if isinstance(node.func, ast.Attribute) else ""
        short = method or (node.func.id if isinstance(node.func, ast.Name) else "")
        if short:
            view.calls[short] = view.calls.get(short, 0) + 1
            if self.guards:
                view.guarded_calls.add(short)
        if name.startswith("sdp_runtime."):
            view.runtime.setdefault(name, []).append(spot)
            if _is_wrap(name):
                for arg in node.args[:1]:
                    view.wrapped.add(ast.unparse(arg))
            last = name.rsplit(".", 1)[-1]
            view.broadcasts |= last.startswith("broadcast") or last == (
                "BroadcastGlobalVariablesCallback")
            view.distributed_tapes += last == "DistributedGradientTape"
            view.distributed_optimizers += last == "DistributedOptimizer"
            view.shards |= last.startswith("shard")
        if method == "shard" or name.endswith("DistributedSampler"):
            view.shards = True
        for prefix in _OTHER_DISTRIBUTION:
            if name.startswith(prefix) and not view.other_distribution:
                view.other_distribution = f"{name} at {view.display}:{spot.line}"
        if name.startswith(_TORCH_OPTIMIZER) and name.count(".") == 2 and \
                not name.startswith("torch.optim.lr_scheduler") and name[12:13].isupper():
            wrapped = any(_is_distributed_optimizer(self.qualified(p.func))
                          for p in self.parents if isinstance(p, ast.Call))
            view.optimizers.append((spot, _params_root(node), wrapped))
        elif method == "step" and not node.args and not node.keywords:
            view.steps.append(spot)
        elif method == "backward":
            view.backward.append(spot)
        elif method == "apply_gradients":
            view.apply_gradients.append(spot)
        elif method == "compile" and any(k.arg == "optimizer" for k in node.keywords):
            optimizer = next(k.value for k in node.keywords if k.arg == "optimizer")
            view.compiles.append((spot, "DistributedOptimizer" in ast.unparse(optimizer)
                                  or self._bound_to_distributed(optimizer)))
        elif method == "fit" and view.tensorflow:
            view.fits.append(spot)
        if name.endswith("GradientTape") and not name.startswith("sdp_runtime."):
            view.tapes.append((spot, False))
        if name.endswith("utils.data.DataLoader") or name == "torch.utils.data.DataLoader":
            sampler = next((k.value for k in node.keywords if k.arg in ("sampler",
                                                                       "batch_sampler")), None)
            view.loaders.append((spot, sampler is not None))
        function = self.function[-1] if self.function else ""
        parent = self.parents[-1] if self.parents else None
        if name.endswith("ModelCheckpoint") and isinstance(parent, ast.Assign) and \
                isinstance(parent.targets[0], ast.Name):
            self.named_callbacks.append((spot, function, parent.targets[0].id))
        elif not self.guards and _writes(self, node, name, method):
            view.writes.append((spot, function))
        if not self.guards and not self.rank0_first and _downloads(node, name) and not any(
            self.mentions_rank(a) for a in [*node.args, *(k.value for k in node.keywords)]
        ):  # a path of its own per rank (``f"mnist-{rank()}.npz"``) is no shared file
            view.downloads.append((spot, function))
            if name in FILE_DOWNLOADS or name in EXTRACTIONS or method in EXTRACT_METHODS:
                view.rewriting.add(spot)
        self.generic_visit(node)

    def _bound_to_distributed(self, expr: ast.expr) -> bool:
        return isinstance(expr, ast.Name) and expr.id in self.view.wrapped


def _is_wrap(name: str) -> bool:
    return name.startswith("sdp_runtime.") and name.endswith(
        ("DistributedDataParallel", "DistributedOptimizer", "DistributedModel")
    )


def _is_distributed_optimizer(name: str) -> bool:
    return name.startswith("sdp_runtime.") and name.endswith("DistributedOptimizer")


def _params_root(call: ast.Call) -> str:
    """``model`` for ``SGD(model.parameters())``, ``self.net`` for ``[{"params":
    self.net.fc.parameters()}]``: the object whose parameters the optimizer steps."""
    params = call.args[0] if call.args else next(
        (k.value for k in call.keywords if k.arg == "params"), None)
    if params is None:
        return ""
    for node in ast.walk(params):
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                and node.func.attr in ("parameters", "named_parameters")):
            return ast.unparse(node.func.value)
    return ast.unparse(params)


_RANK_CALL = re.compile(r"^(get_)?(local_)?rank$|^is_(local_)?main_process$|^process_index$")


def _rank0_test(reader: _Reader, test: ast.expr) -> int:
    """1 when ``test`` depends on the rank (``sdp.rank() == 0``, ``verbose``, ``is_main``)."""
    return int(reader.mentions_rank(test) or "is_main" in ast.unparse(test))


def _writes(reader: _Reader, node: ast.Call, name: str, method: str) -> bool:
    if name in _WRITE_FUNCTIONS or method in _WRITE_METHODS:
        return True
    if name.endswith("ModelCheckpoint") and "sdp_runtime" not in name:
        return True
    if name == "open" or name == "builtins.open":
        modes = list(node.args[1:2]) + [k.value for k in node.keywords if k.arg == "mode"]
        return any(isinstance(m, ast.Constant) and isinstance(m.value, str)
                   and set(m.value) & set("wax") for m in modes)
    # ``model.save(path)``: Keras; ``self.save(...)`` is a method of the program's own.
    receiver = node.func.value if isinstance(node.func, ast.Attribute) else None
    return (method == "save" and reader.view.tensorflow and not reader.view.torch
            and not (isinstance(receiver, ast.Name) and receiver.id == "self"))


def _downloads(node: ast.Call, name: str) -> bool:
    if isinstance(node.func, ast.Attribute) and node.func.attr in EXTRACT_METHODS:
        return True  # ``zipfile.ZipFile(p).extractall(d)``, ``tar.extractall(d)``
    if name in _DOWNLOADS or (name.startswith(("keras.datasets.", "tensorflow.keras.datasets."))
                              and name.endswith(".load_data")):
        return True
    if name.endswith(("keras.utils.get_file",)):
        return True
    return name.startswith("torchvision.datasets.") and any(
        k.arg == "download" and not (isinstance(k.value, ast.Constant) and not k.value.value)
        for k in node.keywords
    )


def _walk_here(node: ast.AST) -> list[ast.AST]:
    """The nodes of ``node`` that run with it (not the bodies of functions, lambdas and classes
    it defines)."""
    found: list[ast.AST] = []
    todo = [node]
    while todo:
        current = todo.pop()
        found.append(current)
        for child in ast.iter_child_nodes(current):
            if not isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef,
                                      ast.Lambda)):
                todo.append(child)
    return found


def _is_main_guard(stmt: ast.stmt) -> bool:
    return (
        isinstance(stmt, ast.If) and isinstance(stmt.test, ast.Compare)
        and isinstance(stmt.test.left, ast.Name) and stmt.test.left.id == "__name__"
    )


def _runs_calls(tree: ast.Module) -> bool:
    """A module-level script: it calls something at import besides setting up (a call statement
    or an assignment from a call that is not a definition's decorator)."""
    for stmt in tree.body:
        if isinstance(stmt, (ast.For, ast.While, ast.With)):
            return True
        value = getattr(stmt, "value", None)
        if isinstance(stmt, (ast.Expr, ast.Assign, ast.AnnAssign)) and isinstance(value, ast.Call):
            func = ast.unparse(value.func)
            if func.split(".")[-1] in ("fit", "train", "main", "run", "step", "backward") or \
                    func.startswith(("train", "engine.", "trainer.")):
                return True
    return False


# -- the program -------------------------------------------------------------------------------


@dataclass
class PartResult:
    state: str  # "holds", "noted", "missing", "n/a"
    detail: str = ""


@dataclass
class EntryResult:
    entry: str
    parts: dict[str, PartResult]
    #: Manual notes the check adds, by the file they go to.
    notes: dict[Path, list[Change]] = field(default_factory=dict)

    def as_json(self) -> dict[str, object]:
        return {"entry": self.entry,
                "parts": {k: {"state": v.state, "detail": v.detail} for k, v in self.parts.items()},
                "holds": all(p.state in ("holds", "noted", "n/a") for p in self.parts.values())}


def check_program(views: Mapping[Path, ModuleView],
                  imports: Mapping[Path, list[Path]]) -> list[EntryResult]:
    """Check every entry point of the run that trains (through any module it imports)."""
    results: list[EntryResult] = []
    for path, view in views.items():
        if not view.entry or not view.in_run:
            continue
        reach = [view, *(views[p] for p in reachable_modules(imports, path) if p in views)]
        if not any(v.trains for v in reach):
            continue
        if any(v.kind.startswith("already distributed") for v in reach) or (
            any(v.other_distribution for v in reach) and not any(v.runtime for v in reach)
        ):
            continue  # distributed by other means: the converter left it alone, and says so
        results.append(_check_entry(view, reach))
    return results


def _check_entry(entry: ModuleView, reach: list[ModuleView]) -> EntryResult:
    result = EntryResult(entry.display, {})
    refusal = next((n for v in reach for n in v.notes if n.message.startswith("not converted")),
                   None)
    if refusal is not None:
        # The converter declined the program, and said why: every part is that note's.
        result.parts = {part: PartResult("noted", refusal.message) for part in PARTS}
        return result

    def add(view: ModuleView, spot: Spot | None, part: str, message: str) -> None:
        line, col = (spot.line, spot.col) if spot else (1, 1)
        result.notes.setdefault(view.path, []).append(
            Change(line, col, "contract", f"{message} [{_TAG.get(part, part)}]", manual=True))

    def decide(part: str, missing: list[tuple[ModuleView, Spot | None, str]], holds: str,
               by: frozenset[str] | None = None) -> None:
        """``missing``: what the program lacks for ``part``; an item is noted where a manual
        note of a transform that speaks for it (``by``, else the part's) is in its module."""
        # A note written into the file by an earlier run (``# sdp-convert: manual - ...``)
        # comes back as ``manual_marker``: it still says what to do there.
        speakers = (by or _NOTED_BY[part]) | {"manual_marker"}
        uncovered = [item for item in missing if not any(
            n.transform in speakers for n in item[0].notes) and not _opted_out(*item[:2])]
        if not missing:
            result.parts[part] = PartResult("holds", holds)
        elif not uncovered:
            note = next((n.message for v in reach for n in v.notes if n.transform in speakers),
                        "opted out (# sdp-convert: skip)")
            result.parts[part] = PartResult("noted", note)
        else:
            result.parts[part] = PartResult("missing", uncovered[0][2])
            for view, spot, message in uncovered:
                add(view, spot, part, message)

    sdp = "sdp"
    runtime_used = any(v.runtime for v in reach)
    where_training = next(v for v in reach if v.trains)
    train_spot = (where_training.steps or where_training.apply_gradients or where_training.fits
                  or [c for c, _ in where_training.compiles] or [None])[0]
    train_at = (f"{where_training.display}:{train_spot.line}" if train_spot
                else where_training.display)

    # 1. init
    inits = [s for v in reach for n, spots in v.runtime.items() if _is_init(n) for s in spots]
    if not runtime_used and _opted_out(where_training, train_spot):
        result.parts = {part: PartResult("noted", "opted out (# sdp-convert: skip)")
                        for part in PARTS}
        return result
    if not runtime_used:
        decide("init", [(entry, None, (
            f"the training in {train_at}, run from {entry.display}, is not converted: nothing "
            "of it runs data-parallel (no sdp.init(), no wrapped model, no split data); "
            "convert it by hand, or give the converter the whole project"))], "")
    else:
        ok = any(_is_init(n) for n in entry.runtime) or any(v.init_at_import for v in reach)
        missing = [] if ok else [(entry, None, (
            f"sdp.init() is not called on the way from {entry.display} to the training in "
            f"{train_at}: call it first thing in {entry.display} (`import sdp_runtime.torch as "
            "sdp; sdp.init()`, or sdp_runtime.tensorflow)"))]
        # What runs at import runs before the entry's own init(): the entry imports first.
        for v in reach:
            for spot in v.early_runtime:
                where = ("before its sdp.init()" if v is entry else
                         f"when {entry.display} imports it, before sdp.init()")
                missing.append((v, spot, (
                    f"{spot.text}() runs {where} (NotInitializedError): move it after init(), "
                    "into the code that runs once the program has started")))
        decide("init", missing,
               ", ".join(f"{s.text}() at {next(v.display for v in reach if any(s in x for x in v.runtime.values()))}:{s.line}" for s in inits[:1]))  # noqa: E501 - one line: contract.py is being rewritten

    # 2. averaging, 4. initial state
    averaging: list[tuple[ModuleView, Spot | None, str]] = []
    state: list[tuple[ModuleView, Spot | None, str]] = []
    wrapped = {w for v in reach for w in v.wrapped}
    optimizers = [(v, o) for v in reach for o in v.optimizers]
    torch_training = any(v.steps for v in reach) and any(v.backward for v in reach)
    ddp = sum(len(spots) for v in reach for n, spots in v.runtime.items()
              if n.endswith(("DistributedDataParallel", "DistributedModel")))
    distributed_optimizers = sum(v.distributed_optimizers for v in reach)
    distributed_tapes = sum(v.distributed_tapes for v in reach)
    broadcasts = any(v.broadcasts for v in reach)
    if torch_training and optimizers:
        unwrapped = [(v, o) for v, o in optimizers if not o[2] and not _matches(o[1], wrapped)]
        if ddp + distributed_optimizers >= len(optimizers):
            unwrapped = []  # as many wraps as optimizers: each has its own (not followed here)
        for v, (spot, root, _) in unwrapped:
            what = f"`{root}`" if root else "a model"
            averaging.append((v, spot, (
                f"the optimizer {spot.text}(...) steps the parameters of {what} (trained in "
                f"{train_at}), which no {sdp}.DistributedDataParallel wraps in the program run "
                f"by {entry.display}: "
                "every rank would train its own copy; wrap the model where it is made "
                f"(`model = {sdp}.DistributedDataParallel(model)`) before the optimizer is "
                "built")))
        if not ddp and not broadcasts:
            v, (spot, _, _) = optimizers[0]
            state.append((v, spot, (
                f"every rank starts from its own random weights for the model {spot.text}(...) "
                f"steps: wrap it in {sdp}.DistributedDataParallel, or broadcast rank 0's "
                f"(`{sdp}.broadcast_parameters(model.state_dict(), root_rank=0)`)")))
    for v in reach:
        for spot, distributed in v.compiles:
            if not distributed and not distributed_tapes:
                averaging.append((v, spot, (
                    f"{spot.text}(optimizer=...) here builds the model that {entry.display} "
                    f"trains with fit, and its optimizer is not {sdp}.keras.DistributedOptimizer:"
                    " gradients are not averaged; wrap it: "
                    f"`optimizer={sdp}.keras.DistributedOptimizer(...)`")))
        plain = [spot for spot, _ in v.tapes]
        if v.apply_gradients and len(plain) > v.distributed_tapes + v.distributed_optimizers:
            for spot in plain:
                averaging.append((v, spot, (
                    f"{spot.text}() records gradients that apply_gradients applies unaveraged: "
                    f"wrap the tape (`tape = {sdp}.DistributedGradientTape(tape)`)")))
    keras_or_tapes = [v for v in reach if v.compiles or (v.tapes and v.apply_gradients)]
    if keras_or_tapes and not broadcasts:
        v = keras_or_tapes[0]
        spot = v.compiles[0][0] if v.compiles else v.tapes[0][0]
        state.append((v, spot, (
            "nothing broadcasts rank 0's initial weights: add "
            f"{sdp}.keras.callbacks.BroadcastGlobalVariablesCallback(0) to fit's callbacks, or "
            f"call {sdp}.broadcast_variables(model.variables, root_rank=0) after the first step")))
    decide("averaging", averaging, "gradients averaged")
    decide("state", state, "rank 0's initial state on every rank")

    # 3. data
    data: list[tuple[ModuleView, Spot | None, str]] = []
    split = any(v.shards for v in reach) or any(has for v in reach for _, has in v.loaders)
    if not split and torch_training:
        loaders = [(v, s) for v in reach for s, has in v.loaders if not has]
        for v, spot in loaders[:1]:
            data.append((v, spot, (
                f"the DataLoader built here feeds the training in {train_at} and has no "
                "DistributedSampler: every rank reads all of the data; give it "
                f"`sampler=DistributedSampler(dataset, num_replicas={sdp}.size(), "
                f"rank={sdp}.rank())`")))
        if not loaders:
            data.append((where_training, train_spot, (
                "no split of the training data was found for this training: give each rank its "
                f"own part (`x[{sdp}.rank()::{sdp}.size()]`, a DistributedSampler)")))
    elif not split and any(v.fits or v.apply_gradients for v in reach):
        v = next(v for v in reach if v.fits or v.apply_gradients)
        data.append((v, (v.fits or v.apply_gradients)[0], (
            "the data trained on here is not split between ranks: shard it "
            f"(`dataset.shard({sdp}.size(), {sdp}.rank())` before shuffle and batch, or "
            f"`x[{sdp}.rank()::{sdp}.size()]`)")))
    decide("data", data, "training data split")

    # 5. writes and downloads
    writes: list[tuple[ModuleView, Spot | None, str]] = []
    downloads: list[tuple[ModuleView, Spot | None, str]] = []
    guarded = {name for v in reach for name in v.guarded_calls}
    calls: dict[str, int] = {}
    for v in reach:
        for name, n in v.calls.items():
            calls[name] = calls.get(name, 0) + n
    for v in reach:
        for spot, function in v.writes:
            # In a function: guarded where every call is (the function runs on rank 0 only),
            # unknown where nothing here calls it by name (a callback's hook): not flagged.
            if function and (function in guarded or not calls.get(function)):
                continue
            writes.append((v, spot, (
                f"{spot.text}(...) writes on every rank: run it on rank 0 only "
                f"(`if {sdp}.rank() == 0:`)")))
        for spot, function in v.downloads:
            if function and (function in guarded or not calls.get(function)):
                continue
            downloads.append((v, spot, (
                f"{spot.text}(...) writes the same files on every rank at once: run it on rank "
                f"0 only (`if {sdp}.rank() == 0:`), then `{sdp}.barrier()`" if spot in v.rewriting
                else f"{spot.text}(...) downloads on every rank at once: run it in "
                f"`with {sdp}.rank0_first():`")))
    decide("writes", writes, "writes on rank 0",
           frozenset({"guard_rank0_writes", "barrier_before_reads"}))
    if not downloads:
        pass
    elif result.parts["writes"].state == "holds":
        decide("writes", downloads, "", frozenset({"order_downloads"}))
    else:
        decide("downloads", downloads, "", frozenset({"order_downloads"}))
        if result.parts.pop("downloads").state == "missing":
            result.parts["writes"].detail += "; " + downloads[0][2]
    return result


def _opted_out(view: ModuleView, spot: Spot | None) -> bool:
    return spot is not None and any(a <= spot.line <= b for a, b in view.opted_out)


def _is_init(name: str) -> bool:
    return name.startswith("sdp_runtime.") and name.endswith((".init", ".init_process_group"))


def _matches(root: str, wrapped: set[str]) -> bool:
    if not root:
        return False
    return any(root == w or root.startswith(w + ".") for w in wrapped)
