"""What runs on rank 0 only: one definition for every transform.

A node runs on rank 0 only when it is in the body of ``if <rank 0>:`` or of
``x if <rank 0> else y``, where ``<rank 0>`` is ``<rank call> == 0``, ``0 == <rank call>``,
``not <rank call>``, or the same with a variable that holds a rank call
(``rank = dist.get_rank()``); or when an earlier statement of an enclosing block of the same
function leaves every other rank (Horovod style: ``if hvd.rank() != 0: return``, also
``continue``, ``break``, ``raise``, ``sys.exit()``); or when it is in a function of the file that
is only ever called there.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import libcst as cst
import libcst.matchers as m
from libcst.helpers import get_full_name_for_node

from .scopes import (
    assigned_values,
    callee,
    class_of,
    function_references,
    param_for_arg,
    training_calls,
)
from .syntax import findall
from .writes import COLLECTIVE_PREFIXES

if TYPE_CHECKING:
    from .model import FileModel

#: Calls whose result is this process's global rank, in every library the converter reads.
RANK_FUNCTIONS = (
    "sdp_runtime.torch.rank",
    "sdp_runtime.tensorflow.rank",
    "torch.distributed.get_rank",
    "horovod.torch.rank",
    "horovod.tensorflow.rank",
    "horovod.tensorflow.keras.rank",
    "horovod.keras.rank",
    "smdistributed.dataparallel.torch.distributed.get_rank",
    "smdistributed.dataparallel.tensorflow.rank",
    "sdp_runtime.torch.distributed.get_rank",
    "sdp_runtime.tensorflow.keras.rank",
    "sdp_runtime.torch.smp.rank",
    "sdp_runtime.tensorflow.smp.rank",
    "smdistributed.modelparallel.torch.rank",
    "smdistributed.modelparallel.tensorflow.rank",
)
#: Calls whose result is this process's rank on its machine.
LOCAL_RANK_FUNCTIONS = tuple(
    name.rsplit(".", 1)[0] + ".local_rank" for name in RANK_FUNCTIONS
    if name.endswith(".rank")
) + ("torch.distributed.get_node_local_rank", "sdp_runtime.torch.distributed.get_local_rank",
     "smdistributed.dataparallel.torch.distributed.get_local_rank")
_EXITS = ("sys.exit", "exit", "quit")


def local_rank0_only(fm: FileModel, node: cst.CSTNode) -> bool:
    """Whether ``node`` runs on the first process of each machine only (``if
    sdp.local_rank() == 0:``, or the same with a variable that holds it: ``local_rank =
    hvd.local_rank()``): what a download into a machine's cache needs."""
    child = node
    for parent in fm.ancestors(node):
        if isinstance(parent, cst.If) and child is parent.body:
            subject = _rank_subject(parent.test, equal=True)
            values = assigned_values(fm, subject) if isinstance(subject, cst.Name) else [subject]
            if values and all(
                isinstance(v, cst.Call) and fm.refers_to(v.func, *LOCAL_RANK_FUNCTIONS)
                for v in values
            ):
                return True
        child = parent
    return False


def is_rank_call(fm: FileModel, expr: cst.BaseExpression) -> bool:
    return isinstance(expr, cst.Call) and fm.refers_to(expr.func, *RANK_FUNCTIONS)


def is_rank0_test(fm: FileModel, test: cst.BaseExpression) -> bool:
    """``<rank call> == 0`` / ``0 == <rank call>`` / ``not <rank call>`` with a known rank call."""
    subject = _rank_subject(test, equal=True)
    return subject is not None and is_rank_call(fm, subject)


def is_rank0_condition(fm: FileModel, test: cst.BaseExpression) -> bool:
    """``is_rank0_test``, or the same with a variable that holds a rank call; or a variable
    that is true on rank 0 only (``verbose = 1 if hvd.rank() == 0 else 0``; ``if verbose:``)."""
    if is_rank0_test(fm, test):
        return True
    subject = _rank_subject(test, equal=True)
    return _holds_rank(fm, subject) or _true_on_rank0_only(fm, test)


def _true_on_rank0_only(fm: FileModel, test: cst.BaseExpression) -> bool:
    if not isinstance(test, cst.Name):
        return False
    values = assigned_values(fm, test)
    return bool(values) and all(
        isinstance(v, cst.IfExp) and is_rank0_condition(fm, v.test)
        and _truthy(v.body) is True and _truthy(v.orelse) is False
        for v in values
    )


def _truthy(expr: cst.BaseExpression) -> bool | None:
    """The truth of a literal (``1``, ``0``, ``True``, ``None``, ``""``); None for others."""
    if isinstance(expr, cst.Integer):
        return expr.value not in ("0", "0x0", "0o0", "0b0")
    if isinstance(expr, cst.Name) and expr.value in ("True", "False", "None"):
        return expr.value == "True"
    if isinstance(expr, cst.SimpleString):
        return len(expr.evaluated_value or "") > 0
    return None


