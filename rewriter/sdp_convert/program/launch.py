"""How a script that distributes itself is switched on: the flag in front of its own
distribution, that flag's default, and the launch that sets it.

Many such scripts run on one process as they are usually started: ``if args.local_rank != -1:
init_process_group(...)`` with ``--local_rank`` defaulting to -1, ``if args.distributed:`` with
a ``--distributed`` that is ``store_true``, ``if hparams.distributed_run:`` with
``distributed_run=False`` in the hyper-parameters. "Launch it as before" then means one
process; ``distribution_switch`` finds such a flag, so that the note can say which flag and
which launch command start the script's own distribution.
"""

from __future__ import annotations

import ast
import contextlib
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING

import libcst as cst
import libcst.matchers as m

from .scopes import callers
from .syntax import arg_named, code, findall

if TYPE_CHECKING:
    from .model import FileModel


@dataclass(frozen=True)
class Switch:
    """A flag whose default leaves the script's own distribution off."""

    #: The flag as the script reads it (``args.local_rank``, ``hparams.distributed_run``).
    flag: str
    #: The test it is read in (``args.local_rank != -1``).
    test: str
    #: Its default, as code (``-1``, ``False``).
    default: str
    #: The command-line spellings of its option (``--local_rank``), when it is one.
    options: tuple[str, ...] = ()
    #: The rank ``init_process_group`` is given by the script (``rank=rank``), when it is not
    #: the launcher's (torchrun's environment): its own launcher starts it.
    own_rank: str | None = None
    #: Where the flag is worked out from other flags (``args.distributed = args.world_size > 1
    #: or args.multiprocessing_distributed``): that code and those flags' defaults, in words.
    derived: str = ""
    #: The distribution is a ``tf.distribute`` strategy, which runs in the script's one process
    #: (over the machine's GPUs, or as one worker of a cluster its configuration names).
    strategy: bool = False
    #: The spellings of the parser's ``--local_rank`` option when the script reads each
    #: process's GPU from it: only a launcher that passes it (``torch.distributed.launch``)
    #: starts it right; torchrun sets ``LOCAL_RANK`` in the environment instead.
    local_rank_options: tuple[str, ...] = ()

    @property
    def launch(self) -> str:
        """The launch that turns the distribution on, in words."""
        if self.strategy:
            value = "" if self.default in ("False", "None") else " VALUE"
            return (f"`python SCRIPT.py {self.options[0]}{value} ...`" if self.options
                    else f"{self.flag} set")
        through = f" (through {' / '.join(self.options)})" if self.derived and self.options else ""
        if self.own_rank is not None:
            return (f"one process per GPU, each given its rank (init_process_group(rank="
                    f"{self.own_rank})), with {self.flag} set{through}, as its own launcher does")
        flag_is_local_rank = self.flag.rsplit(".", 1)[-1] == "local_rank" and self.options
        local = self.options if flag_is_local_rank else self.local_rank_options
        if local:
            command = "`python -m torch.distributed.launch --nproc_per_node=N SCRIPT.py ...`"
            if not flag_is_local_rank:
                command += f" with {self.flag} set{through}"
            passes = ("it passes each process its --local-rank" if "--local-rank" in local else
                      "it passes each process --local-rank since PyTorch 2.0: add that spelling "
                      f"to the parser's {' / '.join(local)}")
            return (f"{command} ({passes}; torchrun passes none, it sets LOCAL_RANK in the "
                    "environment instead)")
        if self.options:
            option = self.options[0]
            value = "" if self.default in ("False", "None") else " VALUE"
            return f"`torchrun --nproc_per_node=N SCRIPT.py {option}{value} ...`"
        return f"`torchrun --nproc_per_node=N SCRIPT.py ...` with {self.flag} set{through}"


def distribution_switch(fm: FileModel, node: cst.CSTNode) -> Switch | None:
    """The flag in front of ``node`` (the call that distributes the script: its
    ``init_process_group``, its ``DistributedDataParallel``, its own set-up function) whose
    default leaves it off: the test of an ``if`` around it (or around a call of the function it
    is in) that is false with the flag's default. None when no such test is found, or the
    default cannot be read (a value set at run time: ``args.distributed = world_size > 1``)."""
    for test in _tests_around(fm, node):
        attributes = {code(n) for n in findall(test, m.Attribute())}
        for flag in sorted(a for a in attributes if re.fullmatch(r"\w+(\.\w+)+", a)):
            default, options = _default(fm, flag.rsplit(".", 1)[-1])
            derived = ""
            if default is None:
                default, options, derived = _derived_default(fm, flag)
            if default is None:
                default, derived = _imported_default(fm, flag)
            if default is None:
                continue
            if _evaluate(code(test), {flag: default}) is False:
                strategy = isinstance(node, cst.Call) and any(
                    q.startswith("tensorflow.distribute.") for q in fm.qualified_names(node.func))
                return Switch(flag, code(test), repr(default), options, _own_rank(fm), derived,
                              strategy, _local_rank_options(fm))
    return None


