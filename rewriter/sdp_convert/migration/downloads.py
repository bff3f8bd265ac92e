"""A migrated script's downloads at import, before its ``init()``: repaired where that is safe.

Before::

    import horovod.torch as hvd

    urllib.request.urlretrieve(URL, filename="train.csv")
    ...
    if __name__ == "__main__":
        args = parser.parse_args()
        hvd.init()
        main()

After::

    import sdp_runtime.torch as hvd

    hvd.init()
    if hvd.rank() == 0:
        urllib.request.urlretrieve(URL, filename="train.csv")
    hvd.barrier()
    ...
    if __name__ == "__main__":
        args = parser.parse_args()
        hvd.init()
        main()

Why: every rank downloads into the same files at once, and the rank test and barrier that fix it
need ``init()`` first (before it they raise ``NotInitializedError``). The runtime's ``init()``
does nothing the second time (as Horovod's), so the script's own stays. Done only where moving
``init()`` earlier changes nothing else: the script's first ``init()`` is a statement of its
``__main__`` block, without arguments, and nothing that now runs after it instead of before
(the module's statements after the download, the block's statements before ``init()``) sets
the environment, a multiprocessing start method, a GPU or TensorFlow's configuration. Anywhere
else the contract's note stays: move it after ``init()``.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

import libcst as cst

from ..analysis import is_main_guard
from ..program.deletions import next_statement
from ..program.fetches import fetch_unit, file_fetches

if TYPE_CHECKING:
    from .checks import MigrationChecks

#: Calls that must keep running before ``init()``: it reads the environment, starts processes
#: and takes a GPU.
_BEFORE_INIT = (
    "os.putenv", "os.environ.update", "os.environ.setdefault", "os.environ.__setitem__",
    "multiprocessing.set_start_method", "torch.multiprocessing.set_start_method",
    "torch.multiprocessing.set_sharing_strategy", "torch.cuda.set_device",
)


def order_import_downloads(t: MigrationChecks, module: cst.Module, init: cst.Call | None) -> None:
    """Put ``init()`` before the first download the module runs at import, and each download on
    rank 0 only, then a barrier (module docstring); nothing where that is not safe."""
    fm = t.fm
    top = [c for c in file_fetches(fm) if _at_import(t, c)]
    alias = t.alias
    if not top or init is None or init.args or not t.state.info.entry_point or alias is None or (
        t.ROOT != "horovod" or fm.code(init.func) != f"{alias}.init"
    ):  # Horovod's own init() (another library's may take what it needs as arguments)
        return
    main = _main_block(module)
    init_stmt = t.enclosing_statement(init)
    if main is None or init_stmt is None or init_stmt not in main.body.body:
        return
    units = [fetch_unit(fm, c) for c in top]
    if any(u.problem is not None or not u.barrier or not u.statements for u in units):
        return
    first = units[0].statements[0]
    if first not in module.body:
        return
    start = module.body.index(first)
    moved = [*module.body[start:], *main.body.body[:main.body.body.index(init_stmt)]]
    if any(_before_init(t, s) for s in moved if s is not main):
        return
    t.insert_before(first, cst.parse_statement(f"{alias}.init()\n"))
    firsts = {id(u.statements[0]) for u in units}
    for unit, call in zip(units, top, strict=True):
        for stmt in unit.statements:
            t.guard_rank0(stmt)
        if id(next_statement(fm, unit.statements[-1])) not in firsts:  # one after consecutive ones
            t.insert_after(unit.statements[-1], cst.parse_statement(f"{alias}.barrier()\n"))
        t.record(call, f"{fm.code(call.func)}(...) ran at import on every rank at once, before "
                       f"{alias}.init(): {alias}.init() now comes first (the script's own does "
                       f"nothing the second time), then it runs on rank 0 only, then "
                       f"{alias}.barrier()")


def _at_import(t: MigrationChecks, call: cst.Call) -> bool:
    return not any(isinstance(a, (cst.FunctionDef, cst.ClassDef, cst.Lambda, cst.If, cst.With))
                   for a in t.ancestors(call))


def _main_block(module: cst.Module) -> cst.If | None:
    for stmt in module.body:
        if isinstance(stmt, cst.If) and is_main_guard(stmt.test):
            return stmt
    return None


def _before_init(t: MigrationChecks, stmt: cst.CSTNode) -> bool:
    """Whether ``stmt`` (outside a function or class) sets what ``init()`` reads."""
    for node in _walk(stmt):
        if isinstance(node, cst.Call) and (
            t.refers_to(node.func, *_BEFORE_INIT)
            or t.refers_to(node.func, "tensorflow.config", prefix=True)
        ):
            return True
        targets = (node.targets if isinstance(node, cst.Assign) else [
            cst.AssignTarget(node.target)] if isinstance(node, (cst.AugAssign, cst.AnnAssign))
            else [])
        if any(isinstance(a.target, cst.Subscript) and t.refers_to(a.target.value, "os.environ")
               for a in targets):
            return True
        if isinstance(node, cst.Del) and "environ" in t.module.code_for_node(node):
            return True
    return False


def _walk(node: cst.CSTNode) -> Iterator[cst.CSTNode]:
    """The node and everything in it that runs with it (not the bodies of functions or
    classes it defines)."""
    yield node
    if isinstance(node, (cst.FunctionDef, cst.ClassDef, cst.Lambda)):
        return
    for child in node.children:
        yield from _walk(child)