def is_not_rank0_condition(fm: FileModel, test: cst.BaseExpression) -> bool:
    """``<rank> != 0`` / ``0 != <rank>`` / ``<rank> > 0`` / a bare ``<rank>`` (true off rank 0)."""
    subject = _rank_subject(test, equal=False)
    if subject is None and not isinstance(test, (cst.Comparison, cst.UnaryOperation)):
        subject = test  # ``if rank:``
    return subject is not None and (is_rank_call(fm, subject) or _holds_rank(fm, subject))


def is_rank_exit(
    stmt: cst.CSTNode, condition: Callable[[cst.BaseExpression], bool]
) -> bool:
    """``if <condition>: ... return`` (or ``continue``/``break``/``raise``/``sys.exit()``)."""
    if not isinstance(stmt, cst.If) or not condition(stmt.test):
        return False
    body = stmt.body
    if isinstance(body, cst.SimpleStatementSuite):
        last_small: cst.BaseSmallStatement = body.body[-1]
    elif isinstance(body.body[-1], cst.SimpleStatementLine):
        last_small = body.body[-1].body[-1]  # type: ignore[union-attr]
    else:
        return False
    if isinstance(last_small, (cst.Return, cst.Continue, cst.Break, cst.Raise)):
        return True
    return (
        isinstance(last_small, cst.Expr)
        and isinstance(last_small.value, cst.Call)
        and (get_full_name_for_node(last_small.value.func) or "") in _EXITS
    )


def rank0_only(fm: FileModel, node: cst.CSTNode) -> bool:
    """Whether ``node`` runs on rank 0 only already (see the module's docstring)."""
    child = node
    same_function = True  # an exit before a def does not govern when the def's body runs
    for parent in fm.ancestors(node):
        if (
            isinstance(parent, (cst.If, cst.IfExp))
            and child is parent.body
            and is_rank0_condition(fm, parent.test)
        ):
            return True
        if (
            same_function
            and isinstance(parent, (cst.IndentedBlock, cst.Module))
            and isinstance(child, cst.BaseStatement)
            and _exit_before(fm, parent, child)
        ):
            return True
        if isinstance(parent, (cst.FunctionDef, cst.Lambda, cst.ClassDef)):
            same_function = False
        child = parent
    return False


def _exit_before(
    fm: FileModel, block: cst.IndentedBlock | cst.Module, stmt: cst.BaseStatement
) -> bool:
    """Whether a statement before ``stmt`` in ``block`` leaves the block off rank 0
    (``if rank != 0: return``). Where the first such statement of a block is, and where each
    statement is, are found once per block for the file: asked for every write, a scan of the
    statements before it would cost a file of module-level writes the square of its length."""
    memo = fm.facts.rank_exits
    if memo is None:
        memo = fm.facts.rank_exits = {}
    found = memo.get(id(block))
    if found is None:
        body = block.body
        first = next(
            (i for i, s in enumerate(body)
             if is_rank_exit(s, lambda test: is_not_rank0_condition(fm, test))),
            len(body),
        )
        found = memo[id(block)] = ({id(s): i for i, s in enumerate(body)}, first)
    positions, first = found
    return first < positions.get(id(stmt), len(block.body))


def only_called_on_rank0(fm: FileModel, node: cst.CSTNode) -> bool:
    """``node`` is in a function of this file that is only ever called on rank 0."""
    function = fm.enclosing_function(node)
    if function is None:
        return False
    if class_of(fm, function) is not None:
        # A method: every ``<something>.<name>(...)`` call of the file.
        calls = fm.method_calls(function.name.value)
        return bool(calls) and all(rank0_only(fm, c) for c in calls)
    refs = function_references(fm, function)
    return bool(refs) and all(
        isinstance(call := fm.parent(ref), cst.Call) and call.func is ref and rank0_only(fm, call)
        for ref in refs
    )


def _rank_subject(test: cst.BaseExpression, *, equal: bool) -> cst.BaseExpression | None:
    """The expression compared with 0 (``== 0`` when ``equal``, else ``!= 0`` / ``> 0``)."""
    if isinstance(test, cst.UnaryOperation) and isinstance(test.operator, cst.Not):
        return test.expression if equal else None
    if not (isinstance(test, cst.Comparison) and len(test.comparisons) == 1):
        return None
    operator = test.comparisons[0].operator
    wanted = (cst.Equal,) if equal else (cst.NotEqual, cst.GreaterThan)
    if not isinstance(operator, wanted):
        return None
    left, right = test.left, test.comparisons[0].comparator
    if m.matches(right, m.Integer("0")):
        return left
    if m.matches(left, m.Integer("0")) and not isinstance(operator, cst.GreaterThan):
        return right
    return None