def distribution_condition(fm: FileModel, node: cst.CSTNode) -> str | None:
    """The test of the innermost ``if`` around ``node`` (or around a call of its function, 2
    calls up), as code, when ``distribution_switch`` could not read the default of what it
    reads (``if config.train.distributed:`` with the default in another module's
    configuration; ``if dist.is_initialized():``): the distribution is conditional, whether it
    is on as the script is usually started is unknown. None outside any such ``if``; a
    ``__name__`` test is no condition."""
    for test in _tests_around(fm, node):
        if "__name__" not in code(test):
            return code(test)
    return None


def _derived_default(fm: FileModel, flag: str) -> tuple[object, tuple[str, ...], str]:
    """The default of a flag the script works out from other flags, once (``args.distributed =
    args.world_size > 1 or args.multiprocessing_distributed``): that expression with their
    defaults; ``(None, (), "")`` when it is set elsewhere too or reads anything else."""
    base, _, name = flag.rpartition(".")
    assigns = [a for a in findall(fm.module, m.Assign(targets=[m.AssignTarget(
        m.Attribute(value=m.Name(base), attr=m.Name(name)))])) if isinstance(a, cst.Assign)]
    if len(assigns) != 1:
        return None, (), ""
    value = assigns[0].value
    sources = sorted({code(n) for n in findall(value, m.Attribute(value=m.Name(base)))})
    defaults: dict[str, object] = {}
    options: tuple[str, ...] = ()
    for source in sources:
        default, spelled = _default(fm, source.rsplit(".", 1)[-1])
        if default is None:
            return None, (), ""
        defaults[source] = default
        options += spelled[:1]
    result = _evaluate(code(value), defaults) if defaults else None
    if result is None:
        return None, (), ""
    given = ", ".join(f"{s} = {d!r}" for s, d in defaults.items())
    return result, options, f", being `{code(value)}` with {given}"


def _imported_default(fm: FileModel, flag: str) -> tuple[object, str]:
    """The default a module this one imports gives the configuration attribute ``flag``
    (``config.train.distributed`` <- ``config.train.distributed = False`` in
    ``config/defaults.py``: ``ModuleFacts.attribute_defaults``), with where it is set."""
    key = flag.split(".", 1)[1] if "." in flag else ""
    for path, value, where in fm.project.attribute_defaults if fm.project is not None else ():
        if path == key:
            return _literal(cst.parse_expression(value)), f", set in {where}"
    return None, ""


def _local_rank_options(fm: FileModel) -> tuple[str, ...]:
    """The parser's ``--local_rank`` / ``--local-rank`` spellings, where the script reads the
    option (``args.local_rank``: each process's GPU, say)."""
    _, options = _default(fm, "local_rank")
    if not findall(fm.module, m.Attribute(attr=m.Name("local_rank"))):
        return ()
    return tuple(o for o in options if o.startswith("--"))


#: What a script that is its own launcher starts its processes with.
_STARTS_PROCESSES = (
    "torch.multiprocessing.spawn", "torch.multiprocessing.start_processes",
    "torch.multiprocessing.Process", "multiprocessing.Process",
)


def _own_rank(fm: FileModel) -> str | None:
    """The ``rank=`` the script gives ``init_process_group`` itself, where it starts its
    processes itself (``torch.multiprocessing.spawn``): not read from the environment a launcher
    such as torchrun sets, nor a configuration value or flag handed to it by whoever started
    it (``rank=config.dist.node_rank`` with ``init_method="env://"``)."""
    if not fm.calls_to(*_STARTS_PROCESSES):
        return None
    for call in fm.calls_to("torch.distributed.init_process_group"):
        rank = arg_named(call, "rank", 4)
        if rank is not None and "environ" not in code(rank.value) and "RANK" not in code(
            rank.value
        ):
            return code(rank.value)
    return None


def _tests_around(fm: FileModel, node: cst.CSTNode, depth: int = 0) -> list[cst.BaseExpression]:
    """The tests of the ``if``s whose body holds ``node``, innermost first, then those around
    the calls of its function (2 calls up)."""
    tests: list[cst.BaseExpression] = []
    child = node
    for parent in fm.ancestors(node):
        if isinstance(parent, cst.If) and child in (parent.body, parent.test):
            tests.append(parent.test)  # (a read of the flag itself shows the distribution)
        if isinstance(parent, cst.FunctionDef):
            if depth < 2:
                for call in callers(fm, parent):
                    tests += _tests_around(fm, call, depth + 1)
            break
        child = parent
    return tests


