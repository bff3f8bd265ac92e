"""Files a script writes on rank 0 and reads back later, and files private to each process.

``written_path``/``read_path`` give the path expression of a write (from the tables of
``writes``) or of a read (``torch.load``, Keras ``load_weights``/``load_model``,
``tf.train.Checkpoint.restore``, ``open`` for reading, ``numpy.load``, ...). Two paths are the same
when their code is the same (``args.save`` and ``args.save``); a ``CheckpointManager``'s
``save()`` is read back by ``restore(<manager>.latest_checkpoint)``.

``is_private_temp`` says whether a path lies in a directory made for this process alone
(``tempfile.mkdtemp()``, ``tempfile.TemporaryDirectory()``, ``NamedTemporaryFile``): every rank has
its own, so a write there must not be guarded.
"""

from __future__ import annotations

import ast
from typing import TYPE_CHECKING

import libcst as cst
import libcst.matchers as m
from libcst.metadata import QualifiedNameSource

from .ranks import divergent_condition, is_rank_call
from .scopes import arguments_for, assigned_values, callers, class_of, referents
from .syntax import findall, names_read
from .writes import (
    FRAMEWORK_METHOD_WRITES,
    FRAMEWORK_WRITES,
    METHOD_WRITES,
    OPENERS,
    WRITES,
    argument,
    in_memory,
    open_mode,
    writes_in,
)

if TYPE_CHECKING:
    from collections.abc import Callable

    from .model import FileModel

#: Calls reading a file, with where the path is.
READS: dict[str, tuple[int, str]] = {
    "torch.load": (0, "f"),
    "torch.jit.load": (0, "f"),
    "numpy.load": (0, "file"),
    "numpy.loadtxt": (0, "fname"),
    "pickle.load": (0, "file"),
    "keras.models.load_model": (0, "filepath"),
    "keras.saving.load_model": (0, "filepath"),
    "tensorflow.keras.models.load_model": (0, "filepath"),
    "tensorflow.saved_model.load": (0, "export_dir"),
    "sdp_runtime.tensorflow.keras.load_model": (0, "filepath"),
    "PIL.Image.open": (0, "fp"),
    "matplotlib.pyplot.imread": (0, "fname"),
    "imageio.imread": (0, "uri"),
    "imageio.v2.imread": (0, "uri"),
    "pandas.read_csv": (0, "filepath_or_buffer"),
    "pandas.read_pickle": (0, "filepath_or_buffer"),
    "pandas.read_json": (0, "path_or_buf"),
}

#: Calls writing a file whose path the read tables cannot see in ``WRITES`` (where the write
#: vocabulary does not need it): ``tf.saved_model.save(model, export_dir)``.
PATH_WRITES: dict[str, tuple[int, str]] = {
    "tensorflow.saved_model.save": (1, "export_dir"),
    "tensorflow.keras.models.save_model": (1, "filepath"),
    "keras.models.save_model": (1, "filepath"),
    "keras.saving.save_model": (1, "filepath"),
}

#: ``<object>.<method>(path)`` reading a file in a script of that framework.
METHOD_READS: dict[str, tuple[str, ...]] = {
    "torch": ("from_pretrained",),
    "tensorflow": ("load_weights", "restore", "from_pretrained"),
}

#: Making a directory or file that belongs to this process only.
PRIVATE_TEMPS = (
    "tempfile.mkdtemp",
    "tempfile.mkstemp",
    "tempfile.TemporaryDirectory",
    "tempfile.NamedTemporaryFile",
    "tempfile.TemporaryFile",
    "tempfile.SpooledTemporaryFile",
)

#: The runtime's barrier (any alias of the runtime module).
BARRIERS = (
    "sdp_runtime.torch.barrier",
    "sdp_runtime.tensorflow.barrier",
    "sdp_runtime.tensorflow.keras.barrier",
    "sdp_runtime.torch.distributed.barrier",
    "torch.distributed.barrier",
    "horovod.torch.barrier",
)


def _path_arg(call: cst.Call, position: int, keyword: str) -> cst.BaseExpression | None:
    arg = argument(call, position, keyword)
    return arg.value if arg is not None else None