def _holds_rank(fm: FileModel, subject: cst.BaseExpression | None) -> bool:
    if not isinstance(subject, cst.Name):
        return False
    values = assigned_values(fm, subject)
    return bool(values) and all(is_rank_call(fm, v) for v in values)


def runs_collectives(fm: FileModel, body: cst.BaseSuite) -> bool:
    """Whether a block trains or communicates: skipping it on some ranks would hang them."""
    calls = training_calls(fm) | set(fm.calls_to(*COLLECTIVE_PREFIXES, prefix=True))
    return any(any(p is body for p in fm.ancestors(c)) for c in calls)


#: Tests whose answer can differ between ranks, read from their code: the rank, and what each
#: process sees of the file system (``os.path.exists``: rank 0 may have written the file
#: already, or may be the only one on a machine that sees it).
_PER_RANK_TEST = re.compile(
    r"\b((get_)?(local_)?rank|is_(local_)?main_process|exists|isfile|isdir|is_file|is_dir|"
    r"glob|iglob|listdir|scandir)\s*\("
)


def divergent_condition(fm: FileModel, node: cst.CSTNode) -> cst.BaseExpression | None:
    """The test of the innermost ``if``/``while`` (or conditional expression) around ``node``
    whose answer can differ between ranks, or None: a collective placed there would be entered
    by some ranks only (deadlock), so none may be."""
    child: cst.CSTNode = node
    for parent in fm.ancestors(node):
        if isinstance(parent, (cst.FunctionDef, cst.ClassDef, cst.Lambda)):
            return None  # what calls the function decides; not followed here
        test = None
        if isinstance(parent, (cst.If, cst.While, cst.IfExp)) and child is not parent.test:
            test = parent.test
        if test is not None and (
            _PER_RANK_TEST.search(fm.module.code_for_node(test)) or any(
                _holds_rank(fm, n) for n in _names(test))
        ):
            return test
        child = parent
    return None


def _names(test: cst.BaseExpression) -> list[cst.BaseExpression]:
    return [n for n in findall(test, m.Name() | m.Attribute())
            if isinstance(n, (cst.Name, cst.Attribute))]


_DDP = ("sdp_runtime.torch.DistributedDataParallel", "torch.nn.parallel.DistributedDataParallel",
        "sdp_runtime.torch.parallel.DistributedDataParallel")


@dataclass(frozen=True)
class Collective:
    """A call every rank must make together, reached from a statement: ``call`` is in the
    statement (the collective itself, or the call of a function of this file that leads to
    it); ``path`` names the calls on the way, outermost first, ending with the collective."""

    call: cst.Call
    path: tuple[str, ...]

    @property
    def words(self) -> str:
        """``evaluate(...), which runs model(...)`` (the report's words)."""
        return ", which runs ".join(self.path)


def reaches_collective(fm: FileModel, node: cst.CSTNode) -> Collective | None:
    """A call in ``node`` (a statement or a block) that every rank must make together, directly
    or through the functions of this file it calls (4 deep, the wrapped models handed to them
    followed into their parameters): a wrapped model's forward (DDP syncs buffers, BatchNorm's
    included, and may reduce), or a runtime/torch.distributed call (a barrier, a broadcast, an
    allreduce). What reaches one must never be moved onto rank 0 alone: the others never come.
    In project mode, functions of other modules of the run are known too
    (``ModuleFacts.collective_helpers``). None when nothing does (or when the way goes through
    code of another module the run does not hold)."""
    models = set(fm.facts.wrapped_models or ())
    return _reach(fm, node, models, 0, set())


def _reach(fm: FileModel, node: cst.CSTNode, models: set[str], depth: int,
           seen: set[int]) -> Collective | None:
    for call in findall(node, m.Call()):
        assert isinstance(call, cst.Call)
        func = fm.module.code_for_node(call.func)
        if _wrapped(fm, call.func, models):
            return Collective(call, (f"{func}(...)",))
        if fm.refers_to(call.func, *COLLECTIVE_PREFIXES, prefix=True) and not fm.refers_to(
            call.func, *RANK_FUNCTIONS, *_NOT_COLLECTIVE
        ):
            return Collective(call, (f"{func}(...)",))
        outside = _helper_of_another_module(fm, call, models)
        if outside is not None:
            return Collective(call, (f"{func}(...)", *outside))
        function = callee(fm, call) if depth < 4 else None
        if function is None or id(function) in seen:
            continue
        inner = {code for code in models if code.startswith("self.")}
        for arg in call.args:
            param = param_for_arg(function, call, arg)
            if param is not None and _wrapped(fm, arg.value, models):
                inner.add(param.name.value)
        found = _reach(fm, function.body, inner | (models - _param_names(function)), depth + 1,
                       seen | {id(function)})
        if found is not None:
            return Collective(call, (f"{func}(...)", *found.path))
    return None


