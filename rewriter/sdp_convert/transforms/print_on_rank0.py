"""Show progress bars (and, on request, ``print`` output) on rank 0 only.

Before::

    for x, y in tqdm(train_loader, desc="train"):
        ...
    print(f"epoch {epoch}: loss {loss:.4f}")

After (``--rank0-output all``; the default ``progress`` does the first edit only)::

    for x, y in tqdm(train_loader, desc="train", disable=sdp.rank() != 0):
        ...
    sdp.rank0_print(f"epoch {epoch}: loss {loss:.4f}")

Why: every rank runs the same loop, so N ranks draw N progress bars over each other and print
every line N times; Horovod and Accelerate users expect one copy, from rank 0. Progress bars
(``tqdm``, ``trange``, ``tqdm.auto``/``tqdm.notebook``) get ``disable=<sdp>.rank() != 0`` (or'ed
with a ``disable=`` they have) by default. With ``--rank0-output all`` (``rank0-output = "all"``
in ``[tool.sdp-convert]``, ``rank0_output="all"`` in the Python API), ``print(...)`` calls become
``sdp.rank0_print(...)`` (the same arguments; it prints on rank 0 only) too, except prints to a
``file=`` and those already on rank 0 only. ``--rank0-output none`` changes neither. Logging is
left as it is (every rank logs; ``logging.basicConfig`` is the user's).
"""

from __future__ import annotations

import libcst as cst

from ..base import Transform
from ..program.ranks import only_called_on_rank0, rank0_only
from ..program.syntax import add_keyword, arg_named, code

PROGRESS_BARS = (
    "tqdm.tqdm",
    "tqdm.trange",
    "tqdm.auto.tqdm",
    "tqdm.auto.trange",
    "tqdm.notebook.tqdm",
    "tqdm.notebook.trange",
    "tqdm.std.tqdm",
    "tqdm.rich.tqdm",
)


class PrintOnRank0(Transform):
    DESCRIPTION = "Progress bars (and, with --rank0-output all, print) on rank 0 only."
    FRAMEWORKS = frozenset({"torch", "tensorflow"})

    def prepare(self, module: cst.Module) -> None:
        self._bars: set[cst.Call] = set()
        self._prints: set[cst.Call] = set()
        mode = self.state.options.rank0_output
        if mode == "none":
            return
        for call in self.calls_to(*PROGRESS_BARS):
            disable = arg_named(call, "disable")
            if disable is not None and "rank()" in code(disable.value):
                continue  # ours, or the script's own rank test
            if self._on_rank0(call):
                continue
            self._bars.add(call)
            self.add_runtime_import()
            self.record(
                call, f"{code(call.func)}(...) shown on rank 0 only (disable= on the others)"
            )
        if mode != "all":
            return
        for call in self.calls_to("builtins.print"):
            if arg_named(call, "file") is not None or self._on_rank0(call):
                continue
            self._prints.add(call)
            self.add_runtime_import()
            self.record(call, f"print(...) -> {self.sdp}.rank0_print(...): printed on rank 0 only")

    def _on_rank0(self, call: cst.Call) -> bool:
        guarded = self.state.edits.guarded  # by guard_rank0_writes, which runs first
        return (
            any(p in guarded for p in self.ancestors(call))
            or rank0_only(self.fm, call)
            or only_called_on_rank0(self.fm, call)
        )

    def leave_Call(self, original_node: cst.Call, updated_node: cst.Call) -> cst.BaseExpression:
        if original_node in self._bars:
            others = cst.parse_expression(f"{self.sdp}.rank() != 0")
            disable = arg_named(updated_node, "disable")
            if disable is None:
                return add_keyword(updated_node, "disable", others, first=False)
            value = cst.BooleanOperation(
                left=disable.value.with_changes(
                    lpar=[cst.LeftParen()], rpar=[cst.RightParen()]
                ) if isinstance(disable.value, (cst.BooleanOperation, cst.IfExp, cst.Lambda))
                else disable.value,
                operator=cst.Or(),
                right=others,
            )
            args = [a.with_changes(value=value) if a is disable else a for a in updated_node.args]
            return updated_node.with_changes(args=args)
        if original_node in self._prints:
            return updated_node.with_changes(func=cst.parse_expression(f"{self.sdp}.rank0_print"))
        return updated_node
