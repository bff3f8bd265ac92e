"""Write files on rank 0 only: checkpoints, logs, arrays, plots, TensorBoard events.

Before::

    torch.save(model.state_dict(), "model.pt")
    with open("history.json", "w") as f:
        json.dump(history, f)
    writer = SummaryWriter("runs")
    writer.add_scalar("loss", loss, step)

After::

    if sdp.rank() == 0:
        torch.save(model.state_dict(), "model.pt")
        with open("history.json", "w") as f:
            json.dump(history, f)
    writer = SummaryWriter("runs") if sdp.rank() == 0 else None
    if sdp.rank() == 0:
        writer.add_scalar("loss", loss, step)

Why: every rank holds the same weights after the averaged step, so N ranks writing the same path
write N identical copies at once, racing on one file (torn checkpoints, interleaved logs, N-fold
TensorBoard events). Rank 0 writes; the others skip. Checkpoints stay loadable by the original
script because the runtime's DistributedDataParallel state dict has no ``module.`` prefix.

What counts as a write: the calls in ``WRITES`` (generic Python: json/pickle/yaml dumps to a
stream, numpy saves, shutil copies/moves, os.rename/replace, matplotlib's savefig,
image/audio writers, wandb/mlflow logging, pandas ``to_csv``-style and ``Path.write_text``-style
methods, ``save`` of a PIL image or a tokenizer) and ``FRAMEWORK_WRITES`` (e.g. ``torch.save``,
``torchvision.utils.save_image``), ``open`` in a writing mode, and in project mode the
functions of other modules that write (``utils.save_checkpoint(...)``: guarded at the call, the
helper's module stays as it is for its other callers). Reads, ``print``, logging
and ``os.makedirs`` stay on every rank (``allow_existing_dirs`` makes the latter race-free).
Writes private to each process stay too (``program.readback.private_write``: an ``io.BytesIO``,
a ``tempfile`` directory of its own, a file named after the rank or ``os.getpid()``). A write
whose statement runs a wrapped model or a collective, also through helpers
(``torch.save(predict(model, loader), p)``), stays on every rank with a note: rank 0 would wait.

Deletions (``program.deletions``: ``shutil.rmtree``, ``os.remove``, ``tf.io.gfile.rmtree``,
``Path.unlink``, ...) run on rank 0 with the file-system test or loop around them, then every rank
waits at ``sdp.barrier()`` (one after consecutive deletions), unless the ranks may not all get
there (in a loop, an ``except``): then no barrier, and the report says so.

Handles (``open(..., "w")`` and ``SummaryWriter(...)`` assigned to a name or ``self.<attr>``)
become ``None`` on the other ranks, and every statement using them is guarded, followed into this
file's functions the handle is passed to and into objects made from it (``csv.writer(f)``); a
use already testing the handle (``if writer is not None:``) is left as it is. If any use cannot be
guarded (returned, in a condition, ...), nothing of that handle changes and it gets a manual note.
``with open(p, "w") as f:`` is guarded whole, unless its body trains (``backward``/``step``/
collectives), in which case only the opening is conditional (``... if sdp.rank() == 0 else
contextlib.nullcontext()``) and the uses of ``f`` are guarded.

Writes already under ``if <rank> == 0:`` (a rank call, or a variable holding one:
``rank = dist.get_rank()``), or in a function only called there, are left alone; a write inside a
function called from everywhere is guarded inside it (the rank is global). What cannot be guarded
safely (a write in a condition, a mode known only at run time, a result used later) gets a manual
note. The framework writes go in ``FRAMEWORK_WRITES``/``FRAMEWORK_METHOD_WRITES``/
``FRAMEWORK_HANDLES`` (TensorFlow: ``tf.saved_model.save``, ``model.save``, ``save_weights``,
``checkpoint.save``, ``manager.save()``, ``tf.summary.create_file_writer``); the rest is
framework-neutral.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import partial

import libcst as cst
from libcst.codemod.visitors import AddImportsVisitor

from ..base import Transform
from ..program.builders import rank0_test
from ..program.deletions import (
    DELETIONS,
    deletion_unit,
    is_deletion,
    next_statement,
    path_deletions,
)
from ..program.guards import guard_advice, is_none_test, under_handle_test, why_not_guardable
from ..program.project import repairs_of
from ..program.ranks import (
    collective_apart,
    kept_off_rank0,
    only_called_on_rank0,
    rank0_only,
    reaches_collective,
    runs_collectives,
)
from ..program.readback import private_write
from ..program.scopes import (
    Binding,
    assigned_binding,
    binding_of,
    callee,
    node_order,
    param_for_arg,
    uses,
)
from ..program.writes import (
    FRAMEWORK_HANDLES,
    FRAMEWORK_METHOD_WRITES,
    FRAMEWORK_WRITES,
    HANDLES,
    METHOD_WRITES,
    OPENERS,
    STREAM_WRITES,
    WRITES,
    argument,
    describe_write,
    module_function_call,
    noop_twin,
    object_saves,
    open_mode,
    use_message,
    writes_in,
)


@dataclass
class _Action:
    """One edit, kept until all are known so that nested guards can be dropped."""

    kind: str  # "guard" (a statement), "ifexp" (an assignment's value), "with" (a with item)
    node: cst.CSTNode  # the statement, Assign/AnnAssign, or WithItem
    anchor: cst.CSTNode  # the statement the edit is in (to find nesting)
    records: list[tuple[cst.CSTNode, str]] = field(default_factory=list)
    barrier: bool = False  # a deletion: every rank waits for it (``sdp.barrier()`` after)


class GuardRank0Writes(Transform):
    DESCRIPTION = "Write files (checkpoints, logs, TensorBoard) on rank 0 only."
    FRAMEWORKS = frozenset({"torch", "tensorflow"})
    #: Project mode: a module that trains nothing, writing on every rank (contract's repair).
    PROJECT_ROLES = frozenset({"repair:guard_write"})

    def prepare(self, module: cst.Module) -> None:
        self._describe = partial(describe_write, self.fm)
        self._actions: list[_Action] = []
        self._else: dict[cst.CSTNode, cst.BaseExpression] = {}  # ifexp assignment -> its else
        self._by_node: dict[cst.CSTNode, _Action] = {}
        self._ifexp: set[cst.CSTNode] = set()
        self._with_items: set[cst.CSTNode] = set()
        self._followed: set[int] = set()
        self._problems: list[str] = []
        framework = self.state.info.framework or ""
        self._writes = {**WRITES, **FRAMEWORK_WRITES.get(framework, {})}
        project = self.state.options.project  # other modules' writing functions and classes
        self._writes.update(dict.fromkeys(getattr(project, "writers", ())))  # at the call site
        self._handles = (*HANDLES, *FRAMEWORK_HANDLES.get(framework, ()),
                         *getattr(project, "handles", ()))
        candidates: list[cst.Call] = []
        candidates += self.calls_to(*self._writes, *STREAM_WRITES, *OPENERS, *self._handles)
        for method in METHOD_WRITES:
            candidates += [c for c in self.method_calls(method) if c.args]
        candidates += object_saves(self.fm) + self.calls_to(*DELETIONS) + path_deletions(self.fm)
        for method in FRAMEWORK_METHOD_WRITES.get(framework, ()):
            calls = self.method_calls(method)
            candidates += [c for c in calls if not module_function_call(self.fm, c)]
        # The whole-program contract's ``guard_write``: a write on every rank in a module that
        # trains nothing itself, or the call of a helper of another module that writes.
        asked = [node for _, node in repairs_of(self.fm, "guard_write")
                 if isinstance(node, cst.Call)]
        if not self.state.info.training:
            candidates = [c for c in candidates if any(c is n for n in asked)]
        candidates += [c for c in asked if not any(c is n for n in candidates)]
        order = node_order(self.fm)
        seen: set[int] = set()
        for call in sorted(candidates, key=lambda c: order.get(id(c), -1)):
            if id(call) not in seen:
                seen.add(id(call))
                self._write(call)
        self._apply()

    # -- deciding -------------------------------------------------------------------------------

    def _write(self, call: cst.Call) -> None:
        names = self.qualified_names(call.func)
        what = self._describe(call)
        opener = next((n for n in names if n in OPENERS), None)
        if opener is not None:
            default, position = OPENERS[opener]
            mode = open_mode(call, default, position)
            if mode is None:
                if not rank0_only(self.fm, call):
                    self.record(
                        call,
                        f"{what} opens a file in a mode known only at run time: if it writes, "
                        f"open and use it on rank 0 only (if {self.sdp}.rank() == 0:)",
                        manual=True,
                    )
                return
            if not writes_in(mode):
                return  # a read
        stream = next((n for n in names if n in STREAM_WRITES), None)
        if stream is not None and argument(call, *STREAM_WRITES[stream]) is None:
            return  # returns a string
        if private_write(self.fm, call, self.state.info.framework or ""):
            return  # a buffer, a temporary directory, a file of each rank's own
        if rank0_only(self.fm, call) or only_called_on_rank0(self.fm, call):
            return
        is_handle = opener is not None or any(n in self._handles for n in names)
        parent = self.parent(call)
        if is_handle and isinstance(parent, cst.WithItem) and parent.item is call:
            self._with(parent, what)
            return
        noop = noop_twin(call, names)
        if noop is not None and isinstance(parent, (cst.Assign, cst.AnnAssign)):
            # A writer with a do-nothing twin: the other ranks get the twin, every use stays.
            self._else[parent] = noop
            self._add("ifexp", parent, self.enclosing_statement(parent) or parent, call,
                      f"{what} on rank 0 only ({self.module.code_for_node(noop)} on the others)")
            return
        if is_handle:
            binding = assigned_binding(self.fm, call)
            assign = self.parent(call)
            if binding is not None and isinstance(assign, (cst.Assign, cst.AnnAssign)):
                self._handle(
                    assign,
                    call,
                    binding,
                    f"{what} on rank 0 only ({binding.code} is None on the other ranks)",
                )
                return
        if is_deletion(self.fm, call):
            self._deletion(call, what)
            return
        self._guard_statement(call, f"{what} runs on rank 0 only")

    def _deletion(self, call: cst.Call, what: str) -> None:
        """Rank 0 deletes (with the file-system test or loop around it), the others wait."""
        stmt = self.enclosing_statement(call)
        if stmt is None or why_not_guardable(self.fm, call, stmt) is not None:
            self._guard_statement(call, f"{what} runs on rank 0 only")
            return
        unit, barrier = deletion_unit(self.fm, stmt)
        self._add("guard", unit, unit, call, f"{what} runs on rank 0 only" + (
            f", then {self.sdp}.barrier(): no rank uses the path before the deletion is done"
            if barrier else "; no barrier after it (the ranks may not all get there): if other "
            f"ranks use the path, make them wait ({self.sdp}.barrier() where every rank passes)"
        ))
        self._by_node[unit].barrier |= barrier

    def _guard_statement(self, node: cst.CSTNode, message: str) -> None:
        """Guard the statement holding ``node`` if that is safe, else note it."""
        stmt = self.enclosing_statement(node)
        problem = why_not_guardable(self.fm, node, stmt)
        if problem is not None or stmt is None:
            self.record(
                node,
                f"{self._describe(node)} writes on every rank: "
                + guard_advice(problem or "it is not in a statement", self.sdp),
                manual=True,
            )
            return
        self._add("guard", stmt, stmt, node, message)

    def _with(self, item: cst.WithItem, what: str) -> None:
        stmt = self.parent(item)
        assert isinstance(stmt, cst.With)
        if runs_collectives(self.fm, stmt.body) or collective_apart(self.fm, stmt, item):
            # The body trains, or runs what every rank must run together (a wrapped model's
            # forward through a helper, also of another module): only the opening is
            # conditional, the uses are guarded.
            mark = len(self._actions)
            self._add(
                "with",
                item,
                stmt,
                item.item,
                f"{what} on rank 0 only (contextlib.nullcontext() on the other ranks)",
            )
            binding = binding_of(self.fm, item.asname.name) if item.asname is not None else None
            self._all_or_nothing(mark, item.item, what, binding)
            return
        self._add("guard", stmt, stmt, item.item, f"{what} runs on rank 0 only")

    def _handle(
        self, assign: cst.Assign | cst.AnnAssign, call: cst.Call, binding: Binding, message: str
    ) -> None:
        stmt = self.enclosing_statement(assign)
        mark = len(self._actions)
        self._add("ifexp", assign, stmt or assign, call, message)
        self._all_or_nothing(mark, call, self._describe(call), binding)

    def _all_or_nothing(
        self, mark: int, call: cst.CSTNode, what: str, binding: Binding | None
    ) -> None:
        """Guard every use of a handle just made conditional, or undo all actions from ``mark``
        (the one making it conditional included) and note it."""
        self._followed, self._problems = set(), []
        if binding is not None:
            self._guard_uses(binding, 0)
        # A use that also runs a collective (``writer.add_scalar(.., evaluate(model))``) stays
        # on every rank, where the handle is None: the whole handle stays as it was.
        self._problems += [f"`{self._describe(a.node)}` also calls {c.words}, which every rank "
                           "must run together" for a in self._actions[mark:] if a.kind == "guard"
                           and (c := reaches_collective(self.fm, a.node)) is not None]
        if not self._problems:
            return
        for action in self._actions[mark:]:
            del self._by_node[action.node]
        del self._actions[mark:]
        self.record(
            call,
            f"{what} writes on every rank, and its handle is used where a guard cannot go "
            f"({self._problems[0]}): open and use it on rank 0 only (if {self.sdp}.rank() == 0:)",
            manual=True,
        )

    def _guard_uses(self, binding: Binding, depth: int) -> None:
        """Guard each statement using a handle that is None on the other ranks."""
        if depth > 3 or id(binding.target) in self._followed:
            return
        self._followed.add(id(binding.target))
        for use in uses(self.fm, binding):
            if (
                rank0_only(self.fm, use)
                or under_handle_test(self.fm, use, binding)
                or is_none_test(self.fm, use)
            ):
                continue
            parent = self.parent(use)
            if isinstance(parent, cst.Arg) and parent.value is use:
                call = self.parent(parent)
                function = callee(self.fm, call) if isinstance(call, cst.Call) else None
                param = (
                    param_for_arg(function, call, parent)
                    if function is not None and isinstance(call, cst.Call)
                    else None
                )
                inner = binding_of(self.fm, param) if param is not None else None
                if inner is not None:
                    self._guard_uses(inner, depth + 1)
                    continue
            if isinstance(parent, cst.WithItem) and parent.item is use:
                stmt = self.parent(parent)
                assert isinstance(stmt, cst.With)
                if not runs_collectives(self.fm, stmt.body):
                    self._add("guard", stmt, stmt, use, use_message(self.fm, stmt, binding.code))
                    continue
            stmt = self.enclosing_statement(use)
            small = (
                stmt.body[0]
                if isinstance(stmt, cst.SimpleStatementLine) and len(stmt.body) == 1
                else None
            )
            made = assigned_binding(self.fm, small.value) if isinstance(small, cst.Assign) else None
            if (
                made is not None
                and stmt is not None
                and isinstance(small, cst.Assign)
                and why_not_guardable(self.fm, use, small) is None
            ):
                # ``rows = csv.writer(log)``: made from the handle, None where it is.
                self._add(
                    "ifexp",
                    small,
                    stmt,
                    use,
                    f"{made.code} is made on rank 0 only, like {binding.code}",
                )
                self._guard_uses(made, depth + 1)
                continue
            if (
                stmt is not None
                and isinstance(small, cst.Expr)
                and why_not_guardable(self.fm, use, stmt) is None
            ):
                self._add("guard", stmt, stmt, use, use_message(self.fm, stmt, binding.code))
                continue
            code = self.module.code_for_node(stmt or use).strip().splitlines()[0]
            self._problems.append(f"`{code}`")

    def _add(
        self, kind: str, node: cst.CSTNode, anchor: cst.CSTNode, at: cst.CSTNode, message: str
    ) -> None:
        action = self._by_node.get(node)
        if action is None:
            action = _Action(kind, node, anchor)
            self._by_node[node] = action
            self._actions.append(action)
            action.records.append((at, message))

    # -- applying -------------------------------------------------------------------------------

    def _apply(self) -> None:
        earlier = set(self.state.edits.guarded)  # by an earlier transform (order_downloads)
        guarded = {a.node for a in self._actions if a.kind == "guard"} | earlier
        # Deletions one after another share one guard and one barrier, after the last of them.
        waits, ancestors = {id(a.node) for a in self._actions if a.barrier}, self.ancestors
        for action in self._actions:
            if action.anchor in earlier or any(p in guarded for p in ancestors(action.anchor)):
                continue  # inside a statement guarded whole
            if action.kind == "guard" and (note := kept_off_rank0(self.fm, action, self._describe)):
                self.record(action.anchor, note, manual=True)  # every rank must run it
                continue
            if action.kind == "guard":
                self.guard_rank0(action.node)
                if action.barrier and id(next_statement(self.fm, action.node)) not in waits:
                    self.insert_after(action.node, cst.parse_statement(f"{self.sdp}.barrier()\n"))
            elif action.kind == "ifexp":
                self._ifexp.add(action.node)
            else:
                self._with_items.add(action.node)
                AddImportsVisitor.add_needed_import(self.context, "contextlib")
            for at, message in action.records:
                self.record(at, message)
            self.add_runtime_import()

    def leave_Assign(self, original_node: cst.Assign, updated_node: cst.Assign) -> cst.Assign:
        if original_node in self._ifexp:
            return updated_node.with_changes(
                value=cst.IfExp(
                    test=rank0_test(self.sdp),
                    body=updated_node.value,
                    orelse=self._else.get(original_node, cst.Name("None")),
                )
            )
        return updated_node

    def leave_AnnAssign(
        self, original_node: cst.AnnAssign, updated_node: cst.AnnAssign
    ) -> cst.AnnAssign:
        if original_node in self._ifexp and updated_node.value is not None:
            return updated_node.with_changes(
                value=cst.IfExp(
                    test=rank0_test(self.sdp),
                    body=updated_node.value,
                    orelse=self._else.get(original_node, cst.Name("None")),
                )
            )
        return updated_node

    def leave_WithItem(
        self, original_node: cst.WithItem, updated_node: cst.WithItem
    ) -> cst.WithItem:
        if original_node in self._with_items:
            return updated_node.with_changes(
                item=cst.IfExp(
                    test=rank0_test(self.sdp),
                    body=updated_node.item,
                    orelse=cst.parse_expression("contextlib.nullcontext()"),
                )
            )
        return updated_node

    # -- questions ------------------------------------------------------------------------------
