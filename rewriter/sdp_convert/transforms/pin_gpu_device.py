"""Pin each process to one GPU, its local rank's, and point hard-coded GPU indices there.

Before::

    device = torch.device("cuda:0" if torch.cuda.is_available() else "cpu")
    torch.cuda.set_device(0)
    x = x.cuda(0)

After::

    sdp.init()
    if torch.cuda.is_available():
        torch.cuda.set_device(sdp.local_rank())
    ...
    device = torch.device(f"cuda:{sdp.local_rank()}" if torch.cuda.is_available() else "cpu")
    torch.cuda.set_device(sdp.local_rank())
    x = x.cuda(sdp.local_rank())

Why: the processes of one machine share its GPUs; each must use its own, the one of its local
rank, or they all pile onto GPU 0. ``torch.cuda.set_device`` right after ``init()`` makes
``"cuda"``, ``torch.device("cuda")`` and ``.cuda()`` mean that GPU, so those are left as they are;
only explicit indices (``"cuda:1"``, ``.cuda(0)``, ``torch.device("cuda", 0)``, ``device=0``,
an integer variable used as a GPU, also through a function's parameter or ``self.<attr>``, as
in ``device = 0`` handed to a ``Trainer`` that calls ``model.to(gpu_id)``) are rewritten. No
``set_device`` is added where the script already calls one (its index becomes the local rank).
A script that uses several GPUs in one process (model parallel) and one that sets
``CUDA_VISIBLE_DEVICES`` itself get a manual note.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Literal

import libcst as cst
import libcst.matchers as m

from ..base import Transform
from ..program.builders import module_spelling
from ..program.flow import origin
from ..program.index import FileIndex, file_index
from ..program.syntax import arg_named, code, end_of_import_block, findall, mentions

_CUDA_INDEX = re.compile(r"cuda:(\d+)")
_LOCAL_RANK = (
    "sdp_runtime.torch.local_rank",
    "sdp_runtime.torch.distributed.get_local_rank",
)
_VISIBLE = "CUDA_VISIBLE_DEVICES"
_CONSTANTS = ("True", "False", "None")
_ENV_WRITERS = ("os.environ.setdefault", "os.environ.update", "os.putenv")


class PinGpuDevice(Transform):
    DESCRIPTION = "Pin each process to the GPU of its local rank; hard-coded GPU indices follow."
    FRAMEWORKS = frozenset({"torch"})
    PROJECT_ROLES = frozenset({"entry"})

    def prepare(self, module: cst.Module) -> None:
        self.index: FileIndex = file_index(self.fm)
        # original Integer / SimpleString -> the GPU index it names
        self.literals: dict[cst.CSTNode, int] = {}
        self.anchor: cst.CSTNode | None = None
        self.insert = True
        pinned = by_literal = False  # the script calls set_device(local rank) / set_device(<n>)

        for call in self.calls_to("torch.cuda.set_device", "torch.cuda.device"):
            arg = arg_named(call, "device", 0)
            if arg is not None:
                pins = self._device(arg.value, integers=True, note=True)
                setting = self.refers_to(call.func, "torch.cuda.set_device")
                pinned |= setting and pins == "local"
                by_literal |= setting and pins == "literal"
        for call in self.calls_to("torch.device"):
            kind, index = arg_named(call, "type", 0), arg_named(call, "index", 1)
            if kind is not None and index is not None:
                if _is_string(kind.value, "cuda"):
                    self._device(index.value, integers=True, note=True)
            elif kind is not None:
                self._device(kind.value, integers=True, note=False)
        for call in (*self.method_calls("cuda"), *self.method_calls("to")):
            arg = arg_named(call, "device", 0)
            if arg is not None:
                self._device(arg.value, integers=True, note=False)
        for call in self.calls_to("torch", prefix=True):  # torch.zeros(2, device=0)
            arg = arg_named(call, "device")
            if arg is not None:
                self._device(arg.value, integers=True, note=False)
        for call in self.calls_to("torch.load"):
            arg = arg_named(call, "map_location", 1)
            if arg is not None:
                self._device(arg.value, integers=False, note=False)
        for call in self.method_calls("add_argument"):
            arg = arg_named(call, "default")
            if arg is not None:
                self._device(arg.value, integers=False, note=False)

        if len(set(self.literals.values())) > 1:
            gpus = ", ".join(f"cuda:{i}" for i in sorted(set(self.literals.values())))
            first = min(self.literals, key=lambda n: self.index.order.get(id(n), 0))
            self.record(
                first,
                f"one process uses several GPUs ({gpus}): model parallelism is not converted; "
                f"give each process its own GPUs by hand",
                manual=True,
            )
            self.literals.clear()
            by_literal = False

        for call in self.calls_to(*_ENV_WRITERS):
            if any(_names_visible_devices(a) for a in call.args):
                self._visible_devices(call)

        # set_device goes right after init(): the file's own, or the one add_runtime_init adds
        self.insert = not (pinned or by_literal)
        inits = self.calls_to(f"{self.state.runtime_module}.init")
        if not inits and not self.state.info.entry_point:
            # A module others import: no init() here (add_runtime_init says where it goes), and
            # set_device(local_rank()) at import would run before it.
            self.insert = False
        if self.insert and inits:
            self.anchor = self.enclosing_statement(inits[0])
            if self.anchor is not None:
                self._pin(_after_torch_import(module, self.anchor))
            self.insert = False
        elif self.insert:
            self.anchor = end_of_import_block(module)
            if self.anchor is not None:
                self.anchor = _after_torch_import(module, self.anchor)

    # -- what the file says about devices -----------------------------------------------------

    def _device(
        self, expr: cst.BaseExpression, *, integers: bool, note: bool
    ) -> Literal["literal", "local"] | None:
        """Note the literals of ``expr`` (original) that name a GPU. Says whether ``expr`` names
        a GPU by a literal index or by the local rank."""
        pins: Literal["literal", "local"] | None = None
        for leaf in self._leaves(expr, 0):
            if isinstance(leaf, cst.UnaryOperation) and isinstance(leaf.operator, cst.Minus):
                continue  # ``gpu = -1``: the script's way of saying "CPU", no GPU index
            if isinstance(leaf, cst.Integer) and integers:
                self.literals[leaf] = int(leaf.evaluated_value)
                pins = "literal"
            elif isinstance(leaf, cst.SimpleString) and isinstance(leaf.evaluated_value, str):
                found = _CUDA_INDEX.fullmatch(leaf.evaluated_value)
                if found:
                    self.literals[leaf] = int(found.group(1))
                    pins = "literal"
            elif mentions(self.fm, leaf, *_LOCAL_RANK):
                pins = "local"
            elif note and not self._is_device_object(leaf):
                self.record(
                    leaf,
                    f"GPU index {code(leaf)} chosen by the script: each process must use its own "
                    f"GPU, {self.sdp}.local_rank()",
                    manual=True,
                )
        return pins

    def _leaves(
        self, expr: cst.BaseExpression, depth: int, at: cst.CSTNode | None = None
    ) -> Iterator[cst.BaseExpression]:
        """The values ``expr`` may take: both sides of ``a if c else b`` / ``a or b``, and where a
        name or ``self.<attr>`` comes from (``program.flow.origin``: assignments, the argument
        of a parameter's one caller, a function's one return)."""
        at = at if at is not None else expr
        if isinstance(expr, cst.IfExp):
            yield from self._leaves(expr.body, depth, at)
            yield from self._leaves(expr.orelse, depth, at)
        elif isinstance(expr, cst.BooleanOperation):
            yield from self._leaves(expr.left, depth, at)
            yield from self._leaves(expr.right, depth, at)
        elif (
            isinstance(expr, (cst.Name, cst.Attribute))
            and depth < 4
            and code(expr) not in _CONSTANTS
        ):
            if isinstance(expr, cst.Name):
                binding = self.index.reaching(expr.value, at)
                if binding is not None and binding.kind == "import":
                    return
            back = origin(self.fm, self.index, expr, at)
            if back is not None and back.value is not None:
                yield from self._leaves(back.value, depth + 1, back.at)
            else:
                yield expr
        else:
            yield expr

    def _is_device_object(self, expr: cst.BaseExpression) -> bool:
        """``torch.device(...)``, a string, or the name of something else than a number."""
        if isinstance(expr, (cst.SimpleString, cst.FormattedString, cst.ConcatenatedString)):
            return True
        return isinstance(expr, cst.Call) and self.refers_to(expr.func, "torch.device")

    def _visible_devices(self, node: cst.CSTNode) -> None:
        self.record(
            node,
            f"{_VISIBLE} set by the script: every process would see the same GPUs; remove it "
            f"(each process picks its GPU by local rank)",
            manual=True,
        )

    # -- rewriting ----------------------------------------------------------------------------

    def _pin(self, anchor: cst.CSTNode) -> None:
        torch = module_spelling(self.fm, "torch", self.add_import)
        self.add_runtime_import()
        self.insert_after(
            anchor,
            cst.parse_statement(
                f"if {torch}.cuda.is_available():\n"
                f"    {torch}.cuda.set_device({self.sdp}.local_rank())\n"
            ),
        )
        self.record(
            anchor, f"{torch}.cuda.set_device({self.sdp}.local_rank()) when CUDA is available"
        )

    def leave_Module(self, original_node: cst.Module, updated_node: cst.Module) -> cst.Module:
        # Here, not in prepare: add_runtime_init inserts init() after the same statement in its
        # own leave_Module, which runs first, so set_device lands after init().
        if self.insert:
            if self.anchor is None:
                self.record(
                    original_node,
                    f"call torch.cuda.set_device({self.sdp}.local_rank()) after {self.sdp}.init()",
                    manual=True,
                )
            else:
                self._pin(self.anchor)
        return updated_node

    def leave_Integer(
        self, original_node: cst.Integer, updated_node: cst.Integer
    ) -> cst.BaseExpression:
        if original_node not in self.literals:
            return updated_node
        self.add_runtime_import()
        self.record(original_node, f"GPU {original_node.value} -> {self.sdp}.local_rank()")
        return cst.parse_expression(f"{self.sdp}.local_rank()").with_changes(
            lpar=updated_node.lpar, rpar=updated_node.rpar
        )

    def leave_SimpleString(
        self, original_node: cst.SimpleString, updated_node: cst.SimpleString
    ) -> cst.BaseExpression:
        if original_node not in self.literals:
            return updated_node
        self.add_runtime_import()
        quote = original_node.quote
        new = f"f{quote}cuda:{{{self.sdp}.local_rank()}}{quote}"
        self.record(original_node, f"{original_node.value} -> {new}")
        return cst.parse_expression(new).with_changes(
            lpar=updated_node.lpar, rpar=updated_node.rpar
        )

    def leave_Assign(self, original_node: cst.Assign, updated_node: cst.Assign) -> cst.Assign:
        # os.environ["CUDA_VISIBLE_DEVICES"] = "0"
        for target in original_node.targets:
            if (
                isinstance(target.target, cst.Subscript)
                and self.refers_to(target.target.value, "os.environ")
                and _names_visible_devices(target.target)
            ):
                self._visible_devices(original_node)
        return updated_node


def _is_string(expr: cst.BaseExpression, value: str) -> bool:
    return isinstance(expr, cst.SimpleString) and expr.evaluated_value == value


def _names_visible_devices(node: cst.CSTNode) -> bool:
    if isinstance(node, cst.Arg) and node.keyword is not None and node.keyword.value == _VISIBLE:
        return True
    return any(
        isinstance(s, cst.SimpleString) and s.evaluated_value == _VISIBLE
        for s in findall(node, m.SimpleString())
    )


def _after_torch_import(module: cst.Module, anchor: cst.CSTNode) -> cst.CSTNode:
    """``anchor``, or the later top-level statement that imports torch when ``anchor`` (a
    top-level statement) comes first: ``set_device`` must not run before ``import torch``."""
    body = list(module.body)
    if anchor not in body:
        return anchor
    for stmt in body[: body.index(anchor) + 1]:
        if _imports_torch(stmt):
            return anchor
    for stmt in body[body.index(anchor) + 1 :]:
        if _imports_torch(stmt):
            return stmt
    return anchor


def _imports_torch(stmt: cst.CSTNode) -> bool:
    if not isinstance(stmt, cst.SimpleStatementLine):
        return False
    for small in stmt.body:
        if isinstance(small, cst.Import) and any(
            (cst.helpers.get_full_name_for_node(a.name) or "").split(".")[0] == "torch"
            for a in small.names
        ):
            return True
        if (
            isinstance(small, cst.ImportFrom)
            and small.module is not None
            and not small.relative
            and (cst.helpers.get_full_name_for_node(small.module) or "").split(".")[0] == "torch"
        ):
            return True
    return False