def _default(fm: FileModel, name: str) -> tuple[object, tuple[str, ...]]:
    """The default of the flag ``name``: an ``add_argument`` whose destination it is
    (``default=``, or the ``store_true``/``store_false`` action's), or else the one literal the
    file gives it (``HParams(distributed_run=False)``, ``{"distributed_run": False}``,
    ``distributed_run = False``). ``(None, ())`` when there is none, or several."""
    for call in fm.method_calls("add_argument"):
        options = tuple(a.value.evaluated_value for a in call.args if a.keyword is None
                        and isinstance(a.value, cst.SimpleString)
                        and isinstance(a.value.evaluated_value, str))
        dest = arg_named(call, "dest")
        longs = [o for o in options if o.startswith("--")]
        spelled = (_literal(dest.value) if dest is not None else
                   longs[0].lstrip("-").replace("-", "_") if longs else None)
        if spelled != name:
            continue
        default, action = arg_named(call, "default"), arg_named(call, "action")
        if default is not None:
            return _literal(default.value), options
        kind = _literal(action.value) if action is not None else None
        return {"store_true": False, "store_false": True}.get(str(kind)), options
    for call in fm.calls_to(*_ABSL_DEFINES):
        flag = arg_named(call, "name", 0)
        if flag is not None and _literal(flag.value) == name:
            default = arg_named(call, "default", 1)
            return (_literal(default.value) if default is not None else None), (f"--{name}",)
    values = []
    for kw in findall(fm.module, m.Arg(keyword=m.Name(name))):
        assert isinstance(kw, cst.Arg)
        values.append(_literal(kw.value))
    for element in findall(fm.module, m.DictElement(key=m.SimpleString())):
        assert isinstance(element, cst.DictElement)
        if _literal(element.key) == name:
            values.append(_literal(element.value))
    for assign in findall(fm.module, m.Assign(targets=[m.AssignTarget(
            m.Name(name) | m.Attribute(attr=m.Name(name)))])):
        assert isinstance(assign, cst.Assign)
        values.append(_literal(assign.value))
    found = {repr(v) for v in values}
    return (values[0], ()) if len(found) == 1 and values[0] is not None else (None, ())


#: absl's flag definitions (``flags.DEFINE_boolean("multi_gpu", False, "...")``), however
#: reached (``absl.flags``, ``tf.compat.v1.flags``, ``tf.app.flags``).
_ABSL_DEFINES = tuple(
    f"{module}.DEFINE_{kind}"
    for module in ("absl.flags", "tensorflow.compat.v1.flags", "tensorflow.app.flags",
                   "tensorflow.compat.v1.app.flags")
    for kind in ("boolean", "bool", "integer", "string", "float", "enum")
)

_UNREAD = object()


def _literal(expr: cst.BaseExpression) -> object:
    """The value of a literal (``-1``, ``False``, ``"x"``); None for anything else."""
    with contextlib.suppress(ValueError, SyntaxError):
        return ast.literal_eval(code(expr))
    return None


def _evaluate(test: str, values: dict[str, object]) -> bool | None:
    """The truth of ``test`` with each flag of ``values`` holding its value; None when it reads
    anything else or is not made of comparisons, ``and``/``or``/``not`` and literals."""

    def value_of(node: ast.expr) -> object:
        if ast.unparse(node) in values:
            return values[ast.unparse(node)]
        if isinstance(node, ast.Constant):
            return node.value
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub | ast.Not):
            inner = value_of(node.operand)
            if inner is _UNREAD:
                return _UNREAD
            return -inner if isinstance(node.op, ast.USub) else not inner  # type: ignore
        if isinstance(node, ast.BoolOp):
            operands = [value_of(v) for v in node.values]
            if any(o is _UNREAD for o in operands):
                return _UNREAD
            return all(operands) if isinstance(node.op, ast.And) else any(operands)
        if isinstance(node, ast.Compare) and len(node.ops) == 1:
            left, right = value_of(node.left), value_of(node.comparators[0])
            if _UNREAD in (left, right):
                return _UNREAD
            op = node.ops[0]
            with contextlib.suppress(TypeError):
                return {ast.Eq: left == right, ast.NotEq: left != right,
                        ast.Is: left is right, ast.IsNot: left is not right}.get(
                    type(op), _compare(op, left, right))
        return _UNREAD

    try:
        result = value_of(ast.parse(test, mode="eval").body)
    except SyntaxError:
        return None
    return None if result is _UNREAD else bool(result)


def _compare(op: ast.cmpop, left: object, right: object) -> object:
    if isinstance(op, ast.Lt):
        return left < right  # type: ignore[operator]
    if isinstance(op, ast.LtE):
        return left <= right  # type: ignore[operator]
    if isinstance(op, ast.Gt):
        return left > right  # type: ignore[operator]
    if isinstance(op, ast.GtE):
        return left >= right  # type: ignore[operator]
    return _UNREAD
