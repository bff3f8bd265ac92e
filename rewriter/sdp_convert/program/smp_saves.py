"""SMP's saves under a rank test: which can be made safe for a sharded model, and why not.

A sharded model (SMP's partitions, tensor or sharded data parallelism, trained with FSDP by the
runtime) gathers its whole state from every rank holding a shard, so ``model.state_dict()`` under
``if smp.rank() == 0:`` (or ``dp_rank()`` under sharded data parallelism) waits for ranks that
never come; and ``smp.save(..., partial=True)`` writes each shard's file on its own rank, so a
rank test can only leave shards out. For one file this answers:

- ``rank_guard(node)``: the innermost ``if`` whose body holds ``node`` and whose test asks for a
  rank (SMP's ``rank``/``dp_rank``/``rdp_rank``/``mp_rank``/``pp_rank``/``tp_rank``/
  ``local_rank``, or what the migration counts as a rank test);
- ``may_be_sharded(call)``: a ``state_dict()`` whose receiver is SMP's ``DistributedModel`` /
  ``DistributedOptimizer``, or one the file does not show;
- ``not_hoistable(call, guard)``: why the ``state_dict()`` call cannot be computed before
  ``guard`` on every rank (None: it can);
- ``not_unguardable(guard)``: why ``guard`` cannot give way to its body of
  ``smp.save(..., partial=True)`` calls (None: it can);
- ``partial(call)``: whether an ``smp.save`` call writes one file per shard.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import libcst as cst
import libcst.matchers as m

from .ranks import divergent_condition
from .scopes import assigned_values
from .syntax import findall

if TYPE_CHECKING:
    from .model import FileModel

ROOT = "smdistributed.modelparallel"
SAVE = f"{ROOT}.torch.save"
#: SMP's rank queries: ``if <query>() == 0:`` keeps rank 0 and, under a sharded configuration,
#: leaves out ranks holding shards.
RANK_QUERIES = frozenset({"rank", "dp_rank", "rdp_rank", "mp_rank", "pp_rank", "tp_rank",
                          "local_rank"})
WRAPPERS = tuple(f"{ROOT}.torch.{name}" for name in ("DistributedModel", "DistributedOptimizer"))

NOT_ONLY_RANK0 = "the test is not only `smp.<x>_rank() == 0`"


class SmpSaves:
    """The questions above for the file ``t`` reads.

    Arguments:
        t: the transform (its program: names, ancestors, calls).
        mentions_rank: whether an expression asks for the rank (the migration's own test).
        under_rank_check: whether a node runs on some ranks only (an ``if`` on the rank, an
            early exit).
    """

    def __init__(self, fm: FileModel, mentions_rank: Callable[[cst.CSTNode], bool],
                 under_rank_check: Callable[[cst.CSTNode], bool]) -> None:
        self.fm = fm
        self.mentions_rank = mentions_rank
        self.under_rank_check = under_rank_check

    def rank_guard(self, node: cst.CSTNode) -> cst.If | None:
        child: cst.CSTNode = node
        for parent in self.fm.ancestors(node):
            if isinstance(parent, (cst.FunctionDef, cst.ClassDef, cst.Lambda)):
                return None
            if isinstance(parent, cst.If) and child is parent.body and (
                self.mentions_rank(parent.test) or any(
                    isinstance(c, cst.Call) and self.is_rank_query(c)
                    for c in findall(parent.test, m.Call()))
            ):
                return parent
            child = parent
        return None

    def is_rank_query(self, call: cst.Call) -> bool:
        return not call.args and any(
            q.startswith(ROOT + ".") and q.rpartition(".")[2] in RANK_QUERIES
            for q in self.fm.qualified_names(call.func)
        )

    def is_rank0_query_test(self, test: cst.BaseExpression) -> bool:
        """``smp.<x>_rank() == 0`` / ``0 == smp.<x>_rank()`` / ``not smp.<x>_rank()``."""
        subject: cst.BaseExpression | None = None
        if isinstance(test, cst.UnaryOperation) and isinstance(test.operator, cst.Not):
            subject = test.expression
        elif (isinstance(test, cst.Comparison) and len(test.comparisons) == 1
              and isinstance(test.comparisons[0].operator, cst.Equal)):
            left, right = test.left, test.comparisons[0].comparator
            if m.matches(right, m.Integer("0")):
                subject = left
            elif m.matches(left, m.Integer("0")):
                subject = right
        return isinstance(subject, cst.Call) and self.is_rank_query(subject)

    def _receiver_values(self, call: cst.Call) -> list[cst.BaseExpression] | None:
        func = call.func
        if not (isinstance(func, cst.Attribute) and isinstance(func.value, cst.Name)):
            return None
        return assigned_values(self.fm, func.value)

    def is_smp_wrapper(self, call: cst.Call) -> bool:
        """Whether ``x.method()``'s ``x`` is assigned from SMP's model or optimizer wrapper."""
        return any(isinstance(v, cst.Call) and self.fm.refers_to(v.func, *WRAPPERS)
                   for v in self._receiver_values(call) or [])

    def may_be_sharded(self, call: cst.Call) -> bool:
        values = self._receiver_values(call)
        return not values or self.is_smp_wrapper(call)

    def _guard_problem(self, guard: cst.If) -> str | None:
        if not self.is_rank0_query_test(guard.test) or guard.orelse is not None:
            return NOT_ONLY_RANK0
        if self.under_rank_check(guard) or divergent_condition(self.fm, guard) is not None:
            return "the test itself runs on some ranks only"
        return None

    def not_hoistable(self, call: cst.Call, guard: cst.If) -> str | None:
        if self._guard_problem(guard) == NOT_ONLY_RANK0:
            return NOT_ONLY_RANK0
        if not self.is_smp_wrapper(call) or call.args:
            return "its receiver is not shown to be smp.DistributedModel/DistributedOptimizer"
        problem = self._guard_problem(guard)
        if problem is not None:
            return problem
        stmt = self.fm.enclosing_statement(call)
        body = guard.body
        if stmt is None or not isinstance(body, cst.IndentedBlock) or stmt not in body.body:
            return "it is not directly in the test's body"
        for parent in self.fm.ancestors(call):
            if parent is stmt:
                break
            if isinstance(parent, (cst.Lambda, cst.BaseComp, cst.FunctionDef)):
                return "it runs inside a function or comprehension"
        name = cst.ensure_type(cst.ensure_type(call.func, cst.Attribute).value, cst.Name).value
        for before in body.body[: body.body.index(stmt)]:
            if findall(before, m.Name(name)):
                return f"code before it in the test's body uses {name}"
        return None

    def not_unguardable(self, guard: cst.If) -> str | None:
        problem = self._guard_problem(guard)
        if problem is not None:
            return problem
        saves = {id(c) for c in self.fm.calls_to(SAVE)}
        for stmt in cst.ensure_type(guard.body, cst.IndentedBlock).body:
            small = stmt.body[0] if isinstance(stmt, cst.SimpleStatementLine) else None
            if m.matches(stmt, _LOCAL_STATE):
                continue  # this rank's own shard, read for the save: no other rank takes part
            if not (isinstance(stmt, cst.SimpleStatementLine) and len(stmt.body) == 1
                    and isinstance(small, cst.Expr) and isinstance(small.value, cst.Call)
                    and id(small.value) in saves and partial(small.value)
                    and isinstance(small.value.func, cst.Attribute)
                    and isinstance(small.value.func.value, cst.Name)
                    and not findall(stmt, m.Call(func=m.Attribute(attr=m.Name("state_dict"))))):
                return "the test guards more than smp.save(..., partial=True) calls"
        return None


#: ``model_dict = model.local_state_dict()``: the guide's save reads each shard's own state.
_LOCAL_STATE = m.SimpleStatementLine(body=[m.Assign(
    targets=[m.AssignTarget(target=m.Name())],
    value=m.Call(func=m.Attribute(value=m.Name(), attr=m.Name("local_state_dict")), args=[]),
)])


def partial(call: cst.Call) -> bool:
    """Whether an ``smp.save`` call writes one file per shard (``partial=True``, the default)."""
    for arg in call.args:
        if arg.keyword is not None and arg.keyword.value == "partial":
            return m.matches(arg.value, m.Name("True"))
    return len(call.args) < 3  # (a third positional argument is ``partial``)
