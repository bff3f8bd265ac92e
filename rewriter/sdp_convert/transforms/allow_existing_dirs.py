"""Let every rank create the same directory without racing: ``exist_ok=True``.

Before::

    if not os.path.isdir("checkpoint"):
        os.mkdir("checkpoint")
    os.makedirs(args.out_dir)
    Path(args.log_dir).mkdir(parents=True)

After::

    if not os.path.isdir("checkpoint"):
        os.makedirs("checkpoint", exist_ok=True)
    os.makedirs(args.out_dir, exist_ok=True)
    Path(args.log_dir).mkdir(parents=True, exist_ok=True)

Why: directory creation stays on every rank (a rank may write its own files there, and the
rank-0 writes need it), but N ranks checking "does it exist?" and then creating it race: one of
them dies with ``FileExistsError`` (kuangliu/pytorch-cifar's ``main.py`` does within a few
hundred tries). ``os.mkdir(d)`` becomes ``os.makedirs(d, exist_ok=True)`` (which also creates
missing parents), ``os.makedirs`` and ``Path.mkdir`` get ``exist_ok=True``. Left alone: a call
already passing ``exist_ok``, one on rank 0 only, one inside ``try:`` (the script handles the
error), one under a temporary directory of the process (``tempfile.mkdtemp()``: its own).
"""

from __future__ import annotations

import libcst as cst

from ..base import Transform
from ..program.ranks import only_called_on_rank0, rank0_only
from ..program.readback import is_private_temp
from ..program.scopes import assigned_values
from ..program.syntax import add_keyword, arg_named

PATH_CLASSES = ("pathlib.Path", "pathlib.PosixPath", "pathlib.WindowsPath")


class AllowExistingDirs(Transform):
    DESCRIPTION = "Directory creation on every rank with exist_ok=True (no FileExistsError race)."
    FRAMEWORKS = frozenset({"torch", "tensorflow"})
    # In project mode, also in the helper modules a training script imports (``mkdir_p``).
    PROJECT_ROLES = frozenset({"helper"})

    def prepare(self, module: cst.Module) -> None:
        self._mkdir: set[cst.Call] = set()
        self._add: set[cst.Call] = set()
        calls = [(c, "os.mkdir") for c in self.calls_to("os.mkdir")]
        calls += [(c, "os.makedirs") for c in self.calls_to("os.makedirs")]
        calls += [(c, "Path.mkdir") for c in self.method_calls("mkdir") if self._on_path(c)]
        for call, what in calls:
            if arg_named(call, "exist_ok", 2 if what == "os.makedirs" else None) is not None:
                continue
            if any(a.star for a in call.args) or self._skipped(call):
                continue
            path = call.args[0].value if call.args and what != "Path.mkdir" else None
            if path is not None and is_private_temp(self.fm, path):
                continue
            if what == "os.mkdir":
                if len(call.args) != 1:  # a mode: os.makedirs takes it too, but keep it simple
                    continue
                self._mkdir.add(call)
                self.record(call, "os.mkdir(...) -> os.makedirs(..., exist_ok=True): every rank "
                                  "creates it, none fails because another was first")
            else:
                self._add.add(call)
                self.record(call, f"{what}(...): exist_ok=True, every rank creates it, none fails "
                                  "because another was first")

    def _on_path(self, call: cst.Call) -> bool:
        func = call.func
        return isinstance(func, cst.Attribute) and self._is_path(func.value, 0)

    def _is_path(self, expr: cst.BaseExpression, depth: int) -> bool:
        """``Path(...)``, ``Path(a) / "b"``, ``Path(a).parent``, or a name holding one."""
        if depth > 3:
            return False
        if isinstance(expr, cst.BinaryOperation):
            return self._is_path(expr.left, depth + 1)
        if isinstance(expr, cst.Attribute):
            return self._is_path(expr.value, depth + 1)
        if isinstance(expr, cst.Call):
            return self.refers_to(expr.func, *PATH_CLASSES)
        if isinstance(expr, cst.Name):
            values = assigned_values(self.fm, expr)
            return bool(values) and all(self._is_path(v, depth + 1) for v in values)
        return False

    def _skipped(self, call: cst.Call) -> bool:
        if rank0_only(self.fm, call) or only_called_on_rank0(self.fm, call):
            return True
        if any(p in self.state.edits.guarded for p in self.ancestors(call)):
            return True
        return any(isinstance(p, cst.Try) for p in self.ancestors(call))

    def leave_Call(self, original_node: cst.Call, updated_node: cst.Call) -> cst.BaseExpression:
        true = cst.Name("True")
        if original_node in self._mkdir:
            func = updated_node.func
            new_func = func.with_changes(attr=cst.Name("makedirs")) if isinstance(
                func, cst.Attribute) else cst.parse_expression("os.makedirs")
            return add_keyword(updated_node.with_changes(func=new_func), "exist_ok", true,
                               first=False)
        if original_node in self._add:
            return add_keyword(updated_node, "exist_ok", true, first=False)
        return updated_node