def written_path(fm: FileModel, call: cst.Call, framework: str) -> str | None:
    """The code of the path ``call`` writes to (None: not a write to a known path)."""
    names = fm.qualified_names(call.func)
    for name in names:
        if name in OPENERS:
            default, position = OPENERS[name]
            mode = open_mode(call, default, position)
            if mode is None or not writes_in(mode):
                return None
            return _code(fm, _path_arg(call, 0, "file"))
    table = {**WRITES, **FRAMEWORK_WRITES.get(framework, {}), **PATH_WRITES}
    for name in names:
        if name in table:
            where = table[name]
            if where is None or in_memory(fm, argument(call, *where)):
                return None
            return _code(fm, _path_arg(call, *where))
    if isinstance(call.func, cst.Attribute) and not names & set(READS):
        method = call.func.attr.value
        if method in METHOD_WRITES and call.args:  # df.to_csv(path), model.save_pretrained(dir)
            return _code(fm, call.args[0].value)
        if method in FRAMEWORK_METHOD_WRITES.get(framework, ()):
            if not call.args:  # manager.save(): read back through manager.latest_checkpoint
                return f"{fm.module.code_for_node(call.func.value)}.latest_checkpoint"
            return _code(fm, call.args[0].value)
    return None


def read_path(fm: FileModel, call: cst.Call, framework: str) -> str | None:
    """The code of the path ``call`` reads (None: not a read of a known path)."""
    names = fm.qualified_names(call.func)
    for name in names:
        if name in OPENERS:
            default, position = OPENERS[name]
            mode = open_mode(call, default, position)
            if mode is None or writes_in(mode):
                return None
            return _code(fm, _path_arg(call, 0, "file"))
        if name in READS:
            arg = argument(call, *READS[name])
            if arg is None or in_memory(fm, arg):
                return None
            return _code(fm, arg.value)
    if (
        isinstance(call.func, cst.Attribute)
        and call.func.attr.value in METHOD_READS.get(framework, ())
        and call.args
        # ``AutoModel.from_pretrained(dir)``: a class method of an imported class.
        and (call.func.attr.value == "from_pretrained" or not _is_module(fm, call.func.value))
    ):
        return _code(fm, call.args[0].value)
    return None


def same_file(code: str) -> str:
    """What two spellings of one path have in common: a string literal by its value (the
    checkpoint's ``'w.h5'`` is the ``"w.h5"`` read back later), any other code as written."""
    try:
        value = ast.literal_eval(code)
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        return code
    return repr(value) if isinstance(value, (str, bytes)) else code


def writes_private_temp(fm: FileModel, call: cst.Call, framework: str) -> bool:
    """``call`` writes under a temporary file or directory of this process (never guard it:
    every rank has its own, and the rank's own code reads it back)."""
    return is_private_temp(fm, _destination(fm, call, framework))


def _destination(fm: FileModel, call: cst.Call, framework: str) -> cst.BaseExpression | None:
    """Where a write goes: its path (or buffer) argument, or the path object a method writes
    (``(Path(tmp) / "x").write_text(...)``); None when it cannot be told."""
    names = fm.qualified_names(call.func)
    table = {**WRITES, **FRAMEWORK_WRITES.get(framework, {})}
    where = next((table[n] for n in names if table.get(n)), None)
    if any(n in OPENERS for n in names):
        where = (0, "file")
    if where is not None:
        arg = argument(call, *where)
        return arg.value if arg is not None else None
    positional = [a for a in call.args if a.keyword is None and not a.star]
    if not positional and isinstance(call.func, cst.Attribute):
        return call.func.value  # ``(Path(tmp) / "x").unlink()``
    # shutil.copy(src, dst), os.remove(path), model.save(path): the destination comes last.
    return positional[-1].value if positional else None


def private_write(fm: FileModel, call: cst.Call, framework: str) -> str | None:
    """Why the write ``call`` belongs to this process alone and must stay on every rank (never
    go under ``if rank == 0:``, nor be reported as a write of one file by every rank), in
    words; None when it may be a file every rank writes:

    * into an in-memory buffer (``io.BytesIO()``);
    * under a temporary file or directory of this process (``tempfile.mkdtemp()``,
      ``TemporaryDirectory()``): its own code reads it back, and rank 0's is not the others';
    * to a file named after the rank (``f"rank_{rank}_log.txt"``, ``hvd.rank()``, a name
      holding one) or the process (``os.getpid()``): each rank writes its own;
    * in a helper module's ``if __name__ == "__main__":`` block (project mode: the module is
      imported by the training script, so that block never runs in training).
    """
    destination = _destination(fm, call, framework)
    if destination is not None and in_memory(fm, cst.Arg(destination)):
        return "it writes into an in-memory buffer"
    if is_private_temp(fm, destination):
        return "it writes under a temporary directory of this process"
    if destination is not None and names_the_process(fm, destination):
        return "its file name is built from the rank, so each rank writes its own file"
    project = fm.project
    if project is not None and project.helper and not fm.info.training and (
        runs_only_as_script(fm, call)
    ):
        return "it runs only when this module is run as a script, not when it is imported"
    return None


