"""The sample list a project's own batch-iterator class indexes, and where it can be split by rank.

The shape (object-detection repositories and course code write it this way)::

    class Dataset:
        def __init__(self, split):
            self.annot_path = TRAIN if split == "train" else TEST
            self.annotations = self.load_annotations()
            self.num_samples = len(self.annotations)
            self.num_batchs = int(np.ceil(self.num_samples / self.batch_size))

        def load_annotations(self):
            with open(self.annot_path) as f:
                annotations = [line.strip() for line in f.readlines() if line.strip()]
            np.random.shuffle(annotations)
            return annotations

        def __iter__(self):
            return self

        def __next__(self):
            ...
            annotation = self.annotations[index]

Every worker reads the whole list, each in its own unseeded order. ``list_split`` proves the list
can be split where it is made: ``__next__`` (or ``__getitem__``) indexes ``self.<attr>``, which
``__init__`` binds once from ``self.<method>(...)``, and nothing else binds; the method builds a
local list (``annotations``) and, before any statement that could order it differently on each
worker (a ``random``/``np.random``/``tf.random`` call, a directory listing not under ``sorted``,
a ``set``), ends building it; it returns that list, or one built from it with exactly one
``append`` per element (``for a in annotations: ...; out.append(...)``, no ``continue``).
The split goes right after the list is built (before the shuffle): ``sdp.shard`` gives every
worker ``ceil(n / size)`` elements (the first ones repeated to fill, as ``DistributedSampler``
pads), so the counts derived from the list (``num_samples``, the batches per epoch) are the same
on every worker and no worker waits in the gradient allreduce for a batch the others never run.

The class may serve the evaluation data too (``Dataset("test")``): the split is made only when a
new constructor flag is set (``shard=False``, stored first thing in ``__init__``), and only the
training construction sets it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import libcst as cst
import libcst.matchers as m

from .syntax import findall

if TYPE_CHECKING:
    from .model import FileModel

#: Calls whose result may be ordered differently on each worker.
_UNORDERED = ("numpy.random.", "random.", "tensorflow.random.", "torch.rand")
_LISTINGS = frozenset({"listdir", "scandir", "walk", "glob", "iglob", "rglob", "iterdir",
                       "set", "frozenset"})


@dataclass
class ListSplit:
    """Where the sample list of a batch-iterator class is split, and the flag that asks for it."""

    cls: cst.ClassDef
    init: cst.FunctionDef
    #: ``self.load_annotations(...)`` in ``__init__`` (the repair names it)
    call: cst.Call
    #: the method that builds the list, and the list's local name there
    method: cst.FunctionDef
    name: str
    #: the top-level statement of ``method`` before which the split goes
    before: cst.BaseStatement
    #: the constructor flag (a name free as a parameter of ``__init__`` and an attribute)
    flag: str
    attr: str


def _method(cls: cst.ClassDef, name: str) -> cst.FunctionDef | None:
    return next((s for s in cls.body.body
                 if isinstance(s, cst.FunctionDef) and s.name.value == name), None)


def _self_attr(node: cst.CSTNode) -> str | None:
    if (isinstance(node, cst.Attribute) and isinstance(node.value, cst.Name)
            and node.value.value == "self"):
        return node.attr.value
    return None


def _indexed_attrs(function: cst.FunctionDef) -> list[str]:
    names = []
    for sub in findall(function, m.Subscript()):
        assert isinstance(sub, cst.Subscript)
        attr = _self_attr(sub.value)
        if attr is not None and attr not in names:
            names.append(attr)
    return names


def _assigned_attrs(cls: cst.ClassDef) -> dict[str, list[cst.CSTNode]]:
    """Every ``self.<attr>`` bound anywhere in the class, with the statements binding it."""
    found: dict[str, list[cst.CSTNode]] = {}
    for node in findall(cls, m.Assign() | m.AugAssign() | m.AnnAssign()):
        targets = ([t.target for t in node.targets] if isinstance(node, cst.Assign)
                   else [node.target])  # type: ignore[attr-defined]
        for target in targets:
            for part in ([e.value for e in target.elements]
                         if isinstance(target, (cst.Tuple, cst.List)) else [target]):
                attr = _self_attr(part)
                if attr is not None:
                    found.setdefault(attr, []).append(node)
    return found


def _binds(stmt: cst.CSTNode, name: str) -> bool:
    """Whether ``stmt`` binds the local ``name`` (assignment or ``for`` target, at any depth)."""
    for node in findall(stmt, m.Assign() | m.AnnAssign() | m.AugAssign() | m.For()
                        | m.WithItem()):
        targets: list[cst.CSTNode] = []
        if isinstance(node, cst.Assign):
            targets = [t.target for t in node.targets]
        elif isinstance(node, cst.For):
            targets = [node.target]
        elif isinstance(node, cst.WithItem):
            targets = [node.asname.name] if node.asname is not None else []
        else:
            targets = [node.target]  # type: ignore[attr-defined]
        for target in targets:
            if any(isinstance(n, cst.Name) and n.value == name
                   for n in [target, *findall(target, m.Name())]):
                return True
    return False


def _unordered(fm: FileModel, stmt: cst.CSTNode) -> bool:
    """A call in ``stmt`` whose result may differ in order between workers."""
    for call in findall(stmt, m.Call()):
        assert isinstance(call, cst.Call)
        names = fm.qualified_names(call.func)
        func = call.func
        short = func.attr.value if isinstance(func, cst.Attribute) else (
            func.value if isinstance(func, cst.Name) else "")
        if any(q.startswith(_UNORDERED) for q in names):
            return True
        if short in _LISTINGS and not _under_sorted(fm, call):
            return True
    return False


def _under_sorted(fm: FileModel, call: cst.Call) -> bool:
    for node in fm.ancestors(call):
        if isinstance(node, cst.Call) and isinstance(node.func, cst.Name) and (
            node.func.value == "sorted"
        ):
            return True
        if isinstance(node, cst.BaseStatement):
            return False
    return False


def _is_shuffle_of(fm: FileModel, stmt: cst.BaseStatement, name: str) -> bool:
    if not (isinstance(stmt, cst.SimpleStatementLine) and len(stmt.body) == 1
            and isinstance(stmt.body[0], cst.Expr) and isinstance(stmt.body[0].value, cst.Call)):
        return False
    call = stmt.body[0].value
    return (fm.refers_to(call.func, "numpy.random.shuffle", "random.shuffle")
            and len(call.args) == 1 and isinstance(call.args[0].value, cst.Name)
            and call.args[0].value.value == name)


def _returned(method: cst.FunctionDef) -> str | None:
    """The local name ``method`` returns: one ``return <name>``, its last statement."""
    returns = findall(method, m.Return())
    body = method.body.body
    last = body[-1] if body else None
    if len(returns) != 1 or not isinstance(last, cst.SimpleStatementLine):
        return None
    ret = last.body[0] if len(last.body) == 1 else None
    if not isinstance(ret, cst.Return) or ret is not returns[0]:
        return None
    return ret.value.value if isinstance(ret.value, cst.Name) else None


def _one_per_element(body: list[cst.BaseStatement], last: int, out: str, source: str) -> bool:
    """``out = []``, then (after ``body[last]``, where ``source`` is complete) ``for x in source:
    ...; out.append(...)`` with one top-level ``append`` and no ``continue``/``break`` of that
    loop: ``out`` has one element per element of ``source``."""
    stmts = body[last + 1:]
    loops = [s for s in stmts if isinstance(s, cst.For) and _binds(s, out) is False
             and isinstance(s.iter, cst.Name) and s.iter.value == source]
    if len(loops) != 1:
        return False
    loop = loops[0]
    appends = [s for s in loop.body.body if isinstance(s, cst.SimpleStatementLine)
               and len(s.body) == 1 and isinstance(s.body[0], cst.Expr)
               and m.matches(s.body[0].value, m.Call(func=m.Attribute(
                   value=m.Name(out), attr=m.Name("append"))))]
    every = findall(loop, m.Call(func=m.Attribute(value=m.Name(out))))
    if len(appends) != 1 or len(every) != 1 or loop.orelse is not None:
        return False
    inner = [f for f in findall(loop.body, m.For() | m.While())]
    for jump in findall(loop.body, m.Continue() | m.Break()):
        if not any(jump in findall(f, m.Continue() | m.Break()) for f in inner):
            return False
    others = [s for s in body if s is not loop and _binds(s, out)]
    return all(m.matches(s, m.SimpleStatementLine(body=[m.Assign(value=m.List(elements=[]))]))
               for s in others)


def _free(taken: set[str], base: str) -> str:
    name, n = base, 1
    while name in taken:
        n += 1
        name = f"{base}_{n}"
    return name


def list_split(fm: FileModel, cls: cst.ClassDef) -> ListSplit | None:
    """The split of the sample list ``cls`` iterates, when the module docstring's structure is
    proven; None otherwise (or when the class splits it already: a ``<sdp>.shard`` call in it)."""
    reader = _method(cls, "__next__") or _method(cls, "__getitem__")
    init = _method(cls, "__init__")
    if reader is None or init is None or findall(cls, m.Call(func=m.Attribute(
            attr=m.Name("shard")))):
        return None
    bound = _assigned_attrs(cls)
    for attr in _indexed_attrs(reader):
        stmts = bound.get(attr, [])
        first = stmts[0] if stmts else None
        if not (isinstance(first, cst.Assign) and len(first.targets) == 1
                and isinstance(first.value, cst.Call)):
            continue
        if any(init not in fm.ancestors(s) for s in stmts[:1]) or len(stmts) != 1:
            continue
        call = first.value
        maker = _self_attr(call.func)
        method = _method(cls, maker) if maker else None
        if method is None:
            continue
        found = _split_in(fm, method)
        if found is None:
            continue
        name, before = found
        params = {p.name.value for p in (*init.params.params, *init.params.kwonly_params)}
        flag = _free(params | set(bound), "shard")
        return ListSplit(cls, init, call, method, name, before, flag, attr)
    return None


def _split_in(fm: FileModel, method: cst.FunctionDef) -> tuple[str, cst.BaseStatement] | None:
    """The list ``method`` builds and the statement before which it is split."""
    out = _returned(method)
    if out is None:
        return None
    body = list(method.body.body)
    candidates = [out]
    for stmt in body:
        if isinstance(stmt, cst.For) and isinstance(stmt.iter, cst.Name):
            candidates.append(stmt.iter.value)
    for name in candidates:
        binders = [i for i, s in enumerate(body) if _binds(s, name)]
        if not binders or any(p.name.value == name for p in method.params.params):
            continue
        last = binders[-1]
        if last + 1 >= len(body):
            continue
        rest = body[last + 1:]
        if any(findall(s, m.Call(func=m.Attribute(value=m.Name(name)))) for s in rest):
            continue  # still filled or changed after its last binding
        if any(_unordered(fm, s) for s in body[: last + 1]):
            return None  # ordered differently on each worker before it is complete
        if name != out and not _one_per_element(body, last, out, name):
            continue
        before = body[last + 1]
        if name == out or _is_shuffle_of(fm, before, name) or not _unordered(fm, before):
            return name, before
    return None


# -- loaders a class builds and draws batches from with next() ------------------------------------

_LOADER_ENDS = ("utils.data.DataLoader", "utils.data.dataloader.DataLoader")


@dataclass
class DrawnLoaders:
    """DataLoaders a class builds (``name = DataLoader(...)``, kept on ``self``) and draws batches
    from with ``next()`` in one of its methods, and the ``iter(self.<list>[i])`` calls that start a
    new pass where ``next()`` raised ``StopIteration``."""

    loaders: list[cst.Call]
    #: ``iter(...)`` calls in ``except StopIteration:`` handlers, with the loader expression
    restarts: list[tuple[cst.Call, cst.BaseExpression]]


def drawn_loaders(fm: FileModel, cls: cst.ClassDef, method: cst.FunctionDef
                  ) -> DrawnLoaders | None:
    """The loaders ``method`` of ``cls`` draws from (``next(self.iters[i])``), when every one is
    a ``DataLoader`` the class builds and binds to a name that it keeps on ``self`` (appended to a
    list attribute that holds nothing else), and every ``iter()`` of the method restarts one of
    them in an ``except StopIteration:``; None otherwise (a sampler of its own is the caller's
    to judge)."""
    if not any(fm.refers_to(c.func, "builtins.next")  # type: ignore[attr-defined]
               for c in findall(method, m.Call())):
        return None
    loaders = [c for c in findall(cls, m.Call()) if isinstance(c, cst.Call) and any(
        q.endswith(_LOADER_ENDS) for q in fm.qualified_names(c.func))]
    if not loaders:
        return None
    names: set[str] = set()
    for call in loaders:
        assign = fm.parent(call)
        if not (isinstance(assign, cst.Assign) and len(assign.targets) == 1
                and isinstance(assign.targets[0].target, cst.Name)):
            return None
        names.add(assign.targets[0].target.value)
    lists: set[str] = set()
    for call in findall(cls, m.Call(func=m.Attribute(attr=m.Name("append")))):
        assert isinstance(call, cst.Call) and isinstance(call.func, cst.Attribute)
        attr = _self_attr(call.func.value)
        if attr is None or len(call.args) != 1:
            continue
        value = call.args[0].value
        if isinstance(value, cst.Name) and value.value in names:
            lists.add(attr)
    restarts: list[tuple[cst.Call, cst.BaseExpression]] = []
    for call in findall(method, m.Call()):
        assert isinstance(call, cst.Call)
        if not (fm.refers_to(call.func, "builtins.iter") and len(call.args) == 1):
            continue
        value = call.args[0].value
        if not (isinstance(value, cst.Subscript) and _self_attr(value.value) in lists):
            return None  # a restart from something else
        handler = next((a for a in fm.ancestors(call) if isinstance(a, cst.ExceptHandler)), None)
        if handler is None or not m.matches(handler.type, m.Name("StopIteration")):
            return None
        restarts.append((call, value))
    # The lists hold only these loaders.
    for call in findall(cls, m.Call(func=m.Attribute(attr=m.Name("append")))):
        assert isinstance(call, cst.Call) and isinstance(call.func, cst.Attribute)
        if _self_attr(call.func.value) in lists and not (
            len(call.args) == 1 and isinstance(call.args[0].value, cst.Name)
            and call.args[0].value.value in names
        ):
            return None
    return DrawnLoaders(loaders, restarts)
