"""The whole-program contract: what a converted program must show, checked on its output.

Whatever the transforms did, this module reads the program as it stands after the conversion
(the converted text of every file of the run, the neighbours as they are) through the same
program model the conversion uses (``program.run.Run``: every module's ``FileModel``, values
followed across modules), and checks, for every entry point that trains, five parts:

1. ``init``: ``sdp.init()`` runs on the way from the entry (in it, or at import of a module it
   imports), if anything of the runtime is called at all;
2. ``averaging``: every optimizer stepped after a backward pass has its gradients averaged (each
   model whose parameters it steps is wrapped in ``DistributedDataParallel``, or the optimizer in
   ``DistributedOptimizer``); every tape whose gradients are applied is a
   ``DistributedGradientTape`` (or its optimizer a ``DistributedOptimizer``); every Keras model
   that is fit is compiled with a ``DistributedOptimizer``;
3. ``data``: the data each training loop reads is split between the ranks (a
   ``DistributedSampler`` on the loader it iterates, ``shard`` on the dataset ``fit`` reads, a
   split by the rank);
4. ``state``: every rank starts from rank 0's weights (``DistributedDataParallel``,
   ``broadcast_parameters`` / ``broadcast_variables``, ``BroadcastGlobalVariablesCallback``);
5. ``writes``: files are written by rank 0 only and downloads run on local rank 0 first.

Each part has one of three answers: it **holds** (the program shows it), it is **missing** (the
program shows that it is not there: the model made at ``main.py:22`` is wrapped nowhere), or it
is **unknown** (the model cannot prove either: the loader the loop reads could not be followed
back to where it is made). A part never holds where a manual note of the conversion speaks for it
(the note says what a person must still do), and "unknown" is never "holds": the report says
what could not be verified and that ``sdp-run --audit`` checks it at run time. Each finding is a
manual note at its spot (the model, the loader, the write), so the file and the run read "needs
attention", never "converted"; where the spot is in a file of the run, ``sdp_convert.projects``
repairs it first (``Finding.repair``) and the contract is checked again.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING

import libcst as cst
import libcst.matchers as m

from .changes import Change
from .program.deletions import DELETIONS, path_deletions
from .program.fetches import fetch_statements, file_fetches
from .program.flow import reaches
from .program.index import file_index, imported_names
from .program.models import moved_attribute
from .program.project import Repair, repair_code
from .program.rank_splits import split_by_rank
from .program.ranks import local_rank0_only, one_process_at_a_time, rank0_only
from .program.readback import private_write, read_path, written_path
from .program.run import (
    ITERATING,
    Module,
    Ref,
    Run,
    TapeStep,
    TorchStep,
    Trace,
    _names_of_call,
)
from .program.sample_lists import drawn_loaders, list_split
from .program.scopes import (
    assigned_values,
    callee,
    class_of,
    param_for_arg,
    referents,
    uses,
)
from .program.sharding import loader_problem
from .program.stream_splits import stream_splits
from .program.syntax import assigned_target, findall, is_none
from .program.tfshards import shards_at
from .program.training import training_facts
from .program.vocab import (
    CACHED_DOWNLOADS,
    DATA_PARALLEL_CHECKPOINTS,
    GROWN_FOR_DATA_PARALLEL,
    ONE_BRANCH_NOTE,
    UNSCALED_LR_NOTE,
)
from .program.writes import (
    FRAMEWORK_METHOD_WRITES,
    FRAMEWORK_WRITES,
    METHOD_WRITES,
    OPENERS,
    STREAM_WRITES,
    UNSEEN_WRITES,
    WRITES,
    argument,
    handle_names,
    in_memory,
    is_mode,
    module_function_call,
    open_mode,
    writes_in,
)

if TYPE_CHECKING:
    from .program.index import FileIndex
    from .program.model import FileModel

PARTS = ("init", "averaging", "data", "state", "writes")
AUDIT = "sdp-run --audit checks it at run time"

#: Which transforms' manual notes speak for which part.
NOTED_BY = {
    "init": frozenset({"add_runtime_init"}),
    "averaging": frozenset({"wrap_model_ddp", "wrap_keras_fit", "wrap_gradient_tape",
                            "flag_manual_steps", "migrate_horovod", "migrate_smddp"}),
    "data": frozenset({"shard_dataloader", "shard_shared_loader", "shard_tf_dataset",
                       "wrap_keras_fit"}),
    "state": frozenset({"broadcast_initial_state", "wrap_keras_fit", "wrap_gradient_tape"}),
    "writes": frozenset({"guard_rank0_writes", "order_downloads", "barrier_before_reads"}),
}

#: Programs distributed by other means: the converter leaves them alone, and so does the check.
OTHER_DISTRIBUTION = (
    "torch.distributed.init_process_group", "torch.nn.parallel.DistributedDataParallel",
    "torch.multiprocessing.spawn", "torch.multiprocessing.Process", "deepspeed.",
    "accelerate.", "lightning.", "pytorch_lightning.", "horovod.", "smdistributed.",
    "tensorflow.distribute.", "torch.distributed.fsdp.",
)

_SKIP = re.compile(r"#\s*sdp-convert:\s*skip\b")
#: A name or call that gives the rank (``rank``, ``args.local_rank``, ``smp.dp_rank()``).
_RANKISH = re.compile(
    r"(^|[._])(get_)?(local_|dp_|rdp_|tp_|pp_|mp_|global_)?rank(_id)?$|^process_index$"
    r"|(^|[._])is_(local_)?main_process$"
)


@dataclass
class Finding:
    """One thing a part lacks (``missing``) or cannot show (``unknown``), at a spot."""

    part: str
    state: str  # "missing" | "unknown"
    module: Module
    node: cst.CSTNode | None
    message: str
    repair: Repair | None = None


@dataclass
class PartResult:
    state: str  # "holds", "missing", "unknown", "n/a"
    detail: str = ""
    #: A manual note of the conversion (or an earlier run's marker) says what to do.
    noted: bool = False


@dataclass
class EntryResult:
    entry: str
    parts: dict[str, PartResult]
    #: The modules of the program (the entry and every module it imports), by display name.
    modules: tuple[str, ...] = ()
    findings: list[Finding] = field(default_factory=list)
    #: Manual notes the check adds, by the file they go to.
    notes: dict[Path, list[Change]] = field(default_factory=dict)
    #: The edits that would make missing parts hold, and the facts other modules' conversions
    #: need (``program.project.Repair``), for the files of the run that can take them.
    repairs: list[Repair] = field(default_factory=list)

    @property
    def holds(self) -> bool:
        return all(p.state in ("holds", "n/a") for p in self.parts.values())

    def as_json(self) -> dict[str, object]:
        return {
            "entry": self.entry,
            "parts": {k: {"state": v.state, "detail": v.detail, "noted": v.noted}
                      for k, v in self.parts.items()},
            "holds": self.holds,
            "modules": list(self.modules),
        }


@dataclass
class Context:
    """What the run knows of each module besides its text."""

    #: Manual notes of each module's conversion (and markers of earlier runs).
    notes: Mapping[Path, Sequence[Change]] = field(default_factory=dict)
    #: What the converter took each file for (``already distributed (...)``).
    kinds: Mapping[Path, str] = field(default_factory=dict)
    #: Line of the converted text -> line of the file as the user wrote it.
    lines: Mapping[Path, Callable[[int], int]] = field(default_factory=dict)
    #: A notebook's line (of its cells as one program) -> ``cell 4, line 11``: what the
    #: user finds in the notebook.
    cells: Mapping[Path, Callable[[int], str]] = field(default_factory=dict)
    #: Line of a node of each module (1 where unknown): the engine's positions.
    position: Callable[[Module, cst.CSTNode], tuple[int, int]] | None = None
    #: The modules each module imports (of the run).
    imports: Mapping[Path, Sequence[Path]] = field(default_factory=dict)
    #: The modules that could not be read, and why (they are not followed).
    unread: Mapping[Path, str] = field(default_factory=dict)


# -- entry points --------------------------------------------------------------------------------


def is_entry(module: Module) -> bool:
    """A notebook, a script with a ``__main__`` block, or a module-level script that runs its
    training (or a project function) when executed."""
    if module.notebook:
        return True
    body = module.fm.module.body
    if any(_is_main_guard(stmt) for stmt in body):
        return True
    for stmt in body:
        if isinstance(stmt, (cst.For, cst.While, cst.With)):
            return True
        if not isinstance(stmt, cst.SimpleStatementLine):
            continue
        for small in stmt.body:
            value = getattr(small, "value", None)
            if isinstance(small, (cst.Expr, cst.Assign, cst.AnnAssign)) and isinstance(
                value, cst.Call
            ):
                func = module.fm.code(value.func)
                if func.split(".")[-1] in ("fit", "fit_generator", "train", "main", "run", "step",
                                            "backward") or (
                    func.startswith(("train", "engine.", "trainer."))
                ):
                    return True
    return False


def _is_main_guard(stmt: cst.CSTNode) -> bool:
    if not isinstance(stmt, cst.If) or not isinstance(stmt.test, cst.Comparison):
        return False
    left = stmt.test.left
    return isinstance(left, cst.Name) and left.value == "__name__"


def reach_of(run: Run, entry: Module, imports: Mapping[Path, Sequence[Path]]) -> list[Module]:
    """The entry and every module of the run it imports, directly or not."""
    found = [entry]
    todo = list(imports.get(entry.path, ()))
    seen = {entry.path}
    while todo:
        path = todo.pop(0)
        if path in seen:
            continue
        seen.add(path)
        module = run.modules.get(path)
        if module is not None:
            found.append(module)
        todo.extend(imports.get(path, ()))
    return found


# -- the check ------------------------------------------------------------------------------------


def check_program(run: Run, context: Context) -> list[EntryResult]:
    """Check every entry point of the run that trains (through any module it imports)."""
    results: list[EntryResult] = []
    for module in run.modules.values():
        if not module.written or not is_entry(module):
            continue
        reach = reach_of(run, module, context.imports)
        result = _check_entry(run, module, reach, context)
        if result is not None:
            results.append(result)
    return results


def _runtime_calls(module: Module) -> dict[str, list[cst.Call]]:
    return {q: calls for q, calls in module.fm.info.calls.items() if q.startswith("sdp_runtime.")}


def _other_distribution(module: Module) -> bool:
    return any(q.startswith(OTHER_DISTRIBUTION) for q in module.fm.info.calls)


class _Entry:
    """The check of one entry point."""

    def __init__(self, run: Run, entry: Module, reach: list[Module], context: Context,
                 torch_steps: list[TorchStep], fits: list, tapes: list[TapeStep]) -> None:
        self.run = run
        self.entry = entry
        self.reach = reach
        # Classes a configuration picks (``getattr(module, spec["type"])(...)``): made, though no
        # call names them (``_rank0`` counts their methods as run, on every rank).
        self.picked: set[tuple[str, int]] = set()
        self.context = context
        self.torch_steps = torch_steps
        self.fits = fits
        self.tapes = tapes
        self.findings: list[Finding] = []
        self.runtime = {q: c for m in reach for q, c in _runtime_calls(m).items()}
        #: The name the entry binds the runtime as (``hvd`` after a Horovod migration).
        self.sdp = _runtime_name(entry)
        #: Per torch step (by key): its gradients are averaged, or will be once the repairs
        #: asked for are made.
        self.averaged: dict[tuple[str, int], bool] = {}
        #: Per torch step: the data loop and the loader it reads, and whether that data is
        #: split (or will be, by a repair).
        self.step_data: dict[tuple[str, int], tuple[Ref, Ref | None, bool]] = {}
        #: Repairs no finding carries (a write guarded at the calls of its helper).
        self.extra_repairs: list[Repair] = []
        #: Data made by a project batch-iterator class whose sample list a repair splits.
        self.list_splits: set[tuple[str, int]] = set()
        #: Per Keras fit: its data is split (or will be, by a repair).
        self.fit_data: dict[tuple[str, int], bool] = {}

    # -- where ---------------------------------------------------------------------------------

    def where(self, ref: Ref | None) -> str:
        if ref is None:
            return "?"
        line = self.line(ref.module, ref.node)
        cell = self.context.cells.get(ref.module.path)
        return f"{ref.module.display} {cell(line)}" if cell else f"{ref.module.display}:{line}"

    def line(self, module: Module, node: cst.CSTNode | None) -> int:
        if node is None or self.context.position is None:
            return 1
        line, _ = self.context.position(module, node)
        mapped = self.context.lines.get(module.path)
        return mapped(line) if mapped is not None else line

    def add(self, part: str, state: str, ref: Ref | None, message: str,
            repair: Repair | None = None, module: Module | None = None) -> None:
        self.findings.append(Finding(part, state, ref.module if ref else (module or self.entry),
                                     ref.node if ref else None, message, repair))

    def repairable(self, module: Module, kind: str = "") -> bool:
        """A file of the run the converter converts from a single-process script (not one
        already distributed, migrated or converted by hand). A notebook is one: its cells are
        converted as one program, the edits made in the cell that holds the site."""
        label = self.context.kinds.get(module.path, "")
        return module.written and not (
            label.startswith(("already", "horovod", "smddp", "smp", "not converted")))

    def repair(self, kind: str, ref: Ref | None, detail: str = "") -> Repair | None:
        if ref is None or not self.repairable(ref.module, kind):
            return None
        if isinstance(ref.node, cst.Module):  # the module as a whole
            return Repair(kind, ref.module.path, 1, "", detail)
        line = self.line(ref.module, ref.node)
        return Repair(kind, ref.module.path, line, repair_code(ref.fm, ref.node).strip(), detail)

    # -- init ----------------------------------------------------------------------------------

    def init(self) -> None:
        train_at = self.training_at()
        if not self.runtime:
            where = (f"{self.entry.display}" if train_at.startswith(self.entry.display)
                     else f"{self.entry.display}, which runs it")
            self.add("init", "missing", None, (
                f"the training in {train_at} ({where}) is not converted: nothing of it runs "
                "data-parallel (no sdp.init(), no wrapped model, no split data)"
                + self._why_not_converted()
            ), self._init_repair())
            return
        entry_init = any(_is_init(q) for q in _runtime_calls(self.entry))
        at_import = any(self._init_at_import(m) for m in self.reach)
        if not (entry_init or at_import):
            self.add("init", "missing", None, (
                f"sdp.init() is not called on the way from {self.entry.display} to the training "
                f"in {train_at}: call it first thing in {self.entry.display} (`import "
                "sdp_runtime.torch as sdp; sdp.init()`, or sdp_runtime.tensorflow)"),
                self._init_repair())
        started = self._tf_started_before_init() if at_import and not (
            entry_init or self.torch_steps) else None
        if started is not None:
            # (Pinned first here, the module's own pin is a no-op: TensorFlow returns early
            # from a setting that does not change.)
            self.add("init", "missing", None, (
                f"TensorFlow starts in {self.entry.display} at {started} before the sdp.init() "
                "and GPU pin of the module it imports later run (setting memory growth or the "
                "visible GPUs then raises RuntimeError): call sdp.init() and pin the GPU first "
                f"thing in {self.entry.display}"), self._init_repair())
        for module in self.reach:
            for call in _early_runtime(module):
                where = ("before its sdp.init()" if module is self.entry else
                         f"when {self.entry.display} imports it, before sdp.init()")
                text = module.fm.code(call.func)
                self.add("init", "missing", Ref(module, call), (
                    f"{text}() runs {where} (NotInitializedError): move it after init(), "
                    "into the code that runs once the program has started"))

    def _tf_started_before_init(self) -> str | None:
        """Where the entry's own code calls TensorFlow (or Keras) at its top level before the
        statement importing a module that initialises the runtime at import (a notebook's
        cells that build a model, then ``from train import *``); None where it does not."""
        fm = self.entry.fm
        initialising = {m.path.stem for m in self.reach
                        if m is not self.entry and self._init_at_import(m)}
        for stmt in fm.module.body:
            if isinstance(stmt, (cst.FunctionDef, cst.ClassDef)):
                continue
            small = stmt.body if isinstance(stmt, cst.SimpleStatementLine) else []
            names = [n.name for x in small if isinstance(x, cst.Import) for n in x.names] + [
                x.module for x in small if isinstance(x, cst.ImportFrom) and x.module]
            if any(fm.code(n).split(".")[-1] in initialising for n in names):
                return None
            for call in findall(stmt, m.Call()):
                if any(q.startswith(("tensorflow.", "keras.")) for q in fm.qualified_names(
                        call.func)):  # type: ignore[attr-defined]
                    return self.where(Ref(self.entry, call))
        return None

    def _init_repair(self) -> Repair | None:
        if not self.repairable(self.entry, "init"):
            return None
        framework = "torch" if self.torch_steps else "tensorflow"
        return Repair("init", self.entry.path, 1, "", self.training_at(), framework=framework)

    def _why_not_converted(self) -> str:
        outside = [m.display for m in self.reach if not m.written]
        if outside:
            return (f"; it is trained in {', '.join(outside)}, which this run only reads: give "
                    "the converter those files too")
        return ""

    @staticmethod
    def _init_at_import(module: Module) -> bool:
        for stmt in module.fm.module.body:
            if isinstance(stmt, cst.SimpleStatementLine):
                for small in stmt.body:
                    if isinstance(small, cst.Expr) and isinstance(small.value, cst.Call) and any(
                        _is_init(q) for q in module.fm.qualified_names(small.value.func)
                    ):
                        return True
        return False

    def training_at(self) -> str:
        first = (
            [s.step for s in self.torch_steps] + [f.fit for f in self.fits]
            + [t.apply for t in self.tapes]
        )
        return self.where(first[0]) if first else self.entry.display

    # -- averaging and state: PyTorch ----------------------------------------------------------

    def torch(self) -> None:
        wrapped = self._wrapped_models()
        broadcast = self._broadcast_models()
        for step in self.torch_steps:
            if any(t.wrapped_by("DistributedOptimizer") for t in step.optimizers):
                self.averaged[step.step.key] = True
                continue  # averaged by the optimizer; it broadcasts nothing: state below
            optimizer = next((t.made for t in step.optimizers if t.made is not None), None)
            what = optimizer.code.split("(")[0] if optimizer is not None else step.optimizer.code
            if step.models_unknown or not step.models:
                self.averaged[step.step.key] = False
                self.add("averaging", "unknown", step.step, (
                    f"{step.models_unknown or 'could not tell which model this optimizer steps'}"
                    f" ({what}, stepped here): whether its gradients are averaged is not "
                    f"verified; {AUDIT}"))
                if not any(
                    q.startswith(("sdp_runtime.", "torch.nn.parallel.")) and q.endswith((
                        "DistributedDataParallel", "DistributedModel", "broadcast_parameters"))
                    for module in self.reach for q in module.fm.info.calls
                ):
                    # Nothing in the program gives the ranks rank 0's weights: that they start
                    # alike is not known (a DDP wrap or a broadcast would make it so).
                    self.add("state", "unknown", step.step, (
                        f"no {self.sdp}.DistributedDataParallel wrap or broadcast_parameters in "
                        "the program gives every rank rank 0's initial weights for the model "
                        f"{what} steps (stepped here): whether the ranks start alike is not "
                        f"verified; {AUDIT}"))
                continue
            self.averaged[step.step.key] = all(
                [self._torch_model(step, trace, what, wrapped, broadcast)
                 for trace in step.models])

    def _torch_model(self, step: TorchStep, trace: Trace, what: str,
                     wrapped: set[tuple[str, int]], broadcast: set[tuple[str, int]]) -> bool:
        """Check one model an optimizer steps; whether its gradients are averaged (or will be,
        by a repair)."""
        made = trace.made
        if made is None:
            self.add("averaging", "unknown", trace.at or step.step, (
                f"the model {what} steps could not be followed to where it is made "
                f"({trace.stop}): whether its gradients are averaged is not verified; {AUDIT}"))
            return False
        if trace.wrapped_by("DistributedDataParallel", "DistributedModel") or (
            made.key in wrapped
        ):
            return self._unused_parameters(step, trace, made)
        if _frozen(made):
            if made.key not in broadcast:
                self.add("state", "missing", made, (
                    f"the frozen model made here ({_model_name(made)}) runs with each rank's own "
                    f"random weights: broadcast rank 0's (`{self.sdp}.broadcast_parameters("
                    "model.state_dict(), root_rank=0)`)"))
            return True  # no gradient: nothing to average
        site = self.wrap_site(trace) or made
        name = _model_name(site)
        repair = self.repair("wrap_model", site, self.where(step.step))
        self.add("averaging", "missing", site, (
            f"the model made here ({name}) is trained in {self.where(step.step)} by {what}, and "
            f"no {self.sdp}.DistributedDataParallel wraps it in the program run by "
            f"{self.entry.display}: every rank would train its own copy; wrap it where it is "
            f"made (`model = {self.sdp}.DistributedDataParallel(model)`)"), repair)
        if made.key not in broadcast:
            self.add("state", "missing", site, (
                f"every rank starts from its own random weights for the model made here "
                f"({name}): wrap it in {self.sdp}.DistributedDataParallel, or broadcast rank 0's "
                f"(`{self.sdp}.broadcast_parameters(model.state_dict(), root_rank=0)`)"))
        return repair is not None

    def _unused_parameters(self, step: TorchStep, trace: Trace, made: Ref) -> bool:
        """A wrapped model whose class runs a trainable submodule under ``torch.no_grad()``
        needs ``find_unused_parameters=True``, or DDP stops at the second step ("Expected to have
        finished reduction"). Whether it is averaged (or will be, by a repair)."""
        no_grad = self.run.unused_parameters(made)
        wrap = trace.wrapped_by("DistributedDataParallel", "DistributedModel")
        if no_grad is None or wrap is None:
            return True
        flag = _keyword(wrap.node, "find_unused_parameters")
        if isinstance(flag, cst.Name) and flag.value == "True":
            return True
        site = self.wrap_site(trace) or made
        repair = self.repair("unused_parameters", site, self.where(no_grad))
        self.add("averaging", "missing", wrap, (
            f"the model wrapped here runs {no_grad.code.split('(')[0]} under torch.no_grad() in "
            f"its forward ({self.where(no_grad)}): those parameters get no gradient, and DDP "
            "stops at the second step (\"Expected to have finished reduction\") unless it is "
            "wrapped with find_unused_parameters=True"), repair)
        return repair is not None

    def wrap_site(self, trace: Trace) -> Ref | None:
        """Where a model is made as far as the program names it: the first assignment of it on
        the way from the call that makes it to where it is trained, outside a factory that makes
        other things too (``config.init_obj("arch", module)``: the wrap goes after
        ``model = config.init_obj(...)``, not into the factory's ``return cls(**spec)``).

        A model moved to its device on the way (``self.model = self.model.to(self.device)`` in
        a trainer's ``__init__``) is wrapped after the move (a wrap before it would make DDP
        of a model still on the CPU), at the first local name it is then bound to
        (``model, config = self.model, self.config`` in the function of the loop): the object's
        attribute stays the plain model for whatever else reads it (callbacks that sample from
        it or save it on rank 0 alone, where a forward of the wrapper would wait for the other
        ranks), and only the loop calls the wrapper. Without such a name, the assignment after
        the move."""
        way = list(reversed(trace.through))  # from where it is made to where it is trained
        moved = max((i for i, ref in enumerate(way) if moved_attribute(ref.fm, ref.node)),
                    default=-1)
        candidates: list[tuple[Ref, cst.BaseExpression]] = []
        for ref in way if moved < 0 else way[moved:]:
            target = assigned_target(ref.fm, ref.node)
            if not isinstance(target, (cst.Name, cst.Attribute)):
                continue
            if moved < 0 and not isinstance(ref.fm.parent(ref.node), cst.Assign):
                continue
            function = ref.fm.enclosing_function(ref.node)
            trains = moved >= 0 and function is not None and (
                function is way[-1].fm.enclosing_function(way[-1].node))
            if function is not None and not trains and len(
                self.run.callers(Ref(ref.module, function))
            ) > 1:
                continue  # a factory called for several objects (not the function that trains)
            if moved < 0:
                return ref
            candidates.append((ref, target))
        local = next((ref for ref, target in candidates if isinstance(target, cst.Name)), None)
        return local or next((ref for ref, _ in candidates), None)

    def _wrapped_models(self) -> set[tuple[str, int]]:
        """Made sites of the models some DDP wrap (anywhere in the program) wraps."""
        found: set[tuple[str, int]] = set()
        for module in self.reach:
            for q, calls in module.fm.info.calls.items():
                if not (q.startswith("sdp_runtime.") or q.startswith("torch.nn.parallel.")):
                    continue
                if not q.endswith(("DistributedDataParallel", "DistributedModel")):
                    continue
                for call in calls:
                    if call.args:
                        found |= {m.key for m in self.run.made(Ref(module, call.args[0].value))}
        return found

    def _broadcast_models(self) -> set[tuple[str, int]]:
        found: set[tuple[str, int]] = set()
        for module in self.reach:
            for q, calls in module.fm.info.calls.items():
                if q.startswith("sdp_runtime.") and q.endswith(
                    ("broadcast_parameters", "broadcast_variables")
                ):
                    for call in calls:
                        for arg in call.args[:1]:
                            for ref in _receivers(Ref(module, arg.value)):
                                found |= {m.key for m in self.run.made(ref)}
        return found

    # -- averaging and state: TensorFlow and Keras --------------------------------------------

    def keras(self) -> None:
        broadcasts = any(q.endswith(("broadcast_variables", "BroadcastGlobalVariablesCallback",
                                     "broadcast_parameters")) for q in self.runtime)
        for fit in self.fits:
            if not fit.compiles:
                custom = self._custom_step_averages(fit)
                if custom is None:
                    self.add("averaging", "unknown", fit.fit, (
                        "the compile of the model this fit trains was not found in the program: "
                        f"whether its optimizer averages the gradients is not verified; {AUDIT}"))
            for compile_ref in fit.compiles:
                optimizer = _keyword(compile_ref.node, "optimizer")
                if optimizer is None:
                    continue
                traces = self.run.trace(Ref(compile_ref.module, optimizer))
                if traces and all(t.wrapped_by("DistributedOptimizer") for t in traces):
                    continue
                if self._custom_step_averages(fit):
                    continue
                self.add("averaging", "missing", compile_ref, (
                    f"{compile_ref.fm.code(compile_ref.node.func)}(optimizer=...) here builds the "  # type: ignore[attr-defined]
                    f"model that {self.where(fit.fit)} trains with fit, and its optimizer is not "
                    f"{self.sdp}.keras.DistributedOptimizer: gradients are not averaged; wrap it:"
                    f" `optimizer={self.sdp}.keras.DistributedOptimizer(...)`"),
                    self.repair("distributed_compile", compile_ref, self.where(fit.fit)))
            if not broadcasts and not self._callback(fit):
                self.add("state", "missing", fit.fit, (
                    "nothing broadcasts rank 0's initial weights: add "
                    f"{self.sdp}.keras.callbacks.BroadcastGlobalVariablesCallback(0) to fit's "
                    f"callbacks, or call {self.sdp}.broadcast_variables(model.variables, "
                    "root_rank=0) after the first step"),
                    # A fit whose model another module compiles: convert it as a training script.
                    self.repair("keras_fit", fit.fit) if not fit.fit.fm.info.training
                    and fit.compiles else None)

    def _callback(self, fit) -> bool:  # noqa: ANN001
        callbacks = _keyword(fit.fit.node, "callbacks")
        if callbacks is None:
            return False
        for trace in self.run.trace(Ref(fit.fit.module, callbacks)):
            for ref in (*trace.through, *([trace.made] if trace.made else [])):
                if "BroadcastGlobalVariablesCallback" in ref.code:
                    return True
        return False

    def _custom_step_averages(self, fit) -> bool | None:  # noqa: ANN001
        """A model class with its own ``train_step`` that records with a
        ``DistributedGradientTape``: True; with a plain tape: False; no such step: None."""
        for trace in fit.models:
            cls = self.run.instance_class(trace)
            step = self.run.method(cls, "train_step") if cls is not None else None
            if step is None:
                continue
            text = step.code
            return "DistributedGradientTape" in text or "DistributedOptimizer" in text
        return None

    def _seeded(self) -> bool:
        """Keras's initialisers seeded with one value on every rank
        (``keras.utils.set_random_seed(1234)`` at import of a module of the program): every rank
        draws the same initial weights (``tf.random.set_seed`` alone does not seed Keras 3)."""
        for module in self.reach:
            for q, calls in module.fm.info.calls.items():
                if not q.endswith("keras.utils.set_random_seed"):
                    continue
                for call in calls:
                    if module.fm.enclosing_function(call) is None and not any(
                        _mentions_rank(Ref(module, a.value)) for a in call.args
                    ):
                        return True
        return False

    def tape(self) -> None:
        broadcasts = any(q.endswith(("broadcast_variables", "BroadcastGlobalVariablesCallback"))
                         for q in self.runtime) or self._seeded()
        for step in self.tapes:
            if any(t.wrapped_by("DistributedOptimizer") for t in step.optimizers):
                continue
            if _in_train_step(step.apply) or self._runtime_gradients(step.apply):
                continue  # fit runs it, with the compile's optimizer (checked with the fit)
            if not step.tapes:
                self.add("averaging", "unknown", step.apply, (
                    "the gradients applied here could not be followed to the tape that records "
                    f"them: whether they are averaged is not verified; {AUDIT}"))
                continue
            for gradient, traces in step.tapes:
                for trace in traces:
                    if trace.wrapped_by("DistributedGradientTape"):
                        continue
                    if trace.made is None:
                        self.add("averaging", "unknown", gradient, (
                            f"the tape of this gradient could not be followed ({trace.stop}): "
                            f"whether the gradients are averaged is not verified; {AUDIT}"))
                        continue
                    self.add("averaging", "missing", trace.made, (
                        f"{trace.made.fm.code(trace.made.node.func)}() records gradients that "  # type: ignore[attr-defined]
                        f"{self.where(step.apply)} applies unaveraged: wrap the tape (`tape = "
                        f"{self.sdp}.DistributedGradientTape(tape)`)"))
        if self.tapes and not broadcasts and not self.fits:
            self.add("state", "missing", self.tapes[0].apply, (
                "nothing broadcasts rank 0's initial weights: call "
                f"{self.sdp}.broadcast_variables(model.variables, root_rank=0) after the first "
                "step"))

    def _runtime_gradients(self, apply: Ref) -> bool:
        """The gradients applied come out of a runtime collective (``sdp.allreduce``,
        ``smp.get_gradients``): averaged there."""
        node = apply.node
        assert isinstance(node, cst.Call)
        for arg in node.args[:1]:
            for trace in self.run.trace(Ref(apply.module, arg.value)):
                for ref in (*trace.through, *([trace.made] if trace.made else [])):
                    for inner in _walk_here(ref.node):
                        if isinstance(inner, cst.Call) and any(
                            q.startswith("sdp_runtime.") for q in ref.fm.qualified_names(
                                inner.func)
                        ):
                            return True
                        if isinstance(inner, cst.Name) and inner is not ref.node and any(
                            t.made is not None and isinstance(t.made.node, cst.Call) and any(
                                q.startswith("sdp_runtime.")
                                for q in t.made.fm.qualified_names(t.made.node.func))
                            for t in self.run.trace(Ref(ref.module, inner), depth=16)
                        ):
                            return True
        return False

    # -- data ----------------------------------------------------------------------------------

    def data(self) -> None:
        seen: dict[tuple[str, int], tuple[Ref | None, bool]] = {}
        for step in self.torch_steps:
            loop = _data_loop(step.loops, step.step)
            drawn = self._drawn_data(step.loops) if loop is None else None
            if drawn is not None:
                self.step_data[step.step.key] = drawn
                continue
            if loop is None and _reads_split_stream(step.loops):
                continue  # this rank's columns of a token-id tensor (``shard_token_stream``)
            if loop is None:
                self.add("data", "unknown", step.step, (
                    f"no loop over training data was found around {self.where(step.step)}: "
                    f"whether each rank reads its own part of the data is not verified; {AUDIT}"))
                continue
            if loop.key not in seen:
                seen[loop.key] = self._loop_data(loop, step.step)
            self.step_data[step.step.key] = (loop, *seen[loop.key])
        done: set[tuple[str, int]] = set(seen)
        for fit in self.fits:
            data = _keyword(fit.fit.node, "x") or (
                fit.fit.node.args[0].value if fit.fit.node.args  # type: ignore[attr-defined]
                and fit.fit.node.args[0].keyword is None else None  # type: ignore[attr-defined]
            )
            if data is None:
                continue
            self.fit_data[fit.fit.key] = split = self._tf_data(Ref(fit.fit.module, data),
                                                              fit.fit, fit.fit)
            if split and self._data_elsewhere(Ref(fit.fit.module, data)):
                # What fit reads is split at its source in another module: the fit's module
                # must not call it unsplit.
                self.extra_repairs += [r for r in [self.repair("known_dataset", fit.fit)] if r]
        for tape_step in self.tapes:
            if _in_train_step(tape_step.apply, method=True):
                continue  # fit's data (checked with the fit)
            loops = self.run.driving_loops(tape_step.apply)
            loop = _data_loop(loops, tape_step.apply)
            if loop is None:
                self.add("data", "unknown", tape_step.apply, (
                    f"no loop over training data was found around {self.where(tape_step.apply)}:"
                    f" whether each rank reads its own part of the data is not verified; {AUDIT}"))
                continue
            if loop.key in done:
                continue
            done.add(loop.key)
            if self._tf_data(_iterable(loop, tape_step.apply), tape_step.apply, loop) and (
                self._data_elsewhere(_iterable(loop, tape_step.apply))
                or self._split_in_class(_iterable(loop, tape_step.apply))
            ):
                # Split at its source in another module (``make_zip_dataset`` of data.py): the
                # loop's module learns it (no "not sharded" note, its step counts per worker).
                self.extra_repairs += [r for r in [self.repair("known_dataset", loop)] if r]

    def _drawn_data(self, loops: Iterable[Ref]) -> tuple[Ref, Ref | None, bool] | None:
        """A ``while`` loop around the step that draws its batches with a method of a class of
        the run (``train_dataset.get_batch()``, ``next()`` over DataLoaders the class builds:
        ``program.sample_lists.drawn_loaders``): the loaders get their DistributedSampler where
        they are built, and a new pass's ``iter(...)`` its ``set_epoch``, when the class is made
        once (for training only); the loop, the loader and whether it is (or will be) split."""
        for loop in loops:
            if not isinstance(loop.node, cst.While):
                continue
            for call in _walk_here(loop.node):
                if not (isinstance(call, cst.Call) and isinstance(call.func, cst.Attribute)):
                    continue
                method = self.run.callee(Ref(loop.module, call))
                owner = class_of(method.fm, method.node) if method is not None and isinstance(
                    method.node, cst.FunctionDef) else None
                found = drawn_loaders(method.fm, owner, method.node) if (  # type: ignore[union-attr, arg-type]
                    owner is not None) else None
                if found is None:
                    continue
                assert method is not None and owner is not None
                init = self.run.method(Ref(method.module, owner), "__init__")
                made = self.run.callers(init) if init is not None else []
                first = Ref(method.module, found.loaders[0])
                if len(made) != 1:
                    self.add("data", "unknown", first, (
                        f"the loop at {self.where(loop)} draws its batches from the DataLoaders "
                        f"{owner.name.value} builds here, and {owner.name.value} is made "
                        f"{len(made)} times: give the training one's loaders a "
                        "DistributedSampler by hand (the others may be evaluation data); "
                        f"{AUDIT}"))
                    return loop, None, False
                split = True
                for loader in found.loaders:
                    ref = Ref(method.module, loader)
                    sampler = _keyword(loader, "sampler") or _keyword(loader, "batch_sampler")
                    if sampler is not None:
                        split = split and all(
                            t.made is not None and any(q.endswith("DistributedSampler")
                                                       for q in _names_of_call(t.made))
                            for t in self.run.trace(Ref(method.module, sampler)))
                        if not split:
                            self.add("data", "unknown", ref, (
                                f"the DataLoader built here feeds the training loop at "
                                f"{self.where(loop)} with a sampler of its own: whether it "
                                f"splits the data is not verified; {AUDIT}"))
                        continue
                    repair = self.repair("shard_loader", ref, self.where(loop))
                    self.add("data", "missing", ref, (
                        f"the DataLoader built here feeds the training loop at "
                        f"{self.where(loop)} through {owner.name.value}.{method.node.name.value}() "
                        "and has no DistributedSampler: every rank reads all of the data"),
                        repair)
                    split = split and repair is not None and loader_problem(
                        method.fm, loader) is None
                if split:
                    for restart, _ in found.restarts:
                        self.extra_repairs += [r for r in [self.repair(
                            "restart_epoch", Ref(method.module, restart))] if r]
                    if method.module is not loop.module:
                        self.extra_repairs += [r for r in [self.repair(
                            "known_data", Ref(loop.module, call), self.where(first))] if r]
                return loop, first, split
        return None

    def _loop_data(self, loop: Ref, step: Ref) -> tuple[Ref | None, bool]:
        """Check the data one training loop reads: the loader it comes from (when one does),
        and whether it is split (or will be, by a repair)."""
        iterable = _iterable(loop, step)
        loader: Ref | None = None
        split = True
        for trace in self._iterable_traces(iterable):
            if _split_by_rank(trace) or self._splits_inside(trace):
                continue
            made = trace.made
            if made is None:
                split = False
                self.add("data", "unknown", trace.at or iterable, (
                    f"the data the loop at {self.where(loop)} reads could not be followed to "
                    f"where it is made ({trace.stop}): whether each rank reads its own part is "
                    f"not verified; {AUDIT}"))
                continue
            names = _names_of_call(made)
            if any(q.endswith("DataLoader") for q in names):
                loader = made
                split = self._loader(made, loop, trace) and split
            elif any(q.endswith(("distributed.DistributedSampler", "shard")) for q in names) or (
                isinstance(made.node, cst.Call)  # ``BucketIterator(sdp.shard(train), ...)``
                and any(_is_shard_arg(made, a.value) for a in made.node.args)
            ):
                continue
            else:
                split = False
                self.add("data", "unknown", made, (
                    f"the loop at {self.where(loop)} reads {_short(made.code)}" + (
                        self._loader_classes(made) or ", and the converter cannot tell whether "
                        "it gives each rank its own part of the data") + f"; {AUDIT}"))
        return loader, split

    def _loader_classes(self, made: Ref) -> str:
        """For a call handed a module of the run whose classes are DataLoader subclasses
        (``config.init_obj("data_loader", module_data)``: the configuration names the class),
        what they are and what to do: the converter does not split the data inside a
        DataLoader subclass (its sampler is the class's own, and it may serve evaluation too)."""
        if not isinstance(made.node, cst.Call):
            return ""
        for candidate in self._module_arguments(made):
            module = self.run.module_named(candidate)
            found = self.run.loader_classes(module) if module is not None else []
            if not found:
                continue
            # Their modules are the program's too (``datasets.MNIST(..., download=True)`` in
            # the class: the writes part reads them).
            for cls, base in found:
                self.picked.update((cls.key, base.key))
                for reached in (cls.module, base.module):
                    if all(m is not reached for m in self.reach):
                        self.reach.append(reached)
            names = ", ".join(sorted({c.node.name.value for c, _ in found}))  # type: ignore[attr-defined]
            bases = sorted({(self.where(b), b.node.name.value) for _, b in found})  # type: ignore[attr-defined]
            base = ", ".join(f"{name} at {where}" for where, name in bases)
            sdp = self.sdp
            return (
                f": an instance of a class of {module.display} that the call chooses ({names}), "  # type: ignore[union-attr]
                f"a DataLoader subclass ({base}) whose own sampler the converter does not "
                "replace (the class may build evaluation loaders too), so every rank may read "
                "all of the data; make the sampler it builds for training yield only this "
                "rank's part (a DistributedSampler with set_epoch(epoch) at the start of each "
                f"epoch, or indices[{sdp}.rank()::{sdp}.size()] of its training indices, the "
                f"same number on every rank) and scale the learning rate by {sdp}.size()")
        return ""

    def _module_arguments(self, made: Ref) -> list[Ref]:
        """The arguments of a call that may name a module (``init_obj("data", module_data)``),
        and for ``getattr(module, spec["type"])(...)`` inside a factory, what the factory's
        callers pass for ``module``."""
        node = made.node
        assert isinstance(node, cst.Call)
        found = [Ref(made.module, a.value) for a in node.args]
        func = node.func
        if not (isinstance(func, cst.Call) and isinstance(func.func, cst.Name)
                and func.func.value == "getattr" and func.args):
            return found
        first = func.args[0].value
        function = made.fm.enclosing_function(node)
        if not isinstance(first, cst.Name) or function is None:
            return found
        param = next((p for p in (*function.params.posonly_params, *function.params.params,
                                  *function.params.kwonly_params) if p.name.value == first.value),
                     None)
        if param is None:
            return [*found, Ref(made.module, first)]
        for caller in self.run.callers(Ref(made.module, function)):
            call = caller.node
            if isinstance(call, cst.Call):
                found += [Ref(caller.module, a.value) for a in call.args
                          if param_for_arg(function, call, a) is param]
        return found

    def _iterable_traces(self, iterable: Ref) -> list[Trace]:
        """Where what a loop reads is made: ``Run.trace`` follows the binding that reaches the
        loop; a name bound in ``if``/``elif`` branches (``loader = DataLoader(...)`` in each)
        may hold any of them, and each is checked."""
        traces = self.run.trace(iterable)
        node = iterable.node
        if not isinstance(node, cst.Name):
            return traces
        reaching = file_index(iterable.fm).reaching(node.value, node)
        for binding in referents(iterable.fm, node):
            if binding is reaching or binding.kind != "assign" or binding.unpacked or (
                binding.value is None
            ):
                continue
            traces += [t for t in self.run.trace(Ref(iterable.module, binding.value))
                       if t.made is None or all(t.made.key != k.made.key
                                                for k in traces if k.made is not None)]
        return traces

    def _split_in_class(self, data: Ref) -> bool:
        """The data is an instance of a project class whose sample list is split inside it
        (by a repair asked now, or already: ``Dataset(..., shard=True)``)."""
        for t in self.run.trace(data):
            if t.made is not None and t.made.key in self.list_splits:
                return True
            cls = self.run.instance_class(t)
            if cls is not None and cls.module is not data.module and self._splits_inside(t):
                return True
        return False

    def _data_elsewhere(self, data: Ref) -> bool:
        return any(t.made is not None and t.made.module is not data.module
                   for t in self.run.trace(data))

    def _split_arguments(self, trace: Trace) -> bool:
        """The source is made from values that are split (``from_tensor_slices((features,
        labels))`` in a helper called with ``sdp.shard(x_train)``)."""
        made = trace.made
        if made is None or not isinstance(made.node, cst.Call):
            return False
        values: list[cst.BaseExpression] = []
        for arg in made.node.args:
            value = arg.value
            values += [e.value for e in value.elements] if isinstance(
                value, (cst.Tuple, cst.List)) else [value]
        found = False
        for value in values:
            traces = self.run.trace(Ref(made.module, value), depth=8)
            if traces and all(_split_by_rank(t) or _sharded(t) for t in traces):
                found = True
            elif traces:
                return False
        return found

    def _splits_inside(self, trace: Trace) -> bool:
        """The data is made by a function of the program that splits it by the rank
        (``def batches(x): x = x[rank::size] ...``, a generator)."""
        made = trace.made
        if made is None or not isinstance(made.node, cst.Call):
            return False
        function = self.run.callee_of_made(made)
        return function is not None and isinstance(
            function.node, (cst.FunctionDef, cst.ClassDef)) and (
            _mentions_rank(function) or _calls_shard(function))

    def _loader(self, loader: Ref, loop: Ref, path: Trace) -> bool:
        """Check a DataLoader a training loop reads (``path``: how its value got there); whether
        it splits the data (or will, by a repair)."""
        node = loader.node
        assert isinstance(node, cst.Call)
        sampler = _keyword(node, "sampler") or _keyword(node, "batch_sampler")
        if sampler is not None:
            sampler = _flag_branch(loader, sampler, path)
            if is_none(sampler):
                sampler = None  # the flag is off on this path: no sampler
        if sampler is not None:
            split = True
            for trace in self.run.trace(Ref(loader.module, sampler)):
                if _split_by_rank(trace) or (trace.made is not None and any(
                    q.endswith("DistributedSampler") for q in _names_of_call(trace.made)
                )):
                    continue
                split = False
                if trace.made is None:
                    self.add("data", "unknown", loader, (
                        f"the sampler of the DataLoader built here could not be followed "
                        f"({trace.stop}): whether it splits the data is not verified; {AUDIT}"))
                    continue
                self.add("data", "missing", loader, (
                    f"the DataLoader built here feeds the training loop at {self.where(loop)}, and "
                    f"its sampler ({_short(trace.made.code)}) does not split the data between "
                    "ranks: every rank reads all of it; use a DistributedSampler"),
                    self.repair("shard_loader", loader, self.where(loop)))
                # Split only by a repair shard_dataloader can make (a plain
                # ``RandomSampler(ds)`` it replaces); another sampler keeps its manual note.
                split = self.findings[-1].repair is not None and (
                    loader_problem(loader.fm, node) is None)
            return split
        if split_by_rank(loader.fm, node):
            return True  # ``SplitDataset(ds).select(smp.dp_rank())``: this rank's part already
        dataset = node.args[0].value if node.args and node.args[0].keyword is None else (
            _keyword(node, "dataset"))
        if dataset is not None and any(
            _split_by_rank(t) or (t.made is not None and _iterable_dataset(t.made))
            for t in self.run.trace(Ref(loader.module, dataset))
        ):
            return True
        repair = self.repair("shard_loader", loader, self.where(loop))
        self.add("data", "missing", loader, (
            f"the DataLoader built here feeds the training loop at {self.where(loop)} and has no "
            "DistributedSampler: every rank reads all of the data; give it "
            f"`sampler=DistributedSampler(dataset, num_replicas={self.sdp}.size(), "
            f"rank={self.sdp}.rank())`"), repair)
        return repair is not None and loader_problem(loader.fm, node) is None

    def _tf_data(self, data: Ref, at: Ref, told: Ref | None = None) -> bool:
        """Check the data a fit (or a tape's loop, ``told``) trains on; whether it is split (or
        will be, by a repair) on every path that binds it. Where it is split on some paths
        only (``if a: ds = f() else: ds = g()``), every data line says which, and ``told``'s
        module learns it (``partly_split``: its notes say the same)."""
        first = len(self.findings)
        split_on: list[str] = []
        not_split: list[str] = []
        unknown: list[str] = []
        for trace in self._zip_inputs(self.run.trace(data, branches=True)):
            if _split_by_rank(trace) or _sharded(trace) or self._split_arguments(trace) or (
                self._splits_inside(trace)
            ):
                split_on.append(self._path_of(trace, data))
                continue
            made = trace.made
            not_split.append(self._path_of(trace, data))
            if made is None:
                unknown.append(not_split.pop())
                self.add("data", "unknown", trace.at or data, (
                    f"the data trained on at {self.where(at)} could not be followed to where it "
                    f"is made ({trace.stop}): whether each rank reads its own part is not "
                    f"verified; {AUDIT}"))
                continue
            names = _names_of_call(made)
            tf_data = any(q.startswith(("tensorflow.data.", "tensorflow.keras.utils.",
                                        "keras.utils.", "tensorflow_datasets."))
                          or q.endswith(("from_tensor_slices", "from_generator", "range",
                                         "_dataset_from_directory", "list_files", "TFRecordDataset",
                                         "TextLineDataset"))
                          for q in names)
            arrays = any(q.startswith(("numpy.", "tensorflow.keras.datasets.", "keras.datasets."))
                         for q in names) or isinstance(made.node, (cst.Name, cst.Subscript))
            if tf_data or arrays:
                # A source in a module that trains nothing itself: sharded there (a module that
                # trains has had its data decided by its own conversion).
                # (Where the rules of ``program.tfshards`` allow a shard: not after a shuffle or
                # batch, each input of a zip at its source.)
                site = _shard_site(trace, made)
                builder = self._builder(trace, made) if tf_data else None
                # A builder of the evaluation data too (called twice or more): its training
                # call's arrays, or nothing (never the evaluation data). A builder called once
                # whose pipeline cannot be sharded inside (it shuffles or batches what it is
                # given): the arrays (or paths) its call hands over, split at that call.
                repair, why = None, ""
                if builder is None or not builder[2]:
                    repair = self.repair("shard_dataset", site, self.where(at)) if tf_data and (
                        not made.fm.info.training) and shards_at(site.fm, site.node) else None
                if repair is None and builder is not None:
                    repair, why = self._argument_repair(trace, made, *builder)
                if repair is not None:  # split by the repair on this path
                    split_on.append(not_split.pop())
                self.add("data", "missing", made, (
                    f"the data trained on at {self.where(at)} comes from here and is not split "
                    f"between ranks{why}: shard it "
                    f"(`dataset.shard({self.sdp}.size(), {self.sdp}.rank())` before shuffle and "
                    f"batch, or `x[{self.sdp}.rank()::{self.sdp}.size()]`)"), repair)
            elif (repaired := self._list_repair(trace, made, at)) is not None:
                if repaired:  # split by the repair on this path
                    split_on.append(not_split.pop())
            else:
                unknown.append(not_split.pop())
                self.add("data", "unknown", made, (
                    f"the data trained on at {self.where(at)} comes from {_short(made.code)}, and "
                    "the converter cannot tell whether it gives each rank its own part; "
                    f"{AUDIT}"))
        if split_on and (not_split or unknown):
            partly = "partly split: " + "; ".join(
                f"{how} on the path{'s' * (len(paths) > 1)} {', '.join(paths)}"
                for how, paths in (("split", list(dict.fromkeys(split_on))),
                                   ("not split", list(dict.fromkeys(not_split))),
                                   ("not known whether split", list(dict.fromkeys(unknown))))
                if paths)
            for finding in self.findings[first:]:
                if finding.part == "data":
                    finding.message = f"{partly}: {finding.message}"
            self.extra_repairs += [r for r in [self.repair("partly_split", told, partly)] if r]
        return not not_split and not unknown

    def _zip_inputs(self, traces: list[Trace]) -> list[Trace]:
        """``traces``, with a ``tf.data.Dataset.zip((a, b))`` (unsplit itself) replaced by the
        traces of its inputs, each on the way through the zip: each input is split at its
        own source, or not."""
        found: list[Trace] = []
        for trace in traces:
            made = trace.made
            value = made.node.args[0].value if made is not None and isinstance(
                made.node, cst.Call) and made.node.args else None
            if not isinstance(value, (cst.Tuple, cst.List)) or not any(
                q.endswith("Dataset.zip") for q in _names_of_call(made)
            ) or _sharded(trace):
                found.append(trace)
                continue
            assert made is not None
            for element in value.elements:
                found += [replace(t, through=(*trace.through, *t.through)) for t in
                          self.run.trace(Ref(made.module, element.value), branches=True)]
        return found

    def _path_of(self, trace: Trace, data: Ref) -> str:
        """The way one path of the training data takes, for a reader: the function of another
        module it comes out of (``through make_32x32_dataset() (data.py:37)``), or where it
        stops."""
        out = next((r for r in trace.through if r.module is not data.module), trace.made)
        if out is None:
            return f"where {_short(trace.stop)} (not followed)"
        function = out.fm.enclosing_function(out.node)
        return f"through {function.name.value}() ({self.where(out)})" if function else (
            f"through {self.where(out)}")

    def _list_repair(self, trace: Trace, made: Ref, at: Ref) -> bool | None:
        """Data made by a batch-iterator class of the run whose sample list can be split where it
        is read (``program.sample_lists``): ask for that split (in the class's module) and for
        the flag at this construction; whether it will be split. None: no such class."""
        cls = self.run.instance_class(trace)
        found = list_split(cls.fm, cls.node) if cls is not None else None  # type: ignore[arg-type]
        if cls is None or found is None:
            return None
        repair = self.repair("shard_list", Ref(cls.module, found.call), found.flag)
        flag = self.repair("shard_list_call", made, found.flag)
        done = repair is not None and flag is not None
        self.add("data", "missing", made, (
            f"the data trained on at {self.where(at)} comes from {_short(made.code)}, a "
            f"{found.cls.name.value} of {self.where(cls)} that reads all of its sample list "
            f"(self.{found.attr}) on every rank: split that list by rank where "
            f"{found.method.name.value}() reads it, before it is shuffled"),
            repair if done else None)
        if done:
            assert flag is not None
            self.extra_repairs.append(flag)
            self.list_splits.add(made.key)
        return done

    def _builder(self, trace: Trace, made: Ref) -> tuple[cst.FunctionDef, Ref | None, bool] | None:
        """The function (or method) of the run that makes the training data at ``made``, with
        its call on the training data's way (None where it is not seen) and whether it is
        called elsewhere too (for the evaluation data, by another entry point, say); None for
        no function, or one nothing calls."""
        function = made.fm.enclosing_function(made.node)
        if function is None:
            return None
        calls = self.run.callers(Ref(made.module, function))
        if not calls:
            return None
        call = next((r for r in trace.through if isinstance(r.node, cst.Call)
                     and any(r.node is c.node for c in calls)), None)
        return function, call, len(calls) > 1

    def _argument_repair(self, trace: Trace, made: Ref, function: cst.FunctionDef,
                         call: Ref | None, shared: bool) -> tuple[Repair | None, str]:
        """``from_tensor_slices((x, y))`` of ``function``'s parameters: the arrays (or file
        paths) its training call passes are split there (``build(sdp.shard(x),
        sdp.shard(y))``), or where that call's function got them from its own caller on the
        training data's way (the outermost call that hands them over), when they come from no
        random draw and no listing of files (the same order on every rank). Else None, and
        why not (said in the note; "" where the shape is not this one)."""
        node = made.node
        if call is None or not isinstance(node, cst.Call) or not isinstance(
            call.node, cst.Call
        ) or not node.args or not any(
            q.endswith("from_tensor_slices") for q in _names_of_call(made)
        ):
            return None, ""
        positions = _param_positions(made.fm, node.args[0].value, function, call.node)
        if positions is None:
            return None, ""
        # Handed over from further out: ``def make(paths): return build(paths)``.
        inner: list[tuple[Ref, str]] = []
        while (outer := call.fm.enclosing_function(call.node)) is not None:
            calls = self.run.callers(Ref(call.module, outer))
            up = next((r for r in trace.through if isinstance(r.node, cst.Call)
                       and any(r.node is c.node for c in calls)), None)
            handed = None if up is None else _param_positions(
                call.fm, [call.node.args[p].value for p in positions], outer, up.node)
            if handed is None:
                break
            inner.append((call, function.name.value))
            function, call, positions, shared = outer, up, handed, len(calls) > 1
        assert isinstance(call.node, cst.Call)
        outer = call.fm.enclosing_function(call.node)
        traces = [t for p in positions for t in self.run.trace(
            Ref(call.module, call.node.args[p].value), branches=True)]
        listed: list[tuple[Trace, Ref]] = []
        for t in traces:
            names = _names_of_call(t.made) if t.made is not None else set()
            if any(".random" in q for q in names):
                return None, ""
            # (A listing helper of the program's, ``py.glob(...)``, is on the way: the one
            # nearest the split.)
            listing = next((r for r in (*t.through, t.made) if r is not None and isinstance(
                r.node, cst.Call) and any(q.rsplit(".", 1)[-1] in _LISTINGS
                                          for q in _names_of_call(r))), None)
            # A listing inside what makes them (``[join(d, f) for f in os.listdir(d)]``,
            # ``list(os.scandir(d))``), but ``sorted(...)``: not sorted here (its items may not
            # sort), so not split.
            within = None if t.made is None or listing is not None or any(
                q.rsplit(".", 1)[-1] == "sorted" for q in names) else next((
                ref for ref in (Ref(t.made.module, c) for c in findall(t.made.node, m.Call()))
                if any(q.rsplit(".", 1)[-1] in _LISTINGS for q in _names_of_call(ref))), None)
            if listing is None and within is None:
                continue
            last = {q.rsplit(".", 1)[-1] for q in _names_of_call(listing)} if listing else set()
            listing = listing or within
            assert listing is not None
            if not last & _SORTABLE or not self.repairable(listing.module, "sort_listing"):
                return None, (
                    f" (the file paths handed to {function.name.value}() at {self.where(call)} "
                    f"come from {_short(listing.code)} at {self.where(listing)}, a listing whose "
                    "order may differ between ranks, so their parts would overlap: sort it, "
                    "`sorted(...)`, before it is split)")
            listed.append((t, listing))
        callers = [c.node for c in self.run.callers(Ref(call.module, outer))] if outer else []
        for t in traces:
            if any(t is seen for seen, _ in listed):
                continue  # a list of paths, whole, sorted where it is listed (below)
            if t.made is not None and isinstance(t.made.node, (cst.Tuple, cst.List)) or any(
                r.node is a.value for r in t.through for c in callers
                if isinstance(c, cst.Call) for a in c.args
            ):
                # Packed here (not followed), or from the caller of the function that hands
                # them over (which could not be followed out to it).
                return None, ""
        # The calls inside, which pass the split arrays on (their module learns that what they
        # make is split: no note there), with no arrays of their own to split.
        self.extra_repairs += [r for c, name in inner
                               if (r := self.repair("shard_arguments", c, f"{name}:"))]
        # Paths listed in the file system's order, which may differ between ranks: sorted
        # where they are listed, so that every rank splits the same list (and whatever the
        # program derives from them follows the same order).
        self.extra_repairs += [r for _, listing in listed
                               if (r := self.repair("sort_listing", listing, self.where(call)))]
        return self.repair("shard_arguments", call, f"{function.name.value}:"
                           f"{','.join(map(str, positions))}{'' if shared else ':once'}"), ""

    # -- writes and downloads ------------------------------------------------------------------

    def writes(self) -> None:
        for module in self.reach:
            framework = module.fm.info.framework or ("torch" if "torch" in module.fm.info.imports
                                                      else "tensorflow")
            # A write that is part of a download (``f.write(urlopen(url).read())``) goes with
            # the download below, whole: never on its own.
            fetched = [s for call in file_fetches(module.fm)
                       for s in fetch_statements(module.fm, call)]
            for call, what in _writes(module, framework):
                if any(p in fetched for p in module.fm.ancestors(call)):
                    continue
                if self._rank0(module, call) or _per_process(module, call, framework) or (
                    self._script_only(module, call) or self._switched_off(module, call)
                ):
                    continue
                function = module.fm.enclosing_function(call)
                if function is not None and _reads_back(module, function, call, framework):
                    name = function.name.value
                    self.add("writes", "missing", Ref(module, call), (
                        f"{what}(...) writes on every rank a file that {name}() reads back (a "
                        "cache): let each machine's first process build it before the others "
                        f"(`with {_runtime_name(module)}.rank0_first():` around the call of "
                        f"{name}()), which then read it whole instead of writing it again"))
                    continue
                if local_rank0_only(module.fm, call):
                    self.add("writes", "unknown", Ref(module, call), (
                        f"{what}(...) writes on the first process of each machine (a local "
                        "rank test): on one machine that is rank 0 alone; on several machines "
                        "that share a file system each writes the same file (test "
                        f"`{_runtime_name(module)}.rank() == 0` to write it once)"))
                    continue
                self.add("writes", "missing", Ref(module, call), (
                    f"{what}(...) writes on every rank: run it on rank 0 only "
                    f"(`if {_runtime_name(module)}.rank() == 0:`)"))
                other = self._other_user(module, call) if module is not self.entry else None
                helper = module.fm.enclosing_function(call)
                if other is not None and helper is not None and module.fm.parent(
                    helper) is module.fm.module and not self._may_run(self.entry, module, call):
                    # A module-level function only other scripts run (``detect_image`` of
                    # utils.py): no write of this program. (A method may be run through a class
                    # a configuration picks by its name: kept.)
                    self.findings.pop()
                    continue
                if other is not None:
                    # ``if rank() == 0:`` there would raise NotInitializedError in that script:
                    # said, not made (as for downloads).
                    self.findings[-1].message += (
                        f" (not made: {other.display} imports {module.display} too and runs "
                        f"without {_runtime_name(module)}.init())")
                    continue
                self.findings[-1].repair, extra = self.guard_repairs(module, call)
                self.extra_repairs += extra
            mkdirs = _strict_mkdirs(module)
            for call, why in (*_unseen_writes(module), *mkdirs):
                if self._rank0(module, call) or self._script_only(module, call) or _per_rank(
                    module, call
                ) or ((call, why) in mkdirs and any(  # the script handles FileExistsError
                    isinstance(p, cst.Try) for p in module.fm.ancestors(call))):
                    continue
                self.add("writes", "unknown" if why.startswith("may") else "missing",
                         Ref(module, call), f"{fm_code(module, call)} {why}".replace(
                             "{sdp}", _runtime_name(module)))
            for call, what, rewriting in _downloads(module):
                if self._rank0(module, call) or one_process_at_a_time(module.fm, call) or _per_rank(
                    module, call
                ) or local_rank0_only(module.fm, call) or self._script_only(module, call):
                    continue
                sdp = _runtime_name(module)
                how = (f"run it on rank 0 only (`if {sdp}.rank() == 0:`), then `{sdp}.barrier()`"
                       if rewriting else f"run it in `with {sdp}.rank0_first():`")
                early = self._before_init(module, call)
                if early is not None:
                    # At import, before init(): the rank test would raise NotInitializedError.
                    how = (f"it runs at import, before {sdp}.init() ({self.where(early)}): move it "
                           f"after {sdp}.init() ({_after_init(module, early)}, before what reads "
                           f"its files), and there {how}")
                self.add("writes", "missing", Ref(module, call), (
                    f"{what}(...) writes the same files on every rank at once: {how}"
                    if rewriting else f"{what}(...) downloads on every rank at once: {how}"))
                # In a module that trains nothing (a data module), ``order_downloads`` puts it
                # there; a module that trains has had it decided by its own conversion.
                self.findings[-1].repair = self._fetch_repair(module, call)

    def _fetch_repair(self, module: Module, call: cst.Call) -> Repair | None:
        """``fetch``, in a module that trains nothing (a data module: ``order_downloads`` puts
        it there; a module that trains has had it decided by its own conversion), with the
        program's framework where the module names none (``torchvision`` alone)."""
        repair = (self.repair("fetch", Ref(module, call)) if not module.fm.info.training
                  else None)
        other = self._other_user(module, call)
        if repair is not None and other is not None:
            # ``rank0_first()`` there would raise NotInitializedError in that script: said, not
            # made (``_other_user``).
            self.findings[-1].message += (
                f" (not made: {other.display} imports {module.display} too and runs without "
                f"{_runtime_name(module)}.init())")
            return None
        if repair is None or module.fm.info.framework is not None:
            return repair
        framework = "torch" if self.torch_steps else "tensorflow"
        return replace(repair, framework=framework)

    def _other_user(self, module: Module, call: cst.Call) -> Module | None:
        """Another script of the run (``test.py``) that imports ``module``, may run ``call``
        (``_may_run``) and never starts the runtime: a runtime call added there would raise."""
        for other in self.run.modules.values():
            if other is self.entry or other is module or not is_entry(other):
                continue
            # (A folder without ``__init__.py`` next to the script: ``import
            # data_loader.data_loaders``, which the import graph does not resolve.)
            imported = module.path in self.context.imports.get(other.path, ()) or any(
                other.path.parent.joinpath(*name.split(".")).with_suffix(".py") == module.path
                for name in other.fm.info.imports)
            if imported and not _runtime_calls(other) and self._may_run(other, module, call):
                return other
        return None

    def _may_run(self, other: Module, module: Module, call: cst.Call) -> bool:
        """Whether ``other`` may run ``call`` of ``module``: the function around it is called,
        through its callers, from ``other`` (a script that only reads a class's constant or
        static method, ``VOCSegmentation.decode_target``, does not run its download). Unsure
        (a call at import, callers too deep to follow) counts as may."""
        imported = {m.path for m in reach_of(self.run, other, self.context.imports)}
        seen: set[tuple[str, int]] = set()
        names: set[str] = set()  # the functions (and classes, for __init__) on the way
        todo = [(module, module.fm.enclosing_function(call))]
        while todo:
            where, function = todo.pop()
            if function is None:
                if where.path in imported or where is module:
                    return True  # runs at import of a module ``other`` imports
                continue  # another script's own code
            if len(seen) > 50:
                return True  # too far to follow
            ref = Ref(where, function)
            if ref.key in seen:
                continue
            seen.add(ref.key)
            names.add(function.name.value)
            owner = class_of(where.fm, function)
            if owner is not None and function.name.value == "__init__":
                names.add(owner.name.value)
            for caller in self.run.callers(ref):
                if caller.module is other:
                    return True
                todo.append((caller.module, caller.module.fm.enclosing_function(caller.node)))
        return _may_call(other, names)

    def _before_init(self, module: Module, call: cst.Call) -> Ref | None:
        """The ``init()`` of the program that runs after ``call``, where ``call`` runs at import
        of its module (a statement of the module, not in a function, a class or the
        ``__main__`` block) before any ``init()`` at import: the first other ``init()`` of the
        program. None where it runs after one."""
        fm = module.fm
        ancestors = list(fm.ancestors(call))
        if any(isinstance(a, (cst.FunctionDef, cst.ClassDef, cst.Lambda)) or _is_main_guard(a)
               for a in ancestors):
            return None
        for reached in self.reach:
            if reached is not module and self._init_at_import(reached):
                return None  # another module initialises at import (maybe before this one)
        for stmt in fm.module.body:
            if stmt in ancestors:
                break
            if any(isinstance(n, cst.Call) and any(_is_init(q) for q in fm.qualified_names(n.func))
                   for n in _walk_here(stmt)):
                return None
        return next((Ref(m, c) for m in self.reach for q, cs in _runtime_calls(m).items()
                     if _is_init(q) for c in cs), None)

    def guard_repairs(self, module: Module, call: cst.Call) -> tuple[Repair | None, list[Repair]]:
        """How to make a write run on rank 0 only: where it is, in a module that trains nothing
        itself (a module that trains has had its writes decided by its conversion); or, for a
        helper function whose every call is a statement of its own in a file of the run, at
        those calls (``save_curve(losses, path)`` in the training script; the helper's module
        stays as its other users know it)."""
        function = module.fm.enclosing_function(call)
        framework = module.fm.info.framework or "torch"
        if function is not None and _reads_back(module, function, call, framework):
            # A cache (``if exists: load ... save``): rank 0 alone writing it, another rank may
            # read it half-written; what it needs is rank 0 first, then the others: said, not
            # made.
            return None, []
        if function is not None and not _runs_its_arguments(module, function):
            # (A helper that runs what it is handed, a model's forward say, runs on every rank:
            # only its write goes to rank 0, in the helper.)
            calls = self.run.callers(Ref(module, function))
            sites = [c for c in calls if isinstance(c.node, cst.Call) and c.module is not module
                     and isinstance(c.fm.parent(c.node), cst.Expr) and self.repairable(c.module)]
            if calls and len(sites) == len(calls):
                repairs = [self.repair("guard_write", c, self.where(Ref(module, call)))
                           for c in sites]
                return None, [r for r in repairs if r is not None]
        if module.fm.info.training:
            return None, []
        return self.repair("guard_write", Ref(module, call)), []

    def _switched_off(self, module: Module, call: cst.Call) -> bool:
        """Whether ``call`` sits under a test of a parameter of its function (``if output_path
        != '':``, ``if path:``, ``if path is not None:``) that every call of the function in
        this program answers no (``detect_image(yolo, image_path, '', ...)``): it never runs
        here. (Calls from other scripts, which are not this program, do not count.)"""
        fm = module.fm
        function = fm.enclosing_function(call)
        if function is None:
            return False
        params = [p.name.value for p in (*function.params.posonly_params,
                                         *function.params.params)]
        ancestors = list(fm.ancestors(call))
        for node in ancestors:
            if node is function:
                return False
            if not (isinstance(node, cst.If) and node.body in ancestors):
                continue
            name = _tested_name(node.test)
            if name is None or name not in params:
                continue
            reach = {id(m) for m in self.reach}
            callers = [c.node for c in self.run.callers(Ref(module, function))
                       if id(c.module) in reach and isinstance(c.node, cst.Call)]
            if callers and all(_passes_falsy(function, call, name) for call in callers):
                return True
        return False

    def _script_only(self, module: Module, call: cst.Call, depth: int = 0) -> bool:
        """Whether ``call`` runs only when a module other than the entry is run as a script: in
        its ``if __name__ == "__main__":`` block, or in a function only such blocks call
        (build_vocab.py's ``main()``, while the training imports just its ``Vocabulary``). It
        does not run in this program, where the runtime is initialised; run on its own, nothing
        initialises it, so it must get no runtime call."""
        if module is not self.entry and _under_main_guard(module, call):
            return True
        function = module.fm.enclosing_function(call)
        if function is None or depth > 3:
            return False
        owner = module.fm.parent(module.fm.parent(function))
        if isinstance(owner, cst.ClassDef) and Ref(module, owner).key in self.picked:
            return False  # a method of a class a configuration picks: this program runs it
        callers = self.run.callers(Ref(module, function))
        return bool(callers) and all(
            isinstance(c.node, cst.Call) and self._script_only(c.module, c.node, depth + 1)
            for c in callers
        )

    def _rank0(self, module: Module, call: cst.Call, depth: int = 0) -> bool:
        """Whether ``call`` runs on rank 0 only, or never from this program: in a function
        that nothing of the program calls (a callback hook: not held against it), or whose every
        call runs on rank 0 only."""
        if rank0_only(module.fm, call):
            return True
        function = module.fm.enclosing_function(call)
        if function is None or depth > 3:
            return False
        callers = self.run.callers(Ref(module, function))
        owner = module.fm.parent(module.fm.parent(function))
        if not callers and isinstance(owner, cst.ClassDef) and (
            Ref(module, owner).key in self.picked
        ):
            return False  # a method of a class a configuration picks: run, by every rank
        if not callers:
            # Nothing calls it by name. Handed over as a value (``trainer.set_callback(
            # 'on_batch_end', batch_end_callback)``, ``callbacks=[save]``), whoever it was given
            # to runs it, on every rank (minGPT's checkpoint callback); else it never runs.
            return not _passed_as_value(module, function)
        return all(self._rank0(c.module, c.node, depth + 1) for c in callers  # type: ignore[arg-type]
                   if isinstance(c.node, cst.Call))

    # -- the result ----------------------------------------------------------------------------

    def result(self) -> EntryResult:
        parts: dict[str, PartResult] = {}
        # (A migration's note on an unscaled learning rate, and what removing DataParallel
        # leaves, checkpoint formats and GPU-count products, speak for no part: the gradients
        # are averaged all the same.)
        notes_in_reach = [
            (m, n) for m in self.reach for n in self.context.notes.get(m.path, ())
            if n.manual and n.transform != "contract"
            and not n.message.startswith((UNSCALED_LR_NOTE, DATA_PARALLEL_CHECKPOINTS))
            and GROWN_FOR_DATA_PARALLEL not in n.message
        ]
        unread = [p for p in self.context.unread if any(p == m.path for m in self.reach)] or [
            p for p, _ in self.context.unread.items()
            if any(p in self.context.imports.get(m.path, ()) for m in self.reach)
        ]
        opted = {m.path: _opted_out(m) for m in self.reach}
        findings = [
            f for f in self.findings
            if not _in_spans(self.line_raw(f), opted.get(f.module.path, []))
        ]
        self.findings = findings
        for part in PARTS:
            mine = [f for f in findings if f.part == part]
            speakers = NOTED_BY[part] | {"manual_marker"}
            notes = [n for _, n in notes_in_reach if n.transform in speakers
                     and (part != "writes" or n.transform != "wrap_keras_fit")]
            if mine:
                state = "missing" if any(f.state == "missing" for f in mine) else "unknown"
                first = next(f for f in mine if f.state == state)
                parts[part] = PartResult(state, first.message, bool(notes))
            elif notes:
                parts[part] = PartResult("unknown" if _unsure(notes[0]) else "missing",
                                         notes[0].message, True)
            else:
                parts[part] = PartResult("holds", _holds_detail(part, self))
        if unread:
            names = ", ".join(sorted(str(p.name) for p in unread))
            for part, result in parts.items():
                if result.state == "holds" and part != "init":
                    parts[part] = PartResult("unknown", f"{names} could not be read: not "
                                             f"checked; {AUDIT}")
        result = EntryResult(self.entry.display, parts,
                             tuple(m.display for m in self.reach), findings)
        self._notes(result, notes_in_reach)
        result.repairs = self.plan()
        return result

    def plan(self) -> list[Repair]:
        """The repairs this program asks for: those of the findings, and what the other
        modules' conversions must know for them (``known_model``: the model an optimizer of a
        module steps is made, and wrapped, in another; ``known_loader``: the loader a loop reads
        is made, and split, in another, whose sampler's ``set_epoch`` goes into that loop's epoch
        loop; ``scale_lr``: an optimizer whose model is averaged and whose data is split)."""
        found: list[Repair] = []

        def add(repair: Repair | None) -> None:
            if repair is not None and repair not in found:
                found.append(repair)

        for finding in self.findings:
            add(finding.repair)
        for repair in self.extra_repairs:
            add(repair)
        if any(r is not None and r.kind == "init" for r in found):
            # The modules it runs, told "no sdp.init() added" by their own conversion: the
            # entry initialises for them.
            for module in self.reach[1:]:
                if any(n.transform == "add_runtime_init" and n.manual
                       for n in self.context.notes.get(module.path, ())):
                    add(self.repair("started_by", Ref(module, module.fm.module),
                                    self.entry.display))
        for step in self.torch_steps:
            averaged = self.averaged.get(step.step.key, False)
            optimizer = next((t.made for t in step.optimizers if t.made is not None), None)
            if optimizer is None:
                continue
            unsure = any(n.transform == "wrap_model_ddp" and n.manual
                         for n in self.context.notes.get(optimizer.module.path, ()))
            if averaged and (unsure or any(t.made is not None and t.made.module is not
                                           optimizer.module for t in step.models)):
                add(self.repair("known_model", optimizer, self.where(step.step)))
            loop, loader, split = self.step_data.get(step.step.key, (None, None, False))
            if loop is not None and split and loop.module is not step.step.module:
                add(self.repair("known_data", step.step, self.where(loop)))
            if loop is not None and loader is not None and split and (
                loader.module is not loop.module
            ):
                known = self.repair("known_loader", loop, self.where(loader))
                if known is not None:
                    add(replace(known, shuffle=_shuffles(self.run, loader)))
            if averaged and split and loop is not None and not _scaled(optimizer):
                add(self.repair("scale_lr", optimizer, self.where(step.step)))
        for fit in self.fits:
            if not self.fit_data.get(fit.fit.key, False):
                continue
            for compile_ref in fit.compiles:
                if compile_ref.module is not fit.fit.module and not _scaled(compile_ref):
                    add(self.repair("scale_keras_lr", compile_ref, self.where(fit.fit)))
        return found

    def line_raw(self, finding: Finding) -> int:
        return self.line(finding.module, finding.node)

    def _notes(self, result: EntryResult,
               notes_in_reach: list[tuple[Module, Change]]) -> None:
        """A manual note per finding, unless a note of the conversion speaks for its part in its
        module already (said once)."""
        covered = {(m.path, part) for m, n in notes_in_reach for part in PARTS
                   if n.transform in NOTED_BY[part] | {"manual_marker"}}
        seen: set[tuple[Path, int, str]] = set()
        for finding in result.findings:
            if (finding.module.path, finding.part) in covered:
                continue
            line = self.line(finding.module, finding.node)
            col = 1
            if finding.node is not None and self.context.position is not None:
                col = self.context.position(finding.module, finding.node)[1]
            key = (finding.module.path, line, finding.message)
            if key in seen:
                continue
            seen.add(key)
            result.notes.setdefault(finding.module.path, []).append(
                Change(line, col, "contract", f"{finding.message} [{finding.part}]",
                       manual=True))


def _check_entry(run: Run, entry: Module, reach: list[Module],
                 context: Context) -> EntryResult | None:
    if any(context.kinds.get(m.path, "").startswith("already distributed") for m in reach):
        return None
    # Training another module runs only as a script (in its ``__main__`` block, or a function
    # only that block calls) is not this entry's: ``evaluate.py`` imports ``get_model`` from
    # ``train.py`` and trains nothing.
    # Nor is training only code outside the entry's reach calls (``run_evaluator.py`` imports
    # the evaluator of ``model_runners.py``, whose trainer only ``run_trainer.py`` calls).
    paths = {m.path for m in reach}

    def runs_here(ref: Ref) -> bool:
        return ref.module is entry or (
            not _only_as_script(run, ref.module, ref.node)
            and _called_from(run, paths, ref.module, ref.node))

    torch_steps = [s for s in run.torch_steps(reach) if runs_here(s.step)]
    fits = [f for f in run.keras_fits(reach) if runs_here(f.fit)]
    tapes = [t for t in run.tape_steps(reach) if runs_here(t.apply)]
    if not (torch_steps or fits or tapes):
        return None
    runtime = any(_runtime_calls(m) for m in reach)
    if not runtime and any(_other_distribution(m) for m in reach):
        return None  # distributed by other means: the converter left it alone, and says so
    check = _Entry(run, entry, reach, context, torch_steps, fits, tapes)
    refusal = next((n for m in reach for n in context.notes.get(m.path, ())
                    if n.manual and n.message.startswith("not converted")), None)
    if refusal is not None:
        # The converter declined the program, and said why: every part is that note's.
        return EntryResult(entry.display,
                           {p: PartResult("missing", refusal.message, True) for p in PARTS},
                           tuple(m.display for m in reach))
    # Every part, converted or not: a program nothing of which runs data-parallel has each
    # missing part named (and repaired, where the converter can) at its own spot.
    check.init()
    check.torch()
    check.keras()
    check.tape()
    check.data()
    check.writes()
    return check.result()


# -- helpers ------------------------------------------------------------------------------------


def _is_init(name: str) -> bool:
    return name.startswith("sdp_runtime.") and name.endswith((".init", ".init_process_group"))


def _early_runtime(module: Module) -> list[cst.Call]:
    """Runtime calls made when the module runs (at import), before its own ``init()``."""
    found: list[cst.Call] = []
    fm = module.fm
    for stmt in fm.module.body:
        if isinstance(stmt, (cst.FunctionDef, cst.ClassDef)) or _is_main_guard(stmt):
            continue
        calls = [n for n in _walk_here(stmt) if isinstance(n, cst.Call)]
        if any(_is_init(q) for c in calls for q in fm.qualified_names(c.func)):
            break
        found += [
            c for c in calls
            if any(q.startswith("sdp_runtime.") and not q.endswith(
                ("is_initialized", "shutdown", "notebook_launcher"))  # (it initialises each rank)
                for q in fm.qualified_names(c.func))
        ]
    return found


def _may_call(other: Module, names: set[str]) -> bool:
    """Whether ``other`` may call one of ``names`` where the run's callers do not show it:
    a call by that last name of something ``other`` does not define itself (through an import
    the graph does not resolve, a folder without ``__init__.py``), a ``getattr`` (a class
    picked by name), or a module handed to another call (``config.init_obj("data", module)``)."""
    body = other.fm.module.body
    own = {s.name.value for s in body if isinstance(s, (cst.FunctionDef, cst.ClassDef))}
    if any(q.rsplit(".", 1)[-1] in names and q.split(".", 1)[0] not in own
           for q in other.fm.info.calls):
        return True
    if "builtins.getattr" in other.fm.info.calls:
        return True
    nodes = other.fm.parents  # every node of the file but the module
    aliases = {
        (a.asname.name.value if a.asname and isinstance(a.asname.name, cst.Name)
         else other.fm.code(a.name).split(".")[0])
        for node in nodes if isinstance(node, cst.Import) for a in node.names
    }
    return any(isinstance(arg.value, cst.Name) and arg.value.value in aliases
               for node in nodes if isinstance(node, cst.Call) for arg in node.args)


def _runtime_name(module: Module) -> str:
    """The name the module binds the runtime as (``hvd`` after a Horovod migration), ``sdp``
    where it binds none."""
    return next((name for name, qualified, _ in imported_names(module.fm)
                 if qualified & _RUNTIMES), "sdp")


#: The runtime modules that have ``init``, ``rank``, ``barrier`` and ``rank0_first``.
_RUNTIMES = frozenset({"sdp_runtime.torch", "sdp_runtime.tensorflow",
                       "sdp_runtime.tensorflow.keras"})


def _after_init(module: Module, init: Ref) -> str:
    """Where code that must run after ``init`` goes, in words."""
    if any(_is_main_guard(a) for a in init.module.fm.ancestors(init.node)):
        where = "into the `if __name__ == \"__main__\":` block"
        return where if init.module is module else f"{where} of {init.module.display}"
    return "into a function called after it"


def _walk_here(node: cst.CSTNode) -> list[cst.CSTNode]:
    found: list[cst.CSTNode] = []
    todo = [node]
    while todo:
        current = todo.pop()
        found.append(current)
        for child in current.children:
            if not isinstance(child, (cst.FunctionDef, cst.ClassDef, cst.Lambda)):
                todo.append(child)
    return found


def _keyword(node: cst.CSTNode, name: str) -> cst.BaseExpression | None:
    if not isinstance(node, cst.Call):
        return None
    for arg in node.args:
        if arg.keyword is not None and arg.keyword.value == name:
            return arg.value
    return None


def _shuffles(run: Run, loader: Ref) -> bool:
    """Whether a DataLoader's order changes every epoch: ``shuffle=`` anything but ``False``,
    or a sampler that shuffles (a DistributedSampler's ``shuffle`` defaults to True)."""
    node = loader.node
    shuffle = _keyword(node, "shuffle")
    if shuffle is None:
        sampler = _keyword(node, "sampler")
        if sampler is None:
            return False
        made = run.made(Ref(loader.module, sampler))
        if len(made) != 1 or not isinstance(made[0].node, cst.Call):
            return True
        loader, node = made[0], made[0].node
        shuffle = _keyword(node, "shuffle")
        if shuffle is None:
            return True
    return not (isinstance(shuffle, cst.Name) and shuffle.value == "False")


#: Dataset methods a shard may go after without changing which samples each rank gets: from
#: where the data is used, the shard goes before these (and before a shuffle: shards of
#: differently shuffled data would overlap).
_AFTER_SHARD = frozenset({"batch", "padded_batch", "ragged_batch", "prefetch", "repeat", "cache",
                          "shuffle", "map", "with_options", "unbatch"})


def _shard_site(trace: Trace, made: Ref) -> Ref:
    """Where ``.apply(sdp.shard)`` goes on a ``tf.data`` pipeline: after the last step of the
    training data's own chain, in the module that makes it, before batching and shuffling
    (``full.enumerate().filter(f)`` of ``train = full.enumerate().filter(f).map(g)``: the hold-out
    ``valid = full.shard(5, 0)`` stays whole); at the source when nothing comes between."""
    for ref in trace.through:
        node = ref.node
        if ref.module is not made.module or not isinstance(node, cst.Call):
            continue
        func = node.func
        if isinstance(func, cst.Attribute) and func.attr.value in _AFTER_SHARD:
            continue
        return ref
    return made


def _scaled(optimizer: Ref) -> bool:
    """The learning rate given to the optimizer made here involves the world size already."""
    return "size()" in optimizer.code or "world_size" in optimizer.code


def _reads_back(module: Module, function: cst.FunctionDef, call: cst.Call,
                framework: str) -> bool:
    """``function`` reads the path ``call`` writes (a cache of its own)."""
    written = written_path(module.fm, call, framework)
    return written is not None and any(
        read_path(module.fm, node, framework) == written
        for node in _walk_all(function) if isinstance(node, cst.Call))


def _runs_its_arguments(module: Module, function: cst.FunctionDef) -> bool:
    """``function`` calls one of its parameters (``dump_predictions(model, ...)`` runs
    ``model(x)``) or the runtime: moved onto rank 0 whole, it would leave the other ranks waiting
    in a collective (a DDP forward, a broadcast)."""
    params = {p.name.value for p in (*function.params.params, *function.params.kwonly_params)}
    for node in _walk_all(function):
        if not isinstance(node, cst.Call):
            continue
        func = node.func
        root = func
        while isinstance(root, cst.Attribute):
            root = root.value
        if isinstance(root, cst.Name) and root.value in params and (
            isinstance(func, cst.Name) or (isinstance(func, cst.Attribute)
                                           and func.attr.value in ("forward", "__call__"))
        ):
            return True
        if any(q.startswith("sdp_runtime.") for q in module.fm.qualified_names(func)):
            return True
    return False


def _in_train_step(ref: Ref, method: bool = False) -> bool:
    """Inside a function named ``train_step``; with ``method``, only the ``train_step`` of a
    class (a Keras model's own step, which ``fit`` runs and feeds), not a step function a loop
    of the program calls (a nested ``@tf.function def train_step``)."""
    function = ref.fm.enclosing_function(ref.node)
    return function is not None and function.name.value == "train_step" and (
        not method or isinstance(ref.fm.parent(ref.fm.parent(function)), cst.ClassDef))


def _frozen(made: Ref) -> bool:
    """A model made here whose every parameter is frozen where it is made (or that only runs
    under ``torch.no_grad()``): it gets no gradient (``program.model_setup.not_trained``)."""
    from .program.model_setup import not_trained

    parent = made.fm.parent(made.node)
    if not (isinstance(parent, cst.Assign) and len(parent.targets) == 1
            and isinstance(parent.targets[0].target, cst.Name)):
        return False
    scope = made.fm.enclosing_function(made.node)
    return not_trained(made.fm, parent.targets[0].target.value, scope, made.node) is not None


def _model_name(made: Ref) -> str:
    parent = made.fm.parent(made.node)
    if isinstance(parent, cst.Assign) and len(parent.targets) == 1:
        return made.fm.code(parent.targets[0].target)
    return _short(made.code)


def _short(text: str) -> str:
    text = " ".join(text.split())
    return text if len(text) <= 60 else text[:57] + "..."


def _receivers(ref: Ref) -> list[Ref]:
    """``model`` of ``model.state_dict()`` / ``model.variables``; the expression itself else."""
    node = ref.node
    while isinstance(node, (cst.Call, cst.Attribute)):
        if isinstance(node, cst.Call):
            node = node.func
            continue
        node = node.value
    return [Ref(ref.module, node)] if isinstance(node, (cst.Name, cst.Attribute)) else [ref]


_COUNTING = ("builtins.range", "tqdm.trange", "tqdm.auto.trange", "itertools.count")
_UNWRAP = ("builtins.enumerate", "tqdm.tqdm", "tqdm.auto.tqdm", "tqdm.notebook.tqdm",
           "builtins.iter", "builtins.zip")


def _reads_split_stream(loops: Iterable[Ref]) -> bool:
    """One of ``loops`` slices this rank's columns of a tensor of token ids
    (``program.stream_splits``, split already: ``ids = ids.narrow(1, sdp.rank() * w, w)``)."""
    return any(
        loop.node is fed for loop in loops for split in stream_splits(loop.fm) if split.done
        for fed in split.loops
    )


def _tested_name(test: cst.BaseExpression) -> str | None:
    """The name a test asks to be set: ``x``, ``x != ''``, ``x != None``, ``x is not None``."""
    if isinstance(test, cst.Name):
        return test.value
    if isinstance(test, cst.Comparison) and isinstance(test.left, cst.Name) and len(
        test.comparisons) == 1:
        target = test.comparisons[0]
        if isinstance(target.operator, (cst.NotEqual, cst.IsNot)) and _falsy(
            target.comparator):
            return test.left.value
    return None


def _passes_falsy(function: cst.FunctionDef, call: cst.Call, name: str) -> bool:
    """Whether ``call`` passes an empty string, ``None``, ``False`` or ``0`` for the parameter
    ``name`` of ``function`` (not passed, or past a ``*`` argument: no)."""
    passed = [arg.value for arg in call.args
              if (param := param_for_arg(function, call, arg)) is not None
              and param.name.value == name]
    return len(passed) == 1 and _falsy(passed[0])


def _falsy(value: cst.BaseExpression | None) -> bool:
    """An empty string, ``None``, ``False`` or ``0`` written out."""
    if isinstance(value, cst.SimpleString):
        return value.evaluated_value in ("", b"")
    if isinstance(value, cst.Name):
        return value.value in ("None", "False")
    return isinstance(value, cst.Integer) and value.evaluated_value == 0


def _data_loop(loops: Iterable[Ref], step: Ref | None = None) -> Ref | None:
    """The innermost loop that reads data (not ``for epoch in range(...)``); with the step it
    drives, also a counting loop whose ``next(it)`` reaches the step (``for epoch in
    range(n): batch = next(db_iter)``)."""
    for loop in loops:
        node = loop.node
        if isinstance(node, (cst.For, cst.CompFor)):
            if _counting(loop):
                if step is not None and _drawn_next(loop, step) is not None:
                    return loop
                continue
            return loop
        if isinstance(node, cst.While) and _next_call(loop) is not None:
            return loop
    return None


def _counting(loop: Ref) -> bool:
    """A ``for`` loop over ``range(...)`` (or ``enumerate``/``tqdm`` of it)."""
    it = loop.node.iter  # type: ignore[attr-defined]
    if isinstance(it, cst.Call) and loop.fm.refers_to(it.func, *_UNWRAP) and it.args:
        it = it.args[0].value
    return isinstance(it, cst.Call) and loop.fm.refers_to(it.func, *_COUNTING)


def _drawn_next(loop: Ref, step: Ref) -> cst.Call | None:
    """The ``next(it)`` of a counting loop whose value reaches the training step it drives
    (``program.flow.reaches``); None where none does (a draw for samples only)."""
    steps = _step_statements(loop, step)
    return next((c for c in _nexts(loop) if steps and reaches(loop.fm, c, steps)), None)


def _next_call(loop: Ref, step: Ref | None = None) -> cst.Call | None:
    """A ``next(it)`` of the loop; with the step it drives, one whose value reaches the step
    where the loop pulls others too (``A, B = next(test_iter)`` after the step for samples is
    not what it trains on: ``program.flow.reaches``, as ``shard_tf_dataset`` decides)."""
    calls = _nexts(loop)
    if step is not None and len(calls) > 1:
        steps = _step_statements(loop, step)
        calls = [c for c in calls if steps and reaches(loop.fm, c, steps)] or calls
    return calls[0] if calls else None


def _nexts(loop: Ref) -> list[cst.Call]:
    return [node for node in _walk_here(loop.node) if isinstance(node, cst.Call)
            and loop.fm.refers_to(node.func, "builtins.next") and node.args]


def _step_statements(loop: Ref, step: Ref) -> list[cst.CSTNode]:
    """The training steps' statements inside ``loop``, ``step``'s among them."""
    fm = loop.fm
    steps: list[cst.CSTNode] = [s.statement for s in training_facts(fm).sites
                                if loop.node in s.loops]
    if step.fm is fm and loop.node in fm.ancestors(step.node):
        steps += [s for s in [fm.enclosing_statement(step.node)] if s is not None]
    return steps


def _iterable(loop: Ref, step: Ref | None = None) -> Ref:
    node = loop.node
    if isinstance(node, cst.While) or (isinstance(node, cst.For) and _counting(loop)):
        call = _next_call(loop, step) if isinstance(node, cst.While) else (
            _drawn_next(loop, step) if step is not None else None)
        assert call is not None
        return Ref(loop.module, call.args[0].value)
    assert isinstance(node, (cst.For, cst.CompFor))
    it = node.iter
    while isinstance(it, cst.Call) and loop.fm.refers_to(it.func, *_UNWRAP) and it.args:
        it = it.args[0].value
    return Ref(loop.module, it)


def _mentions_rank(ref: Ref) -> bool:
    for node in _walk_here(ref.node):
        text = None
        if isinstance(node, cst.Call):
            text = ref.fm.code(node.func)
        elif isinstance(node, (cst.Name, cst.Attribute)):
            text = ref.fm.code(node)
        if text is not None and _RANKISH.search(text.replace("()", "")):
            return True
    return False


def _flag_branch(loader: Ref, sampler: cst.BaseExpression, path: Trace) -> cst.BaseExpression:
    """The sampler a flag parameter of the loader's function chooses
    (``DistributedSampler(...) if shard else None``, ``shard_shared_loader``'s edit of a factory
    shared with evaluation), on the path that reaches the loop: the branch the call of that
    function on ``path`` takes (its argument, or the parameter's default). ``sampler`` itself
    where there is no such flag or its value there is not a literal True/False."""
    fm = loader.fm
    values = assigned_values(fm, sampler) if isinstance(sampler, cst.Name) else [sampler]
    chosen = values[0] if len(values) == 1 else None
    function = fm.enclosing_function(loader.node)
    if not isinstance(chosen, cst.IfExp) or not isinstance(chosen.test, cst.Name) or (
        function is None
    ):
        return sampler
    parameters = function.params
    param = next((p for p in (*parameters.posonly_params, *parameters.params,
                              *parameters.kwonly_params) if p.name.value == chosen.test.value),
                 None)
    if param is None:
        return sampler
    for ref in path.through:
        call = ref.node
        if ref.module is not loader.module or not isinstance(call, cst.Call) or (
            callee(fm, call) is not function
        ):
            continue
        arg = next((a for a in call.args if param_for_arg(function, call, a) is param), None)
        given = arg.value if arg is not None else param.default
        if isinstance(given, cst.Name) and given.value in ("True", "False"):
            return chosen.body if given.value == "True" else chosen.orelse
        return sampler
    return sampler


def _split_by_rank(trace: Trace) -> bool:
    """The value passes through (or is made by) code that uses the rank: a split
    (``x[rank::size]``, ``SplitDataset(ds).select(dp_rank)``, a factory given ``rank=``)."""
    refs = [*trace.through, *([trace.made] if trace.made else [])]
    return any(_mentions_rank(_iterated(r)) for r in refs if not isinstance(r.node, cst.Name))


def _iterated(ref: Ref) -> Ref:
    """What a progress bar or ``enumerate`` iterates: its rank-only display
    (``tqdm(loader, disable=sdp.rank() != 0)``) splits nothing."""
    node = ref.node
    if isinstance(node, cst.Call) and node.args and node.args[0].keyword is None and (
        _names_of_call(ref) & ITERATING
    ):
        return Ref(ref.module, node.args[0].value)
    return ref


def _sharded(trace: Trace) -> bool:
    for ref in (*trace.through, *trace.wraps, *([trace.made] if trace.made else [])):
        node = ref.node
        if isinstance(node, cst.Call):
            if isinstance(node.func, cst.Attribute) and node.func.attr.value in (
                "shard", "distribute_datasets_from_function"
            ):
                return True
            if any(q.startswith("sdp_runtime.") and "shard" in q.rsplit(".", 1)[-1]
                   for q in ref.fm.qualified_names(node.func)):
                return True
            if any(_is_shard_arg(ref, a.value) for a in node.args):
                return True
    return False


def _is_shard_arg(ref: Ref, value: cst.BaseExpression) -> bool:
    """``sdp.shard`` passed (``.apply(sdp.shard)``) or called (``flow(sdp.shard(x), ...)``)."""
    if isinstance(value, cst.Call):
        value = value.func
    return isinstance(value, (cst.Attribute, cst.Name)) and any(
        q.startswith("sdp_runtime.") and q.endswith("shard") for q in ref.fm.qualified_names(value)
    )


def _calls_shard(ref: Ref) -> bool:
    """``ref`` (a function or class) calls the runtime's ``shard`` (``order =
    sdp.shard(np.arange(n))`` in a batch iterator's ``__iter__``)."""
    return any(
        isinstance(node, cst.Call) and _is_shard_arg(ref, node) for node in _walk_all(ref.node)
    )


def _walk_all(node: cst.CSTNode) -> list[cst.CSTNode]:
    found: list[cst.CSTNode] = []
    todo = [node]
    while todo:
        current = todo.pop()
        found.append(current)
        todo.extend(current.children)
    return found


def _iterable_dataset(made: Ref) -> bool:
    """A dataset that splits itself between workers (an ``IterableDataset``): the converter
    leaves it to its own code."""
    return any("IterableDataset" in q for q in _names_of_call(made))


def _writes(module: Module, framework: str) -> list[tuple[cst.Call, str]]:
    """The calls of ``module`` that write a file, with their short names (the vocabulary of
    ``program.writes``, as ``guard_rank0_writes`` reads it)."""
    fm = module.fm
    found: list[tuple[cst.Call, str]] = []
    table = {**WRITES, **FRAMEWORK_WRITES.get(framework, {})}
    for q, calls in fm.info.calls.items():
        if q in table:
            where = table[q]
            for call in calls:
                if where is not None and in_memory(fm, argument(call, *where)):
                    continue
                found.append((call, fm.code(call.func)))
        elif q in STREAM_WRITES:
            for call in calls:
                if argument(call, *STREAM_WRITES[q]) is not None and not in_memory(
                    fm, argument(call, *STREAM_WRITES[q])
                ):
                    found.append((call, fm.code(call.func)))
        elif q in OPENERS:
            default, position = OPENERS[q]
            for call in calls:
                mode = open_mode(call, default, position)
                if mode is not None and writes_in(mode):
                    found.append((call, fm.code(call.func)))
    methods = (*METHOD_WRITES, *FRAMEWORK_METHOD_WRITES.get(framework, ()))
    for method in methods:
        for call in fm.method_calls(method):
            func = call.func
            if not isinstance(func, cst.Attribute) or _is_self_call(func):
                continue
            if any(q in table for q in fm.qualified_names(func)):
                continue
            if method == "save" and framework == "tensorflow" and not call.args:
                continue  # ``manager.save()`` is the CheckpointManager's, guarded like others
            found.append((call, fm.code(func)))
    # ``path.open("wt")`` (a ``pathlib.Path``; ``gzip.open`` and the like are the tables').
    for call in fm.method_calls("open"):
        mode = argument(call, 0, "mode")
        if mode is None or not isinstance(mode.value, cst.SimpleString) or module_function_call(
            fm, call
        ):
            continue
        text = mode.value.evaluated_value
        if isinstance(text, str) and is_mode(text) and writes_in(text):
            found.append((call, fm.code(call.func)))
    # Deleting is writing: ``shutil.rmtree(d)`` on every rank while rank 0 alone fills ``d``.
    found += [(call, fm.code(call.func)) for call in (*fm.calls_to(*DELETIONS),
                                                      *path_deletions(fm))]
    return found


def fm_code(module: Module, call: cst.Call) -> str:
    return f"{module.fm.code(call.func)}(...)"


def _unseen_writes(module: Module) -> list[tuple[cst.Call, str]]:
    """Calls that may write files the converter cannot see: a logging configuration (its file
    handlers), a writer made from a module picked at run time
    (``importlib.import_module(name).SummaryWriter(log_dir)``)."""
    fm = module.fm
    found = [(call, "may add file handlers (a logging configuration the converter cannot "
                    "read): every rank would write the same log file; give the ranks other than "
                    "0 no file handler (`if {sdp}.rank() == 0:`)")
             for call in fm.calls_to(*UNSEEN_WRITES)]
    names = handle_names()
    for name in sorted(names):
        for call in fm.method_calls(name):
            known = fm.qualified_names(call.func)
            if not isinstance(call.func.value, cst.Call) or any(  # type: ignore[attr-defined]
                q.split(".")[0] != "importlib" for q in known
            ):
                continue  # a name the tables know, or an object's method
            found.append((call, f"may make a {name} of a module picked at run time, which "
                                "writes files on every rank: make it on rank 0 only "
                                "(`if {sdp}.rank() == 0:`, the others none)"))
    return found


def _strict_mkdirs(module: Module) -> list[tuple[cst.Call, str]]:
    """Directories made on every rank with an ``exist_ok`` that may be False
    (``path.mkdir(parents=True, exist_ok=exist_ok)``): every rank but the first raises
    ``FileExistsError``; where the name differs between ranks (a timestamp), each makes its own."""
    fm = module.fm
    calls = [*fm.calls_to("os.makedirs"), *(c for c in fm.method_calls("mkdir")
                                            if not module_function_call(fm, c))]
    found = []
    for call in calls:
        flag = argument(call, 2, "exist_ok")  # os.makedirs(name, mode, exist_ok), Path.mkdir's
        if flag is None or (isinstance(flag.value, cst.Name) and flag.value.value == "True"):
            continue
        found.append((call, f"runs on every rank with exist_ok={fm.code(flag.value)}, which may "
                            "be False: every rank but the first raises FileExistsError (and a "
                            "name made from the time may differ between ranks, each making its "
                            "own): make it on rank 0 only and pass its name to the others after "
                            "`{sdp}.barrier()`, or pass exist_ok=True with a name every rank "
                            "shares"))
    return found


def _is_self_call(func: cst.Attribute) -> bool:
    return isinstance(func.value, cst.Name) and func.value.value == "self"


def _per_process(module: Module, call: cst.Call, framework: str) -> bool:
    """A write private to its process: under its own temporary directory, or to a path built
    from the rank (each rank its own file)."""
    if private_write(module.fm, call, framework) is not None:
        return True  # the one answer the conversion gives too (``guard_rank0_writes``)
    return _per_rank(module, call)


def _per_rank(module: Module, call: cst.Call) -> bool:
    return any(_mentions_rank(Ref(module, a.value)) for a in call.args)


def _downloads(module: Module) -> list[tuple[cst.Call, str, bool]]:
    fm = module.fm
    found: list[tuple[cst.Call, str, bool]] = []
    for q, calls in fm.info.calls.items():
        cached = q in CACHED_DOWNLOADS or (
            q.startswith(("keras.datasets.", "tensorflow.keras.datasets."))
            and q.endswith(".load_data")) or q.endswith("keras.utils.get_file")
        torchvision = q.startswith("torchvision.datasets.")
        if not (cached or torchvision):
            continue
        for call in calls:
            if torchvision:
                flag = _keyword(call, "download")
                if flag is None or (isinstance(flag, cst.Name) and flag.value == "False"):
                    continue
            found.append((call, fm.code(call.func), False))
    # Downloads and extractions that rewrite their files each time (``program.fetches``, as
    # ``order_downloads`` sees them: ``urlretrieve``, an archive's ``extractall``/``extract``, a
    # network read written to a file).
    for call in file_fetches(fm):
        found.append((call, fm.code(call.func), True))
    return found


def _passed_as_value(module: Module, function: cst.FunctionDef) -> bool:
    """Whether the function's name is read other than to call it (an argument, a list item, an
    assignment): what receives it may call it."""
    fm = module.fm
    binding = file_index(fm).by_target.get(id(function))  # the ``def``'s own binding
    if binding is None:
        return False
    for use in uses(fm, binding):
        parent = fm.parent(use)
        if not (isinstance(parent, cst.Call) and parent.func is use):
            return True
    return False


def _under_main_guard(module: Module, call: cst.Call) -> bool:
    """In the ``if __name__ == "__main__":`` block of its module: it runs when the module is a
    script, not when another imports it (a function only that block calls: ``_script_only``)."""
    return any(_is_main_guard(parent) for parent in module.fm.ancestors(call))


def _only_as_script(run: Run, module: Module, node: cst.CSTNode, depth: int = 0) -> bool:
    """``node`` runs only when ``module`` is run as a script: in its ``__main__`` block, or in
    a function every call of which (one at least, all in ``module``) runs only so."""
    if any(_is_main_guard(parent) for parent in module.fm.ancestors(node)):
        return True
    function = module.fm.enclosing_function(node)
    if function is None or depth > 4:
        return False
    calls = run.callers(Ref(module, function))
    return bool(calls) and all(
        c.module is module and _only_as_script(run, module, c.node, depth + 1) for c in calls)


def _called_from(run: Run, paths: set[Path], module: Module, node: cst.CSTNode,
                 depth: int = 0) -> bool:
    """Whether ``node`` may run when the modules of ``paths`` run: at the top of one, or in a
    function called there (through callers of any module of the run, 6 calls deep). A function
    nothing calls by name (handed over as a value, or called in a way not followed) may."""
    function = module.fm.enclosing_function(node)
    if function is None:
        return module.path in paths
    if depth > 6:
        return True
    calls = run.callers(Ref(module, function))
    return not calls or any(
        c.module.path in paths and _called_from(run, paths, c.module, c.node, depth + 1)
        for c in calls)


def _opted_out(module: Module) -> list[tuple[int, int]]:
    """Line spans of the statements a ``# sdp-convert: skip`` comment opts out of."""
    text = module.fm.module.code
    if "sdp-convert" not in text:
        return []
    import ast

    rows = text.splitlines()
    try:
        tree = ast.parse(text)
    except (SyntaxError, ValueError, RecursionError):
        return []
    return [
        (n.lineno, n.end_lineno or n.lineno) for n in ast.walk(tree)
        if isinstance(n, ast.stmt) and n.lineno <= len(rows) and _SKIP.search(rows[n.lineno - 1])
    ]


def _in_spans(line: int, spans: list[tuple[int, int]]) -> bool:
    return any(a <= line <= b for a, b in spans)


def _unsure(note: Change) -> bool:
    """A note that says the converter could not tell (rather than what is wrong)."""
    text = note.message.lower()
    return any(w in text for w in ("could not", "cannot tell", "not found", "was found",
                                   "unknown", "check ", ONE_BRANCH_NOTE))


def _holds_detail(part: str, check: _Entry) -> str:
    if part == "init":
        calls = [(m, c) for m in check.reach for q, cs in _runtime_calls(m).items()
                 if _is_init(q) for c in cs]
        if calls:
            module, call = calls[0]
            return f"{module.fm.code(call.func)}() at {check.where(Ref(module, call))}"
        return "sdp.init()"
    return {
        "averaging": "gradients averaged",
        "data": "training data split",
        "state": "rank 0's initial state on every rank",
        "writes": "writes on rank 0",
    }[part]


#: Calls that list files in the order the file system gives (not sorted).
_LISTINGS = frozenset({"glob", "iglob", "listdir", "scandir", "walk", "iterdir", "rglob"})
#: Those whose items are the paths (or names) themselves, which ``sorted(...)`` puts in one
#: order (not ``os.walk``'s tuples of lists, nor ``os.scandir``'s entries).
_SORTABLE = frozenset({"glob", "iglob", "listdir", "iterdir", "rglob"})


def _param_positions(fm: FileModel, value: cst.BaseExpression | list[cst.BaseExpression],
                     function: cst.FunctionDef, call: cst.Call) -> list[int] | None:
    """The positions in ``call`` (of ``function``) of the arguments given for the parameters
    ``value`` names (a name, or a tuple, list or list of names of ``function``'s parameters);
    None where one is not a parameter, or not given by position."""
    parts = value if isinstance(value, list) else (
        [e.value for e in value.elements] if isinstance(value, (cst.Tuple, cst.List)) else [value])
    index = file_index(fm)
    positions: list[int] = []
    for part in parts:
        names = _params_behind(index, part, function)
        if names is None:
            return None
        for name in names:
            position = next((i for i, a in enumerate(call.args)
                             if (p := param_for_arg(function, call, a)) is not None
                             and p.name.value == name), None)
            if position is None and not _defaults_to_none(function, name):
                return None
            if position is not None and position not in positions:
                positions.append(position)
    return positions or None


def _params_behind(index: FileIndex, part: cst.BaseExpression,
                   function: cst.FunctionDef) -> list[str] | None:
    """The parameters of ``function`` the name ``part`` holds: itself, where it is one, or
    those a local name is assigned from in every branch (``memory_data = img_paths``, ``else:
    memory_data = (img_paths, labels)``); None where it holds anything else."""
    if not isinstance(part, cst.Name):
        return None
    binding = index.reaching(part.value, part)
    if binding is not None and binding.kind == "param":
        return [part.value] if binding.stmt is function else None
    seen = index.referents(part)
    names: list[str] = []
    for b in seen:
        if b.kind != "assign" or b.unpacked or b.value is None:
            return None
        values = [e.value for e in b.value.elements] if isinstance(
            b.value, (cst.Tuple, cst.List)) else [b.value]
        for value in values:
            held = _params_behind(index, value, function) if isinstance(value, cst.Name) and (
                value.value != part.value) else None
            if held is None:
                return None
            names += [n for n in held if n not in names]
    return names or None


def _defaults_to_none(function: cst.FunctionDef, name: str) -> bool:
    """``def f(..., name=None)``: a parameter left out of a call holds None there."""
    params = (*function.params.params, *function.params.kwonly_params)
    return any(p.name.value == name and p.default is not None and is_none(p.default)
               for p in params)