def names_the_process(fm: FileModel, expr: cst.BaseExpression, depth: int = 0) -> bool:
    """Whether ``expr`` (a path) is built from the rank or the process id: a rank call, a name
    holding one (``rank = dist.get_rank()``, through assignments), ``os.getpid()``, ``RANK`` /
    ``LOCAL_RANK`` read from the environment, ``args.local_rank``.

    The nodes are looked at kind by kind (``findall``'s class test for each, not libcst's
    matcher of ``Call() | Name() | ...`` on every node), names last: the answer is whether any
    of them says so, whatever the order."""
    if depth > 3:
        return False
    nodes = [*findall(expr, m.Call()), *findall(expr, m.SimpleString()),
             *findall(expr, m.Attribute()), *findall(expr, m.Name())]
    for node in nodes:
        if isinstance(node, cst.Call) and (
            is_rank_call(fm, node) or fm.refers_to(node.func, "os.getpid")
            or fm.refers_to(node.func, *_LOCAL_RANKS)
        ):
            return True
        if isinstance(node, cst.SimpleString) and node.evaluated_value in _RANK_VARIABLES:
            return True  # os.environ["RANK"]
        if isinstance(node, cst.Attribute) and node.attr.value == "local_rank":
            return True  # args.local_rank (not ``cfg.rank``: a LoRA rank is no process's)
        if isinstance(node, cst.Name) and any(
            names_the_process(fm, v, depth + 1) for v in assigned_values(fm, node)
        ):
            return True
    return False


#: Who-am-I calls that differ between the processes of one machine.
_LOCAL_RANKS = ("sdp_runtime.torch.local_rank", "sdp_runtime.tensorflow.local_rank",
                "horovod.torch.local_rank", "horovod.tensorflow.local_rank",
                "horovod.tensorflow.keras.local_rank",
                "smdistributed.dataparallel.torch.distributed.get_local_rank")
_RANK_VARIABLES = ("RANK", "LOCAL_RANK")


def runs_only_as_script(fm: FileModel, node: cst.CSTNode) -> bool:
    """``node`` is in the module's top-level ``if __name__ == "__main__":`` block: it runs when
    the module is run as a script, never when another module imports it."""
    for parent in fm.ancestors(node):
        if isinstance(parent, cst.If) and fm.parent(parent) is fm.module and m.matches(
            parent.test, m.Comparison(left=m.Name("__name__"), comparisons=[
                m.ComparisonTarget(m.Equal(), m.SimpleString())])
        ):
            return "__main__" in fm.module.code_for_node(parent.test)
    return False


def is_private_temp(fm: FileModel, expr: cst.BaseExpression | None, depth: int = 0) -> bool:
    """``expr`` (a path) is under a temporary file or directory made by this process
    (``os.path.join(tmp, "x")``, ``f"{tmp}/x"``, ``Path(tmp) / "x"``, or a name holding one)."""
    if expr is None or depth > 3:
        return False
    for name in [expr] if isinstance(expr, cst.Name) else names_read(expr):
        if _names_private_temp(fm, name) or any(
            is_private_temp(fm, value, depth + 1) for value in assigned_values(fm, name)
        ):
            return True
    return False


def _names_private_temp(fm: FileModel, name: cst.Name) -> bool:
    for value in assigned_values(fm, name):
        if isinstance(value, cst.Call) and fm.refers_to(value.func, *PRIVATE_TEMPS):
            return True
    # ``with tempfile.TemporaryDirectory() as tmp:``
    for assignment in _with_targets(fm, name):
        if fm.refers_to(assignment.func, *PRIVATE_TEMPS):
            return True
    return False


def _with_targets(fm: FileModel, name: cst.Name) -> list[cst.Call]:
    found = []
    for assignment in referents(fm, name):
        node = getattr(assignment, "node", None)
        parent = fm.parent(node) if node is not None else None
        if isinstance(parent, cst.AsName):
            item = fm.parent(parent)
            if isinstance(item, cst.WithItem) and isinstance(item.item, cst.Call):
                found.append(item.item)
    return found


#: Copies: what they write is there to be read (a data set's files copied into a folder): the
#: shutil writes of ``WRITES``.
COPIES = tuple(q for q in WRITES if q.startswith("shutil."))