def _helper_of_another_module(fm: FileModel, call: cst.Call,
                              models: set[str]) -> tuple[str, ...] | None:
    """The calls on the way to a collective inside a function of another module of the project
    (``ModuleFacts.collective_helpers``) that ``call`` runs: one reaching it on its own, or one
    handed a wrapped model (``validation(model, ...)`` running its forward); None if neither."""
    helpers = getattr(fm.project, "collective_helpers", ())
    for name, path, always in helpers:
        if fm.refers_to(call.func, name) and (always or any(
            _wrapped(fm, arg.value, models) for arg in call.args
        )):
            return path
    return None


def _wrapped(fm: FileModel, expr: cst.BaseExpression, models: set[str]) -> bool:
    """``expr`` is a wrapped model: one of ``models`` (the names the wrap was given), or, in a
    converted file (its second pass), a name bound to ``sdp.DistributedDataParallel(...)``."""
    return fm.module.code_for_node(expr) in models or (isinstance(expr, cst.Name) and any(
        isinstance(v, cst.Call) and fm.refers_to(v.func, *_DDP)
        for v in assigned_values(fm, expr)
    ))


def _param_names(function: cst.FunctionDef) -> set[str]:
    params = function.params
    return {p.name.value for p in (*params.posonly_params, *params.params, *params.kwonly_params,
                                   params.star_arg, params.star_kwarg) if isinstance(p, cst.Param)}


#: Runtime calls every rank may make on its own: who am I, how many are we.
_NOT_COLLECTIVE = (
    "sdp_runtime.torch.size", "sdp_runtime.tensorflow.size", "sdp_runtime.torch.local_rank",
    "sdp_runtime.tensorflow.local_rank",
)


def kept_off_rank0(
    fm: FileModel, action: object, describe: Callable[[cst.CSTNode], str]
) -> str | None:
    """Why the write of ``action`` (a guard_rank0_writes action: the statement ``node``, reported
    at ``anchor``, named by ``describe``) must stay on every rank, as a manual note for the
    transform to report, because its statement also enters a collective
    (``f.write(str(model(x)))``: on rank 0 alone, the model's forward would wait for the other
    ranks: BatchNorm's buffers, DDP's reductions); None when it may move onto rank 0."""
    stmt, at = action.node, action.anchor  # type: ignore[attr-defined]
    what = describe(at)
    shared = reaches_collective(fm, stmt)
    if shared is None:
        return None
    return (f"{what} writes on every rank, but the statement also calls {shared.words}, which "
            f"every rank must run together: not moved onto rank 0. Compute the value on every "
            f"rank first, then write it under `if {fm.sdp}.rank() == 0:`")


def collective_apart(fm: FileModel, stmt: cst.With, item: cst.WithItem) -> bool:
    """Whether a statement of the ``with`` body that does not use its file runs what every rank
    must run together (``loss = validation(model, loader)`` in a log's ``with``): that statement
    stays on every rank. (One that writes what it computes, ``json.dump(predict(model), f)``,
    keeps the whole block on every rank with its note.)"""
    name = item.asname.name if item.asname is not None else None
    body = stmt.body.body if isinstance(stmt.body, cst.IndentedBlock) else ()
    return any(
        reaches_collective(fm, s) is not None and not (
            isinstance(name, cst.Name) and findall(s, m.Name(value=name.value)))
        for s in body
    )


#: Inter-process file locks: the processes of a machine run the block one at a time.
_FILE_LOCKS = ("filelock.FileLock", "filelock.SoftFileLock", "filelock.UnixFileLock",
               "fasteners.InterProcessLock", "fasteners.process_lock.InterProcessLock")


def one_process_at_a_time(fm: FileModel, node: cst.CSTNode) -> bool:
    """Whether ``node`` runs inside ``with sdp.rank0_first():`` or a file lock (``with
    filelock.FileLock(path):``, also through a name bound to one): the processes that share
    the lock's file take turns, so a download there runs once and the others find its files."""
    for parent in fm.ancestors(node):
        if not isinstance(parent, cst.With):
            continue
        for item in parent.items:
            values = [item.item]
            if isinstance(item.item, cst.Name):
                values = assigned_values(fm, item.item) or values
            for value in values:
                if isinstance(value, cst.Call) and (
                    fm.code(value).endswith("rank0_first()")
                    or fm.refers_to(value.func, *_FILE_LOCKS)
                ):
                    return True
    return False