def copies_waited_for(
    fm: FileModel, copies: list[cst.Call], on_rank0: Callable[[cst.CSTNode], bool]
) -> list[cst.CSTNode]:
    """The module-level statements after which every rank waits for the files rank 0 alone
    copies (``copies``, those ``on_rank0`` says run there): the copy's own statement, or a call
    of the function of this file that makes it (``make_subset("train", 0, 1000)``), the last of
    several in a row. A copy prepares files some later code reads on every rank (a data set's
    folder listed by ``image_dataset_from_directory``): without the barrier, a rank can list a
    folder half copied. None where a rank-dependent test decides whether the statement runs."""
    units: list[cst.CSTNode] = []
    for call in copies:
        if not on_rank0(call):
            continue
        function = next((a for a in fm.ancestors(call) if isinstance(a, cst.FunctionDef)),
                        None)
        sites = [call] if function is None else callers(fm, function)
        for site in sites:
            stmt = _module_statement(fm, site)
            if stmt is not None and stmt not in units and divergent_condition(fm, site) is None:
                units.append(stmt)
    body = list(fm.module.body)
    return [u for u in units
            if (i := body.index(u)) + 1 == len(body) or body[i + 1] not in units]


def _module_statement(fm: FileModel, node: cst.CSTNode) -> cst.CSTNode | None:
    """The statement of the module's body that holds ``node`` outside any function or class."""
    child = node
    for parent in fm.ancestors(node):
        if isinstance(parent, (cst.FunctionDef, cst.ClassDef, cst.Lambda)):
            return None
        if isinstance(parent, cst.Module):
            return child
        child = parent
    return None


def checkpoint_fits(
    fm: FileModel, callback: cst.Call, path: cst.BaseExpression
) -> list[tuple[cst.Call, str]]:
    """The ``fit`` calls during which a Keras checkpoint callback made at ``callback`` writes
    ``path`` (its ``filepath``), each with the code that names the file where that fit is: the
    first ``.fit(...)`` after it in its own function, with ``path``'s code; or, when no fit
    follows there and ``path`` is a parameter of that function (a callbacks factory,
    ``create_callbacks(saved_weights_name, ...)``, whose list the caller's fit gets), the first
    fit after each call of the factory in its caller's function, with the argument that call
    passes (``config["train"]["saved_weights_name"]``). Nothing else is followed."""
    function = fm.enclosing_function(callback)
    fit = _fit_after(fm, callback, function)
    if fit is not None:
        return [(fit, fm.code(path).strip())]
    if (
        function is None or class_of(fm, function) is not None or not isinstance(path, cst.Name)
        or not (bindings := referents(fm, path))
        or not all(isinstance(getattr(b, "node", None), cst.Param) for b in bindings)
    ):
        return []
    found = []
    for value, call in arguments_for(fm, function, path.value):
        fit = _fit_after(fm, call, fm.enclosing_function(call))
        if fit is not None:
            found.append((fit, fm.code(value).strip()))
    return found


def _fit_after(
    fm: FileModel, node: cst.Call, function: cst.FunctionDef | None
) -> cst.Call | None:
    """The ``.fit(...)`` (or Keras 2's ``.fit_generator(...)``, which the conversion makes a
    ``fit``) whose arguments hold ``node``, else the first of ``function`` (None: the module
    level) after it."""
    fits = (*fm.method_calls("fit"), *fm.method_calls("fit_generator"))
    around = next((p for p in fm.ancestors(node) if any(p is f for f in fits)), None)
    if around is not None:  # ``model.fit(x, callbacks=[ModelCheckpoint(p)])``
        return around  # type: ignore[return-value]
    later = [c for c in fits
             if fm.order(c) > fm.order(node) and fm.enclosing_function(c) is function]
    return min(later, key=fm.order) if later else None


def is_barrier(fm: FileModel, stmt: cst.CSTNode | None) -> bool:
    """``stmt`` is a statement calling a barrier (``sdp.barrier()``)."""
    if not isinstance(stmt, cst.SimpleStatementLine) or len(stmt.body) != 1:
        return False
    expr = stmt.body[0]
    if not (isinstance(expr, cst.Expr) and isinstance(expr.value, cst.Call)):
        return False
    func = expr.value.func
    if fm.refers_to(func, *BARRIERS):
        return True
    return m.matches(func, m.Attribute(attr=m.Name("barrier")))


def _code(fm: FileModel, expr: cst.BaseExpression | None) -> str | None:
    if expr is None or _is_handle(fm, expr):
        return None
    return fm.module.code_for_node(expr).strip()


def _is_handle(fm: FileModel, expr: cst.BaseExpression) -> bool:
    """``f`` of ``with open(p) as f`` / ``f = open(p)``: the opening names the path."""
    if not isinstance(expr, cst.Name):
        return False
    values: list[cst.BaseExpression] = [*assigned_values(fm, expr), *_with_targets(fm, expr)]
    return any(isinstance(v, cst.Call) and fm.refers_to(v.func, *OPENERS) for v in values)


def _is_module(fm: FileModel, expr: cst.BaseExpression) -> bool:
    """``expr`` is an imported module or name (``np`` in ``np.load``), not an object."""
    found = fm.raw_qualified_names(expr)
    return any(q.source is QualifiedNameSource.IMPORT for q in found)
